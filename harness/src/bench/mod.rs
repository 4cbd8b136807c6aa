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
//! bytes the weights a decode step reads ([`decode_bytes_per_token`]). Prefill's is its GFLOP/s as a
//! fraction of the machine's f32 FMA peak, measured in the same run too ([`measure_fma_peak`]), the work
//! counted as a dense implementation does it ([`test_flops`]): every row says how far it is from the
//! physical limit.
//!
//! # The speed gate
//! [`gate_speed`]: a comparison fails when the upper end of its interval is below what
//! `ci/speed.toml` allows — never an absolute time, which differs between machines and days.

mod child;
pub mod file;
pub mod floors;
pub mod gate;
pub mod llama;
pub mod render;
pub mod runner;
pub mod sample;
pub mod speed;
pub mod stats;
#[cfg(test)]
mod tests;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

pub use self::child::parse_sample_ns;
pub use self::file::{
    parse_bench_json, read_bench, validate_bench, write_bench, MAX_BENCH_JSON_BYTES,
    MAX_BUILD_INFO_BYTES, MAX_REPETITIONS, MAX_SPEED_LIMITS_BYTES,
};
pub use self::floors::{bench_simd_kind, gate_floors, HostFloors, SpeedFloor, SpeedFloors};
pub use self::gate::gate_speed_files;
pub use self::llama::{cached_llama_bench, parse_llama_bench_output, LLAMA_BENCH_OWN_FLAGS};
pub use self::render::{render_bench_csv, render_bench_markdown};
pub use self::runner::{bench, check_options, BenchOptions};
pub use self::sample::{
    decode_bytes_per_token, measure_fma_peak, measure_read_bandwidth, sample, test_flops,
};
pub use self::speed::{gate_speed, parse_speed_limits, SpeedCheck, SpeedLimits};
pub use self::stats::{bootstrap_ratio, comparisons, double_ratio, median};
use self::stats::{mean_sd, tokens_per_second};
use crate::report::Environment;

/// Version of `bench.json`'s layout. 2 added the FMA peak (`fma_peak`, `fma_peak_samples`) and the
/// prefill rows' use of it (`compute`); a version-1 file (without them) is still read. The peak RSS
/// (`samples_peak_rss`, `peak_rss_bytes`) and `host_simd` are optional fields of version 2.
pub const BENCH_SCHEMA_VERSION: u32 = 2;

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

/// The architecture of registered model `id` when it is a speech model
/// (`lockstep_engine::models::SPEECH_ARCHITECTURES`: Whisper), which the bench cannot sample — its decoder
/// reads an encoded audio input, and a sample is token prefill or decode. `None` for any other id,
/// registered or not (a path, an unknown id: those fail where they are resolved, with their own errors).
pub fn speech_arch(id: &str) -> Option<String> {
    let reg = crate::registry::Registry::active().ok()?;
    let arch = reg.arch(id)?;
    lockstep_engine::models::SPEECH_ARCHITECTURES
        .iter()
        .any(|(a, _)| *a == arch)
        .then(|| arch.to_string())
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
    /// llama-bench's `model_type` (`llama_model_desc`: `<arch> <size class> <file type>`): when llama-bench
    /// ran on the model, its label on every engine's row of that model (one model, one label); otherwise ours,
    /// `<arch> <params> <file type>` ([`llama::model_type`]).
    pub model_type: String,
    /// llama-bench's `model_size` (`llama_model_size`): bytes of every tensor's data, not the file size (the
    /// file adds the header, metadata and alignment padding).
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
    /// llama-bench's `build_commit`: the short git commit of the binary measured (llama.cpp: llama-bench's
    /// own; lockstep: the checkout's, `-dirty` when it has changes). Empty in files written before it.
    #[serde(default)]
    pub build_commit: String,
    /// llama-bench's `test_time`: when the test's first repetition started, UTC, ISO 8601
    /// (`2026-11-29T14:20:00Z`). Empty in files written before it.
    #[serde(default)]
    pub test_time: String,
    /// Peak resident set of each repetition's process, bytes (its `VmHWM` while it ran,
    /// [`crate::process::Output::peak_rss_bytes`]: llama-bench's and `lockstep bench-sample`'s alike, the
    /// touched pages of the memory-mapped file included). Empty in files written before it, or where the
    /// platform reports none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub samples_peak_rss: Vec<u64>,
    /// The largest of `samples_peak_rss`, bytes; `None` when it is empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rss_bytes: Option<u64>,
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
        self.peak_rss_bytes = self.samples_peak_rss.iter().copied().max();
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

/// Prefill's use of the machine's FMA peak.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ComputeUse {
    /// Engine.
    pub engine: String,
    /// Model id or path.
    pub model: String,
    /// Test name (a pp test).
    pub test: String,
    /// Floating-point operations of the test's timed part ([`sample::test_flops`]).
    pub flops: f64,
    /// `flops × median_ts ÷ n_prompt ÷ 10⁹`: GFLOP/s at the row's median speed.
    pub gflops: f64,
    /// `gflops × 10⁹ ÷ fma_peak`.
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
    /// Measured f32 FMA peak, FLOP/s (the largest of its samples, [`sample::measure_fma_peak`], on the
    /// vectors of the lockstep engine's `--simd`); 0 in a version-1 file.
    #[serde(default)]
    pub fma_peak: f64,
    /// Each FMA peak sample, FLOP/s (empty in a version-1 file).
    #[serde(default)]
    pub fma_peak_samples: Vec<f64>,
    /// The host's load average (1, 5, 15 minutes; `/proc/loadavg`) when the bench started: above the
    /// thread count, other work shared the cores and the numbers are low. `None` where it cannot be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_average: Option<[f64; 3]>,
    /// The host's SIMD kind: the best setting this CPU runs ([`lockstep_engine::Simd::detect`]: `avx512`,
    /// `avx2` or `off`); each lockstep engine's own `--simd` is in `engines`. Empty in files written
    /// before it.
    #[serde(default)]
    pub host_simd: String,
    /// One per engine × model × test.
    pub results: Vec<BenchResult>,
    /// lockstep against each other engine, per model and test.
    pub comparisons: Vec<Comparison>,
    /// Decode's bandwidth fraction per engine, model and tg test.
    pub bandwidth: Vec<BandwidthUse>,
    /// Prefill's GFLOP/s and fraction of the FMA peak per engine, model and pp test (empty in a
    /// version-1 file).
    #[serde(default)]
    pub compute: Vec<ComputeUse>,
}
