//! Result files written safely: checked before any measuring, replaced atomically, never through a device
//! node or a symlink, with file names derived from user data bounded and sanitised.
//!
//! Every command that writes a result (reports, floors, bench and quality outputs, dumps) goes through
//! [`check_file_target`] or [`check_dir_target`] before it starts its work, so a bad `--out` fails in
//! milliseconds instead of after minutes of measuring, and through [`write_atomic`] at the end, so a crash
//! or a full disk leaves the previous file in place rather than half a file.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The longest file-name component [`file_stem`] produces, in bytes (Linux allows 255; room is left for a
/// suffix and an extension).
pub const MAX_STEM_BYTES: usize = 120;

/// The directory a file `path` is written in (`.` for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Check that `path` can receive a result file, before any work is done.
///
/// Accepted: a path that does not exist yet, or an existing regular file, in an existing writable
/// directory (checked by creating and removing a temporary file there).
///
/// Errors, each naming `path` and `what` (e.g. "--out"): the path is a symlink, a directory, a device, a
/// FIFO or a socket (they are never replaced: `/dev/full` stays a device); the directory is missing or not
/// writable.
pub fn check_file_target(path: &Path, what: &str) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => bail!(
            "{what} {}: is a symbolic link; give the path of the file itself (lockstep replaces its \
             output files atomically and would replace the link, not its target)",
            path.display()
        ),
        Ok(m) if m.is_dir() => bail!("{what} {}: is a directory, not a file", path.display()),
        Ok(m) if !m.is_file() => bail!(
            "{what} {}: is not a regular file (a device, FIFO or socket); lockstep writes results only \
             to regular files",
            path.display()
        ),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("{what} {}", path.display())),
    }
    check_writable_dir(parent_dir(path), what, path)
}

/// Check that `dir` can receive result files, before any work is done: it is created if missing (with
/// its parents), must be a real directory (not a symlink to one, not a file) and writable.
///
/// Errors name `dir` and `what` (e.g. "--reports").
pub fn check_dir_target(dir: &Path, what: &str) -> Result<()> {
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(m) if m.file_type().is_symlink() && dir.is_dir() => {}
        Ok(_) => bail!("{what} {}: exists and is not a directory", dir.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir_all(dir)
            .with_context(|| format!("{what} {}: cannot create the directory", dir.display()))?,
        Err(e) => return Err(e).with_context(|| format!("{what} {}", dir.display())),
    }
    check_writable_dir(dir, what, dir)
}

/// Check, before any work, that `dir` can receive result files later, creating nothing: an existing
/// directory (a symlink to one is followed) must be writable; a missing one must have a nearest existing
/// ancestor that is a writable directory (it is created when the files are written). For outputs
/// written after minutes of work or after another output (`synth --hf-out`, `export-hf --out`), so a bad
/// target fails first and leaves nothing behind.
///
/// Errors name `dir` and `what`: it (or an ancestor) is a file, a device, a FIFO or a socket; the
/// directory is not writable.
pub fn check_dir_target_uncreated(dir: &Path, what: &str) -> Result<()> {
    let mut at = dir;
    loop {
        match std::fs::metadata(at) {
            Ok(m) if m.is_dir() => return check_writable_dir(at, what, dir),
            Ok(m) => {
                let kind = if m.is_file() {
                    "a regular file"
                } else {
                    "a device, FIFO or socket"
                };
                if at == dir {
                    bail!(
                        "{what} {}: exists and is {kind}, not a directory; give a directory (it is \
                         created when missing)",
                        dir.display()
                    );
                }
                bail!(
                    "{what} {}: {} is {kind}, not a directory",
                    dir.display(),
                    at.display()
                );
            }
            // missing, or below a file (ENOTDIR): the ancestor says what is wrong
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                if std::fs::symlink_metadata(at).is_ok() {
                    bail!(
                        "{what} {}: {} is a symbolic link to nothing",
                        dir.display(),
                        at.display()
                    );
                }
                let up = parent_dir(at);
                if up == at {
                    bail!("{what} {}: no existing directory above it", dir.display());
                }
                at = up;
            }
            Err(e) => return Err(e).with_context(|| format!("{what} {}", dir.display())),
        }
    }
}

fn check_writable_dir(dir: &Path, what: &str, target: &Path) -> Result<()> {
    if !dir.is_dir() {
        bail!(
            "{what} {}: the directory {} does not exist",
            target.display(),
            dir.display()
        );
    }
    tempfile::NamedTempFile::new_in(dir)
        .map(drop)
        .with_context(|| {
            format!(
                "{what} {}: cannot write in the directory {}",
                target.display(),
                dir.display()
            )
        })
}

/// Write `bytes` to `path` atomically: a temporary file in the same directory, mode 0644, renamed over
/// `path` once complete. On any error the temporary file is removed and an existing `path` is untouched.
///
/// Errors (naming `path`): `path` is not a regular file or is a symlink ([`check_file_target`]), the
/// directory is not writable, the disk is full.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    check_file_target(path, "output")?;
    let dir = parent_dir(path);
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
    // removed by the interrupt handler too (a Ctrl-C while a large file is written)
    let registered = crate::process::register_temp(tmp.path());
    tmp.write_all(bytes)
        .and_then(|()| tmp.as_file().sync_all())
        .with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )?;
    registered
        .commit(|| tmp.persist(path))
        .with_context(|| format!("cannot move the new file into place at {}", path.display()))?;
    Ok(())
}

/// A file-name component made from user data (a model id, a quant name, a prompt id): ASCII letters,
/// digits, `.`, `-` and `_` are kept, every other character becomes `_`, a leading `.` becomes `_` (no
/// hidden files, no `..`), and the result is cut to [`MAX_STEM_BYTES`] with a 16-hex-digit hash of the
/// whole input appended when cut, so distinct long inputs keep distinct names. Never empty.
pub fn file_stem(raw: &str) -> String {
    let mut s: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.starts_with('.') {
        s.replace_range(0..1, "_");
    }
    if s.is_empty() {
        s.push('_');
    }
    if s.len() > MAX_STEM_BYTES {
        let digest = crate::hash::sha256_hex(raw.as_bytes());
        s.truncate(MAX_STEM_BYTES - 17);
        s.push('-');
        s.push_str(&digest[..16]);
    }
    s
}

/// `dir/<file_stem(stem)><suffix>`: a derived output path that is always one bounded, safe component.
pub fn derived_path(dir: &Path, stem: &str, suffix: &str) -> PathBuf {
    dir.join(format!("{}{suffix}", file_stem(stem)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_symlinks_and_directories_are_refused() {
        let e = check_file_target(Path::new("/dev/null"), "--out").unwrap_err();
        assert!(format!("{e:#}").contains("not a regular file"), "{e:#}");
        let dir = tempfile::tempdir().unwrap();
        let e = check_file_target(dir.path(), "--out").unwrap_err();
        assert!(format!("{e:#}").contains("is a directory"), "{e:#}");
        let real = dir.path().join("real.json");
        std::fs::write(&real, "{}").unwrap();
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let e = write_atomic(&link, b"new").unwrap_err();
        assert!(format!("{e:#}").contains("symbolic link"), "{e:#}");
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&real).unwrap(), b"{}");
        let missing = dir.path().join("no/such/dir/out.json");
        let e = check_file_target(&missing, "--out").unwrap_err();
        assert!(format!("{e:#}").contains("does not exist"), "{e:#}");
    }

    #[test]
    fn regular_files_are_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_file_target_in_a_file_is_refused_as_a_directory_target() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, "x").unwrap();
        let e = check_dir_target(&f, "--reports").unwrap_err();
        assert!(format!("{e:#}").contains("not a directory"), "{e:#}");
        check_dir_target(&dir.path().join("new/sub"), "--reports").unwrap();
    }

    #[test]
    fn stems_are_bounded_safe_and_distinct() {
        assert_eq!(file_stem("Q4_K_M"), "Q4_K_M");
        assert_eq!(file_stem("a/b|c\n<script>"), "a_b_c__script_");
        assert_eq!(file_stem(".."), "_.");
        assert_eq!(file_stem(""), "_");
        let a = file_stem(&"x".repeat(300));
        let b = file_stem(&format!("{}y", "x".repeat(299)));
        assert!(a.len() <= MAX_STEM_BYTES && b.len() <= MAX_STEM_BYTES);
        assert_ne!(a, b);
    }
}
