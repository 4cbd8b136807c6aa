//! The dump format — lockstep's public contract with engines — and `lockstep dump`.
//!
//! A dump is one NumPy `.npz` archive (a zip of `.npy` files, readable with `numpy.load`) per run of an
//! engine over given token ids:
//!
//! | array | dtype | shape | meaning |
//! |---|---|---|---|
//! | `lockstep_dump_version` | int32 | `[1]` | [`DUMP_FORMAT_VERSION`] |
//! | `tokens` | int32 | `[T]` | the token ids, in order, at positions `0..T` |
//! | `logits` | float32 | `[T, V]` | output logits at every position |
//! | `<stage id>` | float32 | `[T, D]` | every stage the engine exposes, under its canonical id (`embed`, `blk.3.attn_norm`, `blk.3.out`, `output_norm`, ...); row `t` is position `t` |
//!
//! Stage ids and widths are listed in the README. An engine may omit stages it does not have; the
//! harness reports those as "not compared". Extra arrays are ignored.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use lockstep_engine::hooks::Recorder;
use lockstep_engine::ops::GgmlTarget;
use lockstep_engine::{Model, NumericsMode, Stage, StageKind};
use ndarray::{Array1, Array2};
use ndarray_npy::{NpzReader, NpzWriter};

/// Version of the dump format written in `lockstep_dump_version`.
pub const DUMP_FORMAT_VERSION: i32 = 1;

/// One run of an engine over a token sequence: tokens, logits and stages.
#[derive(Clone, Debug, PartialEq)]
pub struct Dump {
    /// Token ids `[T]`.
    pub tokens: Vec<u32>,
    /// Logits `[T, V]`.
    pub logits: Array2<f32>,
    /// Stages by canonical id, each `[T, D]`.
    pub stages: BTreeMap<String, Array2<f32>>,
}

/// Run `tokens` through `model` as one prefill batch and record every stage.
///
/// Errors: anything the engine reports (bad token id, unsupported type).
pub fn run(model: &Model, tokens: &[u32], mode: NumericsMode, target: GgmlTarget) -> Result<Dump> {
    let mut session = model.session(tokens.len(), mode);
    session.set_ggml_target(target);
    let mut rec = Recorder::new();
    model.forward(&mut session, tokens, Some(&mut rec))?;
    // The logits are a recorded stage like any other; the dump keeps them apart.
    let mut stages = crate::engine::recorded_arrays(rec)?;
    let logits = stages
        .remove(&Stage::global(StageKind::Logits).to_string())
        .context("the engine emitted no logits stage")?;
    Ok(Dump {
        tokens: tokens.to_vec(),
        logits,
        stages,
    })
}

/// Write a dump atomically: a temporary file in the same directory, renamed into place when complete.
///
/// Errors: the directory is missing or unwritable, the disk is full (the temporary file is removed).
pub fn write(path: &Path, dump: &Dump) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
    {
        let mut npz = NpzWriter::new(tmp.as_file());
        let ctx = || format!("writing {}", path.display());
        npz.add_array(
            "lockstep_dump_version",
            &Array1::from_vec(vec![DUMP_FORMAT_VERSION]),
        )
        .with_context(ctx)?;
        let toks: Array1<i32> = dump.tokens.iter().map(|&t| t as i32).collect();
        npz.add_array("tokens", &toks).with_context(ctx)?;
        npz.add_array("logits", &dump.logits).with_context(ctx)?;
        for (name, arr) in &dump.stages {
            npz.add_array(name.as_str(), arr).with_context(ctx)?;
        }
        npz.finish().with_context(ctx)?;
    }
    tmp.persist(path)
        .with_context(|| format!("cannot move the dump into place at {}", path.display()))?;
    Ok(())
}

/// Read a dump written by [`write`] or by any engine following the format.
///
/// Errors name the file: unreadable archive, missing `tokens` / `logits`, a version this build does not
/// read, shapes that disagree (`logits` rows ≠ T, a stage with T' ≠ T rows), NaN-free is *not* checked here.
pub fn read(path: &Path) -> Result<Dump> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("cannot open dump {}", path.display()))?;
    let mut npz = NpzReader::new(file)
        .with_context(|| format!("{} is not an .npz archive", path.display()))?;
    let names = npz
        .names()
        .with_context(|| format!("reading {}", path.display()))?;
    let has = |n: &str| names.iter().any(|x| x.trim_end_matches(".npy") == n);
    if has("lockstep_dump_version") {
        let v: Array1<i32> = npz
            .by_name("lockstep_dump_version")
            .with_context(|| format!("{}: lockstep_dump_version", path.display()))?;
        if v.first() != Some(&DUMP_FORMAT_VERSION) {
            bail!(
                "{}: dump format version {:?}, this lockstep reads {DUMP_FORMAT_VERSION}",
                path.display(),
                v.first()
            );
        }
    }
    for needed in ["tokens", "logits"] {
        if !has(needed) {
            bail!("{}: the dump has no `{needed}` array", path.display());
        }
    }
    let tokens: Array1<i32> = npz
        .by_name("tokens")
        .with_context(|| format!("{}: `tokens` must be int32 [T]", path.display()))?;
    let logits: Array2<f32> = npz
        .by_name("logits")
        .with_context(|| format!("{}: `logits` must be float32 [T, V]", path.display()))?;
    let t = tokens.len();
    if logits.nrows() != t {
        bail!(
            "{}: `logits` has {} rows but `tokens` has {t}",
            path.display(),
            logits.nrows()
        );
    }
    let mut stages = BTreeMap::new();
    for name in &names {
        let name = name.trim_end_matches(".npy");
        if matches!(name, "tokens" | "logits" | "lockstep_dump_version") {
            continue;
        }
        let arr: Array2<f32> = npz.by_name(name).with_context(|| {
            format!("{}: stage `{name}` must be float32 [T, D]", path.display())
        })?;
        if arr.nrows() != t {
            bail!(
                "{}: stage `{name}` has {} rows but `tokens` has {t}",
                path.display(),
                arr.nrows()
            );
        }
        stages.insert(name.to_string(), arr);
    }
    let tokens = tokens
        .iter()
        .map(|&x| {
            u32::try_from(x).with_context(|| format!("{}: negative token id {x}", path.display()))
        })
        .collect::<Result<_>>()?;
    Ok(Dump {
        tokens,
        logits,
        stages,
    })
}
