//! One sample of our engine in process (what `lockstep bench-sample` prints), and what decode's bandwidth
//! fraction needs: the bytes a decode step reads and this machine's read bandwidth.

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
