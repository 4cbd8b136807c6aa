//! Our engine as the commands use it in process: a `--model` loaded, and a session opened with the run's
//! numerics settings (mode, the ggml-cpu build mirrored, SIMD kernels) — one place for the setup that
//! `generate`, `dump`, `bench-sample` and `quality` share.

use anyhow::{Context, Result};
use lockstep_engine::ops::GgmlTarget;
use lockstep_engine::{Model, NumericsMode, Session, Simd};

/// The numerics settings of one session: what the engine computes (`mode`), which llama.cpp ggml-cpu
/// build ggml mode mirrors (`ggml_target`), and which kernels compute it (`simd`; ggml mode gives the same
/// bits with each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Numerics {
    /// Numerics mode: `reference` or `ggml`.
    pub mode: NumericsMode,
    /// The ggml-cpu build ggml mode mirrors (e.g. [`GgmlTarget::host`], the one llama.cpp built here runs).
    pub ggml_target: GgmlTarget,
    /// Kernel instruction set.
    pub simd: Simd,
}

impl Numerics {
    /// `mode` with `simd`'s kernels, mirroring this machine's llama.cpp build ([`GgmlTarget::host`]): the
    /// build llama-bench and llama-perplexity run here.
    pub fn host(mode: NumericsMode, simd: Simd) -> Numerics {
        Numerics {
            mode,
            ggml_target: GgmlTarget::host(),
            simd,
        }
    }

    /// The settings of an open session (to run its sequence again the same way).
    pub fn of(session: &Session, mode: NumericsMode) -> Numerics {
        Numerics {
            mode,
            ggml_target: session.ggml_target(),
            simd: session.simd(),
        }
    }

    /// A session of `model` for up to `n_ctx` positions with these settings.
    pub fn session(&self, model: &Model, n_ctx: usize) -> Session {
        let mut s = model.session(n_ctx, self.mode);
        s.set_ggml_target(self.ggml_target);
        s.set_simd(self.simd);
        s
    }
}

/// Resolve `--model` (a registry id, fetched on first use, or a path to a GGUF file;
/// [`crate::fetch::resolve_model`]) and load it.
///
/// Errors: an unknown id or missing file, a failed fetch, or a file the engine cannot load (naming it).
pub fn load_model(spec: &str) -> Result<Model> {
    let path = crate::fetch::resolve_model(spec)?;
    Model::load(&path).with_context(|| format!("loading model {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_engine::fixtures::TinyLlama;

    fn tiny() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.gguf");
        std::fs::write(&p, TinyLlama::default().build().unwrap()).unwrap();
        (dir, p)
    }

    #[test]
    fn session_carries_the_settings() {
        let (_d, p) = tiny();
        let model = load_model(p.to_str().unwrap()).unwrap();
        let n = Numerics {
            mode: NumericsMode::Ggml,
            ggml_target: GgmlTarget::Avx2,
            simd: Simd::Off,
        };
        let s = n.session(&model, 8);
        assert_eq!(s.ggml_target(), GgmlTarget::Avx2);
        assert_eq!(s.simd(), Simd::Off);
        assert_eq!(Numerics::of(&s, NumericsMode::Ggml), n);
    }

    #[test]
    fn sessions_with_equal_settings_compute_equal_logits() {
        let (_d, p) = tiny();
        let model = load_model(p.to_str().unwrap()).unwrap();
        let n = Numerics::host(NumericsMode::Reference, Simd::Off);
        let a = model
            .forward_last(&mut n.session(&model, 4), &[5, 6, 7], None)
            .unwrap()
            .to_vec();
        let mut s = n.session(&model, 4);
        let b = model.forward_last(&mut s, &[5, 6, 7], None).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn load_model_names_a_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("absent.gguf");
        let e = load_model(missing.to_str().unwrap()).unwrap_err();
        assert!(format!("{e:#}").contains("absent.gguf"), "{e:#}");
    }
}
