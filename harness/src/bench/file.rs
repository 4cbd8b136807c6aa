//! `bench.{json,md,csv}` on disk: written atomically; `bench.json` read bounded and validated, every
//! recorded figure recomputed from the samples.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::render::{render_bench_csv, render_bench_markdown};
use super::stats::{comparisons, mean_sd, median, tokens_per_second};
use super::{BenchReport, BenchResult, Comparison, Test, BENCH_SCHEMA_VERSION};

/// Write `bench.json`, `bench.md`, `bench.csv` into `reports_root/bench-<run id>/`, atomically (the run
/// id bounded and sanitised by [`crate::output::file_stem`]).
pub fn write_bench(reports_root: &Path, r: &BenchReport) -> Result<PathBuf> {
    let files = vec![
        ("bench.json".to_string(), crate::report::to_json_pretty(r)?),
        ("bench.md".to_string(), render_bench_markdown(r)),
        ("bench.csv".to_string(), render_bench_csv(r)?),
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
pub(crate) fn read_capped(path: &Path, cap: u64, what: &str) -> Result<String> {
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
pub(crate) fn agrees(recorded: f64, computed: f64) -> bool {
    recorded.is_finite()
        && computed.is_finite()
        && (recorded == computed
            || (recorded - computed).abs() <= 1e-9 * recorded.abs().max(computed.abs()))
}

/// The engines a bench runs.
pub(crate) const ENGINES: &[&str] = &["lockstep", "baseline", "llama.cpp"];

/// Check a bench report's numbers against themselves, so that nothing recorded can make the speed gate
/// pass what the samples do not show:
/// - `schema_version` is [`BENCH_SCHEMA_VERSION`]; `repetitions` ≥ 1; `read_bandwidth` and each of its
///   samples finite and above 0;
/// - `results` is not empty; each row's engine is `lockstep`, `baseline` or `llama.cpp`, its test valid
///   ([`Test::check`]), its `samples_ns` and `samples_ts` `repetitions` long, every sample above 0 (and
///   finite), `samples_ts` the tokens/s of `samples_ns`, and `median_ts`, `avg_ts`, `stddev_ts`,
///   `avg_ns`, `stddev_ns` those of the samples; `samples_peak_rss` empty or `repetitions` long, each
///   above 0, and `peak_rss_bytes` its largest; no engine × model × test twice; every model × test has
///   a `lockstep` row;
/// - `comparisons` are exactly [`comparisons`] of the results (ratios and intervals recomputed);
/// - each `bandwidth` entry names a result and its `fraction` is that result's
///   `median_ts × bytes_per_token ÷ read_bandwidth`;
/// - version 2: `fma_peak` the largest of its samples, each finite and above 0; every prompt row has one
///   `compute` entry, whose `gflops` is `flops × median_ts ÷ n_prompt ÷ 10⁹` and `fraction`
///   `gflops ÷ fma_peak` (its `flops` is what the bench counted; the speed floors hold it to theirs).
///   Version 1 (before the FMA peak) has neither.
///
/// Errors name the field and what is wrong (the caller adds the file).
pub fn validate_bench(r: &BenchReport) -> Result<()> {
    if !(1..=BENCH_SCHEMA_VERSION).contains(&r.schema_version) {
        bail!(
            "schema_version: {} (this lockstep reads 1 to {BENCH_SCHEMA_VERSION})",
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
    if r.schema_version >= 2 {
        positive("fma_peak", r.fma_peak)?;
        if r.fma_peak_samples.is_empty() {
            bail!("fma_peak_samples: empty");
        }
        for (i, &x) in r.fma_peak_samples.iter().enumerate() {
            positive(&format!("fma_peak_samples[{i}]"), x)?;
        }
        let max = r.fma_peak_samples.iter().copied().fold(0.0, f64::max);
        if !agrees(r.fma_peak, max) {
            bail!(
                "fma_peak: recorded {:?}, the largest of its samples is {max:?}",
                r.fma_peak
            );
        }
    } else if r.fma_peak != 0.0 || !r.fma_peak_samples.is_empty() || !r.compute.is_empty() {
        bail!("schema_version 1 has no fma_peak, fma_peak_samples or compute; this file has them");
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
        if !x.samples_peak_rss.is_empty() && x.samples_peak_rss.len() != r.repetitions {
            bail!(
                "{at}.samples_peak_rss: {} samples, but repetitions is {} (every repetition's, or none)",
                x.samples_peak_rss.len(),
                r.repetitions
            );
        }
        if let Some(j) = x.samples_peak_rss.iter().position(|&b| b == 0) {
            bail!("{at}.samples_peak_rss[{j}]: 0 bytes (a process has some resident memory)");
        }
        let peak = x.samples_peak_rss.iter().copied().max();
        if x.peak_rss_bytes != peak {
            bail!(
                "{at}.peak_rss_bytes: recorded {:?}, the largest of samples_peak_rss is {peak:?}",
                x.peak_rss_bytes
            );
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
    let mut computed = std::collections::HashSet::new();
    for (i, c) in r.compute.iter().enumerate() {
        let at = format!("compute[{i}] ({} {} {})", c.engine, c.model, c.test);
        let Some(x) = rows.get(&(c.engine.as_str(), c.model.as_str(), c.test.as_str())) else {
            bail!("{at}: no result of this engine, model and test");
        };
        if x.n_prompt == 0 {
            bail!("{at}: not a prompt test (only prefill rows have a compute entry)");
        }
        if !computed.insert((c.engine.as_str(), c.model.as_str(), c.test.as_str())) {
            bail!("{at}: a second entry of this engine, model and test");
        }
        positive(&format!("{at}.flops"), c.flops)?;
        let gflops = c.flops * x.median_ts / x.n_prompt as f64 / 1e9;
        if !(c.gflops.is_finite() && agrees(c.gflops, gflops)) {
            bail!(
                "{at}.gflops: recorded {:?}, flops × median_ts ÷ n_prompt gives {gflops:?}",
                c.gflops
            );
        }
        let want = gflops * 1e9 / r.fma_peak;
        if !(c.fraction.is_finite() && agrees(c.fraction, want)) {
            bail!(
                "{at}.fraction: recorded {:?}, gflops ÷ fma_peak gives {want:?}",
                c.fraction
            );
        }
    }
    if r.schema_version >= 2 {
        for x in r.results.iter().filter(|x| x.n_prompt > 0) {
            let name = Test::of(x).name();
            if !computed.contains(&(x.engine.as_str(), x.model.as_str(), name.as_str())) {
                bail!(
                    "compute: no entry for {} {} {name}, a prompt test of the results",
                    x.engine,
                    x.model
                );
            }
        }
    }
    Ok(())
}
