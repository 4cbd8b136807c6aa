//! `tokenizer.json` (+ `tokenizer_config.json`) against the GGUF `tokenizer.ggml.*` block, both ways.
//!
//! Loading: the file is read with the `tokenizers` crate (`tokenizers::Tokenizer::from_file`, which
//! validates it), and its vocabulary, merges, added tokens and pre-tokenizer become the GGUF keys llama.cpp's
//! converter writes for it (`convert_hf_to_gguf.py` `_set_vocab_gpt2` / `_set_vocab_bert`); the pre-tokenizer
//! is named by its regexes ([`crate::tokenizer::bpe::pre_name`]; the converter hashes the tokenizer's
//! output instead). The engine's [`crate::tokenizer::Tokenizer`] then tokenizes as it does from the GGUF.
//!
//! Supported: byte-level BPE (`model.type = "BPE"`, GGUF `gpt2`) and WordPiece (`"WordPiece"`, GGUF `bert`,
//! the converter's phantom-space form: a word-initial piece `▁the` is HF `the`, a continuation `ll` is HF
//! `##ll`).

use std::path::Path;

use serde_json::{json, Value};

use super::layout::ArchLayout;
use super::{get_path, read_json, TOKENIZER};
use crate::gguf::{GgufFile, MetaValue};
use crate::tokenizer::bpe;
use crate::{Error, Result};

/// `tokenizer_config.json`.
pub const TOKENIZER_CONFIG: &str = "tokenizer_config.json";

fn model_err(path: &Path, what: impl Into<String>) -> Error {
    Error::Model {
        path: path.to_path_buf(),
        what: what.into(),
    }
}

/// `tokenizer.json` and `tokenizer_config.json` for the GGUF tokenizer of `g`.
///
/// Errors: a vocabulary type other than `gpt2` / `bert`, a pre-tokenizer the engine does not implement,
/// malformed merges.
pub fn from_gguf(g: &GgufFile) -> Result<(Value, Value)> {
    let model = g.get_str("tokenizer.ggml.model")?;
    let tokens = g.get_str_array("tokenizer.ggml.tokens")?;
    let types = match g.get("tokenizer.ggml.token_type") {
        Some(_) => g.get_i32_array("tokenizer.ggml.token_type")?,
        None => vec![1; tokens.len()],
    };
    let opt_u32 = |k: &str| -> Result<Option<u32>> {
        match g.get(k) {
            Some(_) => g.get_u32(k).map(Some),
            None => Ok(None),
        }
    };
    let opt_bool = |k: &str| -> Result<Option<bool>> {
        match g.get(k) {
            Some(_) => g.get_bool(k).map(Some),
            None => Ok(None),
        }
    };
    let added = |special_types: &[i32], content: &dyn Fn(usize) -> String| -> Vec<Value> {
        (0..tokens.len())
            .filter(|&i| matches!(types[i], 2..=4))
            .map(|i| {
                json!({"id": i, "content": content(i), "single_word": false, "lstrip": false, "rstrip": false,
                       "normalized": false, "special": special_types.contains(&types[i])})
            })
            .collect()
    };
    let text = |id: Option<u32>, f: &dyn Fn(usize) -> String| id.map(|i| f(i as usize));
    match model {
        "gpt2" => {
            let pre_name = match g.get("tokenizer.ggml.pre") {
                Some(_) => Some(g.get_str("tokenizer.ggml.pre")?),
                None => None,
            };
            let pre = bpe::pre_tokenizer(pre_name)
                .map_err(|e| Error::Unsupported(format!("{}: {e}", g.path().display())))?;
            let mut merges = Vec::new();
            for (i, m) in g.get_str_array("tokenizer.ggml.merges")?.iter().enumerate() {
                let (a, b) = bpe::split_merge(m).ok_or_else(|| {
                    model_err(g.path(), format!("tokenizer.ggml.merges[{i}] = {m:?} is not two parts"))
                })?;
                merges.push(json!([a, b]));
            }
            let vocab: serde_json::Map<String, Value> = tokens
                .iter()
                .enumerate()
                .map(|(i, t)| (t.to_string(), json!(i)))
                .collect();
            let mut steps: Vec<Value> = pre
                .regexes
                .iter()
                .map(|re| json!({"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false}))
                .collect();
            steps.push(json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}));
            let own = |i: usize| tokens[i].to_string();
            let (bos, eos) = (
                opt_u32("tokenizer.ggml.bos_token_id")?,
                opt_u32("tokenizer.ggml.eos_token_id")?,
            );
            let add_bos = opt_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false);
            let add_eos = opt_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
            let mut single = Vec::new();
            let mut specials = serde_json::Map::new();
            if let (true, Some(b)) = (add_bos, bos) {
                single.push(json!({"SpecialToken": {"id": own(b as usize), "type_id": 0}}));
                specials.insert(own(b as usize), json!({"id": own(b as usize), "ids": [b], "tokens": [own(b as usize)]}));
            }
            single.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
            if let (true, Some(e)) = (add_eos, eos) {
                single.push(json!({"SpecialToken": {"id": own(e as usize), "type_id": 0}}));
                specials.insert(own(e as usize), json!({"id": own(e as usize), "ids": [e], "tokens": [own(e as usize)]}));
            }
            let post = if add_bos || add_eos {
                json!({"type": "TemplateProcessing", "single": single, "pair": single, "special_tokens": specials})
            } else {
                Value::Null
            };
            let tok = json!({
                "version": "1.0",
                "truncation": null,
                "padding": null,
                "added_tokens": added(&[2, 3], &own),
                "normalizer": null,
                "pre_tokenizer": {"type": "Sequence", "pretokenizers": steps},
                "post_processor": post,
                "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
                "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                          "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                          "vocab": vocab, "merges": merges},
            });
            let tc = json!({
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": text(bos, &own),
                "eos_token": text(eos, &own),
                "add_bos_token": add_bos,
                "add_eos_token": add_eos,
                "clean_up_tokenization_spaces": pre.clean_spaces,
                "model_max_length": 1_000_000_000_000_000_000u64,
            });
            Ok((tok, tc))
        }
        "bert" => {
            // HF form of a phantom-space piece: control / unknown tokens as they are, `▁w` -> `w`, `c` -> `##c`
            let hf = |i: usize| -> String {
                let t = tokens[i];
                if matches!(types[i], 2 | 3) {
                    t.to_string()
                } else if let Some(w) = t.strip_prefix('\u{2581}') {
                    w.to_string()
                } else {
                    format!("##{t}")
                }
            };
            let vocab: serde_json::Map<String, Value> =
                (0..tokens.len()).map(|i| (hf(i), json!(i))).collect();
            if vocab.len() != tokens.len() {
                return Err(model_err(g.path(), "two WordPiece tokens have the same HF form"));
            }
            let id = |k: &str| opt_u32(&format!("tokenizer.ggml.{k}"));
            let unk = id("unknown_token_id")?.or(Some(100)).filter(|&i| (i as usize) < tokens.len());
            let cls = id("bos_token_id")?.or(id("cls_token_id")?);
            let sep = id("seperator_token_id")?;
            let (Some(cls), Some(sep), Some(unk)) = (cls, sep, unk) else {
                return Err(model_err(g.path(), "a WordPiece vocabulary needs CLS, SEP and UNK token ids"));
            };
            let lower = opt_bool("tokenizer.ggml.normalizer.lowercase")?.unwrap_or(true);
            let (c, s) = (hf(cls as usize), hf(sep as usize));
            let tok = json!({
                "version": "1.0",
                "truncation": null,
                "padding": null,
                "added_tokens": added(&[2, 3], &hf),
                "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                               "strip_accents": null, "lowercase": lower},
                "pre_tokenizer": {"type": "BertPreTokenizer"},
                "post_processor": {"type": "TemplateProcessing",
                    "single": [{"SpecialToken": {"id": c, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                               {"SpecialToken": {"id": s, "type_id": 0}}],
                    "pair": [{"SpecialToken": {"id": c, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                             {"SpecialToken": {"id": s, "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}},
                             {"SpecialToken": {"id": s, "type_id": 1}}],
                    "special_tokens": {c.clone(): {"id": c, "ids": [cls], "tokens": [c]},
                                       s.clone(): {"id": s, "ids": [sep], "tokens": [s]}}},
                "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
                "model": {"type": "WordPiece", "unk_token": hf(unk as usize), "continuing_subword_prefix": "##",
                          "max_input_chars_per_word": 100, "vocab": vocab},
            });
            let mut tc = json!({
                "tokenizer_class": "BertTokenizerFast",
                "do_lower_case": lower,
                "cls_token": c,
                "sep_token": s,
                "unk_token": hf(unk as usize),
                "model_max_length": 1_000_000_000_000_000_000u64,
            });
            for (k, name) in [("padding_token_id", "pad_token"), ("mask_token_id", "mask_token")] {
                if let Some(i) = id(k)? {
                    tc[name] = json!(hf(i as usize));
                }
            }
            Ok((tok, tc))
        }
        other => Err(Error::Unsupported(format!(
            "{}: tokenizer.ggml.model {other:?}: the Hugging Face export writes byte-level BPE (gpt2) and WordPiece (bert) tokenizers",
            g.path().display()
        ))),
    }
}

/// The regexes a `tokenizer.json` pre-tokenizer splits with, in order, in llama.cpp's terms: `Split`
/// regexes, `Digits(individual_digits)` as `\p{N}`, `ByteLevel(use_regex)` as GPT-2's regex.
fn pre_regexes(v: &Value, path: &Path, out: &mut Vec<String>) -> Result<()> {
    let ty = v.get("type").and_then(Value::as_str).unwrap_or("");
    match ty {
        "Sequence" => {
            for p in v.get("pretokenizers").and_then(Value::as_array).into_iter().flatten() {
                pre_regexes(p, path, out)?;
            }
        }
        "Split" if v.get("behavior").and_then(Value::as_str) == Some("Isolated")
            && v.get("invert").and_then(Value::as_bool) != Some(true) =>
        {
            match v.get("pattern") {
                Some(p) if p.get("Regex").is_some_and(Value::is_string) => {
                    out.push(p["Regex"].as_str().unwrap_or_default().to_string())
                }
                _ => return Err(model_err(path, format!("pre-tokenizer {v}: only Split on a regex is read"))),
            }
        }
        "Digits" if v.get("individual_digits").and_then(Value::as_bool) == Some(true) => out.push(r"\p{N}".into()),
        "ByteLevel" => {
            if v.get("use_regex").and_then(Value::as_bool).unwrap_or(true) {
                out.push(bpe::GPT2.into());
            }
        }
        _ => {
            return Err(model_err(
                path,
                format!("pre-tokenizer {v}: not one lockstep reads (Sequence, Split(Isolated regex), Digits, ByteLevel)"),
            ))
        }
    }
    Ok(())
}

/// The GGUF `tokenizer.ggml.*` keys of the HF directory `dir` (`tokenizer.json`, and
/// `tokenizer_config.json` / `config.json` for the BOS / EOS tokens).
///
/// Errors: a missing or invalid `tokenizer.json` (the `tokenizers` crate's message), a model type other than
/// BPE / WordPiece, a normalizer on a BPE tokenizer, a pre-tokenizer lockstep does not implement, ids with
/// holes, a special token named in `tokenizer_config.json` that is not in the vocabulary.
pub fn meta_from_dir(dir: &Path, cfg: &Value, l: &ArchLayout) -> Result<Vec<(String, MetaValue)>> {
    let path = dir.join(TOKENIZER);
    if !path.exists() {
        return Err(model_err(dir, format!("no {TOKENIZER}")));
    }
    tokenizers::Tokenizer::from_file(&path)
        .map_err(|e| model_err(&path, format!("the tokenizers crate cannot read it: {e}")))?;
    let tj = read_json(&path)?;
    let tc_path = dir.join(TOKENIZER_CONFIG);
    let tc = if tc_path.exists() {
        read_json(&tc_path)?
    } else {
        json!({})
    };
    let model = tj
        .get("model")
        .ok_or_else(|| model_err(&path, "no \"model\""))?;
    let mtype = model.get("type").and_then(Value::as_str).unwrap_or("");
    let vocab = model
        .get("vocab")
        .and_then(Value::as_object)
        .ok_or_else(|| model_err(&path, "model.vocab is not an object"))?;
    let mut by_id: Vec<Option<String>> = Vec::new();
    let mut types: Vec<i32> = Vec::new();
    let mut place = |id: u64, text: &str, ty: i32| {
        let id = id as usize;
        if by_id.len() <= id {
            by_id.resize(id + 1, None);
            types.resize(id + 1, 1);
        }
        by_id[id] = Some(text.to_string());
        types[id] = ty;
    };
    for (t, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| model_err(&path, format!("model.vocab[{t:?}] is not an id")))?;
        place(id, t, 1);
    }
    let mut added_special = Vec::new();
    for a in tj
        .get("added_tokens")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let (Some(id), Some(text)) = (
            a.get("id").and_then(Value::as_u64),
            a.get("content").and_then(Value::as_str),
        ) else {
            return Err(model_err(
                &path,
                format!("added token {a}: no id or content"),
            ));
        };
        let special = a.get("special").and_then(Value::as_bool).unwrap_or(false);
        place(id, text, if special { 3 } else { 4 });
        if special {
            added_special.push(id as usize);
        }
    }
    let n = by_id.len();
    let hf_tokens: Vec<String> = by_id
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            t.ok_or_else(|| model_err(&path, format!("no token has id {i} (ids must be 0..{n})")))
        })
        .collect::<Result<_>>()?;
    let id_of = |text: &str| hf_tokens.iter().position(|t| t == text).map(|i| i as u32);
    // a token named in tokenizer_config.json (string or {"content": ...})
    let named = |k: &str| -> Result<Option<u32>> {
        let v = match tc.get(k) {
            None | Some(Value::Null) => return Ok(None),
            Some(v) => v,
        };
        let text = v
            .as_str()
            .or_else(|| v.get("content").and_then(Value::as_str))
            .ok_or_else(|| model_err(&tc_path, format!("{k} = {v}: not a token")))?;
        id_of(text).map(Some).ok_or_else(|| {
            model_err(
                &tc_path,
                format!("{k} = {text:?} is not in {TOKENIZER}'s vocabulary"),
            )
        })
    };
    let cfg_id = |k: &str| {
        cfg.get(k)
            .and_then(|v| {
                v.as_u64()
                    .or_else(|| v.as_array().and_then(|a| a.first()).and_then(Value::as_u64))
            })
            .map(|x| x as u32)
    };
    let s = |x: &str| MetaValue::String(x.to_string());
    let mut meta = Vec::new();
    match mtype {
        "BPE" => {
            if !tj.get("normalizer").is_none_or(Value::is_null) {
                return Err(model_err(
                    &path,
                    "a normalizer on a byte-level BPE tokenizer: not read by lockstep",
                ));
            }
            let mut regexes = Vec::new();
            pre_regexes(
                tj.get("pre_tokenizer").unwrap_or(&Value::Null),
                &path,
                &mut regexes,
            )?;
            let clean = tc
                .get("clean_up_tokenization_spaces")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let pre = bpe::pre_name(&regexes, clean)
                .or_else(|| bpe::pre_name(&regexes, !clean))
                .ok_or_else(|| {
                    Error::Unsupported(format!(
                        "{}: pre-tokenizer regexes {regexes:?} are none of llama.cpp's that lockstep implements",
                        path.display()
                    ))
                })?;
            let merges: Vec<MetaValue> = model
                .get("merges")
                .and_then(Value::as_array)
                .ok_or_else(|| model_err(&path, "model.merges is not a list"))?
                .iter()
                .map(|m| match (m.as_str(), m.as_array()) {
                    (Some(x), _) => Ok(s(x)),
                    (_, Some(p)) if p.len() == 2 && p.iter().all(Value::is_string) => {
                        Ok(s(&format!(
                            "{} {}",
                            p[0].as_str().unwrap_or(""),
                            p[1].as_str().unwrap_or("")
                        )))
                    }
                    _ => Err(model_err(&path, format!("merge {m} is not two parts"))),
                })
                .collect::<Result<_>>()?;
            meta.push(("tokenizer.ggml.model".into(), s("gpt2")));
            meta.push(("tokenizer.ggml.pre".into(), s(pre)));
            meta.push((
                "tokenizer.ggml.tokens".into(),
                MetaValue::Array(hf_tokens.iter().map(|t| s(t)).collect()),
            ));
            meta.push((
                "tokenizer.ggml.token_type".into(),
                MetaValue::Array(types.iter().map(|&t| MetaValue::I32(t)).collect()),
            ));
            meta.push(("tokenizer.ggml.merges".into(), MetaValue::Array(merges)));
            for (k, h) in [("bos_token_id", "bos_token"), ("eos_token_id", "eos_token")] {
                if let Some(id) = named(h)?.or(cfg_id(k)) {
                    meta.push((format!("tokenizer.ggml.{k}"), MetaValue::U32(id)));
                }
            }
            for k in ["add_bos_token", "add_eos_token"] {
                if let Some(b) = tc.get(k).and_then(Value::as_bool) {
                    meta.push((format!("tokenizer.ggml.{k}"), MetaValue::Bool(b)));
                }
            }
        }
        "WordPiece" => {
            let prefix = model
                .get("continuing_subword_prefix")
                .and_then(Value::as_str)
                .unwrap_or("##");
            let tokens: Vec<String> = hf_tokens
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    if types[i] == 3 || added_special.contains(&i) {
                        t.clone()
                    } else if let Some(c) = t.strip_prefix(prefix) {
                        c.to_string()
                    } else {
                        format!("\u{2581}{t}")
                    }
                })
                .collect();
            let unk = model
                .get("unk_token")
                .and_then(Value::as_str)
                .and_then(id_of);
            let mut types = types.clone();
            if let Some(u) = unk {
                types[u as usize] = 2;
            }
            let lower = get_path(&tj, "normalizer.lowercase")
                .and_then(Value::as_bool)
                .unwrap_or(true);
            meta.push(("tokenizer.ggml.model".into(), s("bert")));
            meta.push(("tokenizer.ggml.pre".into(), s("default")));
            meta.push((
                "tokenizer.ggml.tokens".into(),
                MetaValue::Array(tokens.iter().map(|t| s(t)).collect()),
            ));
            meta.push((
                "tokenizer.ggml.token_type".into(),
                MetaValue::Array(types.iter().map(|&t| MetaValue::I32(t)).collect()),
            ));
            if !lower {
                meta.push((
                    "tokenizer.ggml.normalizer.lowercase".into(),
                    MetaValue::Bool(false),
                ));
            }
            let cls = named("cls_token")?.or(id_of("[CLS]"));
            for (k, id) in [
                ("bos_token_id", cls),
                ("unknown_token_id", unk),
                ("seperator_token_id", named("sep_token")?.or(id_of("[SEP]"))),
                ("padding_token_id", named("pad_token")?.or(id_of("[PAD]"))),
                ("cls_token_id", cls),
                ("mask_token_id", named("mask_token")?.or(id_of("[MASK]"))),
            ] {
                if let Some(id) = id {
                    meta.push((format!("tokenizer.ggml.{k}"), MetaValue::U32(id)));
                }
            }
        }
        other => {
            return Err(Error::Unsupported(format!(
                "{}: model.type {other:?}: lockstep reads BPE and WordPiece tokenizers",
                path.display()
            )))
        }
    }
    let _ = l;
    Ok(meta)
}
