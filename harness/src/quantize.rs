//! `lockstep quantize` and the in-process variant maker of `lockstep fetch`: llama-quantize's output,
//! byte for byte, without llama.cpp (the engine's [`lockstep_engine::quantize`]).
//!
//! Files are written atomically: into a temporary file in the target directory, fsynced, then renamed
//! over the target, so a reader sees no file or the whole file.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use lockstep_engine::gguf::GgufFile;
use lockstep_engine::quant::GgmlType;
use lockstep_engine::quantize::{self as q, FileType, QuantizeParams};

/// What one quantization made.
#[derive(Debug, Clone)]
pub struct Made {
    /// The file written.
    pub path: PathBuf,
    /// Its size in bytes.
    pub size: u64,
    /// Tensors per type, in order of first appearance.
    pub types: Vec<(GgmlType, usize)>,
    /// Tensors whose type the shape fallback changed.
    pub fallbacks: usize,
    /// Wall time.
    pub elapsed: Duration,
}

impl Made {
    /// `Q4_0 x181, Q2_K x30, F32 x61` (the notes style of models.toml).
    pub fn types_line(&self) -> String {
        self.types
            .iter()
            .map(|(t, n)| format!("{t} x{n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Quantizes the GGUF file `src` (already opened) with `params` into `out`, atomically.
///
/// Errors: the engine's plan errors (an unsupported type, a tensor that cannot be converted, …, naming
/// the source file); a temporary file that cannot be created in `out`'s directory, a write, fsync or
/// rename error (each naming the file); `out` is a symlink, a device, a FIFO or a directory
/// ([`crate::output::check_file_target`]: checked before any work, so `/dev/null` stays a device).
pub fn quantize_opened(src: &GgufFile, params: &QuantizeParams, out: &Path) -> Result<Made> {
    quantize_opened_with(src, params, out, crate::progress::Display::Hidden)
}

/// [`quantize_opened`], showing the bytes written as `display` says ([`crate::progress::byte_bar`]).
pub fn quantize_opened_with(
    src: &GgufFile,
    params: &QuantizeParams,
    out: &Path,
    display: crate::progress::Display,
) -> Result<Made> {
    crate::output::check_file_target(out, "quantize output")?;
    let t0 = Instant::now();
    let plan = q::plan(src, params).with_context(|| {
        format!(
            "cannot quantize {} to {}",
            src.path().display(),
            params.ftype
        )
    })?;
    let dir = match out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = out
        .file_name()
        .map_or_else(|| "out".into(), |n| n.to_string_lossy().into_owned());
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}.partial-"))
        .tempfile_in(&dir)
        .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
    // an interrupt (Ctrl-C, SIGTERM) removes the partial file too, not only an error return
    let registered = crate::process::register_temp(tmp.path());
    let file: &File = tmp.as_file();
    let bar = crate::progress::byte_bar(
        plan.file_size(),
        &format!("quantize {} to {}", src.path().display(), params.ftype),
        display,
    );
    let w = bar.wrap_write(BufWriter::with_capacity(8 << 20, file));
    let w = q::write(src, &plan, w, out).with_context(|| {
        format!(
            "cannot quantize {} to {} into {}",
            src.path().display(),
            params.ftype,
            out.display()
        )
    })?;
    drop(w);
    bar.finish_and_clear();
    file.sync_all()
        .with_context(|| format!("cannot write {}", out.display()))?;
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )?;
    crate::output::check_file_target(out, "quantize output")?;
    registered
        .commit(|| tmp.persist(out))
        .map_err(|e| e.error)
        .with_context(|| format!("cannot rename the finished file to {}", out.display()))?;
    Ok(Made {
        path: out.to_path_buf(),
        size: plan.file_size(),
        types: plan.type_counts(),
        fallbacks: plan.tensors.iter().filter(|t| t.fell_back).count(),
        elapsed: t0.elapsed(),
    })
}

/// Opens `src` and runs [`quantize_opened`].
///
/// Errors: `out` is `src` itself (the same file by any path: `../`, a hard link), which the rename
/// would replace; `src` is not a readable GGUF file (the engine's error names it and the problem); the
/// errors of [`quantize_opened`].
pub fn quantize_file(src: &Path, params: &QuantizeParams, out: &Path) -> Result<Made> {
    quantize_file_with(src, params, out, crate::progress::Display::Hidden)
}

/// [`quantize_file`], showing the bytes written as `display` says (`lockstep quantize`: a bar on a
/// terminal).
pub fn quantize_file_with(
    src: &Path,
    params: &QuantizeParams,
    out: &Path,
    display: crate::progress::Display,
) -> Result<Made> {
    refuse_same_file(src, out)?;
    let file =
        lockstep_engine::hf::open(src).with_context(|| format!("cannot read {}", src.display()))?;
    quantize_opened_with(&file, params, out, display)
}

/// Refuse an output that is the source model: the same device and inode (whatever the spelling of
/// the path), or the same canonical path. A missing `out` is never the source.
fn refuse_same_file(src: &Path, out: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let (Ok(a), Ok(b)) = (std::fs::metadata(src), std::fs::metadata(out)) else {
        return Ok(());
    };
    let same_canonical = matches!(
        (std::fs::canonicalize(src), std::fs::canonicalize(out)),
        (Ok(x), Ok(y)) if x == y
    );
    if (a.dev(), a.ino()) == (b.dev(), b.ino()) || same_canonical {
        anyhow::bail!(
            "--out {}: is the source model {} itself; quantizing into it would replace the model it \
             reads: give another output file",
            out.display(),
            src.display()
        );
    }
    Ok(())
}

/// The parameters of lockstep's variant recipe for a llama-quantize type name (`Q4_K`, `iq4_nl`, …):
/// an exact F32 dequantization, then `--pure` ([`QuantizeParams::variant`]).
///
/// Errors: a type lockstep does not make (the error lists the ones it does).
pub fn variant_params(type_name: &str) -> Result<QuantizeParams> {
    Ok(QuantizeParams::variant(FileType::parse(type_name)?))
}
