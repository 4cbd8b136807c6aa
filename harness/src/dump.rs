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
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use lockstep_engine::hooks::Recorder;
use lockstep_engine::GgmlTarget;
use lockstep_engine::{Model, NumericsMode, Simd, Stage, StageKind};
use ndarray::{Array1, Array2};
use ndarray_npy::NpzWriter;

use crate::npz::{Dtype, Npz};

/// Version of the dump format written in `lockstep_dump_version`.
pub const DUMP_FORMAT_VERSION: i32 = 1;

/// One run of an engine over a token sequence: tokens, logits and stages.
#[derive(Clone, Debug, PartialEq)]
pub struct Dump {
    /// Token ids `[T]`.
    pub tokens: Vec<u32>,
    /// Logits `[T, V]`; `None` in an encoder's dump, whose output is the stage `pooled` (`[1, D]`: one
    /// row, at the step's last position, as `engine/src/models/encoder.rs` emits it).
    pub logits: Option<Array2<f32>>,
    /// Stages by canonical id, each `[T, D]` (`pooled`: `[1, D]`).
    pub stages: BTreeMap<String, Array2<f32>>,
}

/// Run `tokens` through `model` as one prefill batch with `simd`'s kernels and record every stage.
///
/// Errors: no tokens; more tokens than the model's context (before any work); anything the engine reports
/// (bad token id, unsupported type); non-finite logits, naming the first stage that went non-finite.
pub fn run(
    model: &Model,
    tokens: &[u32],
    mode: NumericsMode,
    target: GgmlTarget,
    simd: Simd,
) -> Result<Dump> {
    if tokens.is_empty() {
        bail!("no tokens to dump: the prompt is empty");
    }
    // the dump format (v1) holds logits; an encoder's output is the stage `pooled`
    crate::session::require_logits(model, "dump")?;
    model.check_context(tokens.len())?;
    let numerics = lockstep_engine::Numerics { mode, target, simd };
    let mut session = model.session(tokens.len(), numerics);
    let mut rec = Recorder::new();
    model.forward(&mut session, tokens, Some(&mut rec))?;
    // The logits are a recorded stage like any other; the dump keeps them apart.
    let mut stages = crate::capture::recorded_arrays(rec)?;
    let logits = stages
        .remove(&Stage::global(StageKind::Logits).to_string())
        .context("the engine emitted no logits stage")?;
    crate::capture::check_finite_logits(&logits, &stages)?;
    Ok(Dump {
        tokens: tokens.to_vec(),
        logits: Some(logits),
        stages,
    })
}

/// Write a dump atomically: a temporary file in the same directory, renamed into place when complete.
///
/// Errors: `path` is a symlink, a device, a FIFO or a directory ([`crate::output::check_file_target`]:
/// never replaced), the directory is missing or unwritable, the disk is full (the temporary file is
/// removed).
pub fn write(path: &Path, dump: &Dump) -> Result<()> {
    crate::output::check_file_target(path, "dump output")?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
    let registered = crate::process::register_temp(tmp.path());
    write_npz(tmp.as_file(), path, dump)?;
    tmp.as_file()
        .sync_all()
        .with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )?;
    // again just before the rename: the target may have changed while the model ran
    crate::output::check_file_target(path, "dump output")?;
    registered
        .commit(|| tmp.persist(path))
        .with_context(|| format!("cannot move the dump into place at {}", path.display()))?;
    Ok(())
}

/// Write a dump that lives only as long as the process reading it (a `lockstep serve` step in the
/// session's scratch directory, read once and deleted) as a *new* file `dir/<prefix>XXXXXX.npz`: created
/// with `O_CREAT | O_EXCL` (mode 0600), so it never replaces, truncates or writes through anything that
/// was there — whatever directory a client names. No `fsync`: flushing tens of megabytes per step to the
/// disk buys nothing here. Returns the file's path.
///
/// Errors: `dir` is missing, not a directory or not writable; the disk is full (the new file is then
/// removed).
pub fn write_new_in(dir: &Path, prefix: &str, dump: &Dump) -> Result<PathBuf> {
    let tmp = tempfile::Builder::new()
        .prefix(prefix)
        .suffix(".npz")
        .tempfile_in(dir)
        .with_context(|| format!("cannot create a new dump file in {}", dir.display()))?;
    write_npz(tmp.as_file(), tmp.path(), dump)?;
    let (_, path) = tmp
        .keep()
        .with_context(|| format!("cannot keep the dump in {}", dir.display()))?;
    Ok(path)
}

/// The dump's arrays into `file` (`path` names it in errors).
fn write_npz(file: &std::fs::File, path: &Path, dump: &Dump) -> Result<()> {
    // buffered: the zip writer's many small writes would each be a system call
    let mut npz = NpzWriter::new(std::io::BufWriter::new(file));
    let ctx = || format!("writing {}", path.display());
    npz.add_array(
        "lockstep_dump_version",
        &Array1::from_vec(vec![DUMP_FORMAT_VERSION]),
    )
    .with_context(ctx)?;
    let toks: Array1<i32> = dump.tokens.iter().map(|&t| t as i32).collect();
    npz.add_array("tokens", &toks).with_context(ctx)?;
    if let Some(logits) = &dump.logits {
        npz.add_array("logits", logits).with_context(ctx)?;
    }
    for (name, arr) in &dump.stages {
        npz.add_array(name.as_str(), arr).with_context(ctx)?;
    }
    let mut out = npz.finish().with_context(ctx)?;
    std::io::Write::flush(&mut out).with_context(ctx)
}

/// Largest dump [`read`] accepts, all arrays together (4 GiB: a 512-token dump of every stage of the
/// largest registered model is ~1.3 GB). Each array is also bounded by [`crate::npz::MAX_ARRAY_BYTES`].
pub const MAX_DUMP_BYTES: u64 = 4 << 30;

/// Read a dump written by [`write`] or by any engine following the format.
///
/// A dump without `logits` is an encoder's: it must hold the stage `pooled` with one row (the output at the
/// step's last position); every other stage has T rows.
///
/// Errors name the file: unreadable archive, missing `tokens`, missing both `logits` and `pooled`, a
/// version this build does not read, wrong dtypes or ranks, shapes that disagree (`logits` rows ≠ T, a
/// stage with T' ≠ T rows, an encoder's `pooled` with more than one row),
/// negative token ids, arrays beyond the size bounds (checked before decompressing), a path that is not a
/// regular file (a FIFO, a device, a directory) or a file larger than [`MAX_DUMP_FILE_BYTES`]
/// ([`crate::input`]: checked before it is opened, so a FIFO never blocks). NaN is *not* checked here: the
/// comparison reports it against the stage that holds it.
pub fn read(path: &Path) -> Result<Dump> {
    read_npz(
        Npz::open_capped(path, "the dump", MAX_DUMP_FILE_BYTES)?,
        MAX_DUMP_BYTES,
    )
}

/// Largest dump file [`read`] opens: [`MAX_DUMP_BYTES`] of arrays plus 256 MiB for the archive's and the
/// arrays' headers.
pub const MAX_DUMP_FILE_BYTES: u64 = MAX_DUMP_BYTES + (256 << 20);

/// [`read`] on a dump held in memory, all arrays together within `max_bytes` of data (at most
/// [`MAX_DUMP_BYTES`]); `label` names it in errors (fuzzing and tests use small bounds).
pub fn read_bytes(bytes: Vec<u8>, label: &Path, max_bytes: u64) -> Result<Dump> {
    read_npz(
        Npz::from_bytes(bytes, label)?,
        max_bytes.min(MAX_DUMP_BYTES),
    )
}

fn read_npz(mut npz: Npz, max_bytes: u64) -> Result<Dump> {
    let path = npz.path().display().to_string();
    let names = npz.array_names()?;
    let mut budget = max_bytes;
    // every float array is float32 [T, D]; together they stay within MAX_DUMP_BYTES
    let mut float_2d = |npz: &mut Npz, name: &str| -> Result<Array2<f32>> {
        let raw = npz.read(name, budget)?;
        budget -= raw.data.len() as u64;
        if raw.dtype != Dtype::F32 || raw.shape.len() != 2 {
            bail!(
                "{path}: `{name}` is {} {:?}, the dump format says float32 [T, D]",
                raw.dtype,
                raw.shape
            );
        }
        raw.to_f32()
    };
    if npz.has("lockstep_dump_version") {
        let v = npz.read("lockstep_dump_version", 64)?;
        let v = v
            .to_i32()
            .with_context(|| format!("{path}: lockstep_dump_version"))?;
        if v.len() != 1 || v[(0, 0)] != DUMP_FORMAT_VERSION {
            bail!(
                "{path}: dump format version {:?}, this lockstep reads {DUMP_FORMAT_VERSION}",
                v.iter().collect::<Vec<_>>()
            );
        }
    }
    if !npz.has("tokens") {
        bail!("{path}: the dump has no `tokens` array");
    }
    let pooled = Stage::global(StageKind::Pooled).to_string();
    let encoder = !npz.has("logits");
    if encoder && !npz.has(&pooled) {
        bail!("{path}: the dump has no `logits` array (nor `{pooled}`, an encoder's output)");
    }
    let raw = npz.read("tokens", max_bytes)?;
    if raw.dtype != Dtype::I32 || raw.shape.len() != 1 {
        bail!(
            "{path}: `tokens` must be int32 [T], found {} {:?}",
            raw.dtype,
            raw.shape
        );
    }
    let tokens = raw
        .to_i32()?
        .iter()
        .map(|&x| {
            u32::try_from(x).map_err(|_| anyhow!("{path}: `tokens` holds a negative token id {x}"))
        })
        .collect::<Result<Vec<u32>>>()?;
    let t = tokens.len();
    let logits = if encoder {
        None
    } else {
        let logits = float_2d(&mut npz, "logits")?;
        if logits.nrows() != t || logits.ncols() == 0 {
            bail!(
                "{path}: `logits` is {:?}, expected [{t}, V] with V ≥ 1 (T from `tokens`)",
                logits.dim()
            );
        }
        Some(logits)
    };
    let mut stages = BTreeMap::new();
    for name in &names {
        if matches!(name.as_str(), "tokens" | "logits" | "lockstep_dump_version") {
            continue;
        }
        let arr = float_2d(&mut npz, name)?;
        if encoder && *name == pooled {
            if arr.nrows() != 1 || t == 0 {
                bail!(
                    "{path}: an encoder's `{name}` is {:?}, expected [1, D] (the last position's row)",
                    arr.dim()
                );
            }
        } else if arr.nrows() != t {
            bail!(
                "{path}: stage `{name}` has {} rows but `tokens` has {t}",
                arr.nrows()
            );
        }
        stages.insert(name.clone(), arr);
    }
    Ok(Dump {
        tokens,
        logits,
        stages,
    })
}
