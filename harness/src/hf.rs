//! `lockstep export-hf`: the Hugging Face copy of a GGUF model — `config.json` (the transformers config of
//! the architecture's class: `LlamaForCausalLM`, `Qwen2ForCausalLM`, ..., `Gemma4ForCausalLM`'s text config,
//! `GPT2LMHeadModel`, `BertModel`), `model.safetensors` (F32/F16/BF16 tensors as stored, quantized ones
//! dequantized to F32 exactly as the engine reads them), `tokenizer.json` and `tokenizer_config.json` — so
//! transformers (`from_pretrained(dir)`), engines that load safetensors, and lockstep's own engine (which
//! loads the directory back, [`lockstep_engine::hf::open_dir`]) run the same weights.
//!
//! The layout differences live in one table per architecture, [`lockstep_engine::hf::layout`], which the
//! loader reads the other way. BERT's `config.json` states what llama.cpp computes: `hidden_act =
//! "gelu_pytorch_tanh"` (ggml's GELU is the tanh approximation), token type 0, absolute positions, no
//! dropout, and `lockstep_pooling_type` (llama.cpp's `bert.pooling_type`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The files [`export_hf`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exported {
    /// `<dir>/config.json`.
    pub config: PathBuf,
    /// `<dir>/model.safetensors`.
    pub safetensors: PathBuf,
    /// `<dir>/tokenizer.json`.
    pub tokenizer: PathBuf,
    /// Tensors written.
    pub n_tensors: usize,
}

/// The bytes of `model.safetensors` for `tensors`: deterministic (one metadata key; safetensors sorts the
/// tensors by dtype alignment then name).
pub fn safetensors_bytes(tensors: &[lockstep_engine::hf::export::HfTensor]) -> Result<Vec<u8>> {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|t| {
            let v = safetensors::tensor::TensorView::new(t.dtype, t.shape.clone(), &t.data)
                .with_context(|| format!("safetensors view of {}", t.name))?;
            Ok((t.name.clone(), v))
        })
        .collect::<Result<_>>()?;
    // one metadata key: safetensors writes a HashMap's keys in no fixed order, and the same GGUF must give
    // the same bytes
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize(views, &Some(meta)).context("serializing safetensors")
}

/// Write the Hugging Face copy of the GGUF model `model` into the directory `out` (created if missing):
/// `config.json`, `model.safetensors`, `tokenizer.json`, `tokenizer_config.json`, each written atomically.
///
/// Errors: an unreadable GGUF, an architecture without a layout (the known ones listed), a tensor or
/// `<arch>.*` metadata key without an HF place (refused rather than dropped), a tokenizer without an HF
/// form here; `out` is not a directory (a file, a device) or not writable (checked before any work).
pub fn export_hf(model: &Path, out: &Path) -> Result<Exported> {
    crate::output::check_dir_target_uncreated(out, "--out")?;
    let g =
        lockstep_engine::hf::open(model).with_context(|| format!("reading {}", model.display()))?;
    let e = lockstep_engine::hf::export::export(&g)
        .with_context(|| format!("exporting {}", model.display()))?;
    let st = safetensors_bytes(&e.tensors)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let path = |f: &str| out.join(f);
    let json = |v: &serde_json::Value| -> Result<Vec<u8>> {
        Ok(format!("{}\n", serde_json::to_string_pretty(v)?).into_bytes())
    };
    crate::output::write_atomic(&path("config.json"), &json(&e.config)?)?;
    crate::output::write_atomic(&path("tokenizer.json"), &json(&e.tokenizer)?)?;
    crate::output::write_atomic(&path("tokenizer_config.json"), &json(&e.tokenizer_config)?)?;
    crate::output::write_atomic(&path("model.safetensors"), &st)?;
    Ok(Exported {
        config: path("config.json"),
        safetensors: path("model.safetensors"),
        tokenizer: path("tokenizer.json"),
        n_tensors: e.tensors.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports_the_seeded_bert_deterministically_with_exact_values() {
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
        let l = lockstep_engine::hf::layout::layout_of_arch("bert").unwrap();
        for t in &want {
            let (rule, il) = l.by_gguf(&t.name).unwrap();
            let hf = il.map_or(rule.hf.to_string(), |i| {
                lockstep_engine::hf::layout::with_layer(rule.hf, i)
            });
            let v = st.tensor(&hf).unwrap();
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
        assert_eq!(cfg["architectures"][0], "BertModel");
    }

    #[test]
    fn refuses_an_architecture_without_a_layout() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = lockstep_engine::gguf::GgufWriter::new();
        w.add_metadata(
            "general.architecture",
            lockstep_engine::gguf::MetaValue::String("mamba".into()),
        );
        let p = dir.path().join("m.gguf");
        std::fs::write(&p, w.to_bytes()).unwrap();
        let err = export_hf(&p, &dir.path().join("hf")).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("mamba") && msg.contains("gemma4"), "{msg}");
    }
}
