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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
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

    /// Tokens the timed part processes.
    pub fn n_tokens(&self) -> usize {
        self.n_prompt + self.n_gen
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
/// Errors: whatever the engine reports (a test longer than the model's context, say).
pub fn sample(model: &Model, test: Test, mode: NumericsMode, simd: Simd) -> Result<u64> {
    let n_vocab = model.info().n_vocab;
    let n_ctx = test.n_depth + test.n_tokens();
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
}

/// Runs one sample of one engine: nanoseconds, and llama-bench's record when it is llama.cpp.
type SampleFn = Box<dyn Fn(&Path, Test) -> Result<(u64, Option<serde_json::Value>)>>;

struct Sampler {
    settings: EngineSettings,
    run: SampleFn,
}

fn lockstep_sampler(
    engine: &str,
    bin: &Path,
    mode: NumericsMode,
    simd: Simd,
    threads: usize,
) -> Sampler {
    let b = bin.to_path_buf();
    Sampler {
        settings: EngineSettings {
            engine: engine.into(),
            mode: Some(mode.to_string()),
            simd: Some(simd.to_string()),
            binary: bin.display().to_string(),
        },
        run: Box::new(move |model: &Path, t: Test| {
            let out = Command::new(&b)
                .arg("--threads")
                .arg(threads.to_string())
                .arg("bench-sample")
                .arg("--model")
                .arg(model)
                .args(["--mode", mode.name(), "--simd", simd.name()])
                .args(["-p", &t.n_prompt.to_string(), "-n", &t.n_gen.to_string()])
                .args(["-d", &t.n_depth.to_string()])
                .output()
                .with_context(|| format!("cannot run {}", b.display()))?;
            if !out.status.success() {
                bail!(
                    "{} bench-sample failed ({}): {}",
                    b.display(),
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            let text = String::from_utf8_lossy(&out.stdout);
            let ns: u64 = text.trim().parse().with_context(|| {
                format!(
                    "{} bench-sample printed {:?}, not nanoseconds",
                    b.display(),
                    text.trim()
                )
            })?;
            Ok((ns, None))
        }),
    }
}

fn llama_sampler(bin: &Path, threads: usize, extra: &[String]) -> Sampler {
    let b = bin.to_path_buf();
    let extra = extra.to_vec();
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
            let out = Command::new(&b)
                .arg("-m")
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
                .args(&extra)
                .output()
                .with_context(|| format!("cannot run {}", b.display()))?;
            if !out.status.success() {
                bail!(
                    "{} failed ({}): {}",
                    b.display(),
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            let v: serde_json::Value = serde_json::from_slice(&out.stdout)
                .with_context(|| format!("{} printed no JSON", b.display()))?;
            let rec = v
                .as_array()
                .and_then(|a| a.first())
                .cloned()
                .with_context(|| format!("{} printed no test record", b.display()))?;
            let ns = rec["samples_ns"]
                .as_array()
                .and_then(|a| a.first())
                .and_then(serde_json::Value::as_u64)
                .with_context(|| format!("{}'s record has no samples_ns", b.display()))?;
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

/// Run the bench: every model × test × repetition, engines interleaved; write `bench.json`, `bench.md`
/// and `bench.csv` under `reports_root/bench-<run id>/` (atomically). Returns the directory and report.
///
/// Errors: a model that does not load; any sample that fails (naming engine, model and test) — a bench
/// with a missing sample is not written.
pub fn bench(opts: &BenchOptions) -> Result<(PathBuf, BenchReport)> {
    if opts.repetitions == 0 {
        bail!("--repetitions must be at least 1");
    }
    if opts.tests.is_empty() {
        bail!("no tests: give -p and/or -n sizes above 0");
    }
    let mut samplers = vec![lockstep_sampler(
        "lockstep",
        &opts.lockstep_bin,
        opts.mode,
        opts.simd,
        opts.threads,
    )];
    if let Some((bin, simd)) = &opts.baseline {
        samplers.push(lockstep_sampler(
            "baseline",
            bin,
            opts.mode,
            *simd,
            opts.threads,
        ));
    }
    if let Some(bin) = &opts.llama_bench {
        samplers.push(llama_sampler(bin, opts.threads, &opts.llama_bench_args));
    }
    let bw = measure_read_bandwidth(5);
    let read_bandwidth = median(&bw);

    let mut results = Vec::new();
    let mut comparisons = Vec::new();
    let mut bandwidth = Vec::new();
    for (id, path) in &opts.models {
        let model = Model::load(path).with_context(|| format!("loading {}", path.display()))?;
        let n_params: u64 = model.gguf().tensors().iter().map(|t| t.n_elements).sum();
        let bytes_per_token = decode_bytes_per_token(&model);
        let model_size = model.gguf().file_size();
        let filename = path.display().to_string();
        let ours_type = model_type(&model, n_params);
        drop(model);
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
                let samples_ts: Vec<f64> = ns[k]
                    .iter()
                    .map(|&n| test.n_tokens() as f64 / (n as f64 * 1e-9))
                    .collect();
                let nsf: Vec<f64> = ns[k].iter().map(|&n| n as f64).collect();
                let (avg_ns, stddev_ns) = mean_sd(&nsf);
                let (avg_ts, stddev_ts) = mean_sd(&samples_ts);
                let is_llama = s.settings.engine == "llama.cpp";
                let rec = llama_rec.as_ref().filter(|_| is_llama);
                let field = |k: &str, default: &str| {
                    rec.and_then(|r| r.get(k)).map_or_else(
                        || default.to_string(),
                        |v| v.as_str().map_or_else(|| v.to_string(), str::to_string),
                    )
                };
                results.push(BenchResult {
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
                    median_ts: median(&samples_ts),
                    samples_ns: ns[k].clone(),
                    samples_ts,
                    avg_ns,
                    stddev_ns,
                    avg_ts,
                    stddev_ts,
                });
            }
            let base = results.len() - samplers.len();
            let ours = &results[base];
            for other in &results[base + 1..] {
                let (ratio, lo, hi) = bootstrap_ratio(&ours.samples_ts, &other.samples_ts, 2000);
                comparisons.push(Comparison {
                    model: id.clone(),
                    test: test.name(),
                    numerator: ours.engine.clone(),
                    denominator: other.engine.clone(),
                    ratio,
                    ci_low: lo,
                    ci_high: hi,
                });
            }
            if test.n_gen > 0 {
                for r in &results[base..] {
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
        serde_json::from_str(&std::fs::read_to_string(info).ok()?).ok()
    });
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
    let dir = write_bench(&opts.reports_root, &report)?;
    Ok((dir, report))
}

/// Write `bench.json`, `bench.md`, `bench.csv` into `reports_root/bench-<run id>/`, atomically.
pub fn write_bench(reports_root: &Path, r: &BenchReport) -> Result<PathBuf> {
    let files = vec![
        ("bench.json".to_string(), crate::report::to_json_pretty(r)?),
        ("bench.md".to_string(), render_bench_markdown(r)),
        ("bench.csv".to_string(), render_bench_csv(r)),
    ];
    crate::report::write_files_atomically(reports_root, &format!("bench-{}", r.run_id), &files)
}

/// Read a `bench.json` (or the one inside a bench directory).
///
/// Errors: missing or unreadable file, not JSON of this layout, another schema version — naming the file.
pub fn read_bench(path: &Path) -> Result<BenchReport> {
    let p = if path.is_dir() {
        path.join("bench.json")
    } else {
        path.to_path_buf()
    };
    let text =
        std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?;
    let r: BenchReport = crate::report::from_json(&text)
        .with_context(|| format!("{} is not a lockstep bench.json", p.display()))?;
    if r.schema_version != BENCH_SCHEMA_VERSION {
        bail!(
            "{}: bench schema version {} (this lockstep reads {BENCH_SCHEMA_VERSION})",
            p.display(),
            r.schema_version
        );
    }
    Ok(r)
}

/// `bench.md`: the settings, one table of every result in llama-bench's columns, the ratios with their
/// intervals, and decode's bandwidth use.
pub fn render_bench_markdown(r: &BenchReport) -> String {
    use std::fmt::Write as _;
    let mut md = String::new();
    let e = &r.environment;
    let _ = writeln!(md, "# lockstep bench {}\n", r.run_id);
    let _ = writeln!(
        md,
        "CPU {} ({}) · {} threads · lockstep {} at {} · {} repetitions per engine and test, engines interleaved · \
         read bandwidth {:.1} GB/s (median of {})\n",
        e.cpu_model,
        e.cpu_flags.join(" "),
        e.threads,
        e.lockstep_version,
        e.git_commit.chars().take(12).collect::<String>(),
        r.repetitions,
        r.read_bandwidth / 1e9,
        r.read_bandwidth_samples.len()
    );
    for s in &r.engines {
        let _ = writeln!(
            md,
            "- **{}**: `{}`{}",
            s.engine,
            s.binary,
            match (&s.mode, &s.simd) {
                (Some(m), Some(x)) => format!(", mode {m}, simd {x}"),
                _ => String::new(),
            }
        );
    }
    if let Some(b) = &r.llama_cpp_build {
        let _ = writeln!(
            md,
            "- llama.cpp build: llama-cpp-python {} (vendored llama.cpp {}), {}, {}",
            b["llama_cpp_python"].as_str().unwrap_or("?"),
            b["vendored_llama_cpp_commit"].as_str().unwrap_or("?"),
            b["compiler"].as_str().unwrap_or("?"),
            b["cmake_flags"]
                .as_array()
                .map(|a| a
                    .iter()
                    .filter_map(|v| v.as_str())
                    .collect::<Vec<_>>()
                    .join(" "))
                .unwrap_or_default()
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
            x.engine.clone()
        } else {
            format!("{} ({}, simd {})", x.engine, x.mode, x.simd)
        };
        let _ = writeln!(
            md,
            "| {engine} | {} | {} | {} | {} | {} | {} | {:.2} | {:.2} ± {:.2} |",
            x.model_type,
            x.model,
            test.name(),
            x.n_threads,
            x.type_k,
            x.flash_attn,
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
            c.model, c.test, c.numerator, c.denominator, c.ratio, c.ci_low, c.ci_high
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
                b.engine,
                b.model,
                b.test,
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
    let q = |s: &str| {
        if s.contains([',', '"', '\n']) {
            format!("\"{}\"", s.replace('"', "\"\""))
        } else {
            s.to_string()
        }
    };
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
    /// Read `ci/speed.toml`. Errors name the file.
    pub fn load(path: &Path) -> Result<SpeedLimits> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let l: SpeedLimits = toml::from_str(&text)
            .with_context(|| format!("{} is not a speed limits file", path.display()))?;
        if !(l.max_slowdown >= 0.0 && l.max_slowdown < 1.0 && l.min_ratio_to_llama_cpp >= 0.0) {
            bail!(
                "{}: max_slowdown must be in [0, 1) and min_ratio_to_llama_cpp ≥ 0",
                path.display()
            );
        }
        Ok(l)
    }
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

/// The speed gate. Checks, per model and test:
/// - every comparison in `bench` (against llama.cpp: `min_ratio_to_llama_cpp`; against an interleaved
///   baseline: `1 − max_slowdown`);
/// - with `baseline_file`: the ratio of `lockstep / llama.cpp` in `bench` to the same ratio in the
///   baseline file (each run normalised by its own llama.cpp, so the two runs may come from different
///   moments of a noisy machine), bootstrapped over all four sample sets, against `1 − max_slowdown`.
///
/// A check fails when the upper end of the 95% interval is below its limit: a slowdown the repetitions'
/// spread cannot explain. Errors: a baseline file without the same model, test and llama.cpp rows.
pub fn gate_speed(
    bench: &BenchReport,
    baseline_file: Option<&BenchReport>,
    limits: &SpeedLimits,
) -> Result<Vec<SpeedCheck>> {
    let mut checks = Vec::new();
    for c in &bench.comparisons {
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
        let find = |r: &BenchReport, engine: &str, model: &str, test: &str| -> Option<Vec<f64>> {
            r.results
                .iter()
                .find(|x| {
                    x.engine == engine
                        && x.model == model
                        && Test {
                            n_prompt: x.n_prompt,
                            n_gen: x.n_gen,
                            n_depth: x.n_depth,
                        }
                        .name()
                            == test
                })
                .map(|x| x.samples_ts.clone())
        };
        for x in bench.results.iter().filter(|x| x.engine == "lockstep") {
            let test = Test {
                n_prompt: x.n_prompt,
                n_gen: x.n_gen,
                n_depth: x.n_depth,
            }
            .name();
            let get = |r: &BenchReport, e: &str, which: &str| {
                find(r, e, &x.model, &test).with_context(|| {
                    format!("the {which} bench has no {e} row for {} {test}", x.model)
                })
            };
            let (a, la) = (x.samples_ts.clone(), get(bench, "llama.cpp", "current")?);
            let (b, lb) = (
                get(base, "lockstep", "baseline")?,
                get(base, "llama.cpp", "baseline")?,
            );
            let ratio = double_ratio(&a, &la, &b, &lb, 2000);
            let limit = 1.0 - limits.max_slowdown;
            checks.push(SpeedCheck {
                what: format!("{} {test}", x.model),
                against: "(lockstep / llama.cpp) ÷ baseline file's".into(),
                ratio,
                limit,
                pass: ratio.2 >= limit,
            });
        }
    }
    Ok(checks)
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

    fn result(engine: &str, ts: &[f64]) -> BenchResult {
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
            n_prompt: 0,
            n_gen: 8,
            n_depth: 0,
            type_k: "f32".into(),
            type_v: "f32".into(),
            flash_attn: "0".into(),
            samples_ns: ts.iter().map(|t| (8e9 / t) as u64).collect(),
            samples_ts: ts.to_vec(),
            avg_ns: 0.0,
            stddev_ns: 0.0,
            avg_ts: 0.0,
            stddev_ts: 0.0,
            median_ts: median(ts),
        }
    }

    fn report(ours: &[f64], llama: &[f64]) -> BenchReport {
        let (ratio, ci_low, ci_high) = bootstrap_ratio(ours, llama, 2000);
        BenchReport {
            schema_version: BENCH_SCHEMA_VERSION,
            run_id: "x".into(),
            environment: Environment::detect(1, Path::new("/nonexistent")),
            repetitions: ours.len(),
            engines: Vec::new(),
            llama_cpp_build: None,
            read_bandwidth: 1e10,
            read_bandwidth_samples: vec![1e10],
            results: vec![result("lockstep", ours), result("llama.cpp", llama)],
            comparisons: vec![Comparison {
                model: "m".into(),
                test: "tg8".into(),
                numerator: "lockstep".into(),
                denominator: "llama.cpp".into(),
                ratio,
                ci_low,
                ci_high,
            }],
            bandwidth: Vec::new(),
        }
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
        let e = gate_speed(&again, Some(&empty), &limits)
            .unwrap_err()
            .to_string();
        assert!(e.contains("baseline bench has no lockstep row"), "{e}");
    }
}
