//! The chunks of the text, as llama-perplexity cuts them: `n_ctx` tokens each, BOS in front where the
//! model adds one, the second half scored; one chunk run through our engine.

use anyhow::{bail, Context, Result};
use lockstep_engine::Model;

use super::Params;

/// Scored tokens per chunk: `n_ctx − 1 − n_ctx/2` (llama.cpp `kl_divergence()`).
pub fn scored_per_chunk(n_ctx: usize) -> usize {
    n_ctx - 1 - n_ctx / 2
}

/// Checks `--ctx`: at least 4 tokens (two halves, one scored position) and at most the model's context
/// `n_ctx_train` (GGUF `context_length`; the engine refuses longer sequences).
///
/// Errors: either bound, naming `--ctx` and the limit.
pub fn check_ctx(n_ctx: usize, n_ctx_train: usize) -> Result<()> {
    if n_ctx < 4 {
        bail!("--ctx {n_ctx} is too small (at least 4)");
    }
    if n_ctx > n_ctx_train {
        bail!(
            "--ctx {n_ctx} is larger than the model's context of {n_ctx_train} tokens (context_length); give \
             at most {n_ctx_train}"
        );
    }
    Ok(())
}

/// Tokenizes the corpus as llama-perplexity does and cuts it into chunks of `n_ctx` tokens, at most
/// `max_chunks` (0 = all). Returns the chunks' tokens `[n_chunks · n_ctx]`, original tokens (the BOS
/// substitution is [`chunk_input`]'s) and the corpus's total token count.
///
/// Errors: [`check_ctx`]'s; fewer than `2·n_ctx` tokens (llama.cpp's own limit); a tokenizer failure.
pub fn chunk_tokens(
    model: &Model,
    text: &str,
    n_ctx: usize,
    max_chunks: usize,
) -> Result<(Vec<u32>, usize)> {
    check_ctx(n_ctx, model.info().n_ctx_train)?;
    let tokens = model
        .tokenizer()
        .encode(text, true, false)
        .context("tokenizing the corpus")?;
    // n_ctx ≤ the model's context: 2·n_ctx cannot overflow, but check rather than trust that
    let need = n_ctx
        .checked_mul(2)
        .with_context(|| format!("--ctx {n_ctx} is too large"))?;
    if tokens.len() < need {
        bail!(
            "the corpus tokenizes to only {} tokens; scoring with a context of {n_ctx} needs at least {need} \
             (llama-perplexity's limit): use a longer text or a smaller --ctx",
            tokens.len(),
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
    let mut s = model.session(
        n_ctx,
        crate::session::host_numerics(params.mode, params.simd),
    );
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_context_must_hold_two_scored_halves_and_fit_the_model() {
        assert!(check_ctx(usize::MAX, 256)
            .unwrap_err()
            .to_string()
            .contains("larger than the model's context of 256"));
        assert!(check_ctx(3, 256).is_err() && check_ctx(256, 256).is_ok());
    }
}
