//! The cross-check: `llama-perplexity --kl-divergence` on the same text and chunking, its printout parsed.
//!
//! Runs `llama-perplexity -m BASE -f CORPUS -c n_ctx -b n_ctx --chunks n -fa off -ctk f32 -ctv f32 -t threads
//! --kl-divergence-base FILE` once (llama.cpp `perplexity()`: saves the base's 16-bit log-probs), then for
//! each checked variant the same with `-m VARIANT ... --kl-divergence` (llama.cpp `kl_divergence()`, which
//! takes the tokens from FILE), and reads the final statistics block that `kl_divergence()` prints.
//!
//! The flags make llama.cpp compute what our engine computes: `-b n_ctx` one chunk per batch (`n_seq` = 1,
//! as we run each chunk alone in a fresh KV cache), `-fa off` the plain attention (`ggml_soft_max_ext` of
//! K·Q, no flash attention), `-ctk f32 -ctv f32` an f32 KV cache (ours is f32).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use super::stats::Unc;

/// The figures parsed from one `--kl-divergence` printout (fractions, not %; KLD in nats).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LlamaFigures {
    /// `Mean PPL(Q)`.
    pub ppl_q: Option<Unc>,
    /// `Mean PPL(base)`.
    pub ppl_base: Option<Unc>,
    /// `Mean ln(PPL(Q)/PPL(base))`.
    pub ln_ppl_ratio: Option<Unc>,
    /// `Mean    KLD`.
    pub kld: Option<Unc>,
    /// `99.0%   KLD`.
    pub kld_99: Option<f64>,
    /// `Median  KLD`.
    pub kld_median: Option<f64>,
    /// `RMS Δp`.
    pub rms_p_diff: Option<Unc>,
    /// `Same top p`.
    pub same_top_p: Option<Unc>,
}

/// Parses `v ± u` (optionally followed by `%`) after the first `:` of a line.
fn value_unc(line: &str, percent: bool) -> Option<Unc> {
    let (_, rest) = line.split_once(':')?;
    let rest = rest.trim().trim_end_matches('%').trim();
    let (v, u) = rest.split_once('±')?;
    let scale = if percent { 0.01 } else { 1.0 };
    Some(Unc {
        value: v.trim().parse::<f64>().ok()? * scale,
        unc: u.trim().trim_end_matches('%').trim().parse::<f64>().ok()? * scale,
    })
}

fn value(line: &str) -> Option<f64> {
    line.split_once(':')?
        .1
        .trim()
        .trim_end_matches('%')
        .trim()
        .parse()
        .ok()
}

/// Parses the final statistics of a `llama-perplexity --kl-divergence` printout (llama.cpp
/// `kl_divergence()`'s `LOG` lines: `Mean PPL(Q)                   : %10.6lf ± %10.6lf`, `Mean    KLD: ...`,
/// `RMS Δp    : %6.3lf ± %5.3lf %`, `Same top p: %6.3lf ± %5.3lf %`, ...). Lines not found stay `None`.
pub fn parse(out: &str) -> LlamaFigures {
    let mut f = LlamaFigures::default();
    for line in out.lines() {
        let l = line.trim_start();
        if l.starts_with("Mean PPL(Q)/") || l.starts_with("Mean PPL(Q)-") {
            continue;
        }
        if l.starts_with("Mean PPL(Q)") {
            f.ppl_q = value_unc(l, false);
        } else if l.starts_with("Mean PPL(base)") {
            f.ppl_base = value_unc(l, false);
        } else if l.starts_with("Mean ln(PPL(Q)/PPL(base))") {
            f.ln_ppl_ratio = value_unc(l, false);
        } else if l.starts_with("Mean    KLD") {
            f.kld = value_unc(l, false);
        } else if l.starts_with("99.0%   KLD") {
            f.kld_99 = value(l);
        } else if l.starts_with("Median  KLD") {
            f.kld_median = value(l);
        } else if l.starts_with("RMS Δp") {
            f.rms_p_diff = value_unc(l, true);
        } else if l.starts_with("Same top p") {
            f.same_top_p = value_unc(l, true);
        }
    }
    f
}

/// One llama-perplexity invocation: the command line as run and its wall time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Invocation {
    /// The program and its arguments, space-separated.
    pub command: String,
    /// Wall time in seconds.
    pub seconds: f64,
}

/// Runs `bin args` through [`crate::process::run_bounded`]: its own process group (killed with any
/// helpers on timeout and on Ctrl-C / SIGTERM), stdout and stderr in files under `scratch` named from
/// `what` (bounded and sanitised by [`crate::output::file_stem`]: a variant label may be any text).
fn run(
    bin: &Path,
    args: &[String],
    timeout: Duration,
    scratch: &Path,
    what: &str,
) -> Result<(String, Invocation)> {
    let shown = format!("{} {}", bin.display(), args.join(" "));
    let t0 = std::time::Instant::now();
    let mut cmd = Command::new(bin);
    cmd.args(args);
    let out = crate::process::run_bounded(cmd, timeout, scratch, &crate::output::file_stem(what))?;
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        let tail: Vec<&str> = text.lines().rev().take(15).collect();
        bail!(
            "{shown} failed ({}):\n{}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    Ok((
        text,
        Invocation {
            command: shown,
            seconds: t0.elapsed().as_secs_f64(),
        },
    ))
}

/// Settings of the llama-perplexity runs.
#[derive(Clone, Debug)]
pub struct LlamaRun {
    /// The llama-perplexity binary.
    pub bin: PathBuf,
    /// The corpus file (llama-perplexity `-f`).
    pub corpus: PathBuf,
    /// `-c` and `-b`.
    pub n_ctx: usize,
    /// `--chunks`.
    pub n_chunks: usize,
    /// `-t`.
    pub threads: usize,
    /// Time one run may take before its process group is killed.
    pub timeout: Duration,
    /// Where each run's stdout and stderr are captured (a scratch directory the caller removes).
    pub scratch: PathBuf,
}

impl LlamaRun {
    /// The chunking and numerics flags every run gets, as shown in the report.
    pub fn flags_shown(n_ctx: usize, n_chunks: usize) -> String {
        format!("-c {n_ctx} -b {n_ctx} --chunks {n_chunks} -fa off -ctk f32 -ctv f32")
    }

    fn common(&self, model: &Path, logits: &Path) -> Vec<String> {
        [
            "-m".into(),
            model.display().to_string(),
            "-f".into(),
            self.corpus.display().to_string(),
            "-c".into(),
            self.n_ctx.to_string(),
            "-b".into(),
            self.n_ctx.to_string(),
            "--chunks".into(),
            self.n_chunks.to_string(),
            "-fa".into(),
            "off".into(),
            "-ctk".into(),
            "f32".into(),
            "-ctv".into(),
            "f32".into(),
            "-t".into(),
            self.threads.to_string(),
            "--kl-divergence-base".into(),
            logits.display().to_string(),
        ]
        .to_vec()
    }

    /// Saves the base's log-probs to `logits` (llama-perplexity without `--kl-divergence`).
    ///
    /// Errors: the program cannot start, fails (its last lines quoted), or outlives the timeout.
    pub fn save_base(&self, base: &Path, logits: &Path) -> Result<Invocation> {
        run(
            &self.bin,
            &self.common(base, logits),
            self.timeout,
            &self.scratch,
            "llama-perplexity-base",
        )
        .map(|(_, i)| i)
    }

    /// Runs `--kl-divergence` for one variant against the saved base and parses the statistics; returns
    /// them with the whole printout and the invocation.
    ///
    /// Errors: the program cannot start, fails, outlives the timeout, or prints no `Mean    KLD` line
    /// (fewer than 100 tokens scored).
    pub fn kl_divergence(
        &self,
        variant: &Path,
        logits: &Path,
    ) -> Result<(LlamaFigures, String, Invocation)> {
        let mut args = self.common(variant, logits);
        args.push("--kl-divergence".into());
        let label = super::variant_label(variant);
        let (out, inv) = run(
            &self.bin,
            &args,
            self.timeout,
            &self.scratch,
            &format!("llama-perplexity-kld-{label}"),
        )?;
        let f = parse(&out);
        if f.kld.is_none() {
            bail!(
                "{} printed no `Mean    KLD` line for {} (it prints statistics only from 100 scored tokens)",
                self.bin.display(),
                variant.display()
            );
        }
        Ok((f, out, inv))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_match_our_engine() {
        let r = LlamaRun {
            bin: "llama-perplexity".into(),
            corpus: "c.txt".into(),
            n_ctx: 512,
            n_chunks: 81,
            threads: 2,
            timeout: Duration::from_secs(60),
            scratch: "/tmp".into(),
        };
        let a = r.common(Path::new("m.gguf"), Path::new("b.kld")).join(" ");
        assert!(a.contains(&LlamaRun::flags_shown(512, 81)), "{a}");
        assert!(a.ends_with("-t 2 --kl-divergence-base b.kld"), "{a}");
    }

    #[test]
    fn parses_the_printout() {
        let out = "\
====== Perplexity statistics ======
Mean PPL(Q)                   :  18.123456 ±   0.512345
Mean PPL(base)                :  17.900000 ±   0.500000
Cor(ln(PPL(Q)), ln(PPL(base))):  99.12%
Mean ln(PPL(Q)/PPL(base))     :   0.012345 ±   0.001234
Mean PPL(Q)/PPL(base)         :   1.012421 ±   0.001249
Mean PPL(Q)-PPL(base)         :   0.223456 ±   0.022345

====== KL divergence statistics ======
Mean    KLD:   0.004321 ±   0.000123
Maximum KLD:   0.512345
99.9%   KLD:   0.212345
99.0%   KLD:   0.051234
Median  KLD:   0.002001
RMS Δp    :  1.234 ± 0.045 %
Same top p: 97.654 ± 0.123 %
";
        let f = parse(out);
        assert_eq!(
            f.ppl_q,
            Some(Unc {
                value: 18.123456,
                unc: 0.512345
            })
        );
        assert_eq!(f.ppl_base.unwrap().value, 17.9);
        assert_eq!(f.ln_ppl_ratio.unwrap().unc, 0.001234);
        assert_eq!(f.kld.unwrap().value, 0.004321);
        assert_eq!(f.kld_99, Some(0.051234));
        assert_eq!(f.kld_median, Some(0.002001));
        let r = f.rms_p_diff.unwrap();
        assert!((r.value - 0.01234).abs() < 1e-12 && (r.unc - 0.00045).abs() < 1e-12);
        let s = f.same_top_p.unwrap();
        assert!((s.value - 0.97654).abs() < 1e-12 && (s.unc - 0.00123).abs() < 1e-12);
        assert_eq!(parse("nothing"), LlamaFigures::default());
    }
}
