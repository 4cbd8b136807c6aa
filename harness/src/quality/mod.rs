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
//! The base's logits are computed once and cached compactly ([`base`]): per scored token every token whose
//! log-probability is within [`WINDOW`] nats of the top one (at least the top token, at most [`MAX_KEPT`])
//! with its raw f32 logit, `ln Σ exp(l − l_max)` of the whole row, the logit of the actual next token, and
//! the probability mass of the rest of the vocabulary (the tail). Each variant's full logit rows are then
//! scored against that: NLL, KLD, Δp, same top token ([`score_row`]), accumulated into llama.cpp's
//! statistics ([`stats`]).
//!
//! **KLD from the kept tokens + tail.** KL(P‖Q) ≈ Σ_{i kept} p_i ln(p_i/q_i) + p_tail ln(p_tail/q_tail),
//! with p_tail = Σ_{i not kept} p_i and q_tail = Σ_{i not kept} q_i (both summed directly in f64). The kept
//! terms are exact (the stored logits are the engine's own f32 values, their log-probs taken in f64);
//! grouping the tail into one outcome can only lose divergence (log-sum inequality): the loss is
//! p_tail · KL(P_tail/p_tail ‖ Q_tail/q_tail) ≥ 0, so this is a lower bound of the full KL. The gap is
//! measured against the full-row KL on the first `--full-kl-chunks` chunks (their full base rows are cached
//! too) and reported per variant, for the run's window and cap and for a few others ([`GAP_SETTINGS`]).
//! llama.cpp's own KLD is approximate in another way: it stores base log-probs as 16-bit steps over
//! [max − 16, max] (`log_softmax(n_vocab, logits, log_prob, tok)`) and sums only tokens with
//! ln p_base > −16 (`log_softmax(n_vocab, logits, base_log_prob, tok, kld)`), without a tail term.

pub mod base;
pub mod chunks;
pub mod corpus;
pub mod llama;
pub mod report;
pub mod select;
pub mod stats;

pub use self::chunks::{check_ctx, chunk_input, chunk_tokens, run_chunk, scored_per_chunk};
pub use self::corpus::{Corpus, MAX_CORPUS_BYTES};

pub use self::select::{files_for_types, types_in_dir, variant_label};

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use lockstep_engine::{Model, NumericsMode, Simd};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use self::base::{softmax_norm, BaseKey, BaseLogits, BaseRow, DamagedCache};
use self::report::QualityReport;
use self::stats::{KldAccumulator, QualityStats, TokenScore};

/// Tokens within this many nats of a position's top token are kept in the base cache, by default
/// (`--window`): the 16 nats of llama.cpp's own base file (`log_softmax` keeps `[max − 16, max]`).
pub const WINDOW: f64 = 16.0;

/// At most this many tokens are kept per position, by default (`--max-kept`): 16 384 × (u16 id + f32 logit)
/// = 96 KiB at worst per position, half a 49 152-token f32 row.
///
/// Measured (`lockstep quality --chunks 2 --full-kl-chunks 2`, SmolLM2-135M F32 base over alice29, 510
/// positions): a 16-nat window holds 11 800 of the 49 152 tokens on average (up to 31 600), so it is not
/// small; with this cap 10 500 are kept (134 positions at the cap), the tail mass is 2.2e-4 on average, and
/// the cached KLD is (3.5 ± 0.1)e-4 (relative) below the full-row KL for Q8_0, Q4_0 and Q2_K alike. The
/// gap by setting: top-1024 1.7e-2, 16 nats ≤ 4096 3.4e-3, ≤ 8192 1.1e-3, uncapped 2.6e-4, 20 nats 5.8e-6,
/// 24 nats 6.6e-8 (43 000 tokens kept: most of the row). A relative 1e-7 thus needs ~24 nats, i.e.
/// nearly the full rows; 3.5e-4 is two orders of magnitude below the statistical ± of the Mean KLD. The
/// whole alice29 run (81 chunks, 20 655 positions) keeps 10 177 tokens per position on average, 5 626
/// positions at the cap, mean tail mass 2.7e-4: a 1.3 GB cache file (llama-perplexity's: 2.0 GB).
pub const MAX_KEPT: usize = 16_384;

/// (window in nats, cap) settings whose KLD is compared with the full-row KL on the full-row chunks.
pub const GAP_SETTINGS: &[(f64, usize)] = &[
    (8.0, usize::MAX),
    (12.0, usize::MAX),
    (16.0, 1024),
    (16.0, 4096),
    (16.0, 8192),
    (16.0, usize::MAX),
    (20.0, usize::MAX),
    (24.0, usize::MAX),
];

/// The run's settings, shared by the base and every variant.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
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
    /// Chunks (from the first) whose full base rows are kept to measure the gap of the cached KLD.
    pub full_kl_chunks: usize,
    /// Base tokens within this many nats of a position's top token are stored ([`WINDOW`]).
    pub window: f64,
    /// At most this many base tokens are stored per position ([`MAX_KEPT`]).
    pub max_kept: usize,
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

/// Scores one variant row `q` (raw logits, `[n_vocab]`) predicting `next` against the base record `b`.
///
/// Returns the token's [`TokenScore`] — NLL of both, KLD from the kept tokens + tail (see the
/// [module docs](self)), Δp, same top token (argmax of `q`, first index on ties, against the base's) — and,
/// when the base's full raw logit row `[n_vocab]` is given, the full-row KL for the gap measurement. All
/// log-probabilities are taken in f64 from the f32 logits (llama.cpp's per-token `log_softmax(n_vocab,
/// logits, base_log_prob, tok, kld)` does the same sums in f32/f64 from its 16-bit base).
pub fn score_row(
    b: &BaseRow,
    q: &[f32],
    next: u32,
    full: Option<&[f32]>,
) -> (TokenScore, Option<f64>) {
    let (max, lse, imax) = softmax_norm(q);
    let (m, lse) = (f64::from(max), lse);
    let lq = |x: f32| f64::from(x) - m - lse;
    let mut kept = vec![false; q.len()];
    let mut kld = 0.0;
    for (&id, &l) in b.ids.iter().zip(&b.logits) {
        let lp = b.logp(l);
        kld += lp.exp() * (lp - lq(q[id as usize]));
        kept[id as usize] = true;
    }
    if b.tail > 0.0 {
        let q_tail: f64 = q
            .iter()
            .zip(&kept)
            .filter(|(_, &k)| !k)
            .map(|(&x, _)| lq(x).exp())
            .sum();
        kld += b.tail * (b.tail / q_tail.max(f64::MIN_POSITIVE)).ln();
    }
    let nll = -lq(q[next as usize]);
    let nll_base = -b.logp_next();
    let full_kl = full.map(|p| {
        let (pm, plse, _) = softmax_norm(p);
        let (pm, plse) = (f64::from(pm), plse);
        p.iter()
            .zip(q)
            .map(|(&lp, &l)| {
                let lp = f64::from(lp) - pm - plse;
                lp.exp() * (lp - lq(l))
            })
            .sum()
    });
    (
        TokenScore {
            nll,
            nll_base,
            kld,
            p_diff: (-nll).exp() - (-nll_base).exp(),
            same_top: b.top() as usize == imax,
        },
        full_kl,
    )
}

/// The gap of the cached (kept + tail) KLD to the full-row KL on the first chunks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KlGap {
    /// Tokens compared.
    pub count: usize,
    /// Mean full-row KL (nats).
    pub mean_full: f64,
    /// Mean kept + tail KLD on the same tokens, with the run's window and cap.
    pub mean_kept: f64,
    /// Largest per-token gap full − kept (≥ 0 up to rounding).
    pub max_gap: f64,
    /// The mean kept + tail KLD on the same tokens for other settings ([`GAP_SETTINGS`]).
    pub by_setting: Vec<GapAt>,
}

/// The mean cached KLD with one (window, cap) setting.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GapAt {
    /// Window in nats.
    pub window: f64,
    /// Cap on kept tokens (`None` = no cap).
    pub max_kept: Option<usize>,
    /// Mean kept + tail KLD.
    pub mean_kld: f64,
    /// Mean tokens kept per position.
    pub mean_kept: f64,
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
    /// The cached KLD's gap on the first chunks, when measured.
    pub kl_gap: Option<KlGap>,
    /// Why the variant has no statistics (an unsupported weight type, a vocabulary mismatch, ...).
    pub error: Option<String>,
    /// Wall time of this variant's chunks.
    pub seconds: f64,
}

/// Size and llama.cpp-style bits per weight of a GGUF file (None where unreadable).
fn size_and_bpw(path: &Path) -> (Option<u64>, Option<f64>) {
    let size = std::fs::metadata(path).ok().map(|m| m.len());
    let bpw = lockstep_engine::hf::open(path)
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
    crate::session::require_logits(&model, "quality")?;
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
    let mut by_setting = vec![(0.0f64, 0.0f64); GAP_SETTINGS.len()];
    for i in 0..params.n_chunks {
        let rows = run_chunk(&model, &tokens, i, params)
            .with_context(|| format!("{}: chunk {i}", path.display()))?;
        let full = base.full_chunk(i);
        // per token: its score, the full-row KL and (KLD, tokens kept) at each of GAP_SETTINGS
        type Scored = (TokenScore, Option<f64>, Vec<(f64, f64)>);
        let scored: Vec<Scored> = (0..per)
            .into_par_iter()
            .map(|r| {
                let next = tokens[i * n_ctx + first + r + 1];
                let q = &rows[r * v..(r + 1) * v];
                let f = full.map(|f| &f[r * v..(r + 1) * v]);
                let (t, fk) = score_row(&base.rows[i * per + r], q, next, f);
                let ks = f.map_or_else(Vec::new, |f| {
                    GAP_SETTINGS
                        .iter()
                        .map(|&(w, k)| {
                            let b = BaseRow::from_logits(f, next, w, k);
                            (score_row(&b, q, next, None).0.kld, b.ids.len() as f64)
                        })
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
                for (a, (k, n)) in by_setting.iter_mut().zip(ks) {
                    a.0 += k;
                    a.1 += n;
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
        mean_kept: gap.2 / gap.0 as f64,
        max_gap: gap.3,
        by_setting: GAP_SETTINGS
            .iter()
            .zip(&by_setting)
            .map(|(&(window, k), s)| GapAt {
                window,
                max_kept: (k != usize::MAX).then_some(k),
                mean_kld: s.0 / gap.0 as f64,
                mean_kept: s.1 / gap.0 as f64,
            })
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
    crate::session::require_logits(&model, "quality")?;
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
        let chunk_rows: Vec<BaseRow> = (0..per)
            .into_par_iter()
            .map(|r| {
                let next = tokens[i * n_ctx + first + r + 1];
                BaseRow::from_logits(
                    &logits[r * v..(r + 1) * v],
                    next,
                    params.window,
                    params.max_kept,
                )
            })
            .collect();
        rows.extend(chunk_rows);
        if keep_full {
            full.extend_from_slice(&logits);
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
            window: params.window,
            max_kept: params.max_kept,
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
    /// Labels of the variants to cross-check (each must be a variant of the run).
    pub check_types: Vec<String>,
    /// Time one llama-perplexity run may take before its process group is killed.
    pub llama_timeout: std::time::Duration,
}

/// Checks every option that can be checked without loading a model, before anything is measured: the
/// window and cap, `--ctx ≥ 4`, the report and cache directories (created if missing, writable: a bad
/// `--reports` fails in milliseconds, not after the scoring), the base and every variant a regular
/// file, the llama-perplexity binary an executable file, every `--check-types` label a variant of the
/// run.
///
/// Errors: the first bad option, named with what is wrong.
pub fn validate(opts: &QualityOptions) -> Result<()> {
    let w = opts.params.window;
    if !(w.is_finite() && w >= 0.0) {
        bail!("--window {w}: give a finite number of nats ≥ 0");
    }
    if opts.params.max_kept == 0 {
        bail!("--max-kept 0: at least the top token is kept");
    }
    if opts.params.n_ctx < 4 {
        bail!("--ctx {} is too small (at least 4)", opts.params.n_ctx);
    }
    crate::output::check_dir_target(&opts.reports_root, "--reports")?;
    crate::output::check_dir_target(
        &opts.cache_root.join("quality"),
        "the base-logits cache directory",
    )?;
    if !opts.base.is_file() {
        bail!(
            "the base model {} does not exist or is not a regular file",
            opts.base.display()
        );
    }
    if opts.variants.is_empty() {
        bail!("no variants to score");
    }
    for v in &opts.variants {
        if !v.is_file() {
            bail!(
                "the variant {} does not exist or is not a regular file",
                v.display()
            );
        }
    }
    if let Some(bin) = &opts.llama_perplexity {
        let exec = std::fs::metadata(bin).is_ok_and(|m| {
            m.is_file() && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
        });
        if !exec {
            bail!(
                "--check-llama-perplexity {}: not an executable file",
                bin.display()
            );
        }
        let labels: Vec<String> = opts.variants.iter().map(|v| variant_label(v)).collect();
        for t in &opts.check_types {
            if !labels.iter().any(|l| l.eq_ignore_ascii_case(t)) {
                bail!(
                    "--check-types {t}: no variant of this run is labelled {t}; the run's variants: {}",
                    labels.join(", ")
                );
            }
        }
    }
    Ok(())
}

/// Runs the whole command: corpus, base (cached), every variant (an error stays in its row), the optional
/// llama-perplexity cross-check; writes the report atomically and returns it with its directory.
///
/// Every option is checked first ([`validate`]), then the corpus is read and `--ctx` checked against the
/// base's context, all before anything is measured. A base-logits cache found damaged ([`DamagedCache`]:
/// truncated, out of range, not matching its sha256) is reported through `log`, discarded and computed
/// again. The llama-perplexity runs are bounded by `llama_timeout`, each in its own process group (killed
/// with its helpers on Ctrl-C / SIGTERM), their files in a scratch directory removed on every exit path.
///
/// Errors: [`validate`]'s, the corpus, the base (missing file, engine failure, non-finite logits), the
/// cache or the report directory. A variant's failure is not an error of the run (its row holds it; the
/// caller decides what a run where every variant failed means — `lockstep quality` exits 2).
pub fn run(opts: &QualityOptions, log: &mut dyn FnMut(&str)) -> Result<(QualityReport, PathBuf)> {
    validate(opts)?;
    let corpus = Corpus::resolve(&opts.corpus)?;
    let base_sha256 = crate::hash::sha256_model(&opts.base)
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
        window: params.window,
        max_kept: params.max_kept,
        n_vocab,
        corpus_tokens: n_tokens,
        full_kl_chunks: params.full_kl_chunks,
    };
    let cache = BaseLogits::cache_path(&opts.cache_root, &key);
    let t0 = Instant::now();
    let cached = match BaseLogits::load(&cache, &key) {
        Ok(c) => c,
        Err(e) if e.downcast_ref::<DamagedCache>().is_some() => {
            log(&format!(
                "base: {e:#}; discarding it and computing the base again"
            ));
            None
        }
        Err(e) => return Err(e),
    };
    let (base, base_seconds) = match cached {
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
    let base_kept = base.kept_summary();
    log(&format!(
        "base: {:.0} tokens kept per position on average (window {} nats, cap {}: {} of {} positions at \
         the cap), mean tail mass {:.3e}",
        base_kept.mean_kept,
        params.window,
        params.max_kept,
        base_kept.capped_rows,
        base_kept.rows,
        base_kept.mean_tail
    ));
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
    let mut llama_base = None;
    if let Some(bin) = &opts.llama_perplexity {
        // removed when dropped, on an error return, and by the interrupt handler
        let dir =
            crate::process::ScratchGuard::new_in(&opts.cache_root.join("quality"), ".llama-kld-")
                .context("creating a directory for llama-perplexity's base log-probs")?;
        let lr = llama::LlamaRun {
            bin: bin.clone(),
            corpus: corpus.path.clone(),
            n_ctx: params.n_ctx,
            n_chunks: params.n_chunks,
            threads: opts.threads,
            timeout: opts.llama_timeout,
            scratch: dir.path().to_path_buf(),
        };
        let logits = dir.path().join("base.kld");
        log("llama-perplexity: saving the base log-probs");
        let saved = lr.save_base(&opts.base, &logits);
        match &saved {
            Ok(inv) => log(&format!(
                "llama-perplexity: {} ({:.0} s)",
                inv.command, inv.seconds
            )),
            Err(e) => log(&format!("llama-perplexity: base failed: {e:#}")),
        }
        for t in &opts.check_types {
            // validate() checked every label against the variants
            let Some(v) = variants.iter().find(|v| v.label.eq_ignore_ascii_case(t)) else {
                continue;
            };
            log(&format!("llama-perplexity: --kl-divergence {}", v.label));
            let res = match &saved {
                Ok(_) => lr
                    .kl_divergence(&v.path, &logits)
                    .map(|(f, _, inv)| (f, inv)),
                Err(e) => Err(anyhow::anyhow!("{e:#}")),
            };
            let ours = v.stats.as_ref();
            cross_check.push(match res {
                Ok((f, inv)) => {
                    log(&format!(
                        "llama-perplexity: {} ({:.0} s)",
                        inv.command, inv.seconds
                    ));
                    let mut side = |name: &str, o: Option<stats::Unc>, l: Option<stats::Unc>| {
                        if let (Some(o), Some(l)) = (o, l) {
                            log(&format!(
                                "{}: {name} lockstep {:.6} ± {:.6}, llama.cpp {:.6} ± {:.6}: {}",
                                v.label,
                                o.value,
                                o.unc,
                                l.value,
                                l.unc,
                                if (o.value - l.value).abs() <= l.unc {
                                    "within llama's ±"
                                } else {
                                    "OUTSIDE llama's ±"
                                }
                            ));
                        }
                    };
                    side("Mean KLD", ours.map(|o| o.kld), f.kld);
                    side("Same top p", ours.map(|o| o.same_top_p), f.same_top_p);
                    report::CrossCheck {
                        label: v.label.clone(),
                        kld_within: ours
                            .zip(f.kld)
                            .map(|(o, t)| (o.kld.value - t.value).abs() <= t.unc),
                        same_top_within: ours
                            .zip(f.same_top_p)
                            .map(|(o, t)| (o.same_top_p.value - t.value).abs() <= t.unc),
                        llama: Some(f),
                        error: None,
                        invocation: Some(inv),
                    }
                }
                Err(e) => report::CrossCheck {
                    label: v.label.clone(),
                    llama: None,
                    error: Some(format!("{e:#}")),
                    kld_within: None,
                    same_top_within: None,
                    invocation: None,
                },
            });
        }
        llama_base = saved.ok();
    }
    let report = QualityReport {
        schema_version: report::QUALITY_SCHEMA_VERSION,
        run_id: crate::report::new_run_id(),
        environment: crate::report::Environment::detect(opts.threads, &opts.golden_manifest),
        corpus_tokens: n_tokens,
        corpus,
        params,
        scored_per_chunk: scored_per_chunk(params.n_ctx),
        models: vec![report::ModelTable {
            model: model_name,
            base_path: opts.base.clone(),
            base_sha256,
            base_cache_bytes: std::fs::metadata(&cache).ok().map(|m| m.len()),
            base_cache: cache,
            base_seconds,
            base_kept,
            variants,
        }],
        cross_check,
        llama_base,
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

    fn full_kl(p: &[f32], q: &[f32]) -> f64 {
        let (pm, pl, _) = softmax_norm(p);
        let (qm, ql, _) = softmax_norm(q);
        p.iter()
            .zip(q)
            .map(|(&a, &b)| {
                let lp = f64::from(a) - f64::from(pm) - pl;
                lp.exp() * (lp - (f64::from(b) - f64::from(qm) - ql))
            })
            .sum()
    }

    #[test]
    fn windowed_kld_is_a_lower_bound_and_exact_on_itself() {
        let v = 300;
        let p = logits(v, 1);
        let q: Vec<f32> = p
            .iter()
            .zip(logits(v, 2))
            .map(|(a, b)| a + 0.3 * b)
            .collect();
        // logits spread over 10 nats: a 4-nat window keeps part of the row
        let b = BaseRow::from_logits(&p, 7, 4.0, usize::MAX);
        assert!(b.ids.len() > 1 && b.ids.len() < v && b.tail > 0.0);
        assert!(b.logits.windows(2).all(|w| w[0] >= w[1]));
        let mass: f64 = b.logits.iter().map(|&l| b.logp(l).exp()).sum::<f64>() + b.tail;
        assert!((mass - 1.0).abs() < 1e-12, "{mass}");
        let (t, f) = score_row(&b, &q, 7, Some(&p));
        let f = f.unwrap();
        assert!((f - full_kl(&p, &q)).abs() < 1e-15);
        assert!(t.kld <= f + 1e-12 && t.kld > 0.0, "{} {f}", t.kld);
        // a wider window is closer
        let wide = BaseRow::from_logits(&p, 7, 8.0, usize::MAX);
        let tw = score_row(&wide, &q, 7, None).0;
        assert!(tw.kld >= t.kld - 1e-15 && tw.kld <= f + 1e-12);
        // Q = P: zero divergence, same top, zero Δp
        let (t0, f0) = score_row(&b, &p, 7, Some(&p));
        assert!(t0.kld.abs() < 1e-12 && f0.unwrap().abs() < 1e-12);
        assert!(t0.same_top && t0.p_diff.abs() < 1e-12);
        assert!((t0.nll - t0.nll_base).abs() < 1e-12);
    }

    /// The window covering the whole row: the KLD is the full-row KL to f64 rounding, ~1e-16 relative.
    #[test]
    fn a_window_covering_the_vocabulary_is_exact() {
        let v = 100;
        let p = logits(v, 3);
        let q = logits(v, 4);
        let b = BaseRow::from_logits(&p, 0, 1e9, usize::MAX);
        assert_eq!(b.ids.len(), v);
        assert!(b.tail == 0.0);
        let (t, f) = score_row(&b, &q, 0, Some(&p));
        let f = f.unwrap();
        assert!((t.kld - f).abs() <= 1e-14 * f, "{} {f}", t.kld);
        // a tail of tokens far below the window: exact to their mass (the grouping loses at most
        // p_tail · KL of the tail's shapes)
        let mut p2 = p.clone();
        let mut q2 = q.clone();
        for j in 0..20 {
            p2[j] -= 40.0;
            q2[j] -= 40.0 + (j as f32) * 0.1;
        }
        let b2 = BaseRow::from_logits(&p2, 50, 16.0, usize::MAX);
        assert_eq!(b2.ids.len(), v - 20);
        assert!(b2.tail > 0.0 && b2.tail < 1e-15);
        let (t2, f2) = score_row(&b2, &q2, 50, Some(&p2));
        let f2 = f2.unwrap();
        assert!((t2.kld - f2).abs() <= 1e-12 * f2, "{} {f2}", t2.kld);
        // the next token's log-prob and the top come from the stored logits exactly
        let (_, lse, imax) = softmax_norm(&p2);
        assert_eq!(b2.top() as usize, imax);
        assert_eq!(b2.lse, lse);
    }
}
