//! `lockstep export-hf`: the Hugging Face copy of a GGUF model — `config.json` and `model.safetensors` (f32,
//! every tensor dequantized exactly as the engine reads it) — so engines that load safetensors, and
//! transformers for an architecture its GGUF loader lacks (BERT), run the same weights.
//!
//! Implemented for `bert` (HF `BertModel`, transformers/models/bert/modeling_bert.py): the GGUF names map
//! back to the checkpoint names llama.cpp's converter reads (conversion/bert.py, gguf-py's tensor map; no
//! `bert.` prefix, no pooler). `config.json` states what llama.cpp computes: `hidden_act =
//! "gelu_pytorch_tanh"` (ggml's GELU is the tanh approximation, whatever the original model used), token
//! type 0, absolute positions, no dropout.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use lockstep_engine::gguf::GgufFile;
use lockstep_engine::models::{load_vector, Weight};

/// The files [`export_hf`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exported {
    /// `<dir>/config.json`.
    pub config: PathBuf,
    /// `<dir>/model.safetensors`.
    pub safetensors: PathBuf,
    /// Tensors written.
    pub n_tensors: usize,
}

/// The HF `BertModel` name of a GGUF tensor of a `bert` file, `None` for a tensor BertModel has no place for.
pub fn bert_hf_name(gguf: &str) -> Option<String> {
    let fixed = match gguf {
        "token_embd.weight" => Some("embeddings.word_embeddings.weight"),
        "position_embd.weight" => Some("embeddings.position_embeddings.weight"),
        "token_types.weight" => Some("embeddings.token_type_embeddings.weight"),
        "token_embd_norm.weight" => Some("embeddings.LayerNorm.weight"),
        "token_embd_norm.bias" => Some("embeddings.LayerNorm.bias"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (tensor, suffix) = rest.rsplit_once('.')?;
    if !matches!(suffix, "weight" | "bias") {
        return None;
    }
    let module = match tensor {
        "attn_q" => "attention.self.query",
        "attn_k" => "attention.self.key",
        "attn_v" => "attention.self.value",
        "attn_output" => "attention.output.dense",
        "attn_output_norm" => "attention.output.LayerNorm",
        "ffn_up" => "intermediate.dense",
        "ffn_down" => "output.dense",
        "layer_output_norm" => "output.LayerNorm",
        _ => return None,
    };
    Some(format!("encoder.layer.{layer}.{module}.{suffix}"))
}

/// Write the Hugging Face copy of the `bert` GGUF file `model` into the directory `out` (created if
/// missing): `config.json` and `model.safetensors`, each written atomically.
///
/// Errors: an unreadable GGUF, an architecture other than `bert`, a tensor without an HF name (a file this
/// mapping does not cover: refused rather than dropped), a missing hyperparameter; `out` not writable.
pub fn export_hf(model: &Path, out: &Path) -> Result<Exported> {
    let g = GgufFile::open(model).with_context(|| format!("reading {}", model.display()))?;
    let arch = g.get_str("general.architecture")?;
    if arch != "bert" {
        bail!(
            "{}: architecture {arch:?}: the Hugging Face export is implemented for bert only",
            model.display()
        );
    }
    let u = |k: &str| -> Result<u64> { Ok(u64::from(g.get_u32(&format!("bert.{k}"))?)) };
    let (d, n_layer, n_head, d_ff, n_ctx) = (
        u("embedding_length")?,
        u("block_count")?,
        u("attention.head_count")?,
        u("feed_forward_length")?,
        u("context_length")?,
    );
    let eps = g.get_f32("bert.attention.layer_norm_epsilon")?;
    let mut tensors: BTreeMap<String, (Vec<usize>, Vec<u8>)> = BTreeMap::new();
    let (mut n_vocab, mut n_types) = (0u64, 1u64);
    for t in g.tensors() {
        let Some(hf) = bert_hf_name(&t.name) else {
            bail!(
                "{}: tensor {} has no place in a Hugging Face BertModel (not exported: refusing a partial copy)",
                model.display(),
                t.name
            );
        };
        let (shape, values) = match t.dims.as_slice() {
            [cols] => {
                let c = *cols as usize;
                (vec![c], load_vector(&g, &t.name, c)?)
            }
            [cols, rows] => {
                let (c, r) = (*cols as usize, *rows as usize);
                let w = Weight::load(&g, &t.name, Some(r), Some(c))?;
                let m = w.matrix(&g);
                let mut v = vec![0f32; r * c];
                for (i, row) in v.chunks_exact_mut(c).enumerate() {
                    lockstep_engine::quant::dequantize_row(m.ty, m.row(i), row)?;
                }
                (vec![r, c], v)
            }
            dims => bail!(
                "{}: tensor {} has {} dims",
                model.display(),
                t.name,
                dims.len()
            ),
        };
        if t.name == "token_embd.weight" {
            n_vocab = shape[0] as u64;
        }
        if t.name == "token_types.weight" {
            n_types = shape[0] as u64;
        }
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        tensors.insert(hf, (shape, bytes));
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(name, (shape, bytes))| {
            let v =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                    .with_context(|| format!("safetensors view of {name}"))?;
            Ok((name.clone(), v))
        })
        .collect::<Result<_>>()?;
    // one metadata key: safetensors writes a HashMap's keys in no fixed order, and the same GGUF must give
    // the same bytes
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    let st = safetensors::serialize(views, &Some(meta)).context("serializing safetensors")?;
    let config = serde_json::json!({
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": n_vocab,
        "hidden_size": d,
        "num_hidden_layers": n_layer,
        "num_attention_heads": n_head,
        "intermediate_size": d_ff,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "max_position_embeddings": n_ctx,
        "type_vocab_size": n_types,
        "layer_norm_eps": eps,
        "position_embedding_type": "absolute",
        "pad_token_id": 0,
        "initializer_range": 0.02,
        "torch_dtype": "float32",
        "lockstep_note": "written by `lockstep export-hf` from a GGUF: f32 weights as the engine dequantizes them; \
                          hidden_act is ggml's tanh GELU, the function llama.cpp computes",
    });
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let (cfg_path, st_path) = (out.join("config.json"), out.join("model.safetensors"));
    crate::output::write_atomic(
        &cfg_path,
        format!("{}\n", serde_json::to_string_pretty(&config)?).as_bytes(),
    )?;
    crate::output::write_atomic(&st_path, &st)?;
    Ok(Exported {
        config: cfg_path,
        safetensors: st_path,
        n_tensors: tensors.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_bert_model() {
        assert_eq!(
            bert_hf_name("blk.1.attn_output_norm.bias").as_deref(),
            Some("encoder.layer.1.attention.output.LayerNorm.bias")
        );
        assert_eq!(
            bert_hf_name("token_types.weight").as_deref(),
            Some("embeddings.token_type_embeddings.weight")
        );
        assert_eq!(bert_hf_name("output.weight"), None);
        assert_eq!(bert_hf_name("blk.x.attn_q.weight"), None);
    }

    #[test]
    fn exports_the_seeded_bert_and_refuses_other_archs() {
        let dir = tempfile::tempdir().unwrap();
        let gguf = dir.path().join("b.gguf");
        crate::synth::write_synth("bert", 3, &gguf).unwrap();
        let e = export_hf(&gguf, &dir.path().join("hf")).unwrap();
        let m = lockstep_engine::synth::SynthModel::preset("bert", 3).unwrap();
        let want = lockstep_engine::synth::bert::bert_tensors(&m);
        assert_eq!(e.n_tensors, want.len());
        let bytes = std::fs::read(&e.safetensors).unwrap();
        let again = export_hf(&gguf, &dir.path().join("hf-again")).unwrap();
        assert_eq!(
            bytes,
            std::fs::read(&again.safetensors).unwrap(),
            "deterministic bytes"
        );
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for t in &want {
            let v = st.tensor(&bert_hf_name(&t.name).unwrap()).unwrap();
            let got: Vec<f32> = v
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            assert_eq!(got, t.values, "{}: F32 file, exact values", t.name);
        }
        let cfg: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&e.config).unwrap()).unwrap();
        assert_eq!(cfg["num_hidden_layers"], 2);
        assert_eq!(cfg["type_vocab_size"], 2);
        let llama = dir.path().join("l.gguf");
        crate::synth::write_synth("llama", 3, &llama).unwrap();
        let err = export_hf(&llama, &dir.path().join("hf2")).unwrap_err();
        assert!(format!("{err:#}").contains("bert only"), "{err:#}");
    }
}
