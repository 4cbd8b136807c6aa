//! The one sha256 helper for every file the harness verifies: goldens, the golden manifest, cached models,
//! the matrix and thresholds files a report records.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

/// sha256 of a file, lowercase hex. Errors name the file.
pub fn sha256_file(path: &Path) -> Result<String> {
    sha256_file_with(path, |_| {})
}

/// sha256 of bytes in memory, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// [`sha256_file`], calling `progress(n)` after each chunk of `n` bytes is hashed (for a progress bar).
pub fn sha256_file_with(path: &Path, mut progress: impl FnMut(u64)) -> Result<String> {
    let mut f = File::open(path).with_context(|| format!("{} cannot be opened", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("{} cannot be read", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        progress(n as u64);
    }
    Ok(hex::encode(h.finalize()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn known_digest_and_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("abc");
        std::fs::write(&p, "abc").unwrap();
        let mut seen = 0;
        assert_eq!(
            super::sha256_file_with(&p, |n| seen += n).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(seen, 3);
        let e = format!(
            "{:#}",
            super::sha256_file(&dir.path().join("nope")).unwrap_err()
        );
        assert!(e.contains("nope") && e.contains("cannot be opened"), "{e}");
    }
}
