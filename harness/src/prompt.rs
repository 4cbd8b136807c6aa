//! Prompt text from a file (`--prompt-file`): UTF-8, bounded, read byte for byte.

use anyhow::{bail, Context, Result};

/// Largest `--prompt-file` read (1 MiB: ~250k tokens, far beyond every registered model's context).
pub const MAX_PROMPT_FILE_BYTES: u64 = 1 << 20;

/// Read a `--prompt-file`: UTF-8, at most [`MAX_PROMPT_FILE_BYTES`] (checked before reading).
///
/// Errors: missing or unreadable file, too large, not UTF-8 — each naming the file.
pub fn read_prompt_file(path: &std::path::Path) -> Result<String> {
    use std::io::Read as _;
    let f = std::fs::File::open(path)
        .with_context(|| format!("cannot open the prompt file {}", path.display()))?;
    let len = f
        .metadata()
        .with_context(|| format!("cannot read the prompt file {}", path.display()))?
        .len();
    let mut bytes = Vec::new();
    f.take(MAX_PROMPT_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read the prompt file {}", path.display()))?;
    if len > MAX_PROMPT_FILE_BYTES || bytes.len() as u64 > MAX_PROMPT_FILE_BYTES {
        bail!(
            "the prompt file {} is larger than {MAX_PROMPT_FILE_BYTES} bytes; a prompt that long exceeds \
             every model's context",
            path.display()
        );
    }
    String::from_utf8(bytes)
        .map_err(|e| anyhow::anyhow!("the prompt file {} is not UTF-8: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_utf8_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("p.txt");
        std::fs::write(&p, "héllo\r\n<|im_start|>").unwrap();
        assert_eq!(read_prompt_file(&p).unwrap(), "héllo\r\n<|im_start|>");
    }

    #[test]
    fn refuses_missing_large_and_non_utf8_files_naming_them() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.txt");
        let e = read_prompt_file(&missing).unwrap_err();
        assert!(format!("{e:#}").contains("missing.txt"), "{e:#}");
        let big = dir.path().join("big.txt");
        std::fs::write(&big, vec![b'a'; MAX_PROMPT_FILE_BYTES as usize + 1]).unwrap();
        let e = read_prompt_file(&big).unwrap_err();
        assert!(e.to_string().contains("larger than"), "{e}");
        let exact = dir.path().join("exact.txt");
        std::fs::write(&exact, vec![b'a'; MAX_PROMPT_FILE_BYTES as usize]).unwrap();
        assert_eq!(
            read_prompt_file(&exact).unwrap().len(),
            MAX_PROMPT_FILE_BYTES as usize
        );
        let bin = dir.path().join("bin.txt");
        std::fs::write(&bin, [0xff, 0xfe]).unwrap();
        let e = read_prompt_file(&bin).unwrap_err();
        assert!(e.to_string().contains("not UTF-8"), "{e}");
    }
}
