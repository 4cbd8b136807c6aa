//! Seeded models (models.toml `[[synth]]`): written by lockstep ([`crate::synth::synth_bytes`]) instead of
//! downloaded, checked against the registry's size and sha256 before they are put in place, and cached like a
//! downloaded model (`<cache>/models/<id>.gguf` and its `.sha256` sidecar).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::cache::{check_cached, remove_stale_temps, write_sidecar, FileStamp};
use super::{cache_dir, model_path, models_dir, sidecar_path, FetchOptions, CACHE_ENV};
use crate::registry::SynthEntry;

/// Makes the seeded model `entry` into [`cache_dir`] and returns `<cache>/models/<id>.gguf`. See
/// [`fetch_synth_into`].
///
/// Errors: as [`fetch_synth_into`]; no cache directory can be determined.
pub fn fetch_synth(entry: &SynthEntry, opts: &FetchOptions) -> Result<PathBuf> {
    fetch_synth_into(entry, &cache_dir()?, opts)
}

/// Makes sure `<cache_root>/models/<id>.gguf` ([`model_path`]) holds the seeded model `entry` and returns that
/// path. No pip is run.
///
/// The cache check is a downloaded model's ([`super::fetch_into`]): a file whose `.sha256` sidecar holds the
/// registry's hash and whose identity is the recorded one is used without rehashing (`opts.verify` rehashes
/// always); a file that fails the check is deleted and made again. A missing file is made in memory
/// ([`crate::synth::synth_bytes`] of `arch` and `seed`), its size and sha256 compared with the registry's,
/// and only then written: to a temporary file in `<cache_root>/models`, fsynced and renamed into place
/// (readers see no file or the whole verified file), followed by the sidecar.
///
/// Errors: the entry breaks a registry rule; the cache directory cannot be created or written (nothing is left
/// behind); lockstep cannot write the architecture; the bytes made are not the registered ones (the id, the
/// file and both sizes and hashes named; nothing is written to the cache).
pub fn fetch_synth_into(
    entry: &SynthEntry,
    cache_root: &Path,
    opts: &FetchOptions,
) -> Result<PathBuf> {
    entry.validate()?;
    let models_dir = models_dir(cache_root)?;
    let path = model_path(cache_root, &entry.id);
    let sidecar = sidecar_path(cache_root, &entry.id);
    // The cache functions read only id, size and sha256 of the entry; this one has no packages to download.
    let shim = entry.as_model_entry();
    if check_cached(&shim, &path, &sidecar, opts)? {
        return Ok(path);
    }
    remove_stale_temps(&models_dir);

    let bytes = crate::synth::synth_bytes(&entry.arch, entry.seed)
        .with_context(|| format!("cannot make the seeded model `{}`", entry.id))?;
    let got = crate::hash::sha256_hex(&bytes);
    if bytes.len() as u64 != entry.size || got != entry.sha256 {
        bail!(
            "sha256 mismatch for seeded model `{id}` ({arch}, seed {seed}), to be cached as {file}:\n  \
             expected {exp} ({size} bytes, models.toml)\n  got      {got} ({len} bytes, made by `{recipe}`)\n\
             Nothing was written to the cache. This lockstep writes other bytes than the ones registered: \
             fix models.toml's [[synth]] entry (if the seeded model changed on purpose) or the synth code.",
            id = entry.id,
            arch = entry.arch,
            seed = entry.seed,
            file = path.display(),
            exp = entry.sha256,
            size = entry.size,
            len = bytes.len(),
            recipe = entry.recipe(),
        );
    }
    let write_err = || {
        format!(
            "cannot write the seeded model `{}` into {} (is the disk full or read-only? set {CACHE_ENV} to \
             another directory)",
            entry.id,
            models_dir.display()
        )
    };
    // the partial-file prefix of a download, so a killed fetch's leftover is cleaned up the same way
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.gguf.partial-", entry.id))
        .tempfile_in(&models_dir)
        .with_context(write_err)?;
    tmp.write_all(&bytes)
        .and_then(|()| tmp.as_file().sync_all())
        .with_context(write_err)?;
    tmp.persist(&path)
        .map_err(|e| e.error)
        .with_context(|| format!("cannot move the verified model to {}", path.display()))?;
    let stamp = fs::metadata(&path).ok().and_then(|m| FileStamp::of(&m));
    write_sidecar(&sidecar, &models_dir, &shim, &got, stamp)?;
    Ok(path)
}
