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

/// The architecture `lockstep synth` writes as a Hugging Face checkpoint directory rather than a GGUF file
/// (Whisper has no GGUF form here): [`write_whisper_dir`].
pub const WHISPER_ARCH: &str = "whisper";

/// What [`write_whisper_dir`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenDir {
    /// Bytes of the four files together.
    pub size: u64,
    /// The directory digest, [`crate::hash::sha256_hf_dir`] (what a `[[checkpoints]]` entry records).
    pub sha256: String,
}

/// Write the seeded Whisper `seed` ([`lockstep_engine::synth::whisper`]) into the directory `out` (created
/// if missing; the four files replaced atomically): `config.json`, `model.safetensors` (every tensor F32,
/// one metadata key `format = pt`, as `save_pretrained` writes), `tokenizer.json` and
/// `preprocessor_config.json` — the files oracles/whisper/make_checkpoint.py writes, with lockstep's own
/// seeded weights. The same seed gives the same bytes.
///
/// Errors: `out` is not a directory (a file, a device) or cannot be created or written (checked before any
/// work); the tokenizer or safetensors cannot be built.
pub fn write_whisper_dir(seed: u64, out: &Path) -> Result<WrittenDir> {
    use lockstep_engine::synth::whisper;
    crate::output::check_dir_target_uncreated(out, "--out")?;
    let tensors: Vec<lockstep_engine::hf::export::HfTensor> = whisper::whisper_tensors(seed)
        .into_iter()
        .map(|t| lockstep_engine::hf::export::HfTensor {
            name: t.name,
            dtype: safetensors::Dtype::F32,
            shape: t.shape,
            data: t.values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        })
        .collect();
    let st = crate::hf::safetensors_bytes(&tensors)?;
    let json = |v: &serde_json::Value| -> Result<Vec<u8>> {
        Ok(format!("{}\n", serde_json::to_string_pretty(v)?).into_bytes())
    };
    let tokenizer = whisper::whisper_tokenizer_json()
        .context("building the seeded Whisper's tokenizer.json")?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let files = [
        ("config.json", json(&whisper::whisper_config())?),
        ("tokenizer.json", json(&tokenizer)?),
        (
            "preprocessor_config.json",
            json(&whisper::whisper_preprocessor_config())?,
        ),
        ("model.safetensors", st),
    ];
    let mut size = 0u64;
    for (name, bytes) in &files {
        crate::output::write_atomic(&out.join(name), bytes)?;
        size += bytes.len() as u64;
    }
    Ok(WrittenDir {
        size,
        sha256: crate::hash::sha256_hf_dir(out)?,
    })
}

/// The `[[checkpoints]]` registry entry of the directory [`write_whisper_dir`] wrote to `out`: its id and
/// `path` are the directory's name, so the entry is for a registry file (`--registry FILE`, or models.toml)
/// in the directory that holds `out` (a checkpoint's path is relative to its registry file).
pub fn checkpoint_entry(out: &Path, seed: u64, w: &WrittenDir) -> String {
    let id = out
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let d = lockstep_engine::synth::whisper::WHISPER_DIMS;
    format!(
        "[[checkpoints]]\nid = {id:?}\nname = \"lockstep synth whisper seed {seed}\"\narch = \"whisper\"\n\
         path = {id:?}\nsha256 = {:?}\nnotes = \"lockstep synth --arch whisper --seed {seed}: \
         WhisperForConditionalGeneration, {} encoder + {} decoder layers, d_model {}, {} heads, FFN {}, {} mels, \
         {} encoder positions, F32 ({} bytes)\"\n",
        w.sha256,
        d.encoder_layers,
        d.decoder_layers,
        d.d_model,
        d.heads,
        d.ffn,
        d.n_mels,
        d.source_positions,
        w.size
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

    /// The Python maker's checkpoint (oracles/whisper/make_checkpoint.py), which the seeded Whisper copies
    /// in everything but its weights.
    fn python_whisper() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../oracles/whisper/checkpoints/whisper-seeded")
    }

    fn json_file(p: &Path) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(p).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn whisper_dir_has_the_python_checkpoints_tensors_config_and_tokenizer() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("whisper-s1");
        write_whisper_dir(1, &out).unwrap();
        let py = python_whisper();
        for f in ["config.json", "preprocessor_config.json"] {
            assert_eq!(json_file(&out.join(f)), json_file(&py.join(f)), "{f}");
        }
        let ours = std::fs::read(out.join("model.safetensors")).unwrap();
        let theirs = std::fs::read(py.join("model.safetensors")).unwrap();
        let (a, b) = (
            safetensors::SafeTensors::deserialize(&ours).unwrap(),
            safetensors::SafeTensors::deserialize(&theirs).unwrap(),
        );
        let list = |s: &safetensors::SafeTensors| {
            let mut v: Vec<(String, safetensors::Dtype, Vec<usize>)> = s
                .tensors()
                .into_iter()
                .map(|(n, t)| (n, t.dtype(), t.shape().to_vec()))
                .collect();
            v.sort();
            v
        };
        assert_eq!(list(&a), list(&b), "tensor names, dtypes and shapes");
        assert_eq!(list(&a).len(), 89);
        assert!(list(&a).iter().all(|t| t.1 == safetensors::Dtype::F32));
        assert_eq!(
            safetensors::SafeTensors::read_metadata(&ours)
                .unwrap()
                .1
                .metadata(),
            safetensors::SafeTensors::read_metadata(&theirs)
                .unwrap()
                .1
                .metadata(),
            "the safetensors metadata (format = pt)"
        );
        // the encoder positions: transformers' sinusoids, as the Python maker leaves them
        let f32s = |s: &safetensors::SafeTensors, n: &str| -> Vec<f32> {
            s.tensor(n)
                .unwrap()
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()
        };
        let pos = "model.encoder.embed_positions.weight";
        let (p, q) = (f32s(&a, pos), f32s(&b, pos));
        let worst = p
            .iter()
            .zip(&q)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        // at most one f32 ulp of 1.0: torch's vectorized exp/sin/cos are not correctly rounded, Rust's are
        // (151 of the 3200 entries differ, by at most 6e-8)
        assert!(
            worst <= f32::EPSILON,
            "encoder positions differ from transformers' by {worst}"
        );
        // the weights are lockstep's own draws, not a copy of torch's
        let e = "model.decoder.embed_tokens.weight";
        assert_ne!(f32s(&a, e), f32s(&b, e));
        // the tokenizer: the same vocabulary, and the same ids for text and control tokens
        let load = |d: &Path| tokenizers::Tokenizer::from_file(d.join("tokenizer.json")).unwrap();
        let (ta, tb) = (load(&out), load(&py));
        assert_eq!(ta.get_vocab(true), tb.get_vocab(true), "vocabulary");
        assert_eq!(ta.get_vocab_size(true), 270);
        for text in [
            "<|startoftranscript|><|en|><|transcribe|><|notimestamps|> the hell in there",
            "Hello, world! 123 one  two\tthree<|endoftext|>",
            "héllo wörld — on her inner tone",
        ] {
            let ids = |t: &tokenizers::Tokenizer| t.encode(text, false).unwrap().get_ids().to_vec();
            assert_eq!(ids(&ta), ids(&tb), "{text:?}");
        }
    }

    #[test]
    fn whisper_dir_is_deterministic_and_its_entry_resolves() {
        let dir = tempfile::tempdir().unwrap();
        let (one, two, other) = (
            dir.path().join("w-a"),
            dir.path().join("w-b"),
            dir.path().join("w-c"),
        );
        let w = write_whisper_dir(5, &one).unwrap();
        assert_eq!(
            w,
            write_whisper_dir(5, &two).unwrap(),
            "same seed, same digest"
        );
        for f in [
            "config.json",
            "tokenizer.json",
            "preprocessor_config.json",
            "model.safetensors",
        ] {
            assert_eq!(
                std::fs::read(one.join(f)).unwrap(),
                std::fs::read(two.join(f)).unwrap(),
                "{f}"
            );
        }
        assert_ne!(
            w.sha256,
            write_whisper_dir(6, &other).unwrap().sha256,
            "another seed"
        );
        assert_eq!(w.sha256, crate::hash::sha256_hf_dir(&one).unwrap());
        // the printed entry, saved as a registry file beside the directory, resolves it by its digest
        let reg = dir.path().join("mine.toml");
        std::fs::write(&reg, checkpoint_entry(&one, 5, &w)).unwrap();
        let r = crate::registry::Registry::load(&[reg]).unwrap();
        let c = r.checkpoint("w-a").unwrap();
        assert_eq!(c.arch, "whisper");
        assert_eq!(c.dir().unwrap(), one);
        // and refuses the directory once a weight changes
        std::fs::copy(
            other.join("model.safetensors"),
            one.join("model.safetensors"),
        )
        .unwrap();
        let e = format!("{:#}", c.dir().unwrap_err());
        assert!(e.contains("digest"), "{e}");
    }

    #[test]
    fn whisper_dir_refuses_a_file_as_out() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("w.gguf");
        std::fs::write(&f, b"x").unwrap();
        let e = format!("{:#}", write_whisper_dir(1, &f).unwrap_err());
        assert!(e.contains("w.gguf"), "{e}");
    }

    #[test]
    fn unknown_arch_is_refused_by_name() {
        let e = synth_bytes("mamba", 1).unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.contains("mamba") && msg.contains("qwen3"), "{msg}");
    }
}
