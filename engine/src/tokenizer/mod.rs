//! Tokenizer built from GGUF metadata, reproducing llama.cpp's `llama_tokenize(text, add_special,
//! parse_special)` and `llama_detokenize` (src/llama-vocab.cpp, `llama_vocab::impl::tokenize` /
//! `detokenize`) token for token.
//!
//! Supported vocabularies:
//! - `tokenizer.ggml.model = "gpt2"`: byte-level BPE on the `tokenizers` crate, with the pre-tokenizer
//!   regexes llama.cpp uses for `tokenizer.ggml.pre` (SmolLM2: `smollm`, Qwen2.5: `qwen2`, ...); see [`bpe`].
//! - `tokenizer.ggml.model = "llama"`: SentencePiece-style vocabularies with scores and `<0xXX>` byte tokens
//!   (Gemma 3, LLaMA 2, ...), llama.cpp's `llm_tokenizer_spm` bigram algorithm; see [`spm`].
//! - `tokenizer.ggml.model = "bert"`: WordPiece in the converter's phantom-space form (BERT), llama.cpp's
//!   `llm_tokenizer_wpm_session`, for ASCII text; see [`wpm`]. With `add_special` it adds the CLS token
//!   (`tokenizer.ggml.bos_token_id`) before and the SEP token (`tokenizer.ggml.seperator_token_id`) after.
//!
//! Encoding (`llama_vocab::impl::tokenize`):
//! 1. the text is partitioned on the exact strings of the special tokens, longest first
//!    (`tokenizer_st_partition`). CONTROL and UNKNOWN tokens take part only with `parse_special`;
//!    USER_DEFINED tokens always do (as in HF `tokenizers`' added vocabulary);
//! 2. each text fragment is tokenized: BPE pre-tokenizes it with the model's regexes and merges by rank; SPM
//!    escapes spaces as U+2581 (`▁`), prefixing a space when `tokenizer.ggml.add_space_prefix` says so and the
//!    fragment is the first or follows a special token, then merges bigrams by score;
//! 3. with `add_special`, BOS / EOS are added as `tokenizer.ggml.add_bos_token` / `add_eos_token` say (with
//!    llama.cpp's defaults when the keys are absent: SPM adds BOS, BPE adds nothing).
//!
//! Decoding mirrors `llama_detokenize(.., remove_special = false, unparse_special = false)`: CONTROL and
//! UNKNOWN tokens produce nothing, USER_DEFINED tokens their text, byte tokens their byte, normal tokens their
//! text with `▁` → space (SPM) or through GPT-2's byte↔unicode table (BPE).

pub(crate) mod bpe;
pub(crate) use bpe::bytes_to_unicode;
mod spm;
mod wpm;

use std::collections::HashMap;

use crate::gguf::GgufFile;
use crate::{Error, Result};

// llama.cpp's token attributes (include/llama.h, `enum llama_token_attr`).
const ATTR_UNKNOWN: u32 = 1 << 0;
const ATTR_UNUSED: u32 = 1 << 1;
const ATTR_NORMAL: u32 = 1 << 2;
const ATTR_CONTROL: u32 = 1 << 3;
const ATTR_USER_DEFINED: u32 = 1 << 4;
const ATTR_BYTE: u32 = 1 << 5;

/// GGUF `tokenizer.ggml.token_type` (llama.cpp `enum llama_token_type`) → attribute, as
/// `llama_vocab::impl::load` converts it.
fn attr_of_type(t: i32) -> u32 {
    match t {
        1 => ATTR_NORMAL,
        2 => ATTR_UNKNOWN,
        3 => ATTR_CONTROL,
        4 => ATTR_USER_DEFINED,
        5 => ATTR_UNUSED,
        6 => ATTR_BYTE,
        _ => 0, // LLAMA_TOKEN_TYPE_UNDEFINED and unknown values: LLAMA_TOKEN_ATTR_UNDEFINED
    }
}

/// Token texts llama.cpp treats as end-of-generation (`llama_vocab::impl::load`, the `special_eog_ids`
/// heuristics); they are also forced to CONTROL there.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Fill-in-the-middle tokens llama.cpp detects by text when the GGUF has no id for them (metadata key,
/// candidate texts); a detected token is forced to CONTROL, and FIM pad / repo / sep end generation.
const FIM_TEXTS: &[(&[&str], &[&str], bool)] = &[
    (
        &[
            "tokenizer.ggml.fim_pre_token_id",
            "tokenizer.ggml.prefix_token_id",
        ],
        &[
            "<|fim_prefix|>",
            "<fim-prefix>",
            "<fim_prefix>",
            "<｜fim▁begin｜>",
            "<PRE>",
            "▁<PRE>",
            "<|code_prefix|>",
            "<|prefix|>",
        ],
        false,
    ),
    (
        &[
            "tokenizer.ggml.fim_suf_token_id",
            "tokenizer.ggml.suffix_token_id",
        ],
        &[
            "<|fim_suffix|>",
            "<fim-suffix>",
            "<fim_suffix>",
            "<｜fim▁hole｜>",
            "<SUF>",
            "▁<SUF>",
            "<|code_suffix|>",
            "<|suffix|>",
        ],
        false,
    ),
    (
        &[
            "tokenizer.ggml.fim_mid_token_id",
            "tokenizer.ggml.middle_token_id",
        ],
        &[
            "<|fim_middle|>",
            "<fim-middle>",
            "<fim_middle>",
            "<｜fim▁end｜>",
            "<MID>",
            "▁<MID>",
            "<|code_middle|>",
            "<|middle|>",
        ],
        false,
    ),
    (
        &["tokenizer.ggml.fim_pad_token_id"],
        &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
        true,
    ),
    (
        &["tokenizer.ggml.fim_rep_token_id"],
        &[
            "<|fim_repo|>",
            "<|repo_name|>",
            "<fim-repo>",
            "<REPO>",
            "<reponame>",
        ],
        true,
    ),
    (
        &["tokenizer.ggml.fim_sep_token_id"],
        &["<|file_sep|>"],
        true,
    ),
];

/// The vocabulary-type specific part.
enum Model {
    /// Byte-level BPE (`LLAMA_VOCAB_TYPE_BPE`).
    Bpe {
        inner: Box<tokenizers::Tokenizer>,
        /// The id `inner` gives a character the vocabulary has no token for (see [`bpe::build`]).
        missing: u32,
        unicode_to_byte: HashMap<char, u8>,
        /// llama.cpp `clean_spaces` for this pre-tokenizer (applied by [`Tokenizer::decode`]).
        clean_spaces: bool,
    },
    /// SentencePiece-style (`LLAMA_VOCAB_TYPE_SPM`).
    Spm(spm::SpmVocab),
    /// WordPiece (`LLAMA_VOCAB_TYPE_WPM`), with the separator token appended by `add_special`.
    Wpm {
        vocab: wpm::WpmVocab,
        sep: Option<u32>,
    },
}

/// A tokenizer for one model file: encode text to token ids and decode ids to text.
pub struct Tokenizer {
    model: Model,
    /// Token text as stored in the GGUF (llama.cpp replaces an empty text by `[EMPTY_<id>]`), indexed by id.
    tokens: Vec<String>,
    /// llama.cpp token attributes (`LLAMA_TOKEN_ATTR_*` bits) per id, after its by-text overrides.
    attrs: Vec<u32>,
    /// CONTROL / USER_DEFINED / UNKNOWN tokens sorted by text length, longest first (the partition order,
    /// llama.cpp `cache_special_tokens`).
    specials: Vec<(String, u32)>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    /// `tokenizer.ggml.add_space_prefix` (llama.cpp default: true for SPM, false for BPE).
    add_space_prefix: bool,
    eog: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field(
                "model",
                &match self.model {
                    Model::Bpe { .. } => "bpe",
                    Model::Spm(_) => "spm",
                    Model::Wpm { .. } => "wpm",
                },
            )
            .field("vocab", &self.tokens.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .field("add_space_prefix", &self.add_space_prefix)
            .finish()
    }
}

impl Tokenizer {
    /// Build the tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata, as llama.cpp's
    /// `llama_vocab::impl::load` does (defaults, attribute overrides by token text, special-token cache).
    ///
    /// Errors: a missing or mistyped key (named), an unsupported `tokenizer.ggml.model` or
    /// `tokenizer.ggml.pre`, malformed merges, a BOS / EOS id outside the vocabulary.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Tokenizer> {
        let path = || gguf.path().to_path_buf();
        let model_name = gguf.get_str("tokenizer.ggml.model")?;
        let (is_spm, is_wpm) = match model_name {
            "gpt2" => (false, false),
            "llama" => (true, false),
            "bert" => (false, true),
            other => {
                return Err(Error::Unsupported(format!(
                    "{}: tokenizer.ggml.model = {other:?} is not supported yet (supported: \"gpt2\" byte-level \
                     BPE, \"llama\" SentencePiece, \"bert\" WordPiece)",
                    gguf.path().display()
                )))
            }
        };
        let tokens: Vec<String> = gguf
            .get_str_array("tokenizer.ggml.tokens")?
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                if t.is_empty() {
                    format!("[EMPTY_{i}]")
                } else {
                    t.to_string()
                }
            })
            .collect();
        let n_vocab = tokens.len();
        let mut attrs: Vec<u32> = match gguf.get("tokenizer.ggml.token_type") {
            Some(_) => gguf
                .get_i32_array("tokenizer.ggml.token_type")?
                .into_iter()
                .map(attr_of_type)
                .collect(),
            None => vec![ATTR_NORMAL; n_vocab],
        };
        if attrs.len() != n_vocab {
            return Err(Error::Model {
                path: path(),
                what: format!(
                    "tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens has {n_vocab}",
                    attrs.len()
                ),
            });
        }

        let opt_u32 = |key: &str| -> Result<Option<u32>> {
            match gguf.get(key) {
                Some(_) => gguf.get_u32(key).map(Some),
                None => Ok(None),
            }
        };
        let opt_bool = |key: &str| -> Result<Option<bool>> {
            match gguf.get(key) {
                Some(_) => gguf.get_bool(key).map(Some),
                None => Ok(None),
            }
        };

        // llama.cpp's per-type defaults (`llama_vocab::impl::load`); a default id outside the vocabulary is
        // disabled.
        // WPM: bos 101 ([CLS]), no eos, add_bos (llama.cpp's WPM path adds BOS with add_special anyway)
        let (default_bos, default_eos, mut add_bos, mut add_space_prefix) = if is_spm {
            (1, 2, true, true)
        } else if is_wpm {
            (101, u32::MAX, true, false)
        } else {
            (11, 11, false, false)
        };
        let in_vocab = |id: u32| (id as usize) < n_vocab;
        let mut bos = Some(default_bos).filter(|&id| in_vocab(id));
        let mut eos = Some(default_eos).filter(|&id| in_vocab(id));
        for (key, slot) in [
            ("tokenizer.ggml.bos_token_id", &mut bos),
            ("tokenizer.ggml.eos_token_id", &mut eos),
        ] {
            if let Some(id) = opt_u32(key)? {
                if !in_vocab(id) {
                    return Err(Error::Model {
                        path: path(),
                        what: format!("{key} = {id} is outside the vocabulary ({n_vocab})"),
                    });
                }
                *slot = Some(id);
            }
        }
        let mut add_eos = false;
        if let Some(b) = opt_bool("tokenizer.ggml.add_bos_token")? {
            add_bos = b;
        }
        if let Some(b) = opt_bool("tokenizer.ggml.add_eos_token")? {
            add_eos = b;
        }
        if let Some(b) = opt_bool("tokenizer.ggml.add_space_prefix")? {
            add_space_prefix = b;
        }

        // End-of-generation tokens and llama.cpp's by-text attribute overrides.
        let first_with_text = |texts: &[&str]| -> Option<u32> {
            // llama.cpp walks an unordered_map and takes the first hit; with several candidates present the
            // order is unspecified, so take the lowest id.
            (0..n_vocab)
                .find(|&i| texts.contains(&tokens[i].as_str()))
                .map(|i| i as u32)
        };
        let mut eog: Vec<u32> = Vec::new();
        for (keys, texts, ends_generation) in FIM_TEXTS {
            let mut id = None;
            for key in *keys {
                // llama.cpp keeps the previous value when a key's id is outside the vocabulary.
                if let Some(v) = opt_u32(key)?.filter(|&v| in_vocab(v)) {
                    id = Some(v);
                }
            }
            if id.is_none() {
                id = first_with_text(texts);
                if let Some(i) = id {
                    attrs[i as usize] |= ATTR_CONTROL;
                }
            }
            if let (Some(i), true) = (id, *ends_generation) {
                eog.push(i);
            }
        }
        for (i, t) in tokens.iter().enumerate() {
            if EOG_TEXTS.contains(&t.as_str()) {
                attrs[i] |= ATTR_CONTROL;
                eog.push(i as u32);
            }
            // gpt-oss: always rendered.
            if matches!(
                t.as_str(),
                "<|channel|>" | "<|message|>" | "<|start|>" | "<|constrain|>"
            ) {
                attrs[i] = ATTR_USER_DEFINED;
            }
        }
        for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            if let Some(id) = opt_u32(key)?.filter(|&id| in_vocab(id)) {
                eog.push(id);
            }
        }
        eog.extend(eos);
        eog.sort_unstable();
        eog.dedup();

        // `cache_special_tokens`: sorted by text length, longest first. llama.cpp's std::sort leaves the order
        // of equal lengths unspecified; ids ascending here (it only matters for overlapping equal-length
        // special texts).
        let mut specials: Vec<(String, u32)> = (0..n_vocab)
            .filter(|&i| attrs[i] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN) != 0)
            .map(|i| (tokens[i].clone(), i as u32))
            .collect();
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));

        let model = if is_wpm {
            // llama.cpp's WPM defaults: unk 100, sep 102, unless the file says otherwise
            let mut ids = [
                Some(100u32).filter(|&i| in_vocab(i)),
                Some(102).filter(|&i| in_vocab(i)),
            ];
            for (key, slot) in [
                ("tokenizer.ggml.unknown_token_id", 0),
                ("tokenizer.ggml.seperator_token_id", 1),
            ] {
                if let Some(id) = opt_u32(key)? {
                    if !in_vocab(id) {
                        return Err(Error::Model {
                            path: path(),
                            what: format!("{key} = {id} is outside the vocabulary ({n_vocab})"),
                        });
                    }
                    ids[slot] = Some(id);
                }
            }
            Model::Wpm {
                vocab: wpm::WpmVocab {
                    token_to_id: tokens
                        .iter()
                        .enumerate()
                        .map(|(i, t)| (t.clone(), i as u32))
                        .collect(),
                    max_token_len: tokens.iter().map(String::len).max().unwrap_or(0),
                    unk: ids[0],
                    lowercase: opt_bool("tokenizer.ggml.normalizer.lowercase")?.unwrap_or(true),
                },
                sep: ids[1],
            }
        } else if is_spm {
            let scores = match gguf.get("tokenizer.ggml.scores") {
                None => vec![0.0; n_vocab],
                Some(_) => match gguf.get_f32_array("tokenizer.ggml.scores") {
                    Ok(s) => s,
                    Err(_) => gguf
                        .get_i32_array("tokenizer.ggml.scores")?
                        .into_iter()
                        .map(|s| s as f32)
                        .collect(),
                },
            };
            if scores.len() < n_vocab {
                return Err(Error::Model {
                    path: path(),
                    what: format!(
                        "tokenizer.ggml.scores has {} entries but tokenizer.ggml.tokens has {n_vocab}",
                        scores.len()
                    ),
                });
            }
            let token_to_id = tokens
                .iter()
                .enumerate()
                .map(|(i, t)| (t.clone(), i as u32))
                .collect();
            Model::Spm(spm::SpmVocab {
                token_to_id,
                scores,
            })
        } else {
            let pre = match gguf.get("tokenizer.ggml.pre") {
                Some(_) => Some(gguf.get_str("tokenizer.ggml.pre")?),
                None => None,
            };
            let pre = bpe::pre_tokenizer(pre).map_err(|e| match e {
                Error::Unsupported(m) => {
                    Error::Unsupported(format!("{}: {m}", gguf.path().display()))
                }
                e => e,
            })?;
            let merges_raw = gguf.get_str_array("tokenizer.ggml.merges")?;
            let mut merges = Vec::with_capacity(merges_raw.len());
            for (i, m) in merges_raw.iter().enumerate() {
                merges.push(bpe::split_merge(m).ok_or_else(|| Error::Model {
                    path: path(),
                    what: format!(
                        "tokenizer.ggml.merges[{i}] = {m:?} is not two space-separated parts"
                    ),
                })?);
            }
            let (inner, missing) = bpe::build(&tokens, merges, &pre)
                .map_err(|e| Error::Tokenizer(format!("{}: {e}", gguf.path().display())))?;
            Model::Bpe {
                inner: Box::new(inner),
                missing,
                unicode_to_byte: bpe::bytes_to_unicode()
                    .into_iter()
                    .map(|(b, c)| (c, b))
                    .collect(),
                clean_spaces: pre.clean_spaces,
            }
        };

        Ok(Tokenizer {
            model,
            tokens,
            attrs,
            specials,
            bos,
            eos,
            add_bos,
            add_eos,
            add_space_prefix,
            eog,
        })
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The beginning-of-sequence token id, if the model has one (llama.cpp `llama_vocab_bos`).
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence token id, if the model has one (llama.cpp `llama_vocab_eos`).
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS (llama.cpp `llama_vocab_get_add_bos`:
    /// GGUF `tokenizer.ggml.add_bos_token`, default true for SPM and false for BPE).
    pub fn adds_bos(&self) -> bool {
        self.add_bos
    }

    /// True for tokens that end generation (llama.cpp `llama_vocab_is_eog`: EOS, EOT, EOM, FIM pad / repo /
    /// sep and the end-of-turn texts it recognises).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// Encode text to token ids as llama.cpp's `llama_tokenize(vocab, text, add_special, parse_special)`
    /// (`llama_vocab::impl::tokenize`) does.
    ///
    /// Errors: BOS / EOS requested but the model has none; an SPM byte fallback needing a `<0xXX>` token the
    /// vocabulary lacks; a BPE failure inside the `tokenizers` crate (should not happen for byte-level BPE).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let frags = if text.is_empty() {
            Vec::new()
        } else {
            self.partition(text, parse_special)
        };
        let mut ids = Vec::new();
        let special = |id: Option<u32>, what: &str| {
            id.ok_or_else(|| {
                Error::Tokenizer(format!("the model asks for {what} but has no {what} token"))
            })
        };
        // llama.cpp's WPM path adds BOS (the CLS token) with add_special whatever add_bos says
        let wpm = matches!(self.model, Model::Wpm { .. });
        if add_special && (self.add_bos || wpm) {
            ids.push(special(self.bos, "BOS")?);
        }
        match &self.model {
            Model::Spm(vocab) => {
                // Prefix a space to the first fragment and to every fragment after a special token.
                let mut is_prev_special = true;
                for f in frags {
                    match f {
                        Fragment::Text(t) => {
                            let mut s = String::with_capacity(t.len() + 1);
                            if self.add_space_prefix && is_prev_special {
                                s.push(' ');
                            }
                            s.push_str(t);
                            // llama_escape_whitespace
                            let s = s.replace(' ', "\u{2581}");
                            spm::tokenize(vocab, &s, &mut ids)?;
                            is_prev_special = false;
                        }
                        Fragment::Special(id) => {
                            ids.push(id);
                            is_prev_special = true;
                        }
                    }
                }
            }
            Model::Wpm { vocab, sep } => {
                for f in frags {
                    match f {
                        Fragment::Text(t) => wpm::tokenize(vocab, t, &mut ids)?,
                        Fragment::Special(id) => ids.push(id),
                    }
                }
                if add_special {
                    ids.push(special(*sep, "SEP")?);
                }
            }
            Model::Bpe { inner, missing, .. } => {
                for f in frags {
                    match f {
                        Fragment::Text(t) => {
                            let enc = inner
                                .encode(t, false)
                                .map_err(|e| Error::Tokenizer(format!("encoding {t:?}: {e}")))?;
                            // A character without a token produces nothing, as in llama.cpp.
                            ids.extend(enc.get_ids().iter().filter(|&id| id != missing));
                        }
                        Fragment::Special(id) => ids.push(id),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            ids.push(special(self.eos, "EOS")?);
        }
        Ok(ids)
    }

    /// Split `text` on special-token strings, longest first (llama.cpp `tokenizer_st_partition`). Never yields
    /// an empty text fragment.
    fn partition<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        let mut frags = vec![Fragment::Text(text)];
        for (special, id) in &self.specials {
            // Without parse_special only USER_DEFINED tokens are matched.
            if !parse_special && self.attrs[*id as usize] & (ATTR_CONTROL | ATTR_UNKNOWN) != 0 {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len());
            for f in frags {
                match f {
                    Fragment::Text(t) => {
                        let mut rest = t;
                        while let Some(at) = rest.find(special.as_str()) {
                            if at > 0 {
                                next.push(Fragment::Text(&rest[..at]));
                            }
                            next.push(Fragment::Special(*id));
                            rest = &rest[at + special.len()..];
                        }
                        if !rest.is_empty() {
                            next.push(Fragment::Text(rest));
                        }
                    }
                    s => next.push(s),
                }
            }
            frags = next;
        }
        frags
    }

    /// llama.cpp `llama_vocab::impl::token_to_piece(token, .., lstrip = 0, special)`: the bytes one token
    /// decodes to. With `special = false`, CONTROL and UNKNOWN tokens give nothing.
    fn piece(&self, id: u32, special: bool) -> Vec<u8> {
        let (Some(text), Some(&attr)) = (self.tokens.get(id as usize), self.attrs.get(id as usize))
        else {
            return Vec::new();
        };
        if !special && attr & (ATTR_UNKNOWN | ATTR_CONTROL) != 0 {
            return Vec::new();
        }
        if attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED) != 0 {
            return text.as_bytes().to_vec();
        }
        if attr & ATTR_NORMAL != 0 {
            return match &self.model {
                // llama_unescape_whitespace
                Model::Spm(_) | Model::Wpm { .. } => text.replace('\u{2581}', " ").into_bytes(),
                Model::Bpe {
                    unicode_to_byte, ..
                } => {
                    let mut out = Vec::with_capacity(text.len());
                    bpe::decode_text(text, unicode_to_byte, &mut out);
                    out
                }
            };
        }
        if attr & ATTR_BYTE != 0 {
            // token_to_byte: the hex digits of "<0xXX>" (strtol: 0 when unparsable)
            let byte = text
                .get(3..5)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .unwrap_or(0);
            return vec![byte];
        }
        Vec::new()
    }

    /// The raw bytes a token stands for (llama.cpp `llama_token_to_piece(.., special = true)`): control
    /// tokens give their text, byte tokens their byte; unknown ids give nothing.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.piece(id, true)
    }

    /// Decode token ids to text as llama.cpp's `llama_detokenize(vocab, ids, remove_special = false,
    /// unparse_special = false)`: control tokens are skipped, one leading space of the first token is dropped
    /// when the vocabulary adds a space prefix, and `clean_spaces` vocabularies get llama.cpp's
    /// clean-up. Invalid UTF-8 becomes U+FFFD (see [`Tokenizer::decode_bytes`] for the exact bytes).
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids)).into_owned()
    }

    /// The bytes llama.cpp's `llama_detokenize(vocab, ids, remove_special = false, unparse_special = false)`
    /// writes, which need not be UTF-8 (a byte token alone, or a character whose bytes the vocabulary lacks).
    pub fn decode_bytes(&self, ids: &[u32]) -> Vec<u8> {
        let mut bytes = Vec::new();
        let mut remove_space = self.add_space_prefix;
        for &id in ids {
            let p = self.piece(id, false);
            let p = match (remove_space, p.first()) {
                (true, Some(b' ')) => &p[1..],
                _ => &p[..],
            };
            remove_space = false;
            bytes.extend_from_slice(p);
        }
        if let Model::Bpe {
            clean_spaces: true, ..
        } = self.model
        {
            bpe::clean_spaces(&mut bytes);
        }
        bytes
    }

    /// The token's text as stored in the GGUF vocabulary (byte-level or `▁` form), for diagnostics.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }
}

enum Fragment<'t> {
    Text(&'t str),
    Special(u32),
}

/// Streams decoded text token by token, holding back bytes until they form complete UTF-8. Each token
/// contributes llama.cpp's `llama_token_to_piece(.., special = false)`.
#[derive(Debug, Default)]
pub struct TextStream {
    pending: Vec<u8>,
}

impl TextStream {
    /// Feed one token; returns the text that became complete (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.pending.extend(tok.piece(id, false));
        match std::str::from_utf8(&self.pending) {
            Ok(s) => {
                let out = s.to_string();
                self.pending.clear();
                out
            }
            Err(e) if e.error_len().is_none() => {
                // Incomplete sequence at the end: emit the valid prefix, keep the tail.
                let valid = e.valid_up_to();
                let out = String::from_utf8_lossy(&self.pending[..valid]).into_owned();
                self.pending.drain(..valid);
                out
            }
            Err(_) => {
                let out = String::from_utf8_lossy(&self.pending).into_owned();
                self.pending.clear();
                out
            }
        }
    }

    /// Flush whatever is left (invalid bytes become U+FFFD).
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{GgufWriter, MetaValue};

    fn s(x: &str) -> MetaValue {
        MetaValue::String(x.to_string())
    }

    /// A GGUF holding only tokenizer metadata: `(text, token type, score)` per token plus extra keys.
    fn tokenizer(
        model: &str,
        vocab: &[(String, i32, f32)],
        extra: Vec<(&str, MetaValue)>,
    ) -> Tokenizer {
        let mut w = GgufWriter::new();
        w.add_metadata("tokenizer.ggml.model", s(model));
        w.add_metadata(
            "tokenizer.ggml.tokens",
            MetaValue::Array(vocab.iter().map(|t| s(&t.0)).collect()),
        );
        w.add_metadata(
            "tokenizer.ggml.token_type",
            MetaValue::Array(vocab.iter().map(|t| MetaValue::I32(t.1)).collect()),
        );
        w.add_metadata(
            "tokenizer.ggml.scores",
            MetaValue::Array(vocab.iter().map(|t| MetaValue::F32(t.2)).collect()),
        );
        for (k, v) in extra {
            w.add_metadata(k, v);
        }
        let g = GgufFile::from_bytes(w.to_bytes(), "tokenizer-test").unwrap();
        Tokenizer::from_gguf(&g).unwrap()
    }

    /// `<unk>`, `<s>`, `</s>`, the 256 byte tokens, then a few pieces, a control and a user-defined token.
    fn spm_vocab() -> Vec<(String, i32, f32)> {
        let mut v = vec![
            ("<unk>".to_string(), 2, 0.0),
            ("<s>".to_string(), 3, 0.0),
            ("</s>".to_string(), 3, 0.0),
        ];
        v.extend((0..=255u8).map(|b| (format!("<0x{b:02X}>"), 6, 0.0)));
        for (t, ty, score) in [
            ("\u{2581}", 1, -1.0),
            ("a", 1, -1.0),
            ("b", 1, -1.0),
            ("\u{2581}a", 1, -0.5),
            ("<ctl>", 3, 0.0),
            ("\t\t", 4, 0.0),
        ] {
            v.push((t.to_string(), ty, score));
        }
        v
    }

    #[test]
    fn spm_space_prefix_partition_and_decode_follow_llama_cpp() {
        let tok = tokenizer("llama", &spm_vocab(), vec![]);
        let id = |t: &str| tok.tokens.iter().position(|x| x == t).unwrap() as u32;
        let (sp, a, b, spa) = (id("\u{2581}"), id("a"), id("b"), id("\u{2581}a"));
        // SPM defaults: BOS 1 added, EOS 2, a space prefix.
        assert!(tok.adds_bos());
        assert_eq!(tok.encode("a", true, false).unwrap(), vec![1, spa]);
        assert_eq!(tok.encode("", true, false).unwrap(), vec![1]);
        assert!(tok.encode("", false, false).unwrap().is_empty());
        // A control token splits the text only with parse_special; the next fragment gets a space prefix.
        let ctl = id("<ctl>");
        assert_eq!(
            tok.encode("a<ctl>b", false, true).unwrap(),
            vec![spa, ctl, sp, b]
        );
        let plain = tok.encode("a<ctl>b", false, false).unwrap();
        assert_eq!(plain[1], id("<0x3C>"), "{plain:?}");
        // A user-defined token always splits.
        let tabs = id("\t\t");
        assert_eq!(
            tok.encode("a\t\tb", false, false).unwrap(),
            vec![spa, tabs, sp, b]
        );
        // Decoding: the first token loses its leading space; control tokens vanish, user-defined ones do not.
        assert_eq!(tok.decode(&[spa, sp, b]), "a b");
        assert_eq!(tok.decode(&[1, spa, ctl, tabs, b]), " a\t\tb");
        assert_eq!(tok.decode(&[id("<0xC3>"), id("<0xA9>")]), "é");
        assert_eq!(tok.token_bytes(ctl), b"<ctl>");
        // </s> is end-of-generation; "a" decodes without the prefix when not first.
        assert!(tok.is_eog(2));
        assert_eq!(tok.decode(&[b, a]), "ba");

        let tok = tokenizer(
            "llama",
            &spm_vocab(),
            vec![
                ("tokenizer.ggml.add_space_prefix", MetaValue::Bool(false)),
                ("tokenizer.ggml.add_bos_token", MetaValue::Bool(false)),
            ],
        );
        assert_eq!(tok.encode("a b", true, false).unwrap(), vec![a, sp, b]);
        assert_eq!(tok.decode(&[sp, a]), " a");
    }

    #[test]
    fn bpe_character_without_token_keeps_neighbours_apart() {
        // Every GPT-2 byte character except the one of 0x04, plus "!!".
        let mut vocab: Vec<(String, i32, f32)> = bpe::bytes_to_unicode()
            .into_iter()
            .filter(|&(b, _)| b != 4)
            .map(|(_, c)| (c.to_string(), 1, 0.0))
            .collect();
        vocab.push(("!!".to_string(), 1, 0.0));
        let tok = tokenizer(
            "gpt2",
            &vocab,
            vec![
                ("tokenizer.ggml.pre", s("qwen2")),
                ("tokenizer.ggml.merges", MetaValue::Array(vec![s("! !")])),
            ],
        );
        let bang = vocab.iter().position(|t| t.0 == "!").unwrap() as u32;
        let bangs = vocab.len() as u32 - 1;
        assert_eq!(tok.encode("!!", true, false).unwrap(), vec![bangs]);
        // llama.cpp: the 0x04 symbol blocks the merge and produces no token.
        assert_eq!(
            tok.encode("!\u{4}!", true, false).unwrap(),
            vec![bang, bang]
        );
        // BPE default: no BOS without tokenizer.ggml.add_bos_token.
        assert!(!tok.adds_bos());
    }

    #[test]
    fn unsupported_vocabularies_are_named() {
        let mut w = GgufWriter::new();
        w.add_metadata("tokenizer.ggml.model", s("rwkv"));
        let g = GgufFile::from_bytes(w.to_bytes(), "t").unwrap();
        let e = Tokenizer::from_gguf(&g).unwrap_err().to_string();
        assert!(e.contains("\"rwkv\""), "{e}");
        assert!(bpe::pre_tokenizer(Some("llama3")).is_err());
        assert!(bpe::pre_tokenizer(Some("qwen2")).is_ok());
        assert!(bpe::pre_tokenizer(None).is_ok());
    }
}
