//! GGUF → Hugging Face: the direction of `lockstep export-hf`, by the same [`super::layout`] tables the
//! loader ([`super::open_dir`]) reads. F32, F16 and BF16 tensors keep their type and bytes (transformed
//! where the layouts differ); a quantized tensor is dequantized to F32 as the engine reads it
//! ([`crate::quant::dequantize_row`]).

use serde_json::{json, Value};

use super::layout::{self, Cfg, Heads, Transform};
use super::{full_key, permute_rows, set_path, transpose};
use crate::gguf::GgufFile;
use crate::quant::GgmlType;
use crate::{Error, Result};

/// One tensor of the HF copy.
#[derive(Clone, Debug, PartialEq)]
pub struct HfTensor {
    /// HF name (`model.layers.0.self_attn.q_proj.weight`).
    pub name: String,
    /// `F32`, `F16` or `BF16`.
    pub dtype: safetensors::Dtype,
    /// HF shape (`[out, in]` for a linear weight).
    pub shape: Vec<usize>,
    /// Little-endian bytes.
    pub data: Vec<u8>,
}

/// The HF copy of a GGUF model, in memory.
#[derive(Clone, Debug)]
pub struct HfExport {
    /// The architecture's layout.
    pub layout: &'static layout::ArchLayout,
    /// `config.json`.
    pub config: Value,
    /// The tensors, in GGUF file order.
    pub tensors: Vec<HfTensor>,
    /// `tokenizer.json`.
    pub tokenizer: Value,
    /// `tokenizer_config.json`.
    pub tokenizer_config: Value,
}

fn err(g: &GgufFile, what: String) -> Error {
    Error::Model {
        path: g.path().to_path_buf(),
        what,
    }
}

/// The head width of a GGUF model: `attention.key_length`, else `embedding_length / head_count`.
fn head_dim(g: &GgufFile, a: &str) -> Result<u32> {
    match g.get(&format!("{a}.attention.key_length")) {
        Some(_) => g.get_u32(&format!("{a}.attention.key_length")),
        None => {
            let d = g.get_u32(&format!("{a}.embedding_length"))?;
            let h = g.get_u32(&format!("{a}.attention.head_count"))?;
            if h == 0 || d % h != 0 {
                return Err(err(g, format!("{d} wide over {h} heads")));
            }
            Ok(d / h)
        }
    }
}

fn f32_json(x: f32) -> Value {
    json!(x as f64)
}

/// `config.json` of the HF copy, by the layout's [`Cfg`] rules; every `<arch>.*` key of the file must be
/// taken by a rule (a key no rule knows is refused, not dropped).
fn config_of(g: &GgufFile, l: &layout::ArchLayout) -> Result<Value> {
    let a = l.arch;
    let mut c = json!({
        "architectures": [l.hf_class],
        "model_type": l.model_type,
        "torch_dtype": "float32",
    });
    let mut used: Vec<String> = Vec::new();
    let has = |k: &str| g.get(&full_key(a, k)).is_some();
    for r in l.config {
        let mut take = |k: &str| used.push(full_key(a, k));
        match *r {
            Cfg::U32(k, h) => {
                take(k);
                set_path(&mut c, h, json!(g.get_u32(&full_key(a, k))?));
            }
            Cfg::U32Opt(k, h) => {
                take(k);
                if has(k) {
                    set_path(&mut c, h, json!(g.get_u32(&full_key(a, k))?));
                }
            }
            Cfg::U32Or(k, h, d) => {
                take(k);
                let v = if has(k) {
                    g.get_u32(&full_key(a, k))?
                } else {
                    d
                };
                set_path(&mut c, h, json!(v));
            }
            Cfg::F32(k, h) => {
                take(k);
                set_path(&mut c, h, f32_json(g.get_f32(&full_key(a, k))?));
            }
            Cfg::F32Or(k, h, d) => {
                take(k);
                let v = if has(k) {
                    g.get_f32(&full_key(a, k))?
                } else {
                    d
                };
                set_path(&mut c, h, f32_json(v));
            }
            Cfg::Const(h, v) => set_path(
                &mut c,
                h,
                serde_json::from_str(v).expect("layout constants are JSON"),
            ),
            Cfg::MetaBool(k, v) => {
                take(k);
                if has(k) && g.get_bool(&full_key(a, k))? != v {
                    return Err(err(
                        g,
                        format!("{a}.{k} = {}: only {v} has an HF form here", !v),
                    ));
                }
            }
            Cfg::MetaF32(k, v) => {
                take(k);
                if has(k) && g.get_f32(&full_key(a, k))? != v {
                    return Err(err(
                        g,
                        format!(
                            "{a}.{k} = {}: only {v} has an HF form here",
                            g.get_f32(&full_key(a, k))?
                        ),
                    ));
                }
            }
            Cfg::Ignored(k, _) => take(k),
            Cfg::HeadDim(h) => {
                take("attention.key_length");
                take("attention.value_length");
                let hd = head_dim(g, a)?;
                if has("attention.value_length")
                    && g.get_u32(&full_key(a, "attention.value_length"))? != hd
                {
                    return Err(err(g, format!("{a}: key and value widths differ")));
                }
                set_path(&mut c, h, json!(hd));
            }
            Cfg::EqualsHeadDim(h) => set_path(&mut c, h, json!(head_dim(g, a)?)),
            Cfg::RopeDims(factor) => {
                take("rope.dimension_count");
                let hd = head_dim(g, a)?;
                let n = if has("rope.dimension_count") {
                    g.get_u32(&full_key(a, "rope.dimension_count"))?
                } else {
                    hd
                };
                match factor {
                    Some(f) => set_path(&mut c, f, json!(n as f64 / hd as f64)),
                    None if n != hd => {
                        return Err(err(
                            g,
                            format!("{a}.rope.dimension_count {n} != head width {hd}: {} rotates the whole head", l.hf_class),
                        ))
                    }
                    None => {}
                }
            }
            Cfg::SwaPattern(n) => {
                if has("attention.sliding_window_pattern") {
                    return Err(err(g, format!("{a}.attention.sliding_window_pattern: only llama.cpp's default pattern is exported")));
                }
                let n_layer = g.get_u32(&full_key(a, "block_count"))?;
                let types: Vec<&str> = (0..n_layer)
                    .map(|il| {
                        if n == 0 || il % n < n - 1 {
                            "sliding_attention"
                        } else {
                            "full_attention"
                        }
                    })
                    .collect();
                set_path(&mut c, "layer_types", json!(types));
            }
            Cfg::Gemma4 => gemma4_config(g, &mut c, &mut used)?,
        }
    }
    if let Some((k, _)) = g
        .metadata()
        .iter()
        .find(|(k, _)| k.starts_with(&format!("{a}.")) && !used.contains(k))
    {
        return Err(err(
            g,
            format!("metadata key {k} has no place in config.json of a {} (lockstep's {a} layout): refusing a partial copy", l.hf_class),
        ));
    }
    let n_vocab = g.tensor("token_embd.weight")?.n_rows();
    c["vocab_size"] = json!(n_vocab);
    if a != "bert" {
        c["tie_word_embeddings"] = json!(g.tensor("output.weight").is_err());
    }
    for (k, h) in [
        ("tokenizer.ggml.bos_token_id", "bos_token_id"),
        ("tokenizer.ggml.eos_token_id", "eos_token_id"),
        ("tokenizer.ggml.padding_token_id", "pad_token_id"),
    ] {
        if g.get(k).is_some() && c.get(h).is_none() {
            c[h] = json!(g.get_u32(k)?);
        }
    }
    match a {
        "gpt2" => {
            c["n_ctx"] = c["n_positions"].clone();
            for k in [
                "resid_pdrop",
                "embd_pdrop",
                "attn_pdrop",
                "summary_first_dropout",
            ] {
                c[k] = json!(0.0);
            }
        }
        "bert" => {
            c["hidden_dropout_prob"] = json!(0.0);
            c["attention_probs_dropout_prob"] = json!(0.0);
            c["pad_token_id"] = c.get("pad_token_id").cloned().unwrap_or(json!(0));
        }
        "phi3" | "qwen2" | "qwen3" | "llama" | "starcoder2" | "stablelm" => {
            c["attention_dropout"] = json!(0.0);
        }
        _ => {}
    }
    c["lockstep_note"] = json!(
        "written by `lockstep export-hf` from a GGUF: F32/F16/BF16 tensors as stored, quantized ones dequantized to F32 as the engine reads them"
    );
    Ok(c)
}

/// Gemma 4's config from the GGUF: the inverse of [`super::open_dir`]'s `Cfg::Gemma4`.
fn gemma4_config(g: &GgufFile, c: &mut Value, used: &mut Vec<String>) -> Result<()> {
    let a = "gemma4";
    let k = |s: &str| format!("{a}.{s}");
    for s in [
        "attention.key_length",
        "attention.value_length",
        "attention.key_length_swa",
        "attention.value_length_swa",
        "rope.dimension_count",
        "rope.dimension_count_swa",
        "rope.freq_base",
        "rope.freq_base_swa",
        "attention.sliding_window_pattern",
    ] {
        used.push(k(s));
    }
    let hd = g.get_u32(&k("attention.key_length"))?;
    let hd_swa = g.get_u32(&k("attention.key_length_swa"))?;
    for (v, want, what) in [
        ("attention.value_length", hd, "key_length"),
        ("attention.value_length_swa", hd_swa, "key_length_swa"),
        ("rope.dimension_count", hd, "key_length"),
        ("rope.dimension_count_swa", hd_swa, "key_length_swa"),
    ] {
        if g.get(&k(v)).is_some() && g.get_u32(&k(v))? != want {
            return Err(err(
                g,
                format!("{a}.{v} != {what}: transformers' Gemma 4 has no such config"),
            ));
        }
    }
    let pat: Vec<bool> = g
        .get_array(&k("attention.sliding_window_pattern"))?
        .iter()
        .map(|v| v.as_bool() == Some(true))
        .collect();
    let types: Vec<&str> = pat
        .iter()
        .map(|&s| {
            if s {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    c["layer_types"] = json!(types);
    c["head_dim"] = json!(hd_swa);
    let mut plc = serde_json::Map::new();
    for (il, &s) in pat.iter().enumerate() {
        if !s {
            plc.insert(il.to_string(), json!({"head_dim": hd}));
        }
    }
    c["per_layer_config"] = Value::Object(plc);
    // V = K on the full-attention layers that lack attn_v
    let full: Vec<usize> = (0..pat.len()).filter(|&il| !pat[il]).collect();
    let no_v: Vec<bool> = full
        .iter()
        .map(|il| g.tensor(&format!("blk.{il}.attn_v.weight")).is_err())
        .collect();
    if no_v.iter().any(|&x| x != no_v[0]) {
        return Err(err(
            g,
            "attn_v on some full-attention layers only: attention_k_eq_v is one flag".into(),
        ));
    }
    c["attention_k_eq_v"] = json!(no_v.first().copied().unwrap_or(false));
    let base = |s: &str, d: f32| -> Result<f32> {
        if g.get(&k(s)).is_some() {
            g.get_f32(&k(s))
        } else {
            Ok(d)
        }
    };
    let mut full_rope =
        json!({"rope_type": "default", "rope_theta": base("rope.freq_base", 10000.0)? as f64});
    if let Ok(t) = g.tensor("rope_freqs.weight") {
        let mut ff = vec![0f32; t.n_elements as usize];
        crate::quant::dequantize_row(t.ggml_type, g.tensor_data(t), &mut ff)?;
        let n = ff.iter().take_while(|&&x| x == 1.0).count();
        if ff.len() != hd as usize / 2 || ff[n..].iter().any(|&x| x < 1e20) {
            return Err(err(
                g,
                format!("rope_freqs.weight {ff:?} is not [1] * n + [1e30] * m over {} pairs: transformers' proportional RoPE cannot express it", hd / 2),
            ));
        }
        full_rope = json!({"rope_type": "proportional", "partial_rotary_factor": 2.0 * n as f64 / hd as f64,
                           "rope_theta": base("rope.freq_base", 10000.0)? as f64});
    }
    c["rope_parameters"] = json!({
        "sliding_attention": {"rope_type": "default", "rope_theta": base("rope.freq_base_swa", 10000.0)? as f64},
        "full_attention": full_rope,
    });
    Ok(())
}

/// The HF tensor of GGUF tensor `name` by `rule`: as stored (F32/F16/BF16) or dequantized to F32, then
/// transformed from the GGUF layout to the HF one.
fn tensor_of(g: &GgufFile, rule: &layout::TensorRule, hf: String) -> Result<HfTensor> {
    let t = g.tensor(rule_name(g, &hf, rule)?.as_str())?;
    let dims: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
    if dims.len() > 2 {
        return Err(err(g, format!("tensor {} has {} dims", t.name, dims.len())));
    }
    let (cols, rows) = (dims[0], dims.get(1).copied().unwrap_or(1));
    let raw = g.tensor_data(t);
    let (mut ty, mut data) = match t.ggml_type {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => (t.ggml_type, raw.to_vec()),
        other => {
            let rb = t.row_bytes();
            let mut v = vec![0f32; rows * cols];
            for (i, row) in v.chunks_exact_mut(cols).enumerate() {
                crate::quant::dequantize_row(other, &raw[i * rb..(i + 1) * rb], row)?;
            }
            (
                GgmlType::F32,
                v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            )
        }
    };
    let es = if ty == GgmlType::F32 { 4 } else { 2 };
    let mut shape = if dims.len() == 2 {
        vec![rows, cols]
    } else {
        vec![cols]
    };
    match rule.transform {
        Transform::Same => {}
        Transform::Flatten(k) => shape = vec![rows, cols / k, k],
        Transform::Transpose => {
            data = transpose(&data, rows, cols, es);
            shape = vec![cols, rows];
        }
        Transform::RopePermute(h) => {
            let a = g.get_str("general.architecture")?;
            let n_head = g.get_u32(&format!("{a}.attention.head_count"))? as usize;
            let heads = match h {
                Heads::Query => n_head,
                Heads::Key => match g.get(&format!("{a}.attention.head_count_kv")) {
                    Some(_) => g.get_u32(&format!("{a}.attention.head_count_kv"))? as usize,
                    None => n_head,
                },
            };
            let perm = layout::rope_permutation(rows, heads).ok_or_else(|| {
                err(
                    g,
                    format!(
                        "tensor {}: {rows} rows are not {heads} heads of an even width",
                        t.name
                    ),
                )
            })?;
            let mut inv = vec![0; rows];
            for (gi, &hi) in perm.iter().enumerate() {
                inv[hi] = gi;
            }
            data = permute_rows(&data, cols * es, &inv);
        }
        Transform::NormOffset => {
            let n = rows * cols;
            data = (0..n)
                .flat_map(|i| (super::elem_f32(ty, &data, i) - 1.0).to_le_bytes())
                .collect();
            ty = GgmlType::F32;
        }
    }
    let dtype = match ty {
        GgmlType::F32 => safetensors::Dtype::F32,
        GgmlType::F16 => safetensors::Dtype::F16,
        _ => safetensors::Dtype::BF16,
    };
    Ok(HfTensor {
        name: hf,
        dtype,
        shape,
        data,
    })
}

fn rule_name(g: &GgufFile, hf: &str, rule: &layout::TensorRule) -> Result<String> {
    match layout::match_name(rule.hf, hf) {
        Some(Some(il)) => Ok(layout::with_layer(rule.gguf, il)),
        Some(None) => Ok(rule.gguf.to_string()),
        None => Err(err(g, format!("{hf} does not match {}", rule.hf))),
    }
}

/// The HF copy of GGUF model `g`: config, tensors, tokenizer.
///
/// Errors: an architecture without a layout, a tensor or `<arch>.*` metadata key the layout has no place
/// for (refused rather than dropped), a value transformers' class cannot express (named), a tokenizer type
/// without an HF form here.
pub fn export(g: &GgufFile) -> Result<HfExport> {
    let a = g.get_str("general.architecture")?;
    let l = layout::layout_of_arch(a).ok_or_else(|| {
        Error::Unsupported(format!(
            "{}: architecture {a:?} has no Hugging Face layout (known: {})",
            g.path().display(),
            layout::LAYOUTS
                .iter()
                .map(|l| l.arch)
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })?;
    let config = config_of(g, l)?;
    let mut tensors = Vec::new();
    for t in g.tensors() {
        if a == "gemma4" && t.name == "rope_freqs.weight" {
            continue; // config.json's rope_parameters.full_attention (checked by gemma4_config)
        }
        let (rule, il) = l.by_gguf(&t.name).ok_or_else(|| {
            err(
                g,
                format!("tensor {} has no place in a {} (lockstep's {a} layout): refusing a partial copy", t.name, l.hf_class),
            )
        })?;
        let hf = il.map_or(rule.hf.to_string(), |i| layout::with_layer(rule.hf, i));
        tensors.push(tensor_of(g, rule, hf)?);
    }
    let (tokenizer, tokenizer_config) = super::tokenizer_json::from_gguf(g)?;
    Ok(HfExport {
        layout: l,
        config,
        tensors,
        tokenizer,
        tokenizer_config,
    })
}
