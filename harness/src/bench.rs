//! `lockstep bench`: tokens per second of our engine beside llama.cpp's `llama-bench` (and, optionally, a
//! baseline lockstep binary), run by run on the same GGUF, threads and machine.
//!
//! # What one sample is
//! Every sample is one process, for every engine alike, so that each pays the same costs outside the
//! timed region (loading, page faults of the map, thread-pool start): `llama-bench -r 1` for llama.cpp,
//! `lockstep bench-sample` for ours (and the baseline's). Inside, as llama-bench does (tools/llama-bench/
//! llama-bench.cpp `test_prompt` / `test_gen`): a warm-up (a prompt of `min(n_prompt, 512)` tokens, or one
//! generated token), then the same context cleared (`llama_memory_clear`; for us the same session reset, its
//! KV cache and buffers already written); `n_depth` tokens prefilled untimed; then timed: `n_prompt`
//! tokens as one batch (`pp`), or `n_gen` tokens decoded one at a time (`tg`). Tokens are pseudo-random
//! ids below the vocabulary size, as llama-bench's.
//!
//! # Order and statistics
//! Repetitions interleave the engines (ours, baseline, llama.cpp, ours, ...) so that a slow phase of a
//! shared machine hits all of them. Per engine and test the fields are llama-bench's (`avg_ts`,
//! `stddev_ts`, `avg_ns`, `stddev_ns`, `samples_ns`, `samples_ts`, ...). Each comparison is the ratio of
//! median tokens/s with a 95% percentile-bootstrap interval ([`bootstrap_ratio`]: both sides resampled
//! with replacement, 2000 times, fixed seed). Decode's bandwidth fraction is `tokens/s × bytes read per
//! token ÷ read bandwidth`, the bandwidth measured in the same run ([`measure_read_bandwidth`]) and the
//! bytes the weights a decode step reads ([`decode_bytes_per_token`]).
//!
//! # The speed gate
//! [`gate_speed`]: a comparison fails when the upper end of its interval is below what
//! `ci/speed.toml` allows — never an absolute time, which differs between machines and days.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use lockstep_engine::{Model, NumericsMode, Simd};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::report::Environment;

/// Version of `bench.json`'s layout.
pub const BENCH_SCHEMA_VERSION: u32 = 1;

/// One llama-bench test: `n_prompt` tokens as one batch, or `n_gen` decoded one by one, after `n_depth`
/// tokens already in the context.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Test {
    /// Prompt tokens processed as one batch (0 for a generation test).
    pub n_prompt: usize,
    /// Tokens generated one at a time (0 for a prompt test).
    pub n_gen: usize,
    /// Tokens in the context before the timed part.
    pub n_depth: usize,
}

impl Test {
    /// llama-bench's name: `pp512`, `tg128`, `pp512 @ d512`.
    pub fn name(&self) -> String {
        let base = if self.n_prompt > 0 {
            format!("pp{}", self.n_prompt)
        } else {
            format!("tg{}", self.n_gen)
        };
        if self.n_depth > 0 {
            format!("{base} @ d{}", self.n_depth)
        } else {
            base
        }
    }

    /// Tokens the timed part processes (saturating: [`Test::n_ctx`] is the checked sum).
    pub fn n_tokens(&self) -> usize {
        self.n_prompt.saturating_add(self.n_gen)
    }

    /// Context positions the test needs, `n_depth + n_prompt + n_gen`; `None` when the sum overflows.
    pub fn n_ctx(&self) -> Option<usize> {
        self.n_depth
            .checked_add(self.n_prompt)?
            .checked_add(self.n_gen)
    }

    /// Check that the test is one llama-bench can run: exactly one of `n_prompt` and `n_gen` above 0,
    /// and a context size that fits a `usize`.
    ///
    /// Errors name the test and the overflowing sum (e.g. `-d 18446744073709551615 -p 512`).
    pub fn check(&self) -> Result<()> {
        if (self.n_prompt > 0) == (self.n_gen > 0) {
            bail!(
                "a test has n_prompt {} and n_gen {}: exactly one of them must be above 0",
                self.n_prompt,
                self.n_gen
            );
        }
        if self.n_ctx().is_none() {
            bail!(
                "test {}: n_depth {} + n_prompt {} + n_gen {} overflows a {}-bit count of positions",
                self.name(),
                self.n_depth,
                self.n_prompt,
                self.n_gen,
                usize::BITS
            );
        }
        Ok(())
    }

    fn of(x: &BenchResult) -> Test {
        Test {
            n_prompt: x.n_prompt,
            n_gen: x.n_gen,
            n_depth: x.n_depth,
        }
    }
}

/// The tests of `-p P -n G -d D` (llama-bench's expansion: one pp test per prompt size, one tg test per
/// generation size, each at every depth; sizes 0 are skipped).
pub fn tests_for(n_prompt: &[usize], n_gen: &[usize], n_depth: &[usize]) -> Vec<Test> {
    let mut out = Vec::new();
    for &d in n_depth {
        for &p in n_prompt.iter().filter(|&&p| p > 0) {
            out.push(Test {
                n_prompt: p,
                n_gen: 0,
                n_depth: d,
            });
        }
        for &g in n_gen.iter().filter(|&&g| g > 0) {
            out.push(Test {
                n_prompt: 0,
                n_gen: g,
                n_depth: d,
            });
        }
    }
    out
}

/// An engine's settings in a bench.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineSettings {
    /// `lockstep`, `baseline` or `llama.cpp`.
    pub engine: String,
    /// Numerics mode (lockstep engines).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// SIMD setting (lockstep engines).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simd: Option<String>,
    /// The binary run.
    pub binary: String,
}

/// One engine × model × test: llama-bench's JSON fields, plus ours (`engine`, `mode`, `simd`,
/// `median_ts`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchResult {
    /// `lockstep`, `baseline` or `llama.cpp`.
    pub engine: String,
    /// Numerics mode and SIMD setting of a lockstep engine (empty for llama.cpp).
    pub mode: String,
    /// SIMD setting of a lockstep engine (empty for llama.cpp).
    pub simd: String,
    /// The model's registry id or path as given.
    pub model: String,
    /// llama-bench's `model_filename`.
    pub model_filename: String,
    /// llama-bench's `model_type` (llama.cpp: its own description; ours: `<arch> <params> <file type>`).
    pub model_type: String,
    /// File size in bytes (`model_size`).
    pub model_size: u64,
    /// Parameters (`model_n_params`): elements of every tensor.
    pub model_n_params: u64,
    /// `n_threads`.
    pub n_threads: usize,
    /// `n_prompt`.
    pub n_prompt: usize,
    /// `n_gen`.
    pub n_gen: usize,
    /// `n_depth`.
    pub n_depth: usize,
    /// llama-bench's `type_k`/`type_v`/`flash_attn` for llama.cpp; ours: `f32`, `f32`, off.
    pub type_k: String,
    /// See `type_k`.
    pub type_v: String,
    /// See `type_k`.
    pub flash_attn: String,
    /// Nanoseconds of each repetition's timed part.
    pub samples_ns: Vec<u64>,
    /// Tokens per second of each repetition.
    pub samples_ts: Vec<f64>,
    /// Mean of `samples_ns`.
    pub avg_ns: f64,
    /// Sample standard deviation of `samples_ns`.
    pub stddev_ns: f64,
    /// Mean of `samples_ts`.
    pub avg_ts: f64,
    /// Sample standard deviation of `samples_ts`.
    pub stddev_ts: f64,
    /// Median of `samples_ts` (what the ratios compare).
    pub median_ts: f64,
}

impl BenchResult {
    /// Set `samples_ts`, `avg_ns`, `stddev_ns`, `avg_ts`, `stddev_ts` and `median_ts` from `samples_ns`
    /// and the row's test (tokens/s = `n_prompt + n_gen` tokens ÷ the sample's seconds; sample standard
    /// deviations): what `bench` writes and [`validate_bench`] expects.
    pub fn fill_stats(&mut self) {
        let test = Test::of(self);
        self.samples_ts = self
            .samples_ns
            .iter()
            .map(|&n| tokens_per_second(test, n))
            .collect();
        let nsf: Vec<f64> = self.samples_ns.iter().map(|&n| n as f64).collect();
        (self.avg_ns, self.stddev_ns) = mean_sd(&nsf);
        (self.avg_ts, self.stddev_ts) = mean_sd(&self.samples_ts);
        self.median_ts = median(&self.samples_ts);
    }
}

/// `numerator / denominator` of median tokens/s for one model and test.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// Model id or path.
    pub model: String,
    /// llama-bench test name (`pp512`, `tg128`, `tg128 @ d512`).
    pub test: String,
    /// Engine on top (`lockstep`).
    pub numerator: String,
    /// Engine below (`llama.cpp` or `baseline`).
    pub denominator: String,
    /// Ratio of medians.
    pub ratio: f64,
    /// 2.5th percentile of the bootstrap ratios.
    pub ci_low: f64,
    /// 97.5th percentile of the bootstrap ratios.
    pub ci_high: f64,
}

/// Decode's use of the machine's read bandwidth.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BandwidthUse {
    /// Engine.
    pub engine: String,
    /// Model id or path.
    pub model: String,
    /// Test name (a tg test).
    pub test: String,
    /// Bytes of weights one decode step reads ([`decode_bytes_per_token`]).
    pub bytes_per_token: u64,
    /// `median_ts × bytes_per_token / read_bandwidth`.
    pub fraction: f64,
}

/// A whole bench run (`bench.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// [`BENCH_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Run id (directory name under reports/).
    pub run_id: String,
    /// The machine and build.
    pub environment: Environment,
    /// Repetitions per engine and test.
    pub repetitions: usize,
    /// The engines run.
    pub engines: Vec<EngineSettings>,
    /// llama-bench's build record (`build-info.json` of oracles/llamacpp/build_tools.sh), if it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llama_cpp_build: Option<serde_json::Value>,
    /// Measured read bandwidth, bytes/s (median of its samples).
    pub read_bandwidth: f64,
    /// Each bandwidth sample, bytes/s.
    pub read_bandwidth_samples: Vec<f64>,
    /// One per engine × model × test.
    pub results: Vec<BenchResult>,
    /// lockstep against each other engine, per model and test.
    pub comparisons: Vec<Comparison>,
    /// Decode's bandwidth fraction per engine, model and tg test.
    pub bandwidth: Vec<BandwidthUse>,
}

/// Median of a non-empty slice (mean of the middle two for an even count); NaN when empty.
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// Ratio of medians `median(a) / median(b)` with a 95% percentile-bootstrap interval: `resamples` times,
/// draw `a.len()` values from `a` and `b.len()` from `b` with replacement and take the ratio of medians;
/// the interval is the 2.5th and 97.5th percentiles. Deterministic (xorshift, fixed seed).
///
/// Returns `(ratio, low, high)`; NaNs when either side is empty.
pub fn bootstrap_ratio(a: &[f64], b: &[f64], resamples: usize) -> (f64, f64, f64) {
    if a.is_empty() || b.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: usize| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % n as u64) as usize
    };
    let mut ratios = Vec::with_capacity(resamples);
    let (mut ra, mut rb) = (vec![0.0; a.len()], vec![0.0; b.len()]);
    for _ in 0..resamples {
        for x in ra.iter_mut() {
            *x = a[next(a.len())];
        }
        for x in rb.iter_mut() {
            *x = b[next(b.len())];
        }
        ratios.push(median(&ra) / median(&rb));
    }
    ratios.sort_by(f64::total_cmp);
    let pick = |q: f64| ratios[((q * resamples as f64) as usize).min(resamples - 1)];
    (median(a) / median(b), pick(0.025), pick(0.975))
}

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
fn random_tokens(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
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
    let session = |n: usize| {
        let mut s = model.session(n, mode);
        // ggml mode mirrors the llama.cpp build of this machine, the one llama-bench runs
        s.set_ggml_target(lockstep_engine::ops::GgmlTarget::host());
        s.set_simd(simd);
        s
    };
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

/// What `bench` needs to run.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Models: (id or path as given, resolved path).
    pub models: Vec<(String, PathBuf)>,
    /// Tests, in order.
    pub tests: Vec<Test>,
    /// Repetitions per engine and test (≥ 1).
    pub repetitions: usize,
    /// Threads for every engine.
    pub threads: usize,
    /// Our engine's numerics mode.
    pub mode: NumericsMode,
    /// Our engine's SIMD setting.
    pub simd: Simd,
    /// This lockstep binary (runs `bench-sample`).
    pub lockstep_bin: PathBuf,
    /// A baseline lockstep binary and its SIMD setting, interleaved with ours.
    pub baseline: Option<(PathBuf, Simd)>,
    /// llama-bench, interleaved with ours.
    pub llama_bench: Option<PathBuf>,
    /// Extra llama-bench arguments (e.g. `-fa 0`), recorded.
    pub llama_bench_args: Vec<String>,
    /// Where `bench-<run id>/` goes.
    pub reports_root: PathBuf,
    /// Print progress to stderr.
    pub progress: bool,
    /// The longest one sample's process may run; it is killed with its process group after that.
    pub sample_timeout: std::time::Duration,
}

/// Runs one sample of one engine: nanoseconds, and llama-bench's record when it is llama.cpp.
type SampleFn = Box<dyn Fn(&Path, Test) -> Result<(u64, Option<serde_json::Value>)>>;

struct Sampler {
    settings: EngineSettings,
    run: SampleFn,
}

/// Where a bench's children keep their output, and how long one sample may take.
#[derive(Clone)]
struct ChildSetup {
    scratch: PathBuf,
    timeout: std::time::Duration,
}

/// Run one sample's child process through [`crate::process::run_bounded`] (its own process group,
/// killed on timeout and on an interrupt); a non-zero exit is an error carrying its stderr.
fn run_child(cmd: Command, setup: &ChildSetup, what: &str, shown: &Path) -> Result<Vec<u8>> {
    let out = crate::process::run_bounded(cmd, setup.timeout, &setup.scratch, what)?;
    if !out.status.success() {
        bail!(
            "{} failed ({}): {}",
            shown.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

/// Parse what `lockstep bench-sample` printed: one positive count of nanoseconds.
///
/// Errors (naming `bin`): anything but a decimal integer, or 0 (a sample of no time would be infinite
/// tokens/s).
pub fn parse_sample_ns(stdout: &[u8], bin: &str) -> Result<u64> {
    let text = String::from_utf8_lossy(stdout);
    let ns: u64 = text.trim().parse().with_context(|| {
        format!(
            "{bin} bench-sample printed {:?}, not nanoseconds",
            text.trim().chars().take(200).collect::<String>()
        )
    })?;
    if ns == 0 {
        bail!(
            "{bin} bench-sample printed a sample of 0 ns (no time cannot be turned into tokens/s)"
        );
    }
    Ok(ns)
}

fn lockstep_sampler(
    engine: &str,
    bin: &Path,
    mode: NumericsMode,
    simd: Simd,
    threads: usize,
    setup: &ChildSetup,
) -> Sampler {
    let b = bin.to_path_buf();
    let setup = setup.clone();
    let what = format!("{engine}-bench-sample");
    Sampler {
        settings: EngineSettings {
            engine: engine.into(),
            mode: Some(mode.to_string()),
            simd: Some(simd.to_string()),
            binary: bin.display().to_string(),
        },
        run: Box::new(move |model: &Path, t: Test| {
            let mut cmd = Command::new(&b);
            cmd.arg("--threads")
                .arg(threads.to_string())
                .arg("bench-sample")
                .arg("--model")
                .arg(model)
                .args(["--mode", mode.name(), "--simd", simd.name()])
                .args(["-p", &t.n_prompt.to_string(), "-n", &t.n_gen.to_string()])
                .args(["-d", &t.n_depth.to_string()]);
            let stdout = run_child(cmd, &setup, &what, &b)?;
            Ok((parse_sample_ns(&stdout, &b.display().to_string())?, None))
        }),
    }
}

/// Flags of llama-bench that `lockstep bench` sets itself (model, test sizes, repetitions, threads,
/// output format); `--llama-bench-args` may not give them.
pub const LLAMA_BENCH_OWN_FLAGS: &[&str] = &[
    "-m",
    "--model",
    "-p",
    "--n-prompt",
    "-n",
    "--n-gen",
    "-pg",
    "-d",
    "--n-depth",
    "-r",
    "--repetitions",
    "-t",
    "--threads",
    "-o",
    "--output",
    "-oe",
    "--output-err",
];

/// Parse llama-bench's `-o json` output of one `-r 1` run of `test`: exactly one record, for that
/// test (`n_prompt`, `n_gen` and, when present, `n_depth` equal to the test's; an absent `n_depth` —
/// llama-bench before depths — only for depth 0), with exactly one positive sample in `samples_ns`.
/// Returns the nanoseconds and the record. `bin` names the program in errors.
///
/// Errors name the program, the record and the field: not JSON, no or several records (a list given in
/// `--llama-bench-args`), a record of another test (pp4096 where pp16 was asked), a sample of 0 ns.
pub fn parse_llama_bench_output(
    stdout: &[u8],
    test: Test,
    bin: &str,
) -> Result<(u64, serde_json::Value)> {
    let v: serde_json::Value =
        serde_json::from_slice(stdout).with_context(|| format!("{bin} printed no JSON"))?;
    let records = v
        .as_array()
        .with_context(|| format!("{bin} printed JSON that is not an array of test records"))?;
    if records.len() != 1 {
        bail!(
            "{bin} printed {} test records; one ({}) was asked for (no lists in --llama-bench-args)",
            records.len(),
            test.name()
        );
    }
    let rec = &records[0];
    let field = |k: &str| rec.get(k).and_then(serde_json::Value::as_u64);
    let (Some(p), Some(g)) = (field("n_prompt"), field("n_gen")) else {
        bail!(
            "{bin}'s record has no n_prompt or n_gen count (asked for {})",
            test.name()
        );
    };
    let d = match rec.get("n_depth") {
        None => 0,
        Some(x) => x
            .as_u64()
            .with_context(|| format!("{bin}'s record: n_depth {x} is not a count"))?,
    };
    let got = (p, g, d);
    let want = (test.n_prompt as u64, test.n_gen as u64, test.n_depth as u64);
    if got != want {
        let name = match (usize::try_from(p), usize::try_from(g), usize::try_from(d)) {
            (Ok(n_prompt), Ok(n_gen), Ok(n_depth)) => Test {
                n_prompt,
                n_gen,
                n_depth,
            }
            .name(),
            _ => format!("n_prompt {p}, n_gen {g}, n_depth {d}"),
        };
        bail!(
            "{bin}'s record is of test {name} (n_prompt {p}, n_gen {g}, n_depth {d}), but {} was asked for",
            test.name()
        );
    }
    let samples = rec
        .get("samples_ns")
        .and_then(serde_json::Value::as_array)
        .with_context(|| format!("{bin}'s record ({}) has no samples_ns", test.name()))?;
    if samples.len() != 1 {
        bail!(
            "{bin}'s record ({}) has {} samples_ns; it was run with -r 1",
            test.name(),
            samples.len()
        );
    }
    let ns = samples[0].as_u64().with_context(|| {
        format!(
            "{bin}'s record ({}): samples_ns[0] {} is not a count of nanoseconds",
            test.name(),
            samples[0]
        )
    })?;
    if ns == 0 {
        bail!(
            "{bin}'s record ({}): samples_ns[0] is 0 ns (no time cannot be turned into tokens/s)",
            test.name()
        );
    }
    Ok((ns, rec.clone()))
}

fn llama_sampler(bin: &Path, threads: usize, extra: &[String], setup: &ChildSetup) -> Sampler {
    let b = bin.to_path_buf();
    let extra = extra.to_vec();
    let setup = setup.clone();
    Sampler {
        settings: EngineSettings {
            engine: "llama.cpp".into(),
            mode: None,
            simd: None,
            binary: format!("{} {}", bin.display(), extra.join(" "))
                .trim()
                .to_string(),
        },
        run: Box::new(move |model: &Path, t: Test| {
            let mut cmd = Command::new(&b);
            cmd.arg("-m")
                .arg(model)
                .args(["-p", &t.n_prompt.to_string(), "-n", &t.n_gen.to_string()])
                .args([
                    "-d",
                    &t.n_depth.to_string(),
                    "-r",
                    "1",
                    "-t",
                    &threads.to_string(),
                ])
                .args(["-o", "json"])
                .args(&extra);
            let stdout = run_child(cmd, &setup, "llama-bench", &b)?;
            let (ns, rec) = parse_llama_bench_output(&stdout, t, &b.display().to_string())?;
            Ok((ns, Some(rec)))
        }),
    }
}

/// A model's llama-bench-style description: `<arch> <params> <file type>` (e.g. `llama 135M Q4_1`).
fn model_type(model: &Model, n_params: u64) -> String {
    let size = if n_params >= 1_000_000_000 {
        format!("{:.1}B", n_params as f64 / 1e9)
    } else {
        format!("{}M", (n_params as f64 / 1e6).round())
    };
    let ftype = model
        .gguf()
        .get_u32("general.file_type")
        .ok()
        .map_or_else(|| "?".to_string(), file_type_name);
    format!("{} {size} {ftype}", model.info().arch)
}

/// `llama_ftype` names (llama.h) for `general.file_type`.
fn file_type_name(ft: u32) -> String {
    let n = match ft {
        0 => "all F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K - Medium",
        11 => "Q3_K - Small",
        12 => "Q3_K - Medium",
        13 => "Q3_K - Large",
        14 => "Q4_K - Small",
        15 => "Q4_K - Medium",
        16 => "Q5_K - Small",
        17 => "Q5_K - Medium",
        18 => "Q6_K",
        25 => "IQ4_NL",
        30 => "IQ4_XS",
        32 => "BF16",
        _ => return format!("ftype {ft}"),
    };
    n.to_string()
}

/// Check a bench's options before anything is measured: repetitions and tests (each by
/// [`Test::check`]), `--llama-bench-args` free of the flags the bench sets itself
/// ([`LLAMA_BENCH_OWN_FLAGS`]), the binaries present, and `reports_root` a writable directory
/// ([`crate::output::check_dir_target`]).
///
/// Errors name the option and what is wrong.
pub fn check_options(opts: &BenchOptions) -> Result<()> {
    if opts.repetitions == 0 || opts.repetitions > MAX_REPETITIONS {
        bail!(
            "--repetitions {}: give 1 to {MAX_REPETITIONS}",
            opts.repetitions
        );
    }
    if opts.tests.is_empty() {
        bail!("no tests: give -p and/or -n sizes above 0");
    }
    for (i, t) in opts.tests.iter().enumerate() {
        t.check()?;
        if opts.tests[..i].contains(t) {
            bail!(
                "test {} is asked for twice (a size repeated in -p, -n or -d)",
                t.name()
            );
        }
    }
    for (i, (id, _)) in opts.models.iter().enumerate() {
        if opts.models[..i].iter().any(|(other, _)| other == id) {
            bail!("--model {id} is given twice");
        }
    }
    if let Some(f) = opts
        .llama_bench_args
        .iter()
        .find(|a| LLAMA_BENCH_OWN_FLAGS.contains(&a.as_str()))
    {
        bail!(
            "--llama-bench-args {:?}: {f} is set by lockstep bench itself (model, -p/-n/-d, -r 1, -t, -o json); \
             give sizes with lockstep's own -p/-n/-d/-r/--threads",
            opts.llama_bench_args.join(" ")
        );
    }
    if opts.sample_timeout.is_zero() {
        bail!("--engine-timeout must be above 0 seconds");
    }
    let mut bins = vec![("this lockstep", &opts.lockstep_bin)];
    if let Some((b, _)) = &opts.baseline {
        bins.push(("--baseline-bin", b));
    }
    if let Some(b) = &opts.llama_bench {
        bins.push(("--llama-bench", b));
    }
    for (what, b) in bins {
        if !b.is_file() {
            bail!("{what} {}: no such file", b.display());
        }
    }
    crate::output::check_dir_target(&opts.reports_root, "--reports")
}

/// Run the bench: every model × test × repetition, engines interleaved; write `bench.json`, `bench.md`
/// and `bench.csv` under `reports_root/bench-<run id>/` (atomically). Returns the directory and report.
///
/// Every sample is a child process in its own process group ([`crate::process::run_bounded`]): killed
/// with its helpers after `sample_timeout`, and by the interrupt handler on Ctrl-C / SIGTERM.
///
/// Errors: bad options ([`check_options`]), a model that does not load or a test longer than its context
/// (all before anything is measured); any sample that fails or that is not one (a 0 ns sample, llama-bench's record of another test), naming
/// engine, model and test — a bench with a missing sample is not written.
pub fn bench(opts: &BenchOptions) -> Result<(PathBuf, BenchReport)> {
    check_options(opts)?;
    let scratch = crate::process::ScratchGuard::new("lockstep-bench-")?;
    let setup = ChildSetup {
        scratch: scratch.path().to_path_buf(),
        timeout: opts.sample_timeout,
    };
    let mut samplers = vec![lockstep_sampler(
        "lockstep",
        &opts.lockstep_bin,
        opts.mode,
        opts.simd,
        opts.threads,
        &setup,
    )];
    if let Some((bin, simd)) = &opts.baseline {
        samplers.push(lockstep_sampler(
            "baseline",
            bin,
            opts.mode,
            *simd,
            opts.threads,
            &setup,
        ));
    }
    if let Some(bin) = &opts.llama_bench {
        samplers.push(llama_sampler(
            bin,
            opts.threads,
            &opts.llama_bench_args,
            &setup,
        ));
    }
    // every model loads and holds every test's context before anything is measured
    let mut facts = Vec::new();
    for (id, path) in &opts.models {
        let model = Model::load(path).with_context(|| format!("loading {}", path.display()))?;
        for t in &opts.tests {
            let n_ctx = t.n_ctx().context("the test's context size overflows")?;
            model
                .check_context(n_ctx)
                .with_context(|| format!("--model {id}: test {}", t.name()))?;
        }
        let n_params: u64 = model.gguf().tensors().iter().map(|t| t.n_elements).sum();
        facts.push((
            n_params,
            decode_bytes_per_token(&model),
            model.gguf().file_size(),
            model_type(&model, n_params),
        ));
    }
    let bw = measure_read_bandwidth(5);
    let read_bandwidth = median(&bw);

    let mut results = Vec::new();
    let mut bandwidth = Vec::new();
    for ((id, path), (n_params, bytes_per_token, model_size, ours_type)) in
        opts.models.iter().zip(facts)
    {
        let filename = path.display().to_string();
        for &test in &opts.tests {
            let mut ns: Vec<Vec<u64>> = vec![Vec::new(); samplers.len()];
            let mut llama_rec = None;
            for rep in 0..opts.repetitions {
                for (k, s) in samplers.iter().enumerate() {
                    if opts.progress {
                        eprintln!(
                            "[bench] {id} {} rep {}/{} {}",
                            test.name(),
                            rep + 1,
                            opts.repetitions,
                            s.settings.engine
                        );
                    }
                    let (v, rec) = (s.run)(path, test).with_context(|| {
                        format!("{} on {id}, {}", s.settings.engine, test.name())
                    })?;
                    ns[k].push(v);
                    if rec.is_some() {
                        llama_rec = rec;
                    }
                }
            }
            for (k, s) in samplers.iter().enumerate() {
                let is_llama = s.settings.engine == "llama.cpp";
                let rec = llama_rec.as_ref().filter(|_| is_llama);
                let field = |k: &str, default: &str| {
                    rec.and_then(|r| r.get(k)).map_or_else(
                        || default.to_string(),
                        |v| v.as_str().map_or_else(|| v.to_string(), str::to_string),
                    )
                };
                let mut row = BenchResult {
                    engine: s.settings.engine.clone(),
                    mode: s.settings.mode.clone().unwrap_or_default(),
                    simd: s.settings.simd.clone().unwrap_or_default(),
                    model: id.clone(),
                    model_filename: filename.clone(),
                    model_type: field("model_type", &ours_type),
                    model_size,
                    model_n_params: n_params,
                    n_threads: opts.threads,
                    n_prompt: test.n_prompt,
                    n_gen: test.n_gen,
                    n_depth: test.n_depth,
                    type_k: field("type_k", "f32"),
                    type_v: field("type_v", "f32"),
                    flash_attn: field("flash_attn", "0"),
                    samples_ns: ns[k].clone(),
                    samples_ts: Vec::new(),
                    avg_ns: 0.0,
                    stddev_ns: 0.0,
                    avg_ts: 0.0,
                    stddev_ts: 0.0,
                    median_ts: 0.0,
                };
                row.fill_stats();
                results.push(row);
            }
            if test.n_gen > 0 {
                for r in &results[results.len() - samplers.len()..] {
                    bandwidth.push(BandwidthUse {
                        engine: r.engine.clone(),
                        model: id.clone(),
                        test: test.name(),
                        bytes_per_token,
                        fraction: r.median_ts * bytes_per_token as f64 / read_bandwidth,
                    });
                }
            }
        }
    }
    let llama_cpp_build = opts.llama_bench.as_ref().and_then(|b| {
        let info = b.parent()?.parent()?.join("build-info.json");
        if !info.exists() {
            return None;
        }
        let read = read_capped(&info, MAX_BUILD_INFO_BYTES, "llama.cpp build record")
            .and_then(|t| crate::report::from_json(&t));
        match read {
            Ok(v) => Some(v),
            Err(e) => {
                eprintln!("lockstep: warning: not recorded: {e:#}");
                None
            }
        }
    });
    let comparisons = comparisons(&results);
    let report = BenchReport {
        schema_version: BENCH_SCHEMA_VERSION,
        run_id: crate::report::new_run_id(),
        environment: Environment::detect(opts.threads, Path::new("/nonexistent")),
        repetitions: opts.repetitions,
        engines: samplers.iter().map(|s| s.settings.clone()).collect(),
        llama_cpp_build,
        read_bandwidth,
        read_bandwidth_samples: bw,
        results,
        comparisons,
        bandwidth,
    };
    validate_bench(&report).context("the bench just measured is not a valid bench.json")?;
    let dir = write_bench(&opts.reports_root, &report)?;
    Ok((dir, report))
}

/// Tokens/s of one sample of `ns` nanoseconds of `test` (`n_tokens / (ns · 1e-9)`).
fn tokens_per_second(test: Test, ns: u64) -> f64 {
    test.n_tokens() as f64 / (ns as f64 * 1e-9)
}

/// lockstep against every other engine, per model and test: for each `lockstep` row of `results` (in
/// order), one [`Comparison`] with each other engine's row of the same model and test (in order), the
/// ratio of median tokens/s and its [`bootstrap_ratio`] interval (2000 resamples) — what `bench.json`
/// records and what the speed gate recomputes from the samples.
pub fn comparisons(results: &[BenchResult]) -> Vec<Comparison> {
    // the other engines' rows by model and test, in order (one pass: a hostile file of many rows
    // costs linear time)
    let mut others: std::collections::HashMap<(&str, Test), Vec<&BenchResult>> =
        std::collections::HashMap::new();
    for y in results.iter().filter(|y| y.engine != "lockstep") {
        others
            .entry((y.model.as_str(), Test::of(y)))
            .or_default()
            .push(y);
    }
    let mut out = Vec::new();
    for x in results.iter().filter(|x| x.engine == "lockstep") {
        let test = Test::of(x);
        for y in others
            .get(&(x.model.as_str(), test))
            .map_or(&[][..], Vec::as_slice)
        {
            let (ratio, ci_low, ci_high) = bootstrap_ratio(&x.samples_ts, &y.samples_ts, 2000);
            out.push(Comparison {
                model: x.model.clone(),
                test: test.name(),
                numerator: x.engine.clone(),
                denominator: y.engine.clone(),
                ratio,
                ci_low,
                ci_high,
            });
        }
    }
    out
}

/// Write `bench.json`, `bench.md`, `bench.csv` into `reports_root/bench-<run id>/`, atomically (the run
/// id bounded and sanitised by [`crate::output::file_stem`]).
pub fn write_bench(reports_root: &Path, r: &BenchReport) -> Result<PathBuf> {
    let files = vec![
        ("bench.json".to_string(), crate::report::to_json_pretty(r)?),
        ("bench.md".to_string(), render_bench_markdown(r)),
        ("bench.csv".to_string(), render_bench_csv(r)),
    ];
    crate::report::write_files_atomically(
        reports_root,
        &format!("bench-{}", crate::output::file_stem(&r.run_id)),
        &files,
    )
}

/// The most repetitions a bench runs or a `bench.json` may hold (llama-bench's default is 5; the bootstrap
/// of every comparison resamples them 2000 times).
pub const MAX_REPETITIONS: usize = 1000;

/// The largest `bench.json` read (a bench of many models, tests and repetitions is a few MB).
pub const MAX_BENCH_JSON_BYTES: u64 = 64 << 20;

/// The largest speed limits file read (`ci/speed.toml` is a few hundred bytes).
pub const MAX_SPEED_LIMITS_BYTES: u64 = 64 << 10;

/// The largest llama.cpp `build-info.json` read.
pub const MAX_BUILD_INFO_BYTES: u64 = 1 << 20;

/// Read a text file of at most `cap` bytes. `what` names it in errors.
///
/// Errors (naming `what` and the path): missing or unreadable; not a regular file (a directory, device,
/// FIFO or socket, which no size cap can bound: `/dev/zero` never ends); larger than `cap`; not UTF-8.
fn read_capped(path: &Path, cap: u64, what: &str) -> Result<String> {
    use std::io::Read;
    let meta = std::fs::metadata(path)
        .with_context(|| format!("cannot read the {what} {}", path.display()))?;
    if !meta.is_file() {
        bail!(
            "the {what} {}: is not a regular file (a directory, device, FIFO or socket); lockstep reads \
             only regular files",
            path.display()
        );
    }
    let too_big = |n: u64| {
        anyhow::anyhow!(
            "the {what} {}: {n} bytes, more than the {cap} bytes such a file may have",
            path.display()
        )
    };
    if meta.len() > cap {
        return Err(too_big(meta.len()));
    }
    let f = std::fs::File::open(path)
        .with_context(|| format!("cannot read the {what} {}", path.display()))?;
    // the file was checked by path; check what was opened too (it may have been replaced since)
    if !f.metadata().is_ok_and(|m| m.is_file()) {
        bail!("the {what} {}: is not a regular file", path.display());
    }
    let mut buf = Vec::new();
    f.take(cap + 1)
        .read_to_end(&mut buf)
        .with_context(|| format!("cannot read the {what} {}", path.display()))?;
    if buf.len() as u64 > cap {
        return Err(too_big(buf.len() as u64));
    }
    String::from_utf8(buf).map_err(|e| {
        anyhow::anyhow!(
            "the {what} {}: not UTF-8 text (invalid byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

/// Read a `bench.json` (or the one inside a bench directory): at most [`MAX_BENCH_JSON_BYTES`] of a
/// regular file, parsed and validated by [`parse_bench_json`].
///
/// Errors: missing, unreadable, not a regular file, too large, or anything [`parse_bench_json`] refuses —
/// naming the file.
pub fn read_bench(path: &Path) -> Result<BenchReport> {
    let p = if path.is_dir() {
        path.join("bench.json")
    } else {
        path.to_path_buf()
    };
    let text = read_capped(&p, MAX_BENCH_JSON_BYTES, "bench.json")?;
    parse_bench_json(&text, &p)
}

/// Parse and validate the text of a `bench.json`; `path` only names the file in errors (no I/O).
///
/// Errors, each naming `path`: not JSON of this layout (unknown layout, missing field, wrong type); or
/// anything [`validate_bench`] refuses, with the field (e.g. `results[2].samples_ts[0]`).
pub fn parse_bench_json(text: &str, path: &Path) -> Result<BenchReport> {
    let r: BenchReport = crate::report::from_json(text)
        .with_context(|| format!("{} is not a lockstep bench.json", path.display()))?;
    validate_bench(&r).map_err(|e| anyhow::anyhow!("{}: {e:#}", path.display()))?;
    Ok(r)
}

/// Whether two recomputed floats agree (equal, or within 1e-9 relative: the same arithmetic on the
/// same samples gives the same bits, this only forgives a formatting round trip).
/// Never for a non-finite value.
fn agrees(recorded: f64, computed: f64) -> bool {
    recorded.is_finite()
        && computed.is_finite()
        && (recorded == computed
            || (recorded - computed).abs() <= 1e-9 * recorded.abs().max(computed.abs()))
}

/// The engines a bench runs.
const ENGINES: &[&str] = &["lockstep", "baseline", "llama.cpp"];

/// Check a bench report's numbers against themselves, so that nothing recorded can make the speed gate
/// pass what the samples do not show:
/// - `schema_version` is [`BENCH_SCHEMA_VERSION`]; `repetitions` ≥ 1; `read_bandwidth` and each of its
///   samples finite and above 0;
/// - `results` is not empty; each row's engine is `lockstep`, `baseline` or `llama.cpp`, its test valid
///   ([`Test::check`]), its `samples_ns` and `samples_ts` `repetitions` long, every sample above 0 (and
///   finite), `samples_ts` the tokens/s of `samples_ns`, and `median_ts`, `avg_ts`, `stddev_ts`,
///   `avg_ns`, `stddev_ns` those of the samples; no engine × model × test twice; every model × test has
///   a `lockstep` row;
/// - `comparisons` are exactly [`comparisons`] of the results (ratios and intervals recomputed);
/// - each `bandwidth` entry names a result and its `fraction` is that result's
///   `median_ts × bytes_per_token ÷ read_bandwidth`.
///
/// Errors name the field and what is wrong (the caller adds the file).
pub fn validate_bench(r: &BenchReport) -> Result<()> {
    if r.schema_version != BENCH_SCHEMA_VERSION {
        bail!(
            "schema_version: {} (this lockstep reads {BENCH_SCHEMA_VERSION})",
            r.schema_version
        );
    }
    if r.repetitions == 0 || r.repetitions > MAX_REPETITIONS {
        bail!(
            "repetitions: {}; a bench has 1 to {MAX_REPETITIONS}",
            r.repetitions
        );
    }
    let positive = |field: &str, x: f64| -> Result<()> {
        if !(x.is_finite() && x > 0.0) {
            bail!("{field}: {x:?} is not a finite number above 0");
        }
        Ok(())
    };
    positive("read_bandwidth", r.read_bandwidth)?;
    if r.read_bandwidth_samples.is_empty() {
        bail!("read_bandwidth_samples: empty");
    }
    for (i, &x) in r.read_bandwidth_samples.iter().enumerate() {
        positive(&format!("read_bandwidth_samples[{i}]"), x)?;
    }
    if r.results.is_empty() {
        bail!("results: empty; a bench without results has nothing to gate");
    }
    let mut seen = std::collections::HashSet::new();
    for (i, x) in r.results.iter().enumerate() {
        let test = Test::of(x);
        let at = format!("results[{i}] ({} {} {})", x.engine, x.model, test.name());
        if !ENGINES.contains(&x.engine.as_str()) {
            bail!("{at}.engine: {:?} is none of {ENGINES:?}", x.engine);
        }
        test.check().with_context(|| at.clone())?;
        if !seen.insert((x.engine.as_str(), x.model.as_str(), test)) {
            bail!("{at}: a second row of this engine, model and test");
        }
        for (name, n) in [
            ("samples_ns", x.samples_ns.len()),
            ("samples_ts", x.samples_ts.len()),
        ] {
            if n != r.repetitions {
                bail!(
                    "{at}.{name}: {n} samples, but repetitions is {}",
                    r.repetitions
                );
            }
        }
        for (j, (&ns, &ts)) in x.samples_ns.iter().zip(&x.samples_ts).enumerate() {
            if ns == 0 {
                bail!("{at}.samples_ns[{j}]: 0 ns (no time cannot be turned into tokens/s)");
            }
            positive(&format!("{at}.samples_ts[{j}]"), ts)?;
            let want = tokens_per_second(test, ns);
            if !agrees(ts, want) {
                bail!(
                    "{at}.samples_ts[{j}]: {ts:?} tokens/s, but samples_ns[{j}] = {ns} ns of {} tokens is {want:?}",
                    test.n_tokens()
                );
            }
        }
        let nsf: Vec<f64> = x.samples_ns.iter().map(|&n| n as f64).collect();
        let (avg_ns, stddev_ns) = mean_sd(&nsf);
        let (avg_ts, stddev_ts) = mean_sd(&x.samples_ts);
        for (name, recorded, computed) in [
            ("median_ts", x.median_ts, median(&x.samples_ts)),
            ("avg_ts", x.avg_ts, avg_ts),
            ("stddev_ts", x.stddev_ts, stddev_ts),
            ("avg_ns", x.avg_ns, avg_ns),
            ("stddev_ns", x.stddev_ns, stddev_ns),
        ] {
            if !agrees(recorded, computed) {
                bail!("{at}.{name}: recorded {recorded:?}, its samples give {computed:?}");
            }
        }
    }
    for (i, x) in r.results.iter().enumerate() {
        if !seen.contains(&("lockstep", x.model.as_str(), Test::of(x))) {
            bail!(
                "results[{i}] ({} {} {}): no lockstep row of this model and test",
                x.engine,
                x.model,
                Test::of(x).name()
            );
        }
    }
    let expected = comparisons(&r.results);
    let key = |c: &Comparison| {
        (
            c.model.clone(),
            c.test.clone(),
            c.numerator.clone(),
            c.denominator.clone(),
        )
    };
    let by_key: std::collections::HashMap<_, &Comparison> =
        expected.iter().map(|e| (key(e), e)).collect();
    let recorded: std::collections::HashSet<_> = r.comparisons.iter().map(key).collect();
    for (i, c) in r.comparisons.iter().enumerate() {
        let at = format!(
            "comparisons[{i}] ({} {} {} / {})",
            c.model, c.test, c.numerator, c.denominator
        );
        let Some(e) = by_key.get(&key(c)) else {
            bail!("{at}: the results hold no such pair of rows");
        };
        for (name, recorded, computed) in [
            ("ratio", c.ratio, e.ratio),
            ("ci_low", c.ci_low, e.ci_low),
            ("ci_high", c.ci_high, e.ci_high),
        ] {
            if !agrees(recorded, computed) {
                bail!("{at}.{name}: recorded {recorded:?}, the samples give {computed:?}");
            }
        }
    }
    for e in &expected {
        if !recorded.contains(&key(e)) {
            bail!(
                "comparisons: no {} {} {} / {}, which the results hold",
                e.model,
                e.test,
                e.numerator,
                e.denominator
            );
        }
    }
    if r.comparisons.len() != expected.len() {
        bail!(
            "comparisons: {} entries, the results give {}",
            r.comparisons.len(),
            expected.len()
        );
    }
    let names: Vec<String> = r.results.iter().map(|x| Test::of(x).name()).collect();
    let rows: std::collections::HashMap<(&str, &str, &str), &BenchResult> = r
        .results
        .iter()
        .zip(&names)
        .map(|(x, n)| ((x.engine.as_str(), x.model.as_str(), n.as_str()), x))
        .collect();
    for (i, b) in r.bandwidth.iter().enumerate() {
        let at = format!("bandwidth[{i}] ({} {} {})", b.engine, b.model, b.test);
        let Some(x) = rows.get(&(b.engine.as_str(), b.model.as_str(), b.test.as_str())) else {
            bail!("{at}: no result of this engine, model and test");
        };
        let want = x.median_ts * b.bytes_per_token as f64 / r.read_bandwidth;
        if !(b.fraction.is_finite() && agrees(b.fraction, want)) {
            bail!(
                "{at}.fraction: recorded {:?}, median_ts × bytes_per_token ÷ read_bandwidth gives {want:?}",
                b.fraction
            );
        }
    }
    Ok(())
}

/// `bench.md`: the settings, one table of every result in llama-bench's columns, the ratios with their
/// intervals, and decode's bandwidth use. Every value taken from the report is escaped by [`crate::format::md_text`].
pub fn render_bench_markdown(r: &BenchReport) -> String {
    use std::fmt::Write as _;
    let mut md = String::new();
    let e = &r.environment;
    let _ = writeln!(
        md,
        "# lockstep bench {}\n",
        crate::format::md_text(&r.run_id)
    );
    let _ = writeln!(
        md,
        "CPU {} ({}) · {} threads · lockstep {} at {} · {} repetitions per engine and test, engines interleaved · \
         read bandwidth {:.1} GB/s (median of {})\n",
        crate::format::md_text(&e.cpu_model),
        crate::format::md_text(&e.cpu_flags.join(" ")),
        e.threads,
        crate::format::md_text(&e.lockstep_version),
        crate::format::md_text(&e.git_commit.chars().take(12).collect::<String>()),
        r.repetitions,
        r.read_bandwidth / 1e9,
        r.read_bandwidth_samples.len()
    );
    for s in &r.engines {
        let _ = writeln!(
            md,
            "- **{}**: {}{}",
            crate::format::md_text(&s.engine),
            crate::format::md_text(&s.binary),
            match (&s.mode, &s.simd) {
                (Some(m), Some(x)) => format!(
                    ", mode {}, simd {}",
                    crate::format::md_text(m),
                    crate::format::md_text(x)
                ),
                _ => String::new(),
            }
        );
    }
    if let Some(b) = &r.llama_cpp_build {
        let _ = writeln!(
            md,
            "- llama.cpp build: llama-cpp-python {} (vendored llama.cpp {}), {}, {}",
            crate::format::md_text(b["llama_cpp_python"].as_str().unwrap_or("?")),
            crate::format::md_text(b["vendored_llama_cpp_commit"].as_str().unwrap_or("?")),
            crate::format::md_text(b["compiler"].as_str().unwrap_or("?")),
            crate::format::md_text(
                &b["cmake_flags"]
                    .as_array()
                    .map(|a| a
                        .iter()
                        .filter_map(|v| v.as_str())
                        .collect::<Vec<_>>()
                        .join(" "))
                    .unwrap_or_default()
            )
        );
    }
    let _ = writeln!(md, "\n## Results\n");
    let _ = writeln!(
        md,
        "| engine | model_type | model | test | n_threads | type_k | flash_attn | median t/s | avg_ts ± stddev_ts |"
    );
    let _ = writeln!(md, "|---|---|---|---|--:|---|---|--:|--:|");
    for x in &r.results {
        let test = Test {
            n_prompt: x.n_prompt,
            n_gen: x.n_gen,
            n_depth: x.n_depth,
        };
        let engine = if x.mode.is_empty() {
            crate::format::md_text(&x.engine)
        } else {
            format!(
                "{} ({}, simd {})",
                crate::format::md_text(&x.engine),
                crate::format::md_text(&x.mode),
                crate::format::md_text(&x.simd)
            )
        };
        let _ = writeln!(
            md,
            "| {engine} | {} | {} | {} | {} | {} | {} | {:.2} | {:.2} ± {:.2} |",
            crate::format::md_text(&x.model_type),
            crate::format::md_text(&x.model),
            test.name(),
            x.n_threads,
            crate::format::md_text(&x.type_k),
            crate::format::md_text(&x.flash_attn),
            x.median_ts,
            x.avg_ts,
            x.stddev_ts
        );
    }
    let _ = writeln!(md, "\n## Ratios (median t/s, 95% bootstrap interval)\n");
    let _ = writeln!(md, "| model | test | ratio | 95% interval |");
    let _ = writeln!(md, "|---|---|--:|---|");
    for c in &r.comparisons {
        let _ = writeln!(
            md,
            "| {} | {} | {} / {} = {:.3} | [{:.3}, {:.3}] |",
            crate::format::md_text(&c.model),
            crate::format::md_text(&c.test),
            crate::format::md_text(&c.numerator),
            crate::format::md_text(&c.denominator),
            c.ratio,
            c.ci_low,
            c.ci_high
        );
    }
    if !r.bandwidth.is_empty() {
        let _ = writeln!(md, "\n## Decode and the read bandwidth\n");
        let _ = writeln!(
            md,
            "Bytes per token: the weights one decode step reads (the tied or separate output matrix in full, one \
             embedding row not counted; KV cache not counted). Bound = bandwidth ÷ bytes per token.\n"
        );
        let _ = writeln!(
            md,
            "| engine | model | test | MB per token | bound t/s | fraction of bandwidth |"
        );
        let _ = writeln!(md, "|---|---|---|--:|--:|--:|");
        for b in &r.bandwidth {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.1} | {:.0} | {:.1}% |",
                crate::format::md_text(&b.engine),
                crate::format::md_text(&b.model),
                crate::format::md_text(&b.test),
                b.bytes_per_token as f64 / 1e6,
                r.read_bandwidth / b.bytes_per_token as f64,
                100.0 * b.fraction
            );
        }
    }
    md
}

/// `bench.csv`: one row per result, llama-bench's CSV fields plus ours.
pub fn render_bench_csv(r: &BenchReport) -> String {
    let mut out = String::from(
        "engine,mode,simd,model,model_filename,model_type,model_size,model_n_params,n_threads,n_prompt,n_gen,n_depth,type_k,type_v,flash_attn,avg_ns,stddev_ns,avg_ts,stddev_ts,median_ts\n",
    );
    let q = crate::format::csv_cell;
    for x in &r.results {
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
            q(&x.engine),
            q(&x.mode),
            q(&x.simd),
            q(&x.model),
            q(&x.model_filename),
            q(&x.model_type),
            x.model_size,
            x.model_n_params,
            x.n_threads,
            x.n_prompt,
            x.n_gen,
            x.n_depth,
            q(&x.type_k),
            q(&x.type_v),
            q(&x.flash_attn),
            x.avg_ns,
            x.stddev_ns,
            x.avg_ts,
            x.stddev_ts,
            x.median_ts
        ));
    }
    out
}

/// The speed gate's limits (`ci/speed.toml`).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeedLimits {
    /// Against a baseline lockstep (interleaved in the same bench, or another bench.json normalised by
    /// its own llama.cpp): fail when the interval's upper end is below `1 − max_slowdown`.
    pub max_slowdown: f64,
    /// Against llama.cpp in the same bench: fail when the interval's upper end is below this.
    pub min_ratio_to_llama_cpp: f64,
}

impl SpeedLimits {
    /// Read `ci/speed.toml`: at most [`MAX_SPEED_LIMITS_BYTES`] of a regular file, parsed and checked by
    /// [`parse_speed_limits`]. Errors name the file.
    pub fn load(path: &Path) -> Result<SpeedLimits> {
        let text = read_capped(path, MAX_SPEED_LIMITS_BYTES, "speed limits file")?;
        parse_speed_limits(&text, path)
    }

    /// Check that every limit is finite and in range: `max_slowdown` in [0, 1) (the baseline limit
    /// `1 − max_slowdown` stays above 0, so a check can fail), `min_ratio_to_llama_cpp` in (0, 1000]
    /// (0 would pass any speed). Errors name the field and its value.
    pub fn validate(&self) -> Result<()> {
        let m = self.max_slowdown;
        if !(m.is_finite() && (0.0..1.0).contains(&m)) {
            bail!(
                "max_slowdown: {m:?} is not in [0, 1) (a fraction of the baseline's speed; 1 or more would \
                 pass any slowdown)"
            );
        }
        let r = self.min_ratio_to_llama_cpp;
        if !(r.is_finite() && r > 0.0 && r <= 1000.0) {
            bail!(
                "min_ratio_to_llama_cpp: {r:?} is not in (0, 1000] (lockstep/llama.cpp tokens/s; 0 would \
                 pass any speed)"
            );
        }
        Ok(())
    }
}

/// Parse and check the text of a speed limits file (`ci/speed.toml`); `path` only names the file in
/// errors (no I/O).
///
/// Errors, each naming `path`: not TOML; an unknown key, a missing key, a value that is not a number;
/// a limit out of range or not finite (`nan`, `inf`) ([`SpeedLimits::validate`]).
pub fn parse_speed_limits(text: &str, path: &Path) -> Result<SpeedLimits> {
    let l: SpeedLimits = toml::from_str(text)
        .with_context(|| format!("{} is not a speed limits file", path.display()))?;
    l.validate()
        .map_err(|e| anyhow::anyhow!("{}: {e:#}", path.display()))?;
    Ok(l)
}

/// One line of the speed gate.
#[derive(Clone, Debug, PartialEq)]
pub struct SpeedCheck {
    /// Model and test.
    pub what: String,
    /// `lockstep / llama.cpp`, `lockstep / baseline`, or `(lockstep / llama.cpp) / (baseline file's)`.
    pub against: String,
    /// Ratio and its 95% interval.
    pub ratio: (f64, f64, f64),
    /// The limit the interval's upper end must reach.
    pub limit: f64,
    /// Passed.
    pub pass: bool,
}

/// The speed gate. Checks, per model and test, every ratio recomputed from the samples (the recorded
/// `comparisons` are never trusted; [`validate_bench`] refuses a file whose recorded ones differ):
/// - lockstep against every other engine of `bench` ([`comparisons`]; against llama.cpp:
///   `min_ratio_to_llama_cpp`; against an interleaved baseline: `1 − max_slowdown`);
/// - with `baseline_file`: the ratio of `lockstep / llama.cpp` in `bench` to the same ratio in the
///   baseline file (each run normalised by its own llama.cpp, so the two runs may come from different
///   moments of a noisy machine), bootstrapped over all four sample sets, against `1 − max_slowdown`.
///
/// A check fails when the upper end of the 95% interval is below its limit: a slowdown the repetitions'
/// spread cannot explain.
///
/// Errors: either report invalid ([`validate_bench`]: empty results, non-finite, zero or negative samples,
/// ...), the limits out of range ([`SpeedLimits::validate`]); with a baseline file, a model and test of
/// either file missing from the other (no check is dropped), or without llama.cpp rows.
pub fn gate_speed(
    bench: &BenchReport,
    baseline_file: Option<&BenchReport>,
    limits: &SpeedLimits,
) -> Result<Vec<SpeedCheck>> {
    validate_bench(bench).context("the current bench")?;
    if let Some(b) = baseline_file {
        validate_bench(b).context("the baseline bench")?;
    }
    limits.validate()?;
    let mut checks = Vec::new();
    for c in comparisons(&bench.results) {
        let limit = if c.denominator == "llama.cpp" {
            limits.min_ratio_to_llama_cpp
        } else {
            1.0 - limits.max_slowdown
        };
        checks.push(SpeedCheck {
            what: format!("{} {}", c.model, c.test),
            against: format!("{} / {}", c.numerator, c.denominator),
            ratio: (c.ratio, c.ci_low, c.ci_high),
            limit,
            pass: c.ci_high >= limit,
        });
    }
    if let Some(base) = baseline_file {
        let (cur, old) = (row_index(bench), row_index(base));
        let find = |i: &RowIndex<'_>, engine: &str, model: &str, test: Test| {
            i.get(&(engine, model, test)).map(|x| x.samples_ts.clone())
        };
        // every test the baseline holds must be checked again: a current bench that lost one would
        // silently drop its check
        for y in base.results.iter().filter(|y| y.engine == "lockstep") {
            if find(&cur, "lockstep", &y.model, Test::of(y)).is_none() {
                bail!(
                    "the current bench has no lockstep row for {} {}, which the baseline bench has (every \
                     test of the baseline is checked)",
                    y.model,
                    Test::of(y).name()
                );
            }
        }
        for x in bench.results.iter().filter(|x| x.engine == "lockstep") {
            let test = Test::of(x);
            let name = test.name();
            let get = |i: &RowIndex<'_>, e: &str, which: &str| {
                find(i, e, &x.model, test).with_context(|| {
                    format!("the {which} bench has no {e} row for {} {name}", x.model)
                })
            };
            let (a, la) = (x.samples_ts.clone(), get(&cur, "llama.cpp", "current")?);
            let (b, lb) = (
                get(&old, "lockstep", "baseline")?,
                get(&old, "llama.cpp", "baseline")?,
            );
            let ratio = double_ratio(&a, &la, &b, &lb, 2000);
            let limit = 1.0 - limits.max_slowdown;
            checks.push(SpeedCheck {
                what: format!("{} {name}", x.model),
                against: "(lockstep / llama.cpp) ÷ baseline file's".into(),
                ratio,
                limit,
                pass: ratio.2 >= limit,
            });
        }
    }
    Ok(checks)
}

/// A report's rows by engine, model and test.
type RowIndex<'a> = std::collections::HashMap<(&'a str, &'a str, Test), &'a BenchResult>;

fn row_index(r: &BenchReport) -> RowIndex<'_> {
    r.results
        .iter()
        .map(|x| ((x.engine.as_str(), x.model.as_str(), Test::of(x)), x))
        .collect()
}

/// `(m(a)/m(la)) / (m(b)/m(lb))` (m = median) with a 95% percentile-bootstrap interval over the four
/// sample sets, as [`bootstrap_ratio`].
pub fn double_ratio(
    a: &[f64],
    la: &[f64],
    b: &[f64],
    lb: &[f64],
    resamples: usize,
) -> (f64, f64, f64) {
    let mut s = 0x853c_49e6_748f_ea9bu64;
    let mut next = |n: usize| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % n as u64) as usize
    };
    let mut draw = |v: &[f64]| -> f64 {
        let r: Vec<f64> = (0..v.len()).map(|_| v[next(v.len())]).collect();
        median(&r)
    };
    let mut ratios: Vec<f64> = (0..resamples)
        .map(|_| (draw(a) / draw(la)) / (draw(b) / draw(lb)))
        .collect();
    ratios.sort_by(f64::total_cmp);
    let pick = |q: f64| ratios[((q * resamples as f64) as usize).min(resamples - 1)];
    (
        (median(a) / median(la)) / (median(b) / median(lb)),
        pick(0.025),
        pick(0.975),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_names_follow_llama_bench() {
        let t = tests_for(&[512], &[128], &[0, 512]);
        let names: Vec<String> = t.iter().map(Test::name).collect();
        assert_eq!(names, ["pp512", "tg128", "pp512 @ d512", "tg128 @ d512"]);
        assert!(tests_for(&[0], &[0], &[0]).is_empty());
    }

    #[test]
    fn median_and_bootstrap() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        // identical samples: ratio 1, a degenerate interval
        let a = [10.0; 5];
        assert_eq!(bootstrap_ratio(&a, &a, 500), (1.0, 1.0, 1.0));
        // a clear 2× with noise: the interval holds the ratio and excludes 1
        let x = [20.0, 21.0, 19.5, 20.4, 19.8];
        let y = [10.0, 10.3, 9.9, 10.1, 9.7];
        let (r, lo, hi) = bootstrap_ratio(&x, &y, 2000);
        assert!(
            lo <= r && r <= hi && lo > 1.8 && hi < 2.2,
            "{r} [{lo}, {hi}]"
        );
        let (r, lo, hi) = double_ratio(&x, &y, &x, &y, 2000);
        assert!(lo <= 1.0 && hi >= 1.0 && r == 1.0, "{r} [{lo}, {hi}]");
    }

    const TG8: Test = Test {
        n_prompt: 0,
        n_gen: 8,
        n_depth: 0,
    };

    /// A consistent result row of `test` whose samples are about `ts` tokens/s.
    fn result_of(engine: &str, test: Test, ts: &[f64]) -> BenchResult {
        let samples_ns: Vec<u64> = ts
            .iter()
            .map(|t| (test.n_tokens() as f64 * 1e9 / t) as u64)
            .collect();
        let samples_ts: Vec<f64> = samples_ns
            .iter()
            .map(|&n| tokens_per_second(test, n))
            .collect();
        let nsf: Vec<f64> = samples_ns.iter().map(|&n| n as f64).collect();
        let (avg_ns, stddev_ns) = mean_sd(&nsf);
        let (avg_ts, stddev_ts) = mean_sd(&samples_ts);
        BenchResult {
            engine: engine.into(),
            mode: String::new(),
            simd: String::new(),
            model: "m".into(),
            model_filename: "m.gguf".into(),
            model_type: "llama 1M Q4_1".into(),
            model_size: 1,
            model_n_params: 1,
            n_threads: 2,
            n_prompt: test.n_prompt,
            n_gen: test.n_gen,
            n_depth: test.n_depth,
            type_k: "f32".into(),
            type_v: "f32".into(),
            flash_attn: "0".into(),
            median_ts: median(&samples_ts),
            samples_ns,
            samples_ts,
            avg_ns,
            stddev_ns,
            avg_ts,
            stddev_ts,
        }
    }

    fn result(engine: &str, ts: &[f64]) -> BenchResult {
        result_of(engine, TG8, ts)
    }

    /// A consistent report of `results` (comparisons recomputed).
    fn report_of(results: Vec<BenchResult>) -> BenchReport {
        BenchReport {
            schema_version: BENCH_SCHEMA_VERSION,
            run_id: "x".into(),
            environment: Environment::detect(1, Path::new("/nonexistent")),
            repetitions: results[0].samples_ns.len(),
            engines: Vec::new(),
            llama_cpp_build: None,
            read_bandwidth: 1e10,
            read_bandwidth_samples: vec![1e10],
            comparisons: comparisons(&results),
            results,
            bandwidth: Vec::new(),
        }
    }

    fn report(ours: &[f64], llama: &[f64]) -> BenchReport {
        report_of(vec![result("lockstep", ours), result("llama.cpp", llama)])
    }

    const LIMITS: SpeedLimits = SpeedLimits {
        max_slowdown: 0.1,
        min_ratio_to_llama_cpp: 0.5,
    };

    /// The error of `r`'s validation, with its causes.
    fn invalid(r: &BenchReport) -> String {
        format!("{:#}", validate_bench(r).unwrap_err())
    }

    #[test]
    fn the_gate_fails_a_slowdown_beyond_the_spread_and_passes_noise() {
        let limits = SpeedLimits {
            max_slowdown: 0.1,
            min_ratio_to_llama_cpp: 0.5,
        };
        let base = report(
            &[100.0, 98.0, 102.0, 99.0, 101.0],
            &[120.0, 118.0, 121.0, 119.0, 122.0],
        );
        // the same speed measured again, other noise: passes against llama.cpp and against the baseline
        let again = report(
            &[99.0, 101.5, 97.0, 100.0, 103.0],
            &[121.0, 119.0, 118.5, 120.0, 122.5],
        );
        let checks = gate_speed(&again, Some(&base), &limits).unwrap();
        assert_eq!(checks.len(), 2);
        assert!(checks.iter().all(|c| c.pass), "{checks:?}");
        // 30% slower while llama.cpp is unchanged: the baseline check fails
        let slow = report(
            &[70.0, 69.0, 71.0, 70.5, 68.5],
            &[120.0, 119.0, 121.0, 118.0, 122.0],
        );
        let checks = gate_speed(&slow, Some(&base), &limits).unwrap();
        assert!(checks[0].pass, "0.58 of llama.cpp is above 0.5");
        assert!(!checks[1].pass, "{checks:?}");
        // below llama.cpp's floor
        let slower = report(
            &[40.0, 41.0, 39.0, 40.5, 39.5],
            &[120.0, 119.0, 121.0, 118.0, 122.0],
        );
        assert!(!gate_speed(&slower, None, &limits).unwrap()[0].pass);
        // a baseline without the rows is an error, not a pass
        let mut empty = base.clone();
        empty.results.clear();
        let e = format!(
            "{:#}",
            gate_speed(&again, Some(&empty), &limits).unwrap_err()
        );
        assert!(
            e.contains("the baseline bench") && e.contains("results: empty"),
            "{e}"
        );
        let no_llama = report_of(vec![base.results[0].clone()]);
        let e = gate_speed(&again, Some(&no_llama), &limits)
            .unwrap_err()
            .to_string();
        assert!(e.contains("baseline bench has no llama.cpp row"), "{e}");
    }

    #[test]
    fn recorded_comparisons_that_the_samples_do_not_give_are_refused() {
        let ok = report(&[100.0, 98.0, 102.0], &[120.0, 118.0, 121.0]);
        validate_bench(&ok).unwrap();
        // an upper end of 1e308, or "inf"
        for high in [1e308, f64::INFINITY] {
            let mut r = ok.clone();
            r.comparisons[0].ci_high = high;
            let e = invalid(&r);
            assert!(
                e.contains("comparisons[0] (m tg8 lockstep / llama.cpp).ci_high: recorded"),
                "{e}"
            );
            assert!(gate_speed(&r, None, &LIMITS).is_err());
        }
        // ratio 0.1 with interval [0.1, 5]
        let mut r = ok.clone();
        (
            r.comparisons[0].ratio,
            r.comparisons[0].ci_low,
            r.comparisons[0].ci_high,
        ) = (0.1, 0.1, 5.0);
        assert!(
            invalid(&r).contains(".ratio: recorded 0.1"),
            "{}",
            invalid(&r)
        );
        // the samples show lockstep 100× slower than llama.cpp, the comparison says 1
        let slow = report(&[1.0, 1.1, 0.9], &[100.0, 101.0, 99.0]);
        let mut r = slow.clone();
        r.comparisons = ok.comparisons.clone();
        (
            r.comparisons[0].ratio,
            r.comparisons[0].ci_low,
            r.comparisons[0].ci_high,
        ) = (1.0, 0.9, 1.1);
        assert!(invalid(&r).contains("the samples give"), "{}", invalid(&r));
        // the gate recomputes: even a report never validated cannot pass on its recorded comparisons
        let checks = gate_speed(&slow, None, &LIMITS).unwrap();
        assert!(!checks[0].pass && checks[0].ratio.2 < 0.02, "{checks:?}");
        // a comparison dropped, or one more
        let mut r = ok.clone();
        r.comparisons.clear();
        assert!(
            invalid(&r).contains("comparisons: no m tg8 lockstep / llama.cpp"),
            "{}",
            invalid(&r)
        );
        let mut r = ok.clone();
        r.comparisons.push(r.comparisons[0].clone());
        assert!(invalid(&r).contains("2 entries, the results give 1"));
    }

    #[test]
    fn empty_zero_negative_and_non_finite_samples_are_refused() {
        let ok = report(&[100.0, 98.0, 102.0], &[120.0, 118.0, 121.0]);
        // results: [] with the comparisons kept
        let mut r = ok.clone();
        r.results.clear();
        assert!(invalid(&r).contains("results: empty"));
        assert!(gate_speed(&r, None, &LIMITS).is_err());
        for bad in [0.0, -5.0, f64::INFINITY, f64::NAN] {
            let mut r = ok.clone();
            r.results[1].samples_ts[2] = bad;
            let e = invalid(&r);
            assert!(
                e.contains("results[1] (llama.cpp m tg8).samples_ts[2]")
                    && e.contains("not a finite number above 0"),
                "{e}"
            );
            // as the baseline file too: an error, never a ratio of inf or 1 that passes
            let e = format!("{:#}", gate_speed(&ok, Some(&r), &LIMITS).unwrap_err());
            assert!(e.contains("the baseline bench"), "{e}");
        }
        let mut r = ok.clone();
        r.results[0].samples_ns[0] = 0;
        assert!(
            invalid(&r).contains("samples_ns[0]: 0 ns"),
            "{}",
            invalid(&r)
        );
        // tokens/s that the nanoseconds do not give
        let mut r = ok.clone();
        r.results[0].samples_ts[0] *= 100.0;
        assert!(invalid(&r).contains("but samples_ns[0]"), "{}", invalid(&r));
        // a median that the samples do not give
        let mut r = ok.clone();
        r.results[0].median_ts = 1e6;
        assert!(invalid(&r).contains("median_ts: recorded 1000000.0"));
        // fewer samples than repetitions; an unknown engine; a row twice; no lockstep row
        let mut r = ok.clone();
        r.results[0].samples_ns.pop();
        assert!(invalid(&r).contains("samples_ns: 2 samples, but repetitions is 3"));
        let mut r = ok.clone();
        r.results[1].engine = "vllm".into();
        assert!(invalid(&r).contains("engine: \"vllm\" is none of"));
        let r = report_of(vec![ok.results[0].clone(), ok.results[0].clone()]);
        assert!(invalid(&r).contains("a second row"));
        let r = report_of(vec![ok.results[1].clone()]);
        assert!(invalid(&r).contains("no lockstep row"));
        let mut r = ok.clone();
        r.read_bandwidth = f64::INFINITY;
        assert!(invalid(&r).contains("read_bandwidth: inf"));
        let mut r = ok.clone();
        r.repetitions = MAX_REPETITIONS + 1;
        assert!(invalid(&r).contains("repetitions: 1001; a bench has 1 to 1000"));
    }

    #[test]
    fn every_test_of_the_baseline_file_is_checked() {
        let pp16 = Test {
            n_prompt: 16,
            n_gen: 0,
            n_depth: 0,
        };
        let (ours, llama) = ([100.0, 98.0, 102.0], [120.0, 118.0, 121.0]);
        let both = report_of(vec![
            result("lockstep", &ours),
            result("llama.cpp", &llama),
            result_of("lockstep", pp16, &ours),
            result_of("llama.cpp", pp16, &llama),
        ]);
        assert_eq!(gate_speed(&both, Some(&both), &LIMITS).unwrap().len(), 4);
        let one = report(&ours, &llama);
        let e = gate_speed(&one, Some(&both), &LIMITS)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the current bench has no lockstep row for m pp16"),
            "{e}"
        );
        let e = gate_speed(&both, Some(&one), &LIMITS)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the baseline bench has no lockstep row for m pp16"),
            "{e}"
        );
    }

    #[test]
    fn bench_json_round_trips_through_the_parser() {
        let r = report(&[100.0, 98.0, 102.0], &[120.0, 118.0, 121.0]);
        let text = crate::report::to_json_pretty(&r).unwrap();
        let p = Path::new("b/bench.json");
        assert_eq!(parse_bench_json(&text, p).unwrap(), r);
        let e = parse_bench_json(&text.replace("\"ci_high\": ", "\"ci_high\": 1e300 + "), p);
        assert!(format!("{:#}", e.unwrap_err()).contains("b/bench.json"));
        // "inf" as a string is read as infinity, and refused
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["comparisons"][0]["ci_high"] = "inf".into();
        let e = format!("{:#}", parse_bench_json(&v.to_string(), p).unwrap_err());
        assert!(
            e.starts_with("b/bench.json: comparisons[0]") && e.contains("ci_high: recorded inf"),
            "{e}"
        );
    }

    #[test]
    fn speed_limits_are_finite_in_range_and_known() {
        let p = Path::new("ci/speed.toml");
        let l = parse_speed_limits(include_str!("../../ci/speed.toml"), p).unwrap();
        assert!(l.max_slowdown > 0.0 && l.min_ratio_to_llama_cpp > 0.0);
        for (text, needle) in [
            (
                "max_slowdown = nan\nmin_ratio_to_llama_cpp = 0.5",
                "max_slowdown: NaN",
            ),
            (
                "max_slowdown = 0.1\nmin_ratio_to_llama_cpp = inf",
                "min_ratio_to_llama_cpp: inf",
            ),
            (
                "max_slowdown = -0.1\nmin_ratio_to_llama_cpp = 0.5",
                "max_slowdown: -0.1",
            ),
            (
                "max_slowdown = 1.0\nmin_ratio_to_llama_cpp = 0.5",
                "max_slowdown: 1",
            ),
            (
                "max_slowdown = 0.1\nmin_ratio_to_llama_cpp = 0.0",
                "min_ratio_to_llama_cpp: 0",
            ),
            (
                "max_slowdown = 0.1\nmin_ratio_to_llama_cpp = -inf",
                "min_ratio_to_llama_cpp: -inf",
            ),
            (
                "max_slowdown = 0.1\nmin_ratio_to_llama_cpp = 0.5\nmax_slowdwn = 0.5",
                "unknown field",
            ),
            ("max_slowdown = 0.1", "missing field"),
            (
                "max_slowdown = \"0.1\"\nmin_ratio_to_llama_cpp = 0.5",
                "speed limits",
            ),
        ] {
            let e = format!("{:#}", parse_speed_limits(text, p).unwrap_err());
            assert!(
                e.contains("ci/speed.toml") && e.contains(needle),
                "{text}: {e}"
            );
        }
        // the gate itself refuses limits built without the parser
        let r = report(&[100.0, 98.0, 102.0], &[120.0, 118.0, 121.0]);
        let bad = SpeedLimits {
            max_slowdown: 0.1,
            min_ratio_to_llama_cpp: f64::NAN,
        };
        assert!(gate_speed(&r, None, &bad).is_err());
    }

    #[test]
    fn llama_bench_records_of_no_time_or_another_test_are_refused() {
        let pp16 = Test {
            n_prompt: 16,
            n_gen: 0,
            n_depth: 0,
        };
        let rec = |p: u64, ns: &str| {
            format!(r#"[{{"n_prompt": {p}, "n_gen": 0, "n_depth": 0, "samples_ns": [{ns}]}}]"#)
        };
        let (ns, v) = parse_llama_bench_output(rec(16, "1234").as_bytes(), pp16, "lb").unwrap();
        assert_eq!((ns, v["n_prompt"].as_u64()), (1234, Some(16)));
        for (out, needle) in [
            (rec(16, "0"), "samples_ns[0] is 0 ns"),
            (
                rec(4096, "1234"),
                "record is of test pp4096 (n_prompt 4096, n_gen 0, n_depth 0), but pp16",
            ),
            (rec(16, "-3"), "is not a count of nanoseconds"),
            (rec(16, "1, 2"), "has 2 samples_ns"),
            (
                format!("[{0}, {0}]", &rec(16, "1")[1..rec(16, "1").len() - 1]),
                "printed 2 test records",
            ),
            ("[]".into(), "printed 0 test records"),
            ("not json".into(), "printed no JSON"),
            (r#"[{"n_gen": 0}]"#.into(), "no n_prompt or n_gen"),
        ] {
            let e = format!(
                "{:#}",
                parse_llama_bench_output(out.as_bytes(), pp16, "lb").unwrap_err()
            );
            assert!(e.contains("lb") && e.contains(needle), "{out}: {e}");
        }
        // a record without n_depth is one of depth 0 only
        let no_depth = r#"[{"n_prompt": 16, "n_gen": 0, "samples_ns": [5]}]"#;
        assert!(parse_llama_bench_output(no_depth.as_bytes(), pp16, "lb").is_ok());
        let deep = Test {
            n_depth: 64,
            ..pp16
        };
        assert!(parse_llama_bench_output(no_depth.as_bytes(), deep, "lb").is_err());
        assert!(parse_sample_ns(b"0\n", "ls")
            .unwrap_err()
            .to_string()
            .contains("0 ns"));
        assert!(parse_sample_ns(b"12x", "ls").is_err());
        assert_eq!(parse_sample_ns(b"12\n", "ls").unwrap(), 12);
    }

    #[test]
    fn overflowing_tests_are_refused() {
        let t = Test {
            n_prompt: 512,
            n_gen: 0,
            n_depth: usize::MAX,
        };
        assert_eq!(t.n_ctx(), None);
        let e = t.check().unwrap_err().to_string();
        assert!(
            e.contains("overflows") && e.contains(&usize::MAX.to_string()),
            "{e}"
        );
        assert!(Test { n_gen: 1, ..t }.check().is_err());
        assert!(tests_for(&[512], &[], &[0])[0].check().is_ok());
    }

    #[test]
    fn hostile_text_cannot_break_bench_md_tables() {
        let mut r = report(&[100.0, 98.0, 102.0], &[120.0, 118.0, 121.0]);
        let hostile = "models/a|b\n| x | y |\n<script>alert(1)</script>`.gguf";
        for x in &mut r.results {
            x.model = hostile.into();
            x.model_type = "llama 1M Q4_1|<b>".into();
        }
        r.comparisons = comparisons(&r.results);
        r.bandwidth.push(BandwidthUse {
            engine: "lockstep".into(),
            model: hostile.into(),
            test: "tg8".into(),
            bytes_per_token: 1000,
            fraction: r.results[0].median_ts * 1000.0 / r.read_bandwidth,
        });
        validate_bench(&r).unwrap();
        let md = render_bench_markdown(&r);
        assert!(!md.contains("<script>") && !md.contains("<b>"), "{md}");
        assert!(
            md.contains("&lt;script&gt;") && md.contains("a\\|b"),
            "{md}"
        );
        // every table row has as many cell separators as its header
        let unescaped = |l: &str| {
            let mut n = 0;
            let mut chars = l.chars();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => {
                        chars.next();
                    }
                    '|' => n += 1,
                    _ => {}
                }
            }
            n
        };
        let mut header = 0;
        let mut rows = 0;
        for l in md.lines() {
            if !l.starts_with('|') {
                header = 0;
                continue;
            }
            if header == 0 {
                header = unescaped(l);
            }
            assert_eq!(unescaped(l), header, "{l}");
            rows += 1;
        }
        // results: header, rule, 2 rows; ratios: 3; bandwidth: 3
        assert_eq!(rows, 10, "{md}");
        let csv = render_bench_csv(&r);
        // one line per record: a model path's line breaks become spaces (format::csv_cell)
        assert_eq!(csv.lines().count(), 1 + 2, "{csv}");
    }

    #[test]
    fn files_that_cannot_be_bounded_or_are_too_big_are_not_read() {
        let e = read_bench(Path::new("/dev/zero")).unwrap_err().to_string();
        assert!(
            e.contains("/dev/zero") && e.contains("not a regular file"),
            "{e}"
        );
        let e = SpeedLimits::load(Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("speed.toml");
        std::fs::write(&big, vec![b'#'; MAX_SPEED_LIMITS_BYTES as usize + 1]).unwrap();
        let e = SpeedLimits::load(&big).unwrap_err().to_string();
        assert!(e.contains("more than the 65536 bytes"), "{e}");
        let e = read_bench(&dir.path().join("missing.json"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.json"), "{e}");
    }
}
