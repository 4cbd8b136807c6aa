//! The bench run: every option checked, the models loaded, the engines' samples interleaved repetition
//! by repetition, the report assembled and written.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use lockstep_engine::{Model, NumericsMode, Simd};

use super::child::{lockstep_sampler, ChildSetup};
use super::file::{
    read_capped, validate_bench, write_bench, MAX_BUILD_INFO_BYTES, MAX_REPETITIONS,
};
use super::llama::{llama_sampler, model_type, LLAMA_BENCH_OWN_FLAGS};
use super::sample::{decode_bytes_per_token, measure_fma_peak, measure_read_bandwidth, test_flops};
use super::stats::{comparisons, median, tokens_per_second};
use super::{BandwidthUse, BenchReport, BenchResult, ComputeUse, Test, BENCH_SCHEMA_VERSION};
use crate::report::Environment;

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
    /// A baseline lockstep binary, its SIMD setting and its numerics mode, interleaved with ours (the
    /// mode may differ from ours: reference mode timed against ggml mode with one binary).
    pub baseline: Option<(PathBuf, Simd, NumericsMode)>,
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
    if let Some((b, _, _)) = &opts.baseline {
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
    let load_average = read_load_average(Path::new("/proc/loadavg"));
    if let Some(w) = load_average.and_then(|l| load_warning(l, opts.threads)) {
        eprintln!("lockstep: warning: {w}");
    }
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
    if let Some((bin, simd, mode)) = &opts.baseline {
        samplers.push(lockstep_sampler(
            "baseline",
            bin,
            *mode,
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
    // every model loads and holds every test's context before anything is measured; an encoder (no KV
    // cache, no decode step) runs the prompt tests without depth only, and says so
    let mut facts = Vec::new();
    for (id, path) in &opts.models {
        let model = Model::load(path).with_context(|| format!("loading {}", path.display()))?;
        let tests =
            tests_for_model(&model, &opts.tests).with_context(|| format!("--model {id}"))?;
        if tests.len() < opts.tests.len() && opts.progress {
            eprintln!(
                "[bench] {id}: an encoder ({}) has no decode step: its prompt tests without depth only",
                model.info().arch
            );
        }
        let mut flops = Vec::new();
        for t in &tests {
            let n_ctx = t.n_ctx().context("the test's context size overflows")?;
            model
                .check_context(n_ctx)
                .with_context(|| format!("--model {id}: test {}", t.name()))?;
            flops.push(test_flops(&model, *t));
        }
        let n_params: u64 = model.gguf().tensors().iter().map(|t| t.n_elements).sum();
        // llama-bench's model_size: the tensors' bytes (llama_model_size), not the file's
        let tensor_bytes: u64 = model
            .gguf()
            .tensors()
            .iter()
            .map(|t| t.n_bytes as u64)
            .sum();
        facts.push((
            tests,
            flops,
            n_params,
            decode_bytes_per_token(&model),
            tensor_bytes,
            model_type(&model, n_params),
        ));
    }
    // the machine's limits, with the engines' thread count
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.threads.max(1))
        .build()
        .context("cannot start the probes' thread pool")?;
    let (bw, peak) = pool.install(|| (measure_read_bandwidth(5), measure_fma_peak(5, opts.simd)));
    let read_bandwidth = median(&bw);
    // the peak: the fastest pass (other load only ever slows one down)
    let fma_peak = peak.iter().copied().fold(0.0, f64::max);

    let environment = Environment::detect(opts.threads, Path::new("/nonexistent"));
    let lockstep_commit = format!(
        "{}{}",
        environment.git_commit.chars().take(7).collect::<String>(),
        if environment.git_dirty { "-dirty" } else { "" }
    );
    let n_samples: usize =
        facts.iter().map(|f| f.0.len()).sum::<usize>() * opts.repetitions * samplers.len();
    let mut bar = crate::progress::Progress::new(
        n_samples,
        crate::progress::Display::for_stderr(opts.progress),
    );
    let mut results = Vec::new();
    let mut bandwidth = Vec::new();
    let mut compute = Vec::new();
    for ((id, path), (tests, flops, n_params, bytes_per_token, model_size, ours_type)) in
        opts.models.iter().zip(facts)
    {
        let filename = path.display().to_string();
        for (&test, &flops) in tests.iter().zip(&flops) {
            let test_time = iso_utc_now();
            let mut ns: Vec<Vec<u64>> = vec![Vec::new(); samplers.len()];
            let mut rss: Vec<Vec<u64>> = vec![Vec::new(); samplers.len()];
            let mut llama_rec = None;
            for rep in 0..opts.repetitions {
                for (k, s) in samplers.iter().enumerate() {
                    let name = format!(
                        "{id} {} rep {}/{} {}",
                        test.name(),
                        rep + 1,
                        opts.repetitions,
                        s.settings.engine
                    );
                    bar.start(&name);
                    let t0 = std::time::Instant::now();
                    let out = (s.run)(path, test).with_context(|| {
                        format!("{} on {id}, {}", s.settings.engine, test.name())
                    })?;
                    let (v, rec) = (out.ns, out.record);
                    rss[k].extend(out.peak_rss_bytes);
                    bar.finish(
                        &name,
                        &format!("{:.1} t/s", tokens_per_second(test, v)),
                        t0.elapsed(),
                    );
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
                    // one model, one label: llama-bench's when it ran
                    model_type: llama_rec
                        .as_ref()
                        .and_then(|r| r.get("model_type"))
                        .and_then(|v| v.as_str())
                        .map_or_else(|| ours_type.clone(), str::to_string),
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
                    build_commit: if is_llama {
                        field("build_commit", "")
                    } else {
                        lockstep_commit.clone()
                    },
                    test_time: test_time.clone(),
                    // every repetition's, or none (a platform without rusage)
                    samples_peak_rss: if rss[k].len() == ns[k].len() {
                        rss[k].clone()
                    } else {
                        Vec::new()
                    },
                    peak_rss_bytes: None,
                };
                row.fill_stats();
                results.push(row);
            }
            if test.n_prompt > 0 {
                for r in &results[results.len() - samplers.len()..] {
                    let gflops = flops * r.median_ts / test.n_prompt as f64 / 1e9;
                    compute.push(ComputeUse {
                        engine: r.engine.clone(),
                        model: id.clone(),
                        test: test.name(),
                        flops,
                        gflops,
                        fraction: gflops * 1e9 / fma_peak,
                    });
                }
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
    bar.clear();
    let comparisons = comparisons(&results);
    let report = BenchReport {
        schema_version: BENCH_SCHEMA_VERSION,
        run_id: crate::report::new_run_id(),
        environment,
        repetitions: opts.repetitions,
        engines: samplers.iter().map(|s| s.settings.clone()).collect(),
        llama_cpp_build,
        read_bandwidth,
        read_bandwidth_samples: bw,
        fma_peak,
        fma_peak_samples: peak,
        load_average,
        host_simd: lockstep_engine::Simd::detect().name().to_string(),
        results,
        comparisons,
        bandwidth,
        compute,
    };
    validate_bench(&report).context("the bench just measured is not a valid bench.json")?;
    let dir = write_bench(&opts.reports_root, &report)?;
    Ok((dir, report))
}

/// The tests of `tests` that `model` runs: all of them for a decoder; for an encoder (pooled output, no KV
/// cache) the prompt tests without depth — a sequence is one forward pass from position 0.
///
/// Errors: an encoder and no such test (there would be nothing to measure).
pub(crate) fn tests_for_model(model: &Model, tests: &[Test]) -> Result<Vec<Test>> {
    if model.output() != lockstep_engine::models::Output::Pooled {
        return Ok(tests.to_vec());
    }
    let kept: Vec<Test> = tests
        .iter()
        .filter(|t| t.n_gen == 0 && t.n_depth == 0)
        .copied()
        .collect();
    if kept.is_empty() {
        bail!(
            "a {} model is an encoder: it has no decode step and no KV cache, so only prompt tests without \
             depth (-p N -d 0) measure it, and none was asked for",
            model.info().arch
        );
    }
    Ok(kept)
}

/// The 1, 5 and 15 minute load averages from a `/proc/loadavg`-format file (`0.52 0.58 0.59 1/467 12345`);
/// `None` where it cannot be read or parsed (not Linux).
pub(crate) fn read_load_average(path: &Path) -> Option<[f64; 3]> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut it = text.split_whitespace().map(|w| w.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

/// The warning for a 1-minute load average above the thread count the bench runs with: other work shares
/// the cores, and the samples are slow by an unknown amount (llama-bench records no load; we do).
pub(crate) fn load_warning(load: [f64; 3], threads: usize) -> Option<String> {
    (load[0] > threads as f64).then(|| {
        format!(
            "the host's load average is {:.2} (1 min; {:.2} 5 min), above the {threads} thread(s) given: other \
             work shares the cores and the samples will be slow; bench.json records it (load_average)",
            load[0], load[1]
        )
    })
}

/// Now, UTC, ISO 8601 to the second (`2026-11-29T14:20:00Z`), as llama-bench's `test_time`.
pub(crate) fn iso_utc_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, mo, d, h, mi, s) = crate::format::civil(now);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}
