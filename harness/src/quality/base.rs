//! The base variant's logits, compact, and their cache file.
//!
//! **What is kept.** Per scored position (one logit row `[n_vocab]` of the base, predicting the next token),
//! every token whose log-probability is within [`Params::window`](super::Params) nats of the top one
//! (`l_j ≥ l_max − window` on the raw logits; at least the top token, at most `max_kept` tokens, the most
//! probable first), with its **raw f32 logit** as the engine produced it, plus three scalars of the whole
//! row: `lse = ln Σ_j exp(l_j − l_max)` (f64), the logit of the token that actually follows, and the **tail
//! mass** `Σ_{j not kept} p_j` (f64, summed directly, not as `1 − Σ kept`). A kept token's log-probability
//! is then `l_j − l_max − lse` exactly as computed from the full row (f64 arithmetic on the stored f32
//! logits), so the KLD's kept terms carry no storage error; only the grouping of the tail into one outcome
//! loses divergence (see [`super::score_row`]). llama.cpp `tools/perplexity/perplexity.cpp`
//! (`log_softmax(n_vocab, logits, log_prob, tok)`) instead stores every token as a 16-bit step over
//! `[max − 16, max]` and its `kl_divergence()` sums only tokens with `ln p_base > −16`.
//!
//! **File.** `<cache>/quality/base-<key>.bin`, `<key>` = the first 16 hex digits of sha256 over the format
//! version, the corpus sha256, the base file's sha256, `n_ctx`, `n_chunks`, the numerics mode, the window,
//! `max_kept` and the number of full-row chunks ([`BaseKey::digest`]). Layout, little-endian, format
//! [`FORMAT_VERSION`] 3:
//!
//! 1. magic `LSQBASE3` (`LSQBASE` + the version digit), a u32 length and that many bytes of JSON: the
//!    [`BaseKey`];
//! 2. `n_chunks · n_ctx` u32: the chunks' tokens (before the BOS substitution);
//! 3. per scored token (`n_chunks · (n_ctx − 1 − n_ctx/2)`, chunk by chunk): u32 `n_kept`, f64 `lse`, f64
//!    tail mass, f32 logit of the next token, then `n_kept` ids (u16 when `n_vocab ≤ 65 536`, else u32) and
//!    `n_kept` f32 logits, logit descending (lower id first on ties);
//! 4. the full raw logit rows (f32 × `n_vocab`) of the first `full_kl_chunks` chunks' scored tokens;
//! 5. 32 bytes: the sha256 of every byte before them (magic, header and body).
//!
//! Written atomically (inside a scratch directory next to it, removed on every exit path including an
//! interrupt, then renamed into place). [`BaseLogits::load`] streams the file, hashes it as it goes and
//! checks every field (sizes, ids inside the vocabulary, no id twice in a row, finite values, logits
//! descending and inside the window, the tail a probability, nothing after the end) and finally the
//! sha256: a truncated, hostile or silently corrupted file (a flipped bit in a value that is still in
//! range) is a [`DamagedCache`] error naming the file and what is wrong, never a panic and never wrong
//! figures. `lockstep quality` treats a damaged cache as a cache: it says so on stderr, discards it and
//! computes the base again. A file written for another key is ignored and recomputed the same way.

use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The cache file format this code writes and reads (the digit after `LSQBASE` in the magic).
pub const FORMAT_VERSION: u32 = 3;

const MAGIC_PREFIX: &[u8; 7] = b"LSQBASE";

/// Largest JSON header accepted when reading (a hostile length is refused before allocating).
const MAX_HEADER: usize = 1 << 20;

/// Largest vocabulary a cache header may declare (the largest real vocabularies hold ~260 000 tokens).
pub const MAX_VOCAB: usize = 1 << 24;

/// Bytes of the sha256 trailer.
const CHECKSUM_BYTES: u64 = 32;

/// A base-logits cache file that cannot be used: truncated, out of range, or not matching its sha256.
///
/// `lockstep quality` recomputes the base when it meets one (a cache holds nothing that cannot be
/// computed again); other I/O errors (no permission, a read error of the disk) are not this type and stop
/// the run.
#[derive(Debug, thiserror::Error)]
#[error("the base-logits cache {} is not usable: {what} (at byte {at} of {len})", path.display())]
pub struct DamagedCache {
    /// The file.
    pub path: PathBuf,
    /// What is wrong.
    pub what: String,
    /// Byte offset where it was found.
    pub at: u64,
    /// Bytes of the file.
    pub len: u64,
}

/// What the cached base logits were computed from; the cache key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
    /// Tokens within this many nats of the top one are kept per position.
    pub window: f64,
    /// At most this many tokens are kept per position (the most probable).
    pub max_kept: usize,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// Tokens of the whole corpus (informational).
    pub corpus_tokens: usize,
    /// Chunks whose full logit rows are stored.
    pub full_kl_chunks: usize,
}

impl BaseKey {
    /// The cache file name's key: 16 hex digits of sha256 over the format version and the fields that
    /// decide the contents.
    pub fn digest(&self) -> String {
        let s = format!(
            "v{FORMAT_VERSION}|{}|{}|{}|{}|{}|{:?}|{}|{}",
            self.corpus_sha256,
            self.base_sha256,
            self.n_ctx,
            self.n_chunks,
            self.mode,
            self.window,
            self.max_kept,
            self.full_kl_chunks
        );
        hex::encode(Sha256::digest(s.as_bytes()))[..16].to_string()
    }

    fn same_contents(&self, o: &BaseKey) -> bool {
        self.digest() == o.digest() && self.n_vocab == o.n_vocab
    }

    /// Bytes of one stored token id: 2 when every id fits a u16, else 4.
    pub fn id_bytes(&self) -> usize {
        if self.n_vocab <= 1 << 16 {
            2
        } else {
            4
        }
    }
}

/// One scored position of the base (see the [module docs](self)).
#[derive(Clone, Debug, PartialEq)]
pub struct BaseRow {
    /// The kept token ids, logit descending (lower id first on ties): `ids[0]` is the row's argmax.
    pub ids: Vec<u32>,
    /// Their raw logits (f32, as the engine produced them); `logits[0]` is the row's maximum.
    pub logits: Vec<f32>,
    /// `ln Σ_j exp(l_j − l_max)` over the whole row (f64).
    pub lse: f64,
    /// The raw logit of the token that actually follows.
    pub logit_next: f32,
    /// Probability of all ids not kept, summed directly in f64.
    pub tail: f64,
}

/// `max(row)` and `ln Σ exp(l − max)` in f64, and the first index of the max.
pub fn softmax_norm(row: &[f32]) -> (f32, f64, usize) {
    let mut max = row[0];
    let mut imax = 0;
    for (i, &x) in row.iter().enumerate().skip(1) {
        if x > max {
            max = x;
            imax = i;
        }
    }
    let sum: f64 = row
        .iter()
        .map(|&x| (f64::from(x) - f64::from(max)).exp())
        .sum();
    (max, sum.ln(), imax)
}

impl BaseRow {
    /// The record of one logit row `[n_vocab]` predicting `next`: every token with `l_j ≥ l_max − window`
    /// (at least one, at most `max_kept`, the most probable first), `lse`, the next token's logit and the
    /// tail mass.
    ///
    /// Panics on an empty row or `next` outside it (callers pass engine rows and corpus tokens checked
    /// against the vocabulary).
    pub fn from_logits(row: &[f32], next: u32, window: f64, max_kept: usize) -> BaseRow {
        let (max, lse, _) = softmax_norm(row);
        // the same test as the reader's check: max − l ≤ window, exact in f64 for f32 logits
        let m = f64::from(max);
        let mut idx: Vec<u32> = (0..row.len() as u32)
            .filter(|&j| m - f64::from(row[j as usize]) <= window)
            .collect();
        let cmp = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
        let k = max_kept.clamp(1, row.len());
        if idx.len() > k {
            idx.select_nth_unstable_by(k - 1, cmp);
            idx.truncate(k);
        }
        idx.sort_by(cmp);
        let mut kept = vec![false; row.len()];
        for &i in &idx {
            kept[i as usize] = true;
        }
        let tail: f64 = row
            .iter()
            .zip(&kept)
            .filter(|(_, &k)| !k)
            .map(|(&x, _)| (f64::from(x) - m - lse).exp())
            .sum();
        BaseRow {
            logits: idx.iter().map(|&i| row[i as usize]).collect(),
            ids: idx,
            lse,
            logit_next: row[next as usize],
            tail,
        }
    }

    /// ln p of a raw logit of this row: `l − l_max − lse` in f64.
    pub fn logp(&self, logit: f32) -> f64 {
        f64::from(logit) - f64::from(self.logits[0]) - self.lse
    }

    /// ln p of the token that actually follows.
    pub fn logp_next(&self) -> f64 {
        self.logp(self.logit_next)
    }

    /// The row's argmax (the first kept id).
    pub fn top(&self) -> u32 {
        self.ids[0]
    }
}

/// How much of the base the rows keep: for the report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeptSummary {
    /// Scored positions.
    pub rows: usize,
    /// Mean tokens kept per position.
    pub mean_kept: f64,
    /// Most tokens kept at one position.
    pub max_kept: usize,
    /// Positions that keep exactly `max_kept` tokens and leave a tail (the cap may have cut the window
    /// short there).
    pub capped_rows: usize,
    /// Mean tail mass.
    pub mean_tail: f64,
    /// Largest tail mass.
    pub max_tail: f64,
    /// Bytes of the cache file's row section (ids + logits + per-row scalars).
    pub row_bytes: u64,
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
    /// Full raw logit rows of the first `full_kl_chunks` chunks `[chunks · scored · n_vocab]`.
    pub full: Vec<f32>,
}

/// Per-row scalars in the file: u32 n_kept, f64 lse, f64 tail, f32 logit_next.
const ROW_HEAD: usize = 4 + 8 + 8 + 4;

impl BaseLogits {
    /// The full logit rows of chunk `i` (`[scored · n_vocab]`), when stored.
    pub fn full_chunk(&self, i: usize) -> Option<&[f32]> {
        let h = &self.header;
        if i >= h.full_kl_chunks {
            return None;
        }
        let n = super::scored_per_chunk(h.n_ctx) * h.n_vocab;
        self.full.get(i * n..(i + 1) * n)
    }

    /// How many tokens the rows keep, and the tail they leave.
    pub fn kept_summary(&self) -> KeptSummary {
        let n = self.rows.len();
        let kept: usize = self.rows.iter().map(|r| r.ids.len()).sum();
        KeptSummary {
            rows: n,
            mean_kept: kept as f64 / n.max(1) as f64,
            max_kept: self.rows.iter().map(|r| r.ids.len()).max().unwrap_or(0),
            capped_rows: self
                .rows
                .iter()
                .filter(|r| r.ids.len() == self.header.max_kept && r.tail > 0.0)
                .count(),
            mean_tail: self.rows.iter().map(|r| r.tail).sum::<f64>() / n.max(1) as f64,
            max_tail: self.rows.iter().map(|r| r.tail).fold(0.0, f64::max),
            row_bytes: (n * ROW_HEAD + kept * (self.header.id_bytes() + 4)) as u64,
        }
    }

    /// The cache file for `key` under `cache_root`.
    pub fn cache_path(cache_root: &Path, key: &BaseKey) -> PathBuf {
        cache_root
            .join("quality")
            .join(format!("base-{}.bin", key.digest()))
    }

    /// Writes the cache file atomically: streamed into a scratch directory next to `path` (removed on
    /// every exit path, an interrupt included), with the sha256 trailer, then renamed into place.
    ///
    /// Errors: the directory cannot be created or written (named).
    pub fn save(&self, path: &Path) -> Result<()> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let scratch = crate::process::ScratchGuard::new_in(dir, ".base-partial-")
            .with_context(|| format!("cannot create a temporary directory in {}", dir.display()))?;
        let tmp = scratch.path().join("base.bin");
        let wide = self.header.id_bytes() == 4;
        let write = |file: &std::fs::File| -> std::io::Result<()> {
            let mut w = HashWriter {
                w: BufWriter::with_capacity(1 << 20, file),
                h: Sha256::new(),
            };
            w.write_all(MAGIC_PREFIX)?;
            w.write_all(FORMAT_VERSION.to_string().as_bytes())?;
            let h = serde_json::to_vec(&self.header).map_err(std::io::Error::other)?;
            w.write_all(&(h.len() as u32).to_le_bytes())?;
            w.write_all(&h)?;
            for t in &self.tokens {
                w.write_all(&t.to_le_bytes())?;
            }
            for r in &self.rows {
                w.write_all(&(r.ids.len() as u32).to_le_bytes())?;
                w.write_all(&r.lse.to_le_bytes())?;
                w.write_all(&r.tail.to_le_bytes())?;
                w.write_all(&r.logit_next.to_le_bytes())?;
                for &id in &r.ids {
                    if wide {
                        w.write_all(&id.to_le_bytes())?;
                    } else {
                        w.write_all(&(id as u16).to_le_bytes())?;
                    }
                }
                for x in &r.logits {
                    w.write_all(&x.to_le_bytes())?;
                }
            }
            for x in &self.full {
                w.write_all(&x.to_le_bytes())?;
            }
            let digest = w.h.finalize();
            let mut inner = w.w;
            inner.write_all(&digest)?;
            inner.flush()?;
            drop(inner);
            file.sync_all()
        };
        std::fs::File::create(&tmp)
            .and_then(|f| write(&f))
            .with_context(|| format!("cannot write {}", path.display()))?;
        std::fs::rename(&tmp, path)
            .with_context(|| format!("cannot move the base logits to {}", path.display()))?;
        Ok(())
    }

    /// Reads a cache file and checks it was computed for `key` (`Ok(None)` when it was not, or does not
    /// exist).
    ///
    /// Errors: a [`DamagedCache`] (downcast the `anyhow::Error`) naming the file and what is wrong: not a
    /// lockstep base file; another format version; truncated (with the byte offset); any field out of
    /// range (a count of kept tokens of 0 or above `max_kept`/`n_vocab`, an id outside the vocabulary or
    /// twice in one row, a non-finite value, logits not descending or outside the window, a tail mass
    /// outside [0, 1], a token outside the vocabulary); bytes after the end; a sha256 that does not match
    /// the contents. Any other I/O error (named) is a plain error.
    pub fn load(path: &Path, key: &BaseKey) -> Result<Option<BaseLogits>> {
        let f = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("cannot open {}", path.display())),
        };
        let meta = f
            .metadata()
            .with_context(|| format!("cannot read {}", path.display()))?;
        if !meta.is_file() {
            return Err(DamagedCache {
                path: path.to_path_buf(),
                what: "it is not a regular file".into(),
                at: 0,
                len: 0,
            }
            .into());
        }
        read_cache(
            BufReader::with_capacity(1 << 20, f),
            meta.len(),
            path,
            Some(key),
        )
    }
}

/// Parses a whole base-logits cache file from its bytes (`path` only names it in errors), checking every
/// field and the sha256 trailer as [`BaseLogits::load`] does, for any key: the header's own sizes are
/// checked instead (`n_ctx ≥ 4`, `1 ≤ n_vocab ≤` [`MAX_VOCAB`], `max_kept ≥ 1`, a finite window ≥ 0,
/// `full_kl_chunks ≤ n_chunks`). Pure: no I/O. For fuzzing and tests.
///
/// Errors: a [`DamagedCache`], as [`BaseLogits::load`].
pub fn parse_base_logits(bytes: &[u8], path: &Path) -> Result<BaseLogits> {
    read_cache(bytes, bytes.len() as u64, path, None)?
        .ok_or_else(|| anyhow!("internal: a key-less read gave no result"))
}

/// A writer that hashes what it writes (the cache's sha256 trailer).
struct HashWriter<W: Write> {
    w: W,
    h: Sha256,
}

impl<W: Write> Write for HashWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.w.write(buf)?;
        self.h.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.w.flush()
    }
}

/// Reads a cache of `len` bytes from `src`; with `key`, `Ok(None)` when it was computed for another key.
fn read_cache<R: Read>(
    src: R,
    len: u64,
    path: &Path,
    key: Option<&BaseKey>,
) -> Result<Option<BaseLogits>> {
    let mut r = Reader {
        r: src,
        at: 0,
        len,
        path,
        h: Sha256::new(),
    };
    let magic = r.bytes(8, "the magic")?;
    if &magic[..7] != MAGIC_PREFIX {
        return Err(r.bad("it does not start with LSQBASE: not a lockstep base-logits file"));
    }
    if magic[7] != b'0' + FORMAT_VERSION as u8 {
        return Err(r.bad(&format!(
            "format version {:?}, this lockstep reads version {FORMAT_VERSION}",
            char::from(magic[7])
        )));
    }
    let n = r.u32("the header length")? as usize;
    if n > MAX_HEADER {
        return Err(r.bad(&format!("a header length of {n} bytes")));
    }
    let header: BaseKey = serde_json::from_slice(&r.bytes(n, "the header")?)
        .map_err(|e| r.bad(&format!("the JSON header does not parse ({e})")))?;
    if key.is_some_and(|k| !header.same_contents(k)) {
        return Ok(None);
    }
    let h = &header;
    let sane = h.n_ctx >= 4
        && (1..=MAX_VOCAB).contains(&h.n_vocab)
        && h.max_kept >= 1
        && h.window.is_finite()
        && h.window >= 0.0
        && h.full_kl_chunks <= h.n_chunks;
    if !sane {
        return Err(r.bad(&format!(
            "the header's settings are out of range (n_ctx {} ≥ 4, n_vocab {} in 1 ..= {MAX_VOCAB}, \
             max_kept {} ≥ 1, window {} finite ≥ 0, full_kl_chunks {} ≤ n_chunks {})",
            h.n_ctx, h.n_vocab, h.max_kept, h.window, h.full_kl_chunks, h.n_chunks
        )));
    }
    let per = super::scored_per_chunk(h.n_ctx);
    let n_tok = h.n_chunks.checked_mul(h.n_ctx);
    let n_rows = h.n_chunks.checked_mul(per);
    let n_full = h
        .full_kl_chunks
        .checked_mul(per)
        .and_then(|x| x.checked_mul(h.n_vocab));
    let (Some(n_tok), Some(n_rows), Some(n_full)) = (n_tok, n_rows, n_full) else {
        return Err(r.bad("the header's sizes overflow"));
    };
    // the least the rest can hold: tokens, one kept token per row, the full rows, the checksum
    let least = (n_tok as u64)
        .saturating_mul(4)
        .saturating_add((n_rows as u64).saturating_mul((ROW_HEAD + h.id_bytes() + 4) as u64))
        .saturating_add((n_full as u64).saturating_mul(4))
        .saturating_add(CHECKSUM_BYTES);
    if len.saturating_sub(r.at) < least {
        return Err(r.bad(&format!(
            "it is truncated: {} bytes after the header, at least {least} needed",
            len.saturating_sub(r.at)
        )));
    }
    let mut tokens = Vec::with_capacity(n_tok);
    for i in 0..n_tok {
        let t = r.u32("the tokens")?;
        if t as usize >= h.n_vocab {
            return Err(r.bad(&format!(
                "token {i} is {t}, outside the vocabulary of {}",
                h.n_vocab
            )));
        }
        tokens.push(t);
    }
    let cap = h.max_kept.min(h.n_vocab);
    let mut seen = Vec::new();
    let mut rows = Vec::with_capacity(n_rows);
    for i in 0..n_rows {
        let row = read_row(&mut r, h, cap, i, &mut seen)?;
        rows.push(row);
    }
    let mut full = Vec::with_capacity(n_full);
    for _ in 0..n_full {
        let x = r.f32("the full rows")?;
        if !x.is_finite() {
            return Err(r.bad("a non-finite logit in the full rows"));
        }
        full.push(x);
    }
    let data_end = len.saturating_sub(CHECKSUM_BYTES);
    if r.at > data_end {
        return Err(r.bad("it is truncated: the sha256 trailer is missing or cut short"));
    }
    if r.at < data_end {
        return Err(r.bad(&format!(
            "{} bytes after the end of the data",
            data_end.saturating_sub(r.at)
        )));
    }
    let digest = std::mem::take(&mut r.h).finalize();
    let stored = r.bytes(CHECKSUM_BYTES as usize, "the sha256 trailer")?;
    if stored[..] != digest[..] {
        return Err(r.bad(&format!(
            "its contents do not match their sha256 (stored {}, computed {}): the file was changed or \
             damaged after it was written",
            hex::encode(&stored),
            hex::encode(digest)
        )));
    }
    Ok(Some(BaseLogits {
        header,
        tokens,
        rows,
        full,
    }))
}

/// Reads and checks scored row `i` (`seen`: a per-id stamp of the last row that used the id, grown to
/// the largest id met).
fn read_row<R: Read>(
    r: &mut Reader<'_, R>,
    h: &BaseKey,
    cap: usize,
    i: usize,
    seen: &mut Vec<u32>,
) -> Result<BaseRow> {
    let what = format!("row {i}");
    let n = r.u32(&what)? as usize;
    if n == 0 || n > cap {
        return Err(r.bad(&format!("row {i} keeps {n} tokens (1 ..= {cap} allowed)")));
    }
    let lse = r.f64(&what)?;
    let tail = r.f64(&what)?;
    let logit_next = r.f32(&what)?;
    // lse ≥ 0: the sum includes exp(0) of the top token
    if !(lse.is_finite() && lse >= 0.0) {
        return Err(r.bad(&format!("row {i} has ln Σ exp = {lse}")));
    }
    if !(tail.is_finite() && (0.0..=1.0).contains(&tail)) {
        return Err(r.bad(&format!("row {i} has a tail mass of {tail}")));
    }
    let wide = h.id_bytes() == 4;
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        let id = if wide {
            r.u32(&what)?
        } else {
            u32::from(r.u16(&what)?)
        };
        if id as usize >= h.n_vocab {
            return Err(r.bad(&format!(
                "row {i} keeps id {id}, outside the vocabulary of {}",
                h.n_vocab
            )));
        }
        if seen.len() <= id as usize {
            seen.resize(id as usize + 1, u32::MAX);
        }
        if seen[id as usize] == i as u32 {
            return Err(r.bad(&format!("row {i} keeps id {id} twice")));
        }
        seen[id as usize] = i as u32;
        ids.push(id);
    }
    let mut logits = Vec::with_capacity(n);
    for _ in 0..n {
        logits.push(r.f32(&what)?);
    }
    let top = f64::from(logits[0]);
    let ok = logits.iter().all(|x| x.is_finite())
        && logits.windows(2).all(|w| w[0] >= w[1])
        && top - f64::from(logits[n - 1]) <= h.window
        && logit_next.is_finite()
        && f64::from(logit_next) <= top;
    if !ok {
        return Err(r.bad(&format!(
            "row {i}'s logits are not finite, descending, inside the window of {} nats and at least the \
             next token's",
            h.window
        )));
    }
    Ok(BaseRow {
        ids,
        logits,
        lse,
        logit_next,
        tail,
    })
}

/// A counted, hashing reader whose errors name the file.
struct Reader<'a, R: Read> {
    r: R,
    at: u64,
    len: u64,
    path: &'a Path,
    /// sha256 of every byte read so far (until the trailer is read).
    h: Sha256,
}

impl<R: Read> Reader<'_, R> {
    fn bad(&self, what: &str) -> anyhow::Error {
        DamagedCache {
            path: self.path.to_path_buf(),
            what: what.to_string(),
            at: self.at,
            len: self.len,
        }
        .into()
    }

    fn fill(&mut self, buf: &mut [u8], what: &str) -> Result<()> {
        match self.r.read_exact(buf) {
            Ok(()) => {
                self.at += buf.len() as u64;
                self.h.update(&*buf);
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                Err(self.bad(&format!("it is truncated in {what}")))
            }
            Err(e) => Err(e).with_context(|| format!("cannot read {}", self.path.display())),
        }
    }

    fn bytes(&mut self, n: usize, what: &str) -> Result<Vec<u8>> {
        if (n as u64) > self.len.saturating_sub(self.at) {
            return Err(self.bad(&format!("it is truncated in {what}")));
        }
        let mut b = vec![0; n];
        self.fill(&mut b, what)?;
        Ok(b)
    }

    fn u16(&mut self, what: &str) -> Result<u16> {
        let mut b = [0; 2];
        self.fill(&mut b, what)?;
        Ok(u16::from_le_bytes(b))
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        let mut b = [0; 4];
        self.fill(&mut b, what)?;
        Ok(u32::from_le_bytes(b))
    }

    fn f32(&mut self, what: &str) -> Result<f32> {
        let mut b = [0; 4];
        self.fill(&mut b, what)?;
        Ok(f32::from_le_bytes(b))
    }

    fn f64(&mut self, what: &str) -> Result<f64> {
        let mut b = [0; 8];
        self.fill(&mut b, what)?;
        Ok(f64::from_le_bytes(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n_vocab: usize) -> BaseKey {
        BaseKey {
            corpus_sha256: "c".into(),
            base_sha256: "b".into(),
            base_path: "x.gguf".into(),
            n_ctx: 8,
            n_chunks: 1,
            mode: "ggml".into(),
            window: 16.0,
            max_kept: 3,
            n_vocab,
            corpus_tokens: 20,
            full_kl_chunks: 1,
        }
    }

    fn sample(key: &BaseKey) -> BaseLogits {
        let per = crate::quality::scored_per_chunk(key.n_ctx);
        let v = key.n_vocab;
        let full: Vec<f32> = (0..per * v)
            .map(|j| ((j * 37 % 101) as f32) * 0.1 - 5.0)
            .collect();
        let rows = (0..per)
            .map(|i| BaseRow::from_logits(&full[i * v..(i + 1) * v], (i % v) as u32, 16.0, 3))
            .collect();
        BaseLogits {
            header: key.clone(),
            tokens: (0..8).map(|t| t % v as u32).collect(),
            rows,
            full,
        }
    }

    #[test]
    fn window_keeps_what_is_near_the_top_and_the_tail_sums_the_rest() {
        // logits 0, −1, −10, −20, −30: a window of 16 keeps the first three
        let row = [-10.0f32, 0.0, -30.0, -1.0, -20.0];
        let b = BaseRow::from_logits(&row, 4, 16.0, 100);
        assert_eq!(b.ids, vec![1, 3, 0]);
        assert_eq!(b.logits, vec![0.0, -1.0, -10.0]);
        let z: f64 = row.iter().map(|&x| f64::from(x).exp()).sum();
        assert!((b.lse - z.ln()).abs() < 1e-15);
        let tail = ((-20f64).exp() + (-30f64).exp()) / z;
        assert!((b.tail - tail).abs() < 1e-12 * tail, "{} {tail}", b.tail);
        assert!((b.logp_next() - (-20.0 - z.ln())).abs() < 1e-12);
        let mass: f64 = b.logits.iter().map(|&l| b.logp(l).exp()).sum::<f64>() + b.tail;
        assert!((mass - 1.0).abs() < 1e-15);
        // the cap keeps the most probable; at least the top one even with a zero window
        let c = BaseRow::from_logits(&row, 0, 16.0, 2);
        assert_eq!(c.ids, vec![1, 3]);
        let t = BaseRow::from_logits(&row, 0, 0.0, 100);
        assert_eq!(t.ids, vec![1]);
        assert_eq!(BaseRow::from_logits(&row, 0, 16.0, 0).ids, vec![1]);
        // ties: the lower id first (llama.cpp's argmax takes the first maximum)
        let tie = BaseRow::from_logits(&[1.0, 3.0, 3.0], 0, 16.0, 10);
        assert_eq!(tie.ids, vec![1, 2, 0]);
        assert_eq!(tie.top(), 1);
    }

    #[test]
    fn round_trip_key_mismatch_and_wide_ids() {
        for v in [5, 70_000] {
            let key = key(v);
            let b = sample(&key);
            let dir = tempfile::tempdir().unwrap();
            let p = BaseLogits::cache_path(dir.path(), &key);
            b.save(&p).unwrap();
            assert_eq!(BaseLogits::load(&p, &key).unwrap().unwrap(), b);
            let per = crate::quality::scored_per_chunk(8);
            assert_eq!(b.full_chunk(0).unwrap().len(), per * v);
            let s = b.kept_summary();
            assert_eq!(s.rows, per);
            let other = BaseKey {
                n_chunks: 2,
                ..key.clone()
            };
            assert!(BaseLogits::load(&p, &other).unwrap().is_none());
            let wider = BaseKey {
                window: 20.0,
                ..key.clone()
            };
            assert_ne!(wider.digest(), key.digest());
            assert!(BaseLogits::load(&p, &wider).unwrap().is_none());
        }
        assert!(
            BaseLogits::load(Path::new("/nonexistent/base.bin"), &key(5))
                .unwrap()
                .is_none()
        );
    }

    /// Every damaged file is an error naming it (never a panic, never a silent result).
    #[test]
    fn truncated_and_hostile_files_are_clear_errors() {
        let key = key(5);
        let b = sample(&key);
        let dir = tempfile::tempdir().unwrap();
        let p = BaseLogits::cache_path(dir.path(), &key);
        b.save(&p).unwrap();
        let good = std::fs::read(&p).unwrap();
        let load = |bytes: &[u8]| {
            std::fs::write(&p, bytes).unwrap();
            BaseLogits::load(&p, &key)
                .map(|_| ())
                .unwrap_err()
                .to_string()
        };
        let name = p.display().to_string();
        // every truncation
        for cut in 0..good.len() {
            let e = load(&good[..cut]);
            assert!(
                e.contains(&name) && e.contains("not usable"),
                "cut {cut}: {e}"
            );
        }
        // trailing bytes
        let mut long = good.clone();
        long.push(0);
        assert!(load(&long).contains("after the end"));
        // wrong magic, older version, absurd header length
        let mut m = good.clone();
        m[0] = b'X';
        assert!(load(&m).contains("not a lockstep base-logits file"));
        let mut old = good.clone();
        old[7] = b'1';
        assert!(load(&old).contains("format version '1'"));
        let mut hl = good.clone();
        hl[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(load(&hl).contains("header length"));
        // the first row, right after the header and the tokens
        let hlen = u32::from_le_bytes(good[8..12].try_into().unwrap()) as usize;
        let row0 = 12 + hlen + 8 * 4;
        let patch = |at: usize, bytes: &[u8]| {
            let mut x = good.clone();
            x[at..at + bytes.len()].copy_from_slice(bytes);
            load(&x)
        };
        assert!(patch(row0, &0u32.to_le_bytes()).contains("keeps 0 tokens"));
        assert!(patch(row0, &99u32.to_le_bytes()).contains("keeps 99 tokens"));
        assert!(patch(row0 + 4, &f64::NAN.to_le_bytes()).contains("ln Σ exp"));
        assert!(patch(row0 + 12, &2.0f64.to_le_bytes()).contains("tail mass"));
        assert!(patch(row0 + 12, &(-1e-3f64).to_le_bytes()).contains("tail mass"));
        let ids = row0 + ROW_HEAD;
        assert!(patch(ids, &7u16.to_le_bytes()).contains("outside the vocabulary"));
        let first = u16::from_le_bytes(good[ids..ids + 2].try_into().unwrap());
        assert!(patch(ids + 2, &first.to_le_bytes()).contains("twice"));
        let logits = ids + 3 * 2;
        assert!(patch(logits, &f32::INFINITY.to_le_bytes()).contains("descending"));
        assert!(patch(logits, &(-100.0f32).to_le_bytes()).contains("descending"));
        // a token outside the vocabulary
        assert!(patch(12 + hlen, &9u32.to_le_bytes()).contains("token 0 is 9"));
        // the header: not JSON
        assert!(patch(12, b"!").contains("does not parse"));
    }

    /// A value changed inside its valid range (a row's ln Σ exp, a full-row logit, a token of the text) is
    /// caught by the sha256 trailer: without it the run would score against wrong base figures.
    #[test]
    fn in_range_corruption_is_caught_by_the_checksum() {
        let key = key(5);
        let b = sample(&key);
        let dir = tempfile::tempdir().unwrap();
        let p = BaseLogits::cache_path(dir.path(), &key);
        b.save(&p).unwrap();
        let good = std::fs::read(&p).unwrap();
        assert_eq!(BaseLogits::load(&p, &key).unwrap().unwrap(), b);
        let hlen = u32::from_le_bytes(good[8..12].try_into().unwrap()) as usize;
        let row0 = 12 + hlen + 8 * 4;
        let full0 = good.len() - 32 - b.full.len() * 4;
        let cases: Vec<(usize, Vec<u8>)> = vec![
            // ln Σ exp of row 0: still finite and ≥ 0
            (row0 + 4, (b.rows[0].lse + 1.0).to_le_bytes().to_vec()),
            // the first full-row logit: still finite
            (full0, (b.full[0] + 0.5).to_le_bytes().to_vec()),
            // a token of the text: still inside the vocabulary
            (12 + hlen, ((b.tokens[0] + 1) % 5).to_le_bytes().to_vec()),
            // the trailer itself
            (good.len() - 1, vec![good[good.len() - 1] ^ 1]),
        ];
        for (at, bytes) in cases {
            let mut x = good.clone();
            x[at..at + bytes.len()].copy_from_slice(&bytes);
            assert_ne!(x, good);
            std::fs::write(&p, &x).unwrap();
            let e = BaseLogits::load(&p, &key).unwrap_err();
            let d = e.downcast_ref::<DamagedCache>().expect("a DamagedCache");
            assert_eq!(d.path, p);
            let m = e.to_string();
            assert!(
                m.contains("do not match their sha256") && m.contains(&p.display().to_string()),
                "byte {at}: {m}"
            );
            let e = parse_base_logits(&x, &p).unwrap_err().to_string();
            assert!(e.contains("sha256"), "byte {at}: {e}");
        }
    }

    /// The pure parser: the same file parses; every prefix and hostile headers are errors, not panics or
    /// huge allocations.
    #[test]
    fn the_pure_parser_refuses_hostile_headers() {
        let key = key(5);
        let b = sample(&key);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("b.bin");
        b.save(&p).unwrap();
        let good = std::fs::read(&p).unwrap();
        assert_eq!(parse_base_logits(&good, &p).unwrap(), b);
        for cut in 0..good.len() {
            assert!(parse_base_logits(&good[..cut], &p).is_err());
        }
        let with_header = |k: &BaseKey| {
            let h = serde_json::to_vec(k).unwrap();
            let mut x = b"LSQBASE3".to_vec();
            x.extend_from_slice(&(h.len() as u32).to_le_bytes());
            x.extend_from_slice(&h);
            x.extend_from_slice(&[0; 64]);
            parse_base_logits(&x, &p).unwrap_err().to_string()
        };
        for bad in [
            BaseKey {
                n_ctx: 0,
                ..key.clone()
            },
            BaseKey {
                n_vocab: usize::MAX,
                ..key.clone()
            },
            BaseKey {
                max_kept: 0,
                ..key.clone()
            },
            BaseKey {
                window: -1.0,
                ..key.clone()
            },
            BaseKey {
                full_kl_chunks: 9,
                ..key.clone()
            },
        ] {
            assert!(with_header(&bad).contains("out of range"), "{bad:?}");
        }
        let huge = BaseKey {
            n_chunks: usize::MAX / 2,
            full_kl_chunks: 0,
            ..key.clone()
        };
        let e = with_header(&huge);
        assert!(e.contains("overflow") || e.contains("truncated"), "{e}");
    }
}

#[cfg(test)]
mod seed_tests {
    /// The fuzz seed `harness/fuzz/seeds/quality_base_logits/tiny.bin` (written by
    /// `harness/fuzz/make_seeds.py`, which knows the format independently) reads back as written, and any
    /// one flipped byte is refused: the format and its checksum agree with a second writer.
    #[test]
    fn the_committed_fuzz_seed_reads_and_a_flipped_byte_is_refused() {
        let path = std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fuzz/seeds/quality_base_logits/tiny.bin"
        ));
        let bytes = std::fs::read(path).unwrap();
        let b = super::parse_base_logits(&bytes, path).unwrap();
        assert_eq!(b.tokens, [1, 5, 7, 2]);
        assert_eq!(b.rows.len(), 1);
        assert_eq!(b.rows[0].ids, [7, 2]);
        assert_eq!(b.full.len(), 8);
        for i in [0, 20, bytes.len() / 2, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(super::parse_base_logits(&bad, path).is_err(), "byte {i}");
        }
    }
}
