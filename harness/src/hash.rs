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

/// The files of an HF checkpoint directory that [`sha256_hf_dir`] covers, sorted by name: `config.json`,
/// `tokenizer.json`, `model.safetensors.index.json` if present, and every `*.safetensors`.
///
/// Errors: the directory cannot be read; `config.json` or `tokenizer.json` is missing, or there is no
/// `*.safetensors` (each named, with the directory).
pub fn hf_dir_files(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| {
        format!(
            "{} cannot be read as an HF checkpoint directory",
            dir.display()
        )
    })? {
        let e = e.with_context(|| format!("reading {}", dir.display()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let wanted = matches!(
            name.as_str(),
            "config.json" | "tokenizer.json" | "model.safetensors.index.json"
        ) || name.ends_with(".safetensors");
        if wanted {
            names.push(name);
        }
    }
    names.sort();
    for required in ["config.json", "tokenizer.json"] {
        if !names.iter().any(|n| n == required) {
            anyhow::bail!(
                "{} is not an HF checkpoint directory: it has no {required}",
                dir.display()
            );
        }
    }
    if !names.iter().any(|n| n.ends_with(".safetensors")) {
        anyhow::bail!(
            "{} is not an HF checkpoint directory: it has no *.safetensors file",
            dir.display()
        );
    }
    Ok(names)
}

/// The digest of an HF checkpoint directory, lowercase hex: the sha256 of the text made of one line
/// `"<lowercase hex sha256 of the file>  <file name>\n"` (two spaces, `sha256sum`'s layout) per file of
/// [`hf_dir_files`], in that (sorted) order. Other files (README, generation_config.json) do not count.
///
/// Errors: as [`hf_dir_files`]; a file that cannot be read (named).
pub fn sha256_hf_dir(dir: &Path) -> Result<String> {
    let mut text = String::new();
    for name in hf_dir_files(dir)? {
        let sha = sha256_file(&dir.join(&name))?;
        text.push_str(&format!("{sha}  {name}\n"));
    }
    Ok(sha256_hex(text.as_bytes()))
}

/// sha256 of a model: [`sha256_hf_dir`] for a directory, else [`sha256_file`].
///
/// Errors: as those.
pub fn sha256_model(path: &Path) -> Result<String> {
    if path.is_dir() {
        sha256_hf_dir(path)
    } else {
        sha256_file(path)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn hf_dir_digest_is_sha256sum_of_the_sorted_files() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for (n, body) in [
            ("config.json", "{}"),
            ("tokenizer.json", "t"),
            ("model-00002-of-00002.safetensors", "b"),
            ("model-00001-of-00002.safetensors", "a"),
            ("model.safetensors.index.json", "i"),
            ("tokenizer_config.json", "not covered"),
            ("README.md", "not covered"),
        ] {
            std::fs::write(d.join(n), body).unwrap();
        }
        let h = |s: &str| super::sha256_hex(s.as_bytes());
        let text = format!(
            "{}  config.json\n{}  model-00001-of-00002.safetensors\n{}  model-00002-of-00002.safetensors\n{}  model.safetensors.index.json\n{}  tokenizer.json\n",
            h("{}"), h("a"), h("b"), h("i"), h("t")
        );
        assert_eq!(super::sha256_hf_dir(d).unwrap(), h(&text));
        assert_eq!(super::sha256_model(d).unwrap(), h(&text));
        let before = super::sha256_hf_dir(d).unwrap();
        std::fs::write(d.join("tokenizer_config.json"), "changed").unwrap();
        assert_eq!(super::sha256_hf_dir(d).unwrap(), before, "uncovered files");
        std::fs::write(d.join("model-00002-of-00002.safetensors"), "B").unwrap();
        assert_ne!(super::sha256_hf_dir(d).unwrap(), before, "a shard changed");
        std::fs::remove_file(d.join("config.json")).unwrap();
        let e = format!("{:#}", super::sha256_hf_dir(d).unwrap_err());
        assert!(e.contains("config.json"), "{e}");
    }

    #[test]
    fn hf_dir_digest_is_sha256sum_lines_of_the_checkpoint_files() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("config.json"), "{}").unwrap();
        let e = format!("{:#}", super::sha256_hf_dir(d).unwrap_err());
        assert!(e.contains("no tokenizer.json"), "{e}");
        std::fs::write(d.join("tokenizer.json"), "t").unwrap();
        let e = format!("{:#}", super::sha256_hf_dir(d).unwrap_err());
        assert!(e.contains("no *.safetensors"), "{e}");
        std::fs::write(d.join("model.safetensors"), "abc").unwrap();
        std::fs::write(d.join("README.md"), "not hashed").unwrap();
        let line = |s: &str, n: &str| format!("{}  {n}\n", super::sha256_hex(s.as_bytes()));
        let want = super::sha256_hex(
            format!(
                "{}{}{}",
                line("{}", "config.json"),
                line("abc", "model.safetensors"),
                line("t", "tokenizer.json")
            )
            .as_bytes(),
        );
        assert_eq!(super::sha256_hf_dir(d).unwrap(), want);
        // the committed porter fixtures: the digest make_checkpoint.py printed and models.toml records
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let olmo2 = root.join("oracles/porter/checkpoints/porter-olmo2");
        assert_eq!(
            super::sha256_hf_dir(&olmo2).unwrap(),
            "7717da008d4abf7ef07d2530432e545bed6e6ecc542f050d1f6a69e610814e7b"
        );
    }

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
