//! The base variant's logits, compact, and their cache file.
//!
//! File `<cache>/quality/base-<key>.bin`, `<key>` = the first 16 hex digits of sha256 over the corpus
//! sha256, the base file's sha256, `n_ctx`, `n_chunks`, the numerics mode, [`super::TOP_K`] and the number of
//! full-row chunks. Layout, little-endian:
//!
//! 1. magic `LSQBASE1`, then a u32 length and that many bytes of JSON: the [`BaseKey`];
//! 2. `n_chunks · n_ctx` u32: the chunks' tokens;
//! 3. per scored token (`n_chunks · (n_ctx − 1 − n_ctx/2)`): `top_k` × (u32 id, f32 ln p), f32 ln p(next
//!    token), f64 tail mass;
//! 4. the full ln p rows (f32 × n_vocab) of the first `full_kl_chunks` chunks' scored tokens.
//!
//! About `n_chunks · 255 · 580` bytes for `n_ctx` 512 (150 KB a chunk) plus 50 MB per full-row chunk of a
//! 49 152-token vocabulary. Written atomically (temporary file + rename); a file that does not parse or
//! whose key differs is ignored and recomputed.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

const MAGIC: &[u8; 8] = b"LSQBASE1";

/// What the cached base logits were computed from; the cache key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BaseKey {
    /// sha256 of the corpus file.
    pub corpus_sha256: String,
    /// sha256 of the base GGUF.
    pub base_sha256: String,
    /// The base GGUF's path when computed (informational; not part of the key).
    pub base_path: String,
    /// Tokens per chunk.
    pub n_ctx: usize,
    /// Chunks.
    pub n_chunks: usize,
    /// Numerics mode (`ggml` / `reference`).
    pub mode: String,
    /// Top-k stored per token.
    pub top_k: usize,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// Tokens of the whole corpus (informational).
    pub corpus_tokens: usize,
    /// Chunks whose full log-prob rows are stored.
    pub full_kl_chunks: usize,
}

impl BaseKey {
    /// The cache file name's key: 16 hex digits of sha256 over the fields that decide the contents.
    pub fn digest(&self) -> String {
        let s = format!(
            "{}|{}|{}|{}|{}|{}|{}",
            self.corpus_sha256,
            self.base_sha256,
            self.n_ctx,
            self.n_chunks,
            self.mode,
            self.top_k,
            self.full_kl_chunks
        );
        hex::encode(Sha256::digest(s.as_bytes()))[..16].to_string()
    }

    fn same_contents(&self, o: &BaseKey) -> bool {
        self.digest() == o.digest() && self.n_vocab == o.n_vocab
    }
}

/// One scored position of the base: top-k ids and ln p (probability descending), ln p(next token), tail
/// mass `1 − Σ_top p` (summed directly).
#[derive(Clone, Debug, PartialEq)]
pub struct BaseRow {
    /// Token ids of the top-k, most probable first.
    pub ids: Vec<u32>,
    /// Their ln p.
    pub logp: Vec<f32>,
    /// ln p of the token that actually follows.
    pub logp_next: f32,
    /// Probability of all ids outside the top-k.
    pub tail: f64,
}

/// The base's compact logits for a whole run.
#[derive(Clone, Debug, PartialEq)]
pub struct BaseLogits {
    /// What they were computed from.
    pub header: BaseKey,
    /// The chunks' tokens `[n_chunks · n_ctx]`.
    pub tokens: Vec<u32>,
    /// One per scored token, chunk by chunk.
    pub rows: Vec<BaseRow>,
    /// Full ln p rows of the first `full_kl_chunks` chunks `[chunks · scored · n_vocab]`.
    pub full: Vec<f32>,
}

impl BaseLogits {
    /// The full ln p rows of chunk `i` (`[scored · n_vocab]`), when stored.
    pub fn full_chunk(&self, i: usize) -> Option<&[f32]> {
        let h = &self.header;
        if i >= h.full_kl_chunks {
            return None;
        }
        let n = super::scored_per_chunk(h.n_ctx) * h.n_vocab;
        self.full.get(i * n..(i + 1) * n)
    }

    /// The cache file for `key` under `cache_root`.
    pub fn cache_path(cache_root: &Path, key: &BaseKey) -> PathBuf {
        cache_root
            .join("quality")
            .join(format!("base-{}.bin", key.digest()))
    }

    /// Writes the cache file atomically.
    ///
    /// Errors: the directory cannot be created or written (named).
    pub fn save(&self, path: &Path) -> Result<()> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let mut buf = Vec::with_capacity(64 + self.rows.len() * (8 * self.header.top_k + 12));
        buf.extend_from_slice(MAGIC);
        let h = serde_json::to_vec(&self.header)?;
        buf.extend_from_slice(&(h.len() as u32).to_le_bytes());
        buf.extend_from_slice(&h);
        for t in &self.tokens {
            buf.extend_from_slice(&t.to_le_bytes());
        }
        for r in &self.rows {
            for (id, lp) in r.ids.iter().zip(&r.logp) {
                buf.extend_from_slice(&id.to_le_bytes());
                buf.extend_from_slice(&lp.to_le_bytes());
            }
            buf.extend_from_slice(&r.logp_next.to_le_bytes());
            buf.extend_from_slice(&r.tail.to_le_bytes());
        }
        for x in &self.full {
            buf.extend_from_slice(&x.to_le_bytes());
        }
        let mut tmp = tempfile::Builder::new()
            .prefix(".base-partial-")
            .tempfile_in(dir)
            .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
        tmp.write_all(&buf)
            .and_then(|()| tmp.as_file().sync_all())
            .with_context(|| format!("cannot write {}", path.display()))?;
        tmp.persist(path)
            .map_err(|e| e.error)
            .with_context(|| format!("cannot move the base logits to {}", path.display()))?;
        Ok(())
    }

    /// Reads a cache file and checks it was computed for `key` (`Ok(None)` when it was not, or does not
    /// exist).
    ///
    /// Errors: a file that exists but is truncated or malformed (named; delete it to recompute).
    pub fn load(path: &Path, key: &BaseKey) -> Result<Option<BaseLogits>> {
        let mut f = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("cannot open {}", path.display())),
        };
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let bad = || {
            anyhow::anyhow!(
                "{} is not a complete base-logits cache file; delete it to recompute",
                path.display()
            )
        };
        let mut r = Reader { b: &bytes, at: 0 };
        if r.take(8).ok_or_else(bad)? != MAGIC {
            bail!(bad());
        }
        let n = r.u32().ok_or_else(bad)? as usize;
        let header: BaseKey =
            serde_json::from_slice(r.take(n).ok_or_else(bad)?).map_err(|_| bad())?;
        if !header.same_contents(key) {
            return Ok(None);
        }
        let h = &header;
        let n_tok = h.n_chunks * h.n_ctx;
        let per = super::scored_per_chunk(h.n_ctx);
        let n_rows = h.n_chunks * per;
        let n_full = h.full_kl_chunks * per * h.n_vocab;
        let need = n_tok * 4 + n_rows * (h.top_k * 8 + 12) + n_full * 4;
        if bytes.len() - r.at != need {
            bail!(bad());
        }
        let tokens = (0..n_tok).map(|_| r.u32().expect("sized")).collect();
        let rows = (0..n_rows)
            .map(|_| {
                let mut ids = Vec::with_capacity(h.top_k);
                let mut logp = Vec::with_capacity(h.top_k);
                for _ in 0..h.top_k {
                    ids.push(r.u32().expect("sized"));
                    logp.push(r.f32().expect("sized"));
                }
                BaseRow {
                    ids,
                    logp,
                    logp_next: r.f32().expect("sized"),
                    tail: f64::from_le_bytes(r.take(8).expect("sized").try_into().expect("8")),
                }
            })
            .collect();
        let full = (0..n_full).map(|_| r.f32().expect("sized")).collect();
        Ok(Some(BaseLogits {
            header,
            tokens,
            rows,
            full,
        }))
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn f32(&mut self) -> Option<f32> {
        Some(f32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_key_mismatch() {
        let key = BaseKey {
            corpus_sha256: "c".into(),
            base_sha256: "b".into(),
            base_path: "x.gguf".into(),
            n_ctx: 8,
            n_chunks: 1,
            mode: "ggml".into(),
            top_k: 2,
            n_vocab: 3,
            corpus_tokens: 20,
            full_kl_chunks: 1,
        };
        let per = crate::quality::scored_per_chunk(8);
        let b = BaseLogits {
            header: key.clone(),
            tokens: (0..8).collect(),
            rows: (0..per)
                .map(|i| BaseRow {
                    ids: vec![1, 2],
                    logp: vec![-0.5, -1.5],
                    logp_next: -(i as f32),
                    tail: 0.01,
                })
                .collect(),
            full: vec![-1.0; per * 3],
        };
        let dir = tempfile::tempdir().unwrap();
        let p = BaseLogits::cache_path(dir.path(), &key);
        b.save(&p).unwrap();
        assert_eq!(BaseLogits::load(&p, &key).unwrap().unwrap(), b);
        assert_eq!(b.full_chunk(0).unwrap().len(), per * 3);
        let other = BaseKey {
            n_chunks: 2,
            ..key.clone()
        };
        assert!(BaseLogits::load(&p, &other).unwrap().is_none());
        // truncated: a clear error naming the file
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 3]).unwrap();
        let e = BaseLogits::load(&p, &key).unwrap_err().to_string();
        assert!(e.contains("delete it"), "{e}");
    }
}
