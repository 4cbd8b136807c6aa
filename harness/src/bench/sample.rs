//! One sample of our engine in process (what `lockstep bench-sample` prints), and what the fractions of
//! the physical limits need: the bytes a decode step reads and this machine's read bandwidth (decode), the
//! floating-point work of a prompt batch and this machine's FMA peak (prefill).

use std::time::Instant;

use anyhow::{Context, Result};
use lockstep_engine::{Model, NumericsMode, Simd};
use rayon::prelude::*;

use super::Test;

/// Bytes of weights one decode step reads: every tensor but `token_embd` (of which a step reads one row)
/// when the model has a separate `output.weight`; every tensor when the output is tied to `token_embd`
/// (the logits then read all of it). The KV cache is not counted.
pub fn decode_bytes_per_token(model: &Model) -> u64 {
    let tensors = model.gguf().tensors();
    let has_output = tensors.iter().any(|t| t.name == "output.weight");
    tensors
        .iter()
        .filter(|t| !(has_output && t.name == "token_embd.weight"))
        .map(|t| t.n_bytes as u64)
        .sum()
}

/// Read bandwidth of this machine with the engine's thread pool: the median of `reps` passes summing a
/// 512 MiB buffer (far beyond any cache) split across the rayon threads. Bytes per second.
pub fn measure_read_bandwidth(reps: usize) -> Vec<f64> {
    let words = (512usize << 20) / 8;
    let buf: Vec<u64> = (0..words as u64)
        .into_par_iter()
        .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    (0..reps)
        .map(|_| {
            let t0 = Instant::now();
            let s: u64 = buf
                .par_chunks(1 << 16)
                .map(|c| c.iter().fold(0u64, |a, &x| a.wrapping_add(x)))
                .reduce(|| 0, u64::wrapping_add);
            let secs = t0.elapsed().as_secs_f64();
            std::hint::black_box(s);
            (words * 8) as f64 / secs
        })
        .collect()
}

/// Floating-point operations of one test's timed part on `model` (multiply and add counted apart, as
/// GFLOP/s figures do), for the prefill row's fraction of the FMA peak:
/// - every weight matrix of the blocks (2-D `blk.*` tensors): `2 · rows · cols` per prompt token;
/// - the output matrix (`output.weight`, else the tied `token_embd.weight`) once: the bench asks for the
///   last position's logits only (none for an encoder, whose output is the pooled embedding);
/// - attention's `KQ` and `KQV`: `4 · n_head · head_dim` per (query, key) pair, every query of the batch
///   against the `n_depth` cached positions and the batch's own (causal: its earlier ones and itself;
///   an encoder: all of them), sliding windows counted in full;
/// - a generation test: the same for each of its `n_gen` one-token steps.
///
/// Norms, RoPE, softmax and activations are left out (a few FLOPs per element, not per weight). The count
/// is the work of a dense implementation: it measures how far a row is from what the machine can do,
/// not what an engine happened to skip.
pub fn test_flops(model: &Model, test: Test) -> f64 {
    let gguf = model.gguf();
    let info = model.info();
    let block: f64 = gguf
        .tensors()
        .iter()
        .filter(|t| t.name.starts_with("blk.") && t.dims.len() == 2 && t.dims[1] > 1)
        .map(|t| t.n_elements as f64)
        .sum();
    let encoder = model.output() == lockstep_engine::models::Output::Pooled;
    let output = if encoder {
        0.0
    } else {
        gguf.tensor("output.weight")
            .or_else(|_| gguf.tensor("token_embd.weight"))
            .map_or(0.0, |t| t.n_elements as f64)
    };
    let per_pair = 4.0 * (info.dims.n_head * info.dims.head_dim * info.n_layer) as f64;
    // a batch of n tokens after `past` cached ones: every query sees the cached keys and its batch's
    let batch = |n: usize, past: usize| -> f64 {
        let (n, past) = (n as f64, past as f64);
        let pairs = if encoder {
            n * n
        } else {
            n * past + n * (n + 1.0) / 2.0
        };
        2.0 * n * block + 2.0 * output + per_pair * pairs
    };
    if test.n_prompt > 0 {
        batch(test.n_prompt, test.n_depth)
    } else {
        (0..test.n_gen).map(|i| batch(1, test.n_depth + i)).sum()
    }
}

/// This machine's single-precision FMA throughput with the engine's thread pool: `reps` measurements,
/// FLOP/s (an FMA counted as two operations), each the sum over the pool's threads (all running at once,
/// `rayon::broadcast`) of independent FMA chains on the widest vectors the CPU has and `simd` allows — 16
/// chains of 16-lane `vfmadd` (AVX-512 F), else 12 of 8-lane (AVX2 + FMA), else 8 scalar `mul_add` — enough
/// chains to cover the FMA latency on two ports, so the rate is the ports' throughput. One unmeasured
/// pass first (clock and AVX-512 frequency settle). The fastest pass is the peak the prefill rows are a
/// fraction of (a busy machine only slows a pass down).
///
/// `simd` caps the vectors at what the bench's kernels use: `avx2` measures the 8-lane peak even on an
/// AVX-512 host, so that a `--simd avx2` bench's fractions (and the `avx2` speed floors made from them)
/// are shares of what AVX2 code can do, as on an AVX2-only host; `off` measures scalar FMAs.
pub fn measure_fma_peak(reps: usize, simd: Simd) -> Vec<f64> {
    // ~50 ms per pass on a core that retires two 16-lane FMAs per cycle at 2.5 GHz
    const ITERS: u64 = 1 << 24;
    let pass = || -> f64 {
        rayon::broadcast(|_| {
            let t0 = Instant::now();
            let flops = fma_chains(ITERS, simd);
            flops / t0.elapsed().as_secs_f64()
        })
        .into_iter()
        .sum()
    };
    pass();
    (0..reps).map(|_| pass()).collect()
}

/// Run `iters` rounds of independent FMA chains on this thread ([`measure_fma_peak`]); the FLOPs done.
fn fma_chains(iters: u64, simd: Simd) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        if simd == Simd::Avx512 && lockstep_engine::numerics::cpu_has("avx512f") {
            // SAFETY: the CPU has AVX-512 F (checked above).
            let r = unsafe { fma_chains_avx512(iters) };
            std::hint::black_box(r);
            return (iters * 16 * 16 * 2) as f64;
        }
        if simd != Simd::Off
            && lockstep_engine::numerics::cpu_has("avx2")
            && lockstep_engine::numerics::cpu_has("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA (checked above).
            let r = unsafe { fma_chains_avx2(iters) };
            std::hint::black_box(r);
            return (iters * 12 * 8 * 2) as f64;
        }
    }
    let mut acc = [1.0f32; 8];
    for _ in 0..iters {
        for a in &mut acc {
            *a = a.mul_add(0.999_999, 1e-7);
        }
        acc = std::hint::black_box(acc);
    }
    std::hint::black_box(acc);
    (iters * 8 * 2) as f64
}

/// 16 chains of 16-lane FMAs, `iters` rounds; returns a value of the chains (kept alive).
///
/// # Safety
/// The CPU must have AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_chains_avx512(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    let (m, a) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
    let mut acc = [_mm512_set1_ps(1.0); 16];
    for _ in 0..iters {
        for x in &mut acc {
            *x = _mm512_fmadd_ps(*x, m, a);
        }
    }
    let s = acc
        .iter()
        .fold(_mm512_setzero_ps(), |s, &x| _mm512_add_ps(s, x));
    _mm512_reduce_add_ps(s)
}

/// 12 chains of 8-lane FMAs, `iters` rounds; returns a value of the chains (kept alive).
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_chains_avx2(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    let (m, a) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
    let mut acc = [_mm256_set1_ps(1.0); 12];
    for _ in 0..iters {
        for x in &mut acc {
            *x = _mm256_fmadd_ps(*x, m, a);
        }
    }
    let s = acc
        .iter()
        .fold(_mm256_setzero_ps(), |s, &x| _mm256_add_ps(s, x));
    let mut out = [0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), s);
    out.iter().sum()
}

/// Pseudo-random token ids below `n_vocab` (llama-bench draws `std::rand() % n_vocab`).
pub(crate) fn random_tokens(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % n_vocab as u64) as u32
        })
        .collect()
}

/// One timed sample of our engine on an already loaded model (what `lockstep bench-sample` prints):
/// warm-up, the session reset, `n_depth` tokens prefilled untimed, then the timed part. Nanoseconds.
///
/// Errors: a test that is not one ([`Test::check`]: both or neither of `n_prompt`/`n_gen`, an
/// overflowing context size); whatever the engine reports (a test longer than the model's context, say).
pub fn sample(model: &Model, test: Test, mode: NumericsMode, simd: Simd) -> Result<u64> {
    let n_vocab = model.info().n_vocab;
    test.check()?;
    let n_ctx = test.n_ctx().context("the test's context size overflows")?;
    model.check_context(n_ctx)?;
    // ggml mode mirrors the llama.cpp build of this machine, the one llama-bench runs
    let numerics = crate::session::host_numerics(mode, simd);
    let session = |n: usize| model.session(n, numerics);
    // warm-up, as llama-bench: a prompt batch, or one generated token; like llama-bench's batches
    // (`llama_batch_get_one`), every forward asks for the last position's logits only. As llama-bench
    // times a context it has warmed up and cleared (`llama_memory_clear`), the timed run reuses the
    // warmed session, reset: its buffers are allocated and touched before the clock starts.
    let mut s = session(n_ctx.max(1));
    if test.n_prompt > 0 {
        model.forward_last(
            &mut s,
            &random_tokens(test.n_prompt.min(512), n_vocab, 7),
            None,
        )?;
    } else {
        model.forward_last(&mut s, &random_tokens(1, n_vocab, 7), None)?;
    }
    s.reset();
    if test.n_depth > 0 {
        model.forward_last(&mut s, &random_tokens(test.n_depth, n_vocab, 11), None)?;
    }
    let t0 = Instant::now();
    if test.n_prompt > 0 {
        model.forward_last(&mut s, &random_tokens(test.n_prompt, n_vocab, 13), None)?;
    }
    let gen = random_tokens(test.n_gen, n_vocab, 17);
    for &t in &gen {
        model.forward_last(&mut s, &[t], None)?;
    }
    Ok(t0.elapsed().as_nanos() as u64)
}
