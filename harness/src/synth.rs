//! `lockstep synth`: the tiny seeded models of the model axis, written by lockstep (the engine's
//! [`lockstep_engine::synth`]), and the `[[synth]]` entries of models.toml that `lockstep fetch` makes
//! instead of downloading.
//!
//! A seeded model is deterministic bytes: the registry records its size and sha256, and the file made on
//! any machine is checked against them, as a downloaded model is.

use std::path::Path;

use anyhow::{Context, Result};
use lockstep_engine::synth::SynthModel;

/// What `lockstep synth` wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// Bytes written.
    pub size: u64,
    /// Lowercase hex sha256 of the file.
    pub sha256: String,
}

/// The bytes of the seeded model `arch`/`seed` ([`SynthModel::preset`]).
///
/// Errors: an architecture lockstep cannot write (the known ones listed).
pub fn synth_bytes(arch: &str, seed: u64) -> Result<Vec<u8>> {
    let model = SynthModel::preset(arch, seed)?;
    model
        .build()
        .with_context(|| format!("cannot build the seeded {arch} model (seed {seed})"))
}

/// Write the seeded model `arch`/`seed` to `out`, atomically ([`crate::output::write_atomic`]).
///
/// Errors: as [`synth_bytes`]; `out` is a symlink, device, FIFO or directory, or cannot be written.
pub fn write_synth(arch: &str, seed: u64, out: &Path) -> Result<Written> {
    crate::output::check_file_target(out, "--out")?;
    let bytes = synth_bytes(arch, seed)?;
    crate::output::write_atomic(out, &bytes)?;
    Ok(Written {
        size: bytes.len() as u64,
        sha256: crate::hash::sha256_hex(&bytes),
    })
}

/// The `[[synth]]` registry entry of a file [`write_synth`] wrote to `out` (its id = the file stem), ready to
/// paste into models.toml or a user registry file (`--registry FILE`): the registry is read at run time,
/// so `lockstep fetch ID` then writes and checks the same bytes with no rebuild.
pub fn registry_entry(out: &Path, arch: &str, seed: u64, w: &Written) -> String {
    let id = out
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!(
        "[[synth]]\nid = {id:?}\nname = \"lockstep synth {arch} seed {seed}\"\narch = {arch:?}\nseed = {seed}\n\
         size = {}\nsha256 = {:?}\n",
        w.size, w.sha256
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_engine::models::Model;

    #[test]
    fn the_printed_entry_is_a_registry_that_names_the_file_written() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("my-llama-seed7.gguf");
        let w = write_synth("llama", 7, &out).unwrap();
        let text = registry_entry(&out, "llama", 7, &w);
        let r = crate::registry::Registry::parse(&text).unwrap();
        let e = r.synth("my-llama-seed7").unwrap();
        assert_eq!(
            (e.seed, e.size),
            (7, std::fs::metadata(&out).unwrap().len())
        );
        assert_eq!(e.sha256, crate::hash::sha256_file(&out).unwrap());
    }

    #[test]
    fn every_arch_is_deterministic_and_loads() {
        for &arch in lockstep_engine::synth::SYNTH_ARCHS {
            let a = synth_bytes(arch, 7).unwrap();
            assert_eq!(
                a,
                synth_bytes(arch, 7).unwrap(),
                "{arch}: same seed, same bytes"
            );
            assert_ne!(a, synth_bytes(arch, 8).unwrap(), "{arch}: the seed matters");
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(format!("{arch}.gguf"));
            let w = write_synth(arch, 7, &path).unwrap();
            assert_eq!(w.size, a.len() as u64);
            let model = Model::load(&path).unwrap();
            assert_eq!(model.info().arch, arch);
            assert_eq!(model.info().d_model % 256, 0, "{arch}: K-quant widths");
        }
    }

    #[test]
    fn unknown_arch_is_refused_by_name() {
        let e = synth_bytes("mamba", 1).unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.contains("mamba") && msg.contains("qwen3"), "{msg}");
    }
}
