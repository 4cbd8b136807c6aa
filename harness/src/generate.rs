//! `lockstep generate`: text from a prompt, sampled token by token and streamed to a writer, with the
//! prefill and decode speeds; non-finite logits stop it with the first stage that went non-finite.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use lockstep_engine::sample::{Sampler, SamplerConfig};
use lockstep_engine::tokenizer::TextStream;
use lockstep_engine::Model;

use lockstep_engine::Numerics;

/// What `lockstep generate` is asked for, besides the model and the prompt.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Tokens to generate at most (`-n`).
    pub n_predict: usize,
    /// Temperature, top-k, top-p and seed of the sampler.
    pub sampler: SamplerConfig,
    /// The session's numerics settings.
    pub numerics: Numerics,
    /// Recognise control-token text in the prompt (llama_tokenize's parse_special).
    pub parse_special: bool,
}

/// What one generation did: token counts and wall-clock times of its two phases.
#[derive(Clone, Debug)]
pub struct GenerateStats {
    /// Tokens of the prompt (prefilled as one batch).
    pub prompt_tokens: usize,
    /// Tokens generated (an end-of-generation token is not counted).
    pub generated: usize,
    /// Time of the prefill and the first token's sampling.
    pub prefill: Duration,
    /// Time of the decode loop.
    pub decode: Duration,
    /// The session's backend, as the engine names it.
    pub backend: String,
}

impl GenerateStats {
    /// The line `lockstep generate` prints on stderr: tokens, seconds and tokens per second of prefill
    /// and decode, the mode and the backend.
    pub fn summary(&self, numerics: &Numerics) -> String {
        format!(
            "prefill: {} tokens in {:.3}s ({:.1} tok/s); decode: {} tokens in {:.3}s ({:.1} tok/s); mode {}, backend {}",
            self.prompt_tokens,
            self.prefill.as_secs_f64(),
            self.prompt_tokens as f64 / self.prefill.as_secs_f64(),
            self.generated,
            self.decode.as_secs_f64(),
            self.generated as f64 / self.decode.as_secs_f64().max(1e-9),
            numerics.mode,
            self.backend
        )
    }
}

/// Generate from `prompt` (tokenized with add_special = true): the prompt text is written to `out`
/// first, then each token's text as it is sampled (flushed token by token), then a newline. Stops after
/// `n_predict` tokens, at an end-of-generation token, or when the model's training context is full.
///
/// Errors: a prompt that tokenizes to nothing or exceeds the model's context (before anything is
/// written); non-finite logits (the sequence so far is run again as one batch to name the first stage
/// that went non-finite); the engine's errors; a failed write.
pub fn generate(
    model: &Model,
    prompt: &str,
    opts: &GenerateOptions,
    out: &mut dyn Write,
) -> Result<GenerateStats> {
    crate::session::require_logits(model, "generate")?;
    let tok = model.tokenizer();
    let ids = tok.encode(prompt, true, opts.parse_special)?;
    if ids.is_empty() {
        bail!("the prompt tokenizes to nothing");
    }
    model.check_context(ids.len())?;
    let n_ctx = ids
        .len()
        .saturating_add(opts.n_predict)
        .min(model.info().n_ctx_train);
    let mut session = model.session(n_ctx, opts.numerics);
    let mut sampler = Sampler::new(opts.sampler);
    write!(out, "{prompt}")?;
    out.flush()?;

    let t0 = Instant::now();
    // the last position's logits only, as llama.cpp's generation asks for them
    let last = model.forward_last(&mut session, &ids, None)?;
    if last.iter().any(|v| !v.is_finite()) {
        return Err(non_finite_generation(model, &ids, &opts.numerics));
    }
    let mut next = sampler.sample(last);
    let mut sequence = ids.clone();
    let prefill = t0.elapsed();
    let mut stream = TextStream::default();
    let t1 = Instant::now();
    let mut generated = 0;
    while generated < opts.n_predict && !tok.is_eog(next) {
        write!(out, "{}", stream.push(tok, next))?;
        out.flush()?;
        generated += 1;
        if generated == opts.n_predict || session.n_past() >= n_ctx {
            break;
        }
        sequence.push(next);
        let logits = model.forward_last(&mut session, &[next], None)?;
        if logits.iter().any(|v| !v.is_finite()) {
            return Err(non_finite_generation(model, &sequence, &opts.numerics));
        }
        next = sampler.sample(logits);
    }
    writeln!(out, "{}", stream.finish())?;
    Ok(GenerateStats {
        prompt_tokens: ids.len(),
        generated,
        prefill,
        decode: t1.elapsed(),
        backend: session.backend_name().to_string(),
    })
}

/// The error for non-finite logits during `generate`: the sequence so far is run again as one batch with
/// every stage recorded, to name the first stage that went non-finite.
fn non_finite_generation(model: &Model, sequence: &[u32], numerics: &Numerics) -> anyhow::Error {
    let at = sequence.len() - 1;
    let diagnose = || -> Result<()> {
        let mut s = model.session(sequence.len(), *numerics);
        let mut rec = lockstep_engine::hooks::Recorder::new();
        model.forward(&mut s, sequence, Some(&mut rec))?;
        let mut stages = crate::capture::recorded_arrays(rec)?;
        let logits = stages
            .remove("logits")
            .context("the engine emitted no logits stage")?;
        crate::capture::check_finite_logits(&logits, &stages)
    };
    match diagnose() {
        Err(e) => e.context(format!(
            "generation stopped: non-finite logits at position {at}"
        )),
        Ok(()) => anyhow::anyhow!(
            "generation stopped: non-finite logits at position {at} (not reproduced when the sequence is run \
             as one batch)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_engine::{NumericsMode, Simd};

    fn tiny() -> (tempfile::TempDir, Model) {
        let (dir, p) = crate::session::tiny_model_file();
        (dir, Model::load(&p).unwrap())
    }

    fn opts(n: usize, seed: u64) -> GenerateOptions {
        GenerateOptions {
            n_predict: n,
            sampler: SamplerConfig {
                temperature: 0.8,
                top_k: 40,
                top_p: 0.95,
                seed,
            },
            numerics: crate::session::host_numerics(NumericsMode::Reference, Simd::Off),
            parse_special: false,
        }
    }

    #[test]
    fn streams_the_prompt_then_at_most_n_tokens() {
        let (_d, m) = tiny();
        let mut out = Vec::new();
        let st = generate(&m, "hello", &opts(3, 7), &mut out).unwrap();
        let text = String::from_utf8_lossy(&out).to_string();
        assert!(text.starts_with("hello"), "{text:?}");
        assert!(text.ends_with('\n'), "{text:?}");
        assert!(st.generated <= 3);
        assert_eq!(
            st.prompt_tokens,
            m.tokenizer().encode("hello", true, false).unwrap().len()
        );
        let line = st.summary(&opts(3, 7).numerics);
        assert!(line.starts_with(&format!("prefill: {} tokens", st.prompt_tokens)));
        assert!(line.contains("mode reference"), "{line}");
    }

    #[test]
    fn same_seed_same_text_and_zero_tokens_is_the_prompt() {
        let (_d, m) = tiny();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        generate(&m, "hello", &opts(4, 3), &mut a).unwrap();
        generate(&m, "hello", &opts(4, 3), &mut b).unwrap();
        assert_eq!(a, b);
        let mut none = Vec::new();
        let st = generate(&m, "hi", &opts(0, 3), &mut none).unwrap();
        assert_eq!(st.generated, 0);
        assert_eq!(none, b"hi\n");
    }

    #[test]
    fn an_empty_prompt_is_refused_before_anything_is_written() {
        let (_d, m) = tiny();
        let mut out = Vec::new();
        // the tiny vocabulary adds no BOS (`tokenizer.ggml.add_bos_token = false`): "" is no token
        let e = generate(&m, "", &opts(2, 0), &mut out).unwrap_err();
        assert!(e.to_string().contains("tokenizes to nothing"), "{e}");
        assert!(out.is_empty());
    }
}
