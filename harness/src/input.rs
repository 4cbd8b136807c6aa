//! Input files opened safely: every file lockstep reads that a user, a CI job or an external engine names
//! (a `report.json`, a cost table, a stage map, a dump an engine answers, an injected `value` array) goes
//! through [`open`] (or [`read`] / [`read_string`]), the counterpart of [`crate::output`]'s check of
//! result targets.
//!
//! The check: the path is a regular file (following symlinks) — not a FIFO, which would block the read
//! until a writer comes (past `--engine-timeout`, through SIGTERM), not a device (`/dev/zero` reads
//! forever), not a directory — and at most `max_bytes` long. The file is opened with `O_NONBLOCK` and
//! checked again on the open descriptor (`fstat`), so a FIFO swapped in between the two looks is refused
//! too instead of blocking; reads stop at `max_bytes + 1` bytes, so a file that grows after the check is
//! still bounded. Every error names the file and what it is for.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use anyhow::{bail, Context, Result};

/// Cap for a `report.json` (merge, gate, publish, a cost table): 256 MiB, ~100× the largest report a
/// full matrix writes (a few MB).
pub const MAX_REPORT_BYTES: u64 = 256 << 20;

/// Cap for small configuration files (stage maps, cost tables that are plain objects): 16 MiB.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// What kind of file system object `m` is, in words, for errors.
fn kind(m: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = m.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

fn check_meta(m: &std::fs::Metadata, path: &Path, what: &str, max_bytes: u64) -> Result<()> {
    if !m.is_file() {
        bail!(
            "{what} {}: is {}, not a regular file; lockstep reads inputs only from regular files",
            path.display(),
            kind(m)
        );
    }
    if m.len() > max_bytes {
        bail!(
            "{what} {}: is {} bytes; at most {max_bytes} are read",
            path.display(),
            m.len()
        );
    }
    Ok(())
}

/// Check `path` as an input without opening it: it exists, is a regular file (symlinks followed) and holds
/// at most `max_bytes`. Returns its size in bytes.
///
/// Errors, each naming `what` (e.g. "the stage map") and `path`: missing or unreadable; a directory,
/// FIFO, device or socket; larger than `max_bytes`.
pub fn check(path: &Path, what: &str, max_bytes: u64) -> Result<u64> {
    let m = std::fs::metadata(path).with_context(|| format!("{what} {}", path.display()))?;
    check_meta(&m, path, what, max_bytes)?;
    Ok(m.len())
}

/// Open `path` for reading after [`check`], without ever blocking on it: opened `O_NONBLOCK` and checked
/// again on the descriptor (a FIFO swapped in after the first look is refused, not waited on).
///
/// Errors: as [`check`], and the file cannot be opened (named).
pub fn open(path: &Path, what: &str, max_bytes: u64) -> Result<File> {
    check(path, what, max_bytes)?;
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut o, libc::O_NONBLOCK | libc::O_NOCTTY);
    let f = o
        .open(path)
        .with_context(|| format!("{what} {}: cannot be opened", path.display()))?;
    let m = f
        .metadata()
        .with_context(|| format!("{what} {}", path.display()))?;
    check_meta(&m, path, what, max_bytes)?;
    Ok(f)
}

/// The bytes of the input file `path` ([`open`]), at most `max_bytes` even if it grows while read.
///
/// Errors: as [`open`]; a read error; more than `max_bytes` bytes read (each naming `what` and `path`).
pub fn read(path: &Path, what: &str, max_bytes: u64) -> Result<Vec<u8>> {
    let f = open(path, what, max_bytes)?;
    let mut v = Vec::new();
    f.take(max_bytes.saturating_add(1))
        .read_to_end(&mut v)
        .with_context(|| format!("{what} {}: cannot be read", path.display()))?;
    if v.len() as u64 > max_bytes {
        bail!(
            "{what} {}: grew past {max_bytes} bytes while it was read",
            path.display()
        );
    }
    Ok(v)
}

/// [`read`] as UTF-8 text. Errors: as [`read`]; the file is not UTF-8 (named).
pub fn read_string(path: &Path, what: &str, max_bytes: u64) -> Result<String> {
    String::from_utf8(read(path, what, max_bytes)?)
        .map_err(|_| anyhow::anyhow!("{what} {}: is not UTF-8 text", path.display()))
}

/// Check that `path` may be appended to (the CI step summary, `$GITHUB_STEP_SUMMARY`): missing (it is
/// created), or a regular file — never a FIFO, which would block the append, nor a device or directory.
/// Returns the file opened for appending (`O_NONBLOCK`, checked again on the descriptor).
///
/// Errors, naming `what` and `path`: not a regular file; cannot be opened.
pub fn open_append(path: &Path, what: &str) -> Result<File> {
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => bail!(
            "{what} {}: is {}, not a regular file; lockstep appends only to regular files",
            path.display(),
            kind(&m)
        ),
        _ => {}
    }
    let mut o = std::fs::OpenOptions::new();
    o.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut o, libc::O_NONBLOCK | libc::O_NOCTTY);
    let f = o
        .open(path)
        .with_context(|| format!("{what} {}: cannot be opened", path.display()))?;
    let m = f
        .metadata()
        .with_context(|| format!("{what} {}", path.display()))?;
    if !m.is_file() {
        bail!(
            "{what} {}: is {}, not a regular file; lockstep appends only to regular files",
            path.display(),
            kind(&m)
        );
    }
    Ok(f)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn mkfifo(p: &Path) {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    #[test]
    fn fifos_devices_directories_and_oversized_files_are_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("report.json");
        mkfifo(&fifo);
        let t0 = std::time::Instant::now();
        let e = format!("{:#}", read(&fifo, "the report", 100).unwrap_err());
        assert!(e.contains("a FIFO") && e.contains("report.json"), "{e}");
        let e = format!("{:#}", open_append(&fifo, "the step summary").unwrap_err());
        assert!(e.contains("a FIFO"), "{e}");
        let e = format!(
            "{:#}",
            read(Path::new("/dev/zero"), "the cost table", 100).unwrap_err()
        );
        assert!(
            e.contains("character device") && e.contains("/dev/zero"),
            "{e}"
        );
        let e = format!("{:#}", read(dir.path(), "the map", 100).unwrap_err());
        assert!(e.contains("a directory"), "{e}");
        assert!(t0.elapsed() < std::time::Duration::from_secs(5));
        let big = dir.path().join("big.json");
        std::fs::write(&big, vec![b' '; 101]).unwrap();
        let e = format!("{:#}", read(&big, "the report", 100).unwrap_err());
        assert!(e.contains("101 bytes") && e.contains("at most 100"), "{e}");
        assert_eq!(read(&big, "the report", 101).unwrap().len(), 101);
        let e = format!(
            "{:#}",
            read(&dir.path().join("missing"), "the report", 100).unwrap_err()
        );
        assert!(e.contains("missing"), "{e}");
    }
}
