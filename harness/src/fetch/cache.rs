//! The model cache: `<cache>/models/<id>.gguf` and its verified-hash sidecar, trusted without rehashing
//! while the file's identity ([`FileStamp`]) is the one recorded; stale temporaries removed.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use std::time::SystemTime;

use super::{bytes_bar, model_path, sidecar_path, write_error, FetchOptions, STALE_TEMP_AGE};
use crate::registry::ModelEntry;

/// The cached file of `entry` under `cache_root` if it is usable without rehashing: it exists with the
/// registry's size and its sidecar holds the registry's sha256.
pub fn cached(entry: &ModelEntry, cache_root: &Path) -> Option<PathBuf> {
    let path = model_path(cache_root, &entry.id);
    let meta = fs::metadata(&path).ok()?;
    let size_ok = meta.is_file() && meta.len() == entry.size;
    let sidecar = read_sidecar(&sidecar_path(cache_root, &entry.id))?;
    let ok = size_ok
        && sidecar.sha256 == entry.sha256
        && sidecar
            .stamp
            .is_some_and(|s| Some(s) == FileStamp::of(&meta));
    ok.then_some(path)
}

/// A file's identity when it was last verified: if any field differs now, its bytes may have changed
/// (a write updates ctime, which only the kernel sets), so it is rehashed before use. Unix only; elsewhere
/// [`FileStamp::of`] gives `None` and every use rehashes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStamp {
    /// Size in bytes.
    pub size: u64,
    /// Device id.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// Last modification, ns since the epoch.
    pub mtime_ns: i128,
    /// Last status change, ns since the epoch.
    pub ctime_ns: i128,
}

impl FileStamp {
    /// The stamp of a file's metadata (`None` off Unix).
    pub fn of(meta: &fs::Metadata) -> Option<FileStamp> {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            Some(FileStamp {
                size: meta.size(),
                dev: meta.dev(),
                ino: meta.ino(),
                mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
                ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
            })
        }
        #[cfg(not(unix))]
        {
            let _ = meta;
            None
        }
    }

    /// The sidecar's second line: `# lockstep verified: size=… dev=… ino=… mtime_ns=… ctime_ns=…`.
    pub(crate) fn line(&self) -> String {
        format!(
            "# lockstep verified: size={} dev={} ino={} mtime_ns={} ctime_ns={}",
            self.size, self.dev, self.ino, self.mtime_ns, self.ctime_ns
        )
    }

    fn parse(line: &str) -> Option<FileStamp> {
        let rest = line.trim().strip_prefix("# lockstep verified:")?;
        let mut f = std::collections::BTreeMap::new();
        for kv in rest.split_whitespace() {
            let (k, v) = kv.split_once('=')?;
            f.insert(k, v);
        }
        Some(FileStamp {
            size: f.get("size")?.parse().ok()?,
            dev: f.get("dev")?.parse().ok()?,
            ino: f.get("ino")?.parse().ok()?,
            mtime_ns: f.get("mtime_ns")?.parse().ok()?,
            ctime_ns: f.get("ctime_ns")?.parse().ok()?,
        })
    }
}

/// Decides whether the cached file can be used; removes it (and its sidecar) if it can't.
pub(crate) fn check_cached(
    entry: &ModelEntry,
    path: &Path,
    sidecar: &Path,
    opts: &FetchOptions,
) -> Result<bool> {
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => {
            return Err(e).with_context(|| format!("cannot read cached model {}", path.display()))
        }
    };
    if !meta.is_file() {
        bail!(
            "{} is in the way of the cached model and is not a file; remove it",
            path.display()
        );
    }
    if meta.len() == entry.size {
        let stamp = FileStamp::of(&meta);
        let recorded = read_sidecar(sidecar);
        let hash_ok = recorded.as_ref().is_some_and(|r| r.sha256 == entry.sha256);
        let unchanged = stamp.is_some() && recorded.as_ref().is_some_and(|r| r.stamp == stamp);
        if hash_ok && unchanged && !opts.verify {
            return Ok(true);
        }
        let got = hash_file(path, entry, opts)?;
        if got == entry.sha256 {
            if !(hash_ok && unchanged) {
                // the stamp is read again after hashing: the one the verified bytes had
                let after = fs::metadata(path).ok().and_then(|m| FileStamp::of(&m));
                write_sidecar(
                    sidecar,
                    path.parent().unwrap_or(Path::new(".")),
                    entry,
                    &got,
                    after.filter(|a| Some(*a) == stamp),
                )?;
            }
            return Ok(true);
        }
        eprintln!(
            "lockstep: cached model {} has sha256 {got}, but the registry says {}{}; deleting it and \
             fetching again",
            path.display(),
            entry.sha256,
            if hash_ok {
                " (it changed after it was verified)"
            } else {
                ""
            }
        );
    } else {
        eprintln!(
            "lockstep: cached {} has {} bytes, expected {}; deleting it and fetching again",
            path.display(),
            meta.len(),
            entry.size
        );
    }
    remove_if_exists(sidecar)?;
    remove_if_exists(path)?;
    Ok(false)
}

pub(crate) fn remove_if_exists(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => {
            Err(e).with_context(|| format!("cannot delete {}; delete it by hand", path.display()))
        }
    }
}

/// What a sidecar records: the verified hash and, from lockstep versions that write it, the file's stamp.
#[derive(Debug)]
pub(crate) struct Sidecar {
    /// The verified sha256, lowercase hex.
    pub(crate) sha256: String,
    /// The file's identity when it was verified.
    pub(crate) stamp: Option<FileStamp>,
}

/// The sidecar's record, if the sidecar exists and starts with 64 hex digits.
pub(crate) fn read_sidecar(path: &Path) -> Option<Sidecar> {
    let text = fs::read_to_string(path).ok()?;
    let hash = text.split_whitespace().next()?.to_ascii_lowercase();
    (hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit())).then(|| Sidecar {
        sha256: hash,
        stamp: text.lines().nth(1).and_then(FileStamp::parse),
    })
}

/// Writes the sidecar atomically (temporary file + rename).
pub(crate) fn write_sidecar(
    sidecar: &Path,
    models_dir: &Path,
    entry: &ModelEntry,
    digest: &str,
    stamp: Option<FileStamp>,
) -> Result<()> {
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.gguf.sha256.partial-", entry.id))
        .tempfile_in(models_dir)
        .map_err(|e| write_error(e, models_dir, entry, 0))?;
    let mut text = format!("{digest}  {}.gguf\n", entry.id);
    if let Some(st) = stamp {
        text.push_str(&st.line());
        text.push('\n');
    }
    tmp.write_all(text.as_bytes())
        .map_err(|e| write_error(e, models_dir, entry, 0))?;
    tmp.persist(sidecar)
        .map_err(|e| e.error)
        .with_context(|| format!("cannot write {}", sidecar.display()))?;
    Ok(())
}

/// Rehashes a cached file, with a bytes bar.
pub(crate) fn hash_file(path: &Path, entry: &ModelEntry, opts: &FetchOptions) -> Result<String> {
    let bar = bytes_bar(opts, entry.size, format!("verifying {}", entry.id));
    let digest = crate::hash::sha256_file_with(path, |n| bar.inc(n));
    bar.finish_and_clear();
    digest
}

/// Removes temporary entries left in `models_dir` by a fetch killed long ago. Best effort.
pub(crate) fn remove_stale_temps(models_dir: &Path) {
    let Ok(entries) = fs::read_dir(models_dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let is_temp =
            name.starts_with(".fetch-") || (name.starts_with('.') && name.contains(".partial-"));
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .is_some_and(|age| age > STALE_TEMP_AGE);
        if is_temp && old {
            let p = e.path();
            let _ = if p.is_dir() {
                fs::remove_dir_all(&p)
            } else {
                fs::remove_file(&p)
            };
        }
    }
}
