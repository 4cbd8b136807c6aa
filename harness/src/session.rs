//! Our engine as the commands use it in process: a `--model` loaded, and a session opened with the run's
//! numerics settings (mode, the ggml-cpu build mirrored, SIMD kernels) — one place for the setup that
//! `generate`, `dump`, `bench-sample` and `quality` share. The settings are the engine's one value,
//! [`Numerics`].

use anyhow::{Context, Result};
use lockstep_engine::{GgmlTarget, Model, Numerics, NumericsMode, Simd};

/// `mode` with `simd`'s kernels, mirroring this machine's llama.cpp build ([`GgmlTarget::host`]): the
/// build llama-bench and llama-perplexity run here.
pub fn host_numerics(mode: NumericsMode, simd: Simd) -> Numerics {
    Numerics::new(mode)
        .with_target(GgmlTarget::host())
        .with_simd(simd)
}

/// Resolve `--model` (a registry id, fetched on first use, or a path to a GGUF file;
/// [`crate::fetch::resolve_model`]) and load it.
///
/// Errors: an unknown id or missing file, a failed fetch, or a file the engine cannot load (naming it).
pub fn load_model(spec: &str) -> Result<Model> {
    let path = crate::fetch::resolve_model(spec)?;
    Model::load(&path).with_context(|| format!("loading model {}", path.display()))
}

/// Refuse an encoder (BERT) for a command that needs logits (`generate`, `dump`,
/// `quality`): its forward pass returns the pooled embedding, which no such command may read as logits.
///
/// Errors: `model` is an encoder, naming its architecture and the command.
pub fn require_logits(model: &Model, command: &str) -> Result<()> {
    if model.output() == lockstep_engine::models::Output::Pooled {
        anyhow::bail!(
            "`lockstep {command}` needs a model with logits; this {} model is an encoder (its output is the pooled \
             embedding, with no decode step): hold it to its goldens with `lockstep run` / `lockstep bisect`",
            model.info().arch
        );
    }
    Ok(())
}

/// A tiny synthetic model ([`lockstep_engine::synth::SynthModel`]) written to `m.gguf` in a fresh
/// temporary directory, for the unit tests of the modules that load one (the directory lives as long as the
/// returned guard).
#[cfg(test)]
pub(crate) fn tiny_model_file() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    let bytes = lockstep_engine::synth::SynthModel::default()
        .build()
        .unwrap();
    std::fs::write(&p, bytes).unwrap();
    (dir, p)
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::tiny_model_file as tiny;

    #[test]
    fn host_numerics_mirror_this_machines_build() {
        let n = host_numerics(NumericsMode::Ggml, Simd::Off);
        assert_eq!(n.target, GgmlTarget::host());
        assert_eq!((n.mode, n.simd), (NumericsMode::Ggml, Simd::Off));
        let (_d, p) = tiny();
        let model = load_model(p.to_str().unwrap()).unwrap();
        assert_eq!(model.session(8, n).numerics(), n);
    }

    #[test]
    fn sessions_with_equal_settings_compute_equal_logits() {
        let (_d, p) = tiny();
        let model = load_model(p.to_str().unwrap()).unwrap();
        let n = host_numerics(NumericsMode::Reference, Simd::Off);
        let a = model
            .forward_last(&mut model.session(4, n), &[5, 6, 7], None)
            .unwrap()
            .to_vec();
        let mut s = model.session(4, n);
        let b = model.forward_last(&mut s, &[5, 6, 7], None).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn commands_that_need_logits_refuse_an_encoder() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bert.gguf");
        crate::synth::write_synth("bert", 1, &p).unwrap();
        let model = load_model(p.to_str().unwrap()).unwrap();
        let e = require_logits(&model, "generate").unwrap_err().to_string();
        assert!(
            e.contains("lockstep generate") && e.contains("bert model is an encoder"),
            "{e}"
        );
        let (_d, p) = tiny_model_file();
        assert!(require_logits(&load_model(p.to_str().unwrap()).unwrap(), "dump").is_ok());
    }

    #[test]
    fn load_model_names_a_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("absent.gguf");
        let e = load_model(missing.to_str().unwrap()).unwrap_err();
        assert!(format!("{e:#}").contains("absent.gguf"), "{e:#}");
    }
}
