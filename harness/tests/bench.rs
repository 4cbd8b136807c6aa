//! `lockstep bench` and the speed gate end to end on SmolLM2: a build gated against itself passes, a
//! deliberately slowed one (its SIMD kernels forced off) fails — both measured interleaved in one run, as
//! the gate is meant to be used. Speed is never asserted against a time; only the gate's verdicts are.

mod common;

use std::path::Path;
use std::process::Command;

use common::root;

const MODEL: &str = "smollm2-135m-q4_1";

/// `lockstep bench` of this build (ours at `simd`) against itself as the baseline at `baseline_simd`,
/// small tests, no llama.cpp; returns the bench directory.
fn bench(reports: &Path, simd: &str, baseline_simd: &str) -> std::path::PathBuf {
    let exe = env!("CARGO_BIN_EXE_lockstep");
    let out = Command::new(exe)
        .current_dir(root())
        .args(["bench", "--model", MODEL, "-p", "32", "-n", "8", "-r", "5"])
        .args([
            "--simd",
            simd,
            "--baseline-bin",
            exe,
            "--baseline-simd",
            baseline_simd,
        ])
        .args(["--no-llama", "--reports", reports.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dirs: Vec<_> = std::fs::read_dir(reports)
        .unwrap()
        .map(|d| d.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("bench-")
        })
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    for f in ["bench.json", "bench.md", "bench.csv"] {
        assert!(dirs[0].join(f).is_file(), "{f}");
    }
    dirs[0].clone()
}

fn gate(bench: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .current_dir(root())
        .args(["gate", "--speed", bench.to_str().unwrap()])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
#[ignore = "real model: run by ci/test.sh"]
fn the_speed_gate_passes_a_build_against_itself_and_fails_a_slowed_one() {
    if !lockstep_engine::Simd::Avx2.available() {
        eprintln!("skipping: without AVX2 there is no faster kernel to slow down");
        return;
    }
    let same = tempfile::tempdir().unwrap();
    let dir = bench(same.path(), "avx2", "avx2");
    let r = lockstep::bench::read_bench(&dir).unwrap();
    assert_eq!(r.results.len(), 4, "2 engines × pp32, tg8");
    assert!(r
        .results
        .iter()
        .all(|x| x.samples_ns.len() == 5 && x.median_ts > 0.0));
    assert_eq!(r.comparisons.len(), 2);
    assert!(r.read_bandwidth > 0.0 && r.bandwidth.len() == 2);
    // llama-bench's fields: the build measured, when each test started, the tensors' bytes (not the file's)
    let model =
        lockstep_engine::Model::load(&lockstep::fetch::resolve_model("smollm2-135m-q4_1").unwrap())
            .unwrap();
    let tensor_bytes: u64 = model
        .gguf()
        .tensors()
        .iter()
        .map(|t| t.n_bytes as u64)
        .sum();
    assert!(tensor_bytes < model.gguf().file_size());
    assert!(r.results.iter().all(|x| !x.build_commit.is_empty()
        && x.test_time.ends_with('Z')
        && x.model_size == tensor_bytes));
    assert!(r.load_average.is_some(), "the host's load is recorded");
    // every sample's peak RSS: at least the weights a decode step reads through the map
    assert!(!r.host_simd.is_empty());
    assert!(r
        .results
        .iter()
        .all(|x| x.samples_peak_rss.len() == 5
            && x.peak_rss_bytes.is_some_and(|b| b > tensor_bytes / 2)));
    let (pass, text) = gate(&dir);
    assert!(pass, "the same build against itself must pass:\n{text}");

    let slow = tempfile::tempdir().unwrap();
    let dir = bench(slow.path(), "off", "avx2");
    let (pass, text) = gate(&dir);
    assert!(
        !pass,
        "scalar kernels against the SIMD baseline must fail:\n{text}"
    );
    assert!(
        text.contains("FAIL smollm2-135m-q4_1 pp32: lockstep / baseline"),
        "{text}"
    );
}

/// The speed floors end to end: a bench of SmolLM2 with its SIMD kernels writes the floors, and holds
/// itself to them; the same model with the portable scalar kernels (several times slower in prefill)
/// fails its prefill floor — on this machine, whatever its speed, as the floors are shares of the
/// machine's limits measured in each run.
#[test]
#[ignore = "real model: run by ci/test.sh"]
fn the_speed_floors_hold_a_build_to_its_share_of_the_machine() {
    if !lockstep_engine::Simd::Avx2.available() {
        eprintln!("skipping: without AVX2 there is no faster kernel to slow down");
        return;
    }
    let exe = env!("CARGO_BIN_EXE_lockstep");
    let dir = tempfile::tempdir().unwrap();
    let floors = dir.path().join("speed-floors.toml");
    let bench = |simd: &str, reports: &str, write: bool| -> PathBuf {
        let reports = dir.path().join(reports);
        let mut cmd = Command::new(exe);
        cmd.current_dir(root())
            .args(["bench", "--model", MODEL, "-p", "32", "-n", "8", "-r", "3"])
            .args(["--simd", simd, "--no-llama", "--reports"])
            .arg(&reports);
        if write {
            cmd.arg("--write-speed-floors").arg(&floors);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let d = std::fs::read_dir(&reports)
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        d.path()
    };
    let fast = bench("avx2", "fast", true);
    let f = lockstep::bench::SpeedFloors::load(&floors).unwrap();
    assert_eq!(f.host.len(), 1, "{f:?}");
    let h = f.for_simd("avx2").expect("the avx2 section");
    assert_eq!(h.floor.len(), 2, "{f:?}");
    assert!(h.fma_peak > 0.0 && h.read_bandwidth > 0.0);
    let gate = |b: &Path| {
        Command::new(exe)
            .current_dir(root())
            .args(["gate", "--speed"])
            .arg(b)
            .arg("--speed-floors")
            .arg(&floors)
            .output()
            .unwrap()
    };
    let out = gate(&fast);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "a bench against its own floors:\n{text}"
    );
    assert!(text.contains("2 checks, 0 failed"), "{text}");
    // the scalar kernels are another SIMD kind: without floors of their own, an error (exit 2)
    let slow = bench("off", "slow", false);
    let out = gate(&slow);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "no floors of kind off:\n{err}");
    assert!(err.contains("no speed floors of SIMD kind off"), "{err}");
    // held to the SIMD kernels' figures (the avx2 section filed as off's: a kernel fallen back to
    // scalar code), they fail: decode reads the same bytes at a fraction of the bandwidth. (Prefill is
    // a share of the FMA peak measured on the vectors `--simd` allows, here scalar ones, so the scalar
    // run's pp32 is no slower *relative to its own peak*; a kernel that falls back to scalar under a SIMD
    // setting is measured against that setting's peak and fails its pp row too.)
    let mut as_off = h.clone();
    as_off.simd = "off".into();
    let both = lockstep::bench::SpeedFloors::with_host(Some(f.clone()), as_off);
    std::fs::write(&floors, both.to_toml().unwrap()).unwrap();
    let out = gate(&slow);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "scalar kernels must fail:\n{text}"
    );
    assert!(
        text.contains("FAIL smollm2-135m-q4_1 tg8: lockstep fraction of bandwidth / floor"),
        "{text}"
    );
}

/// The committed speed floors cover exactly the models of the default matrix, each with CI's tests (pp64,
/// and tg16 for a decoder: the encoder's floor is its prompt test only), so that CI's speed step neither
/// drops a model nor fails on a floor it no longer benches.
#[test]
fn the_committed_speed_floors_cover_the_default_matrix() {
    let floors = lockstep::bench::SpeedFloors::load(&root().join("ci/speed-floors.toml")).unwrap();
    let matrix = lockstep::matrix::Matrix::load(&root().join("ci/matrix.toml")).unwrap();
    let mut want = std::collections::BTreeSet::new();
    // the Hugging Face copies are not benched: the same weights as their source (cli.rs, bench --matrix);
    // nor are speech models (their decoder reads an encoded audio input)
    let mut speech = Vec::new();
    for m in matrix
        .models
        .iter()
        .filter(|m| lockstep::registry::Registry::golden_model_of(&m.id) == m.id)
    {
        if lockstep::bench::speech_arch(&m.id).is_some() {
            speech.push(m.id.clone());
            continue;
        }
        want.insert((m.id.clone(), "pp64".to_string()));
        if !m.id.starts_with("synth-bert") {
            want.insert((m.id.clone(), "tg16".to_string()));
        }
    }
    // every SIMD kind's section: the AVX-512 host's at least
    assert!(floors.for_simd("avx512").is_some());
    for h in &floors.host {
        let have: std::collections::BTreeSet<(String, String)> = h
            .floor
            .iter()
            .map(|f| (f.model.clone(), f.test.clone()))
            .collect();
        assert_eq!(have, want, "the {} floors", h.simd);
    }
    assert_eq!(
        speech,
        ["whisper-seeded"],
        "the default matrix's speech models"
    );
}

/// A speech model cannot be benched (a sample is token prefill or decode; its decoder reads an encoded
/// audio input): named, it is refused before any sample with the reason; in `--matrix` it is left out
/// with a note, and the other models are benched.
#[test]
fn the_bench_refuses_a_speech_model_and_leaves_it_out_of_a_matrix() {
    let (code, _, stderr) = lockstep(&[
        "bench",
        "--model",
        "whisper-seeded",
        "-p",
        "4",
        "-n",
        "0",
        "-r",
        "1",
        "--no-llama",
        "--reports",
        "/nonexistent/never-written",
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("cannot measure whisper-seeded: it is a speech model (whisper)"),
        "{stderr}"
    );
    let work = tempfile::tempdir().unwrap();
    let matrix = work.path().join("m.toml");
    // the default matrix's settings with two of its models: synth-llama and whisper-seeded
    let default = std::fs::read_to_string(root().join("ci/matrix.toml")).unwrap();
    let header = &default[..default.find("\n[[models]]\n").unwrap() + 1];
    std::fs::write(
        &matrix,
        format!(
            "{header}[[models]]\nid = \"synth-llama\"\nquant = \"F32\"\nprompts = [\"synth\"]\n\n\
             [[models]]\nid = \"whisper-seeded\"\nquant = \"F32\"\nprompts = [\"*\"]\n\
             oracles = [\"transformers-f32\"]\n"
        ),
    )
    .unwrap();
    let reports = work.path().join("reports");
    let (code, stdout, stderr) = lockstep(&[
        "bench",
        "--matrix",
        matrix.to_str().unwrap(),
        "-p",
        "4",
        "-n",
        "0",
        "-r",
        "1",
        "--no-llama",
        "--reports",
        reports.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("whisper-seeded left out of --matrix: a speech model"),
        "{stderr}"
    );
    assert!(
        stdout.contains("synth-llama") && !stdout.contains("whisper-seeded | "),
        "{stdout}"
    );
}

// ---- hostile input to `gate --speed` and `bench`: synthetic files and a fake llama-bench, no download ----

use std::path::PathBuf;
use std::time::{Duration, Instant};

use lockstep::bench::{comparisons, BenchReport, BenchResult, Test, BENCH_SCHEMA_VERSION};

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_lockstep"))
}

/// Run the binary; (exit code, stdout, stderr). Fails the test on a panic.
fn lockstep(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(exe())
        .current_dir(root())
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !stderr.contains("panicked"),
        "lockstep {args:?} panicked:\n{stderr}"
    );
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
    )
}

/// Expect exit 2 with every needle in stderr.
fn expect_error(args: &[&str], needles: &[&str]) {
    let (code, stdout, stderr) = lockstep(args);
    assert_eq!(
        code, 2,
        "lockstep {args:?}: exit {code}\n{stdout}\n{stderr}"
    );
    for n in needles {
        assert!(
            stderr.contains(n),
            "lockstep {args:?}: no {n:?} in\n{stderr}"
        );
    }
}

/// A consistent result row: `ts` tokens/s per repetition of `test` (samples_ns derived, stats filled).
fn row(engine: &str, test: Test, ts: &[f64]) -> BenchResult {
    let mut r = BenchResult {
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
        samples_ns: ts
            .iter()
            .map(|t| (test.n_tokens() as f64 * 1e9 / t) as u64)
            .collect(),
        samples_ts: Vec::new(),
        avg_ns: 0.0,
        stddev_ns: 0.0,
        avg_ts: 0.0,
        stddev_ts: 0.0,
        median_ts: 0.0,
        build_commit: "0c1e570".into(),
        test_time: "2026-11-29T14:20:00Z".into(),
        samples_peak_rss: Vec::new(),
        peak_rss_bytes: None,
    };
    r.fill_stats();
    r
}

const TG8: Test = Test {
    n_prompt: 0,
    n_gen: 8,
    n_depth: 0,
};
const PP16: Test = Test {
    n_prompt: 16,
    n_gen: 0,
    n_depth: 0,
};

/// A valid bench of `tests`, lockstep at `ours` and llama.cpp at `llama` tokens/s.
fn bench_of(tests: &[Test], ours: &[f64], llama: &[f64]) -> BenchReport {
    let mut results = Vec::new();
    for &t in tests {
        results.push(row("lockstep", t, ours));
        results.push(row("llama.cpp", t, llama));
    }
    BenchReport {
        schema_version: BENCH_SCHEMA_VERSION,
        run_id: "synthetic".into(),
        environment: lockstep::report::Environment::detect(1, Path::new("/nonexistent")),
        repetitions: ours.len(),
        engines: Vec::new(),
        llama_cpp_build: None,
        read_bandwidth: 1e10,
        read_bandwidth_samples: vec![1e10],
        fma_peak: 1e11,
        fma_peak_samples: vec![1e11],
        load_average: None,
        host_simd: "avx512".into(),
        comparisons: comparisons(&results),
        // every prompt row's share of the FMA peak, at 1 GFLOP per test
        compute: results
            .iter()
            .filter(|x| x.n_prompt > 0)
            .map(|x| {
                let gflops = x.median_ts / x.n_prompt as f64;
                lockstep::bench::ComputeUse {
                    engine: x.engine.clone(),
                    model: x.model.clone(),
                    test: Test {
                        n_prompt: x.n_prompt,
                        n_gen: x.n_gen,
                        n_depth: x.n_depth,
                    }
                    .name(),
                    flops: 1e9,
                    gflops,
                    fraction: gflops * 1e9 / 1e11,
                }
            })
            .collect(),
        results,
        bandwidth: Vec::new(),
    }
}

const OURS: [f64; 5] = [100.0, 98.0, 102.0, 99.0, 101.0];
const LLAMA: [f64; 5] = [120.0, 118.0, 121.0, 119.0, 122.0];

fn write_json(dir: &Path, name: &str, v: &serde_json::Value) -> String {
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_string_pretty(v).unwrap()).unwrap();
    p.to_str().unwrap().to_string()
}

fn json(r: &BenchReport) -> serde_json::Value {
    serde_json::from_str(&lockstep::report::to_json_pretty(r).unwrap()).unwrap()
}

#[test]
fn gate_flags_of_the_other_mode_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let b = write_json(
        dir.path(),
        "b.json",
        &json(&bench_of(&[TG8], &OURS, &LLAMA)),
    );
    let limits = dir.path().join("speed.toml");
    std::fs::write(
        &limits,
        "max_slowdown = 0.1\nmin_ratio_to_llama_cpp = 0.5\nmax_slowdown_vs_floors = 0.5\n",
    )
    .unwrap();
    let limits = limits.to_str().unwrap();
    expect_error(
        &["gate", "--baseline", &b, "report.json"],
        &["--baseline", "--speed"],
    );
    expect_error(
        &["gate", "--speed-limits", limits, "report.json"],
        &["--speed-limits", "--speed"],
    );
    expect_error(
        &["gate", "--speed", &b, "--thresholds", "ci/thresholds.toml"],
        &["--thresholds"],
    );
    // the valid file passes as such
    let (code, stdout, stderr) = lockstep(&["gate", "--speed", &b, "--speed-limits", limits]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("1 checks, 0 failed"), "{stdout}");
}

#[test]
fn the_speed_gate_recomputes_what_a_bench_json_records() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ok = json(&bench_of(&[TG8], &OURS, &LLAMA));
    let case = |name: &str, edit: &dyn Fn(&mut serde_json::Value), needles: &[&str]| {
        let mut v = ok.clone();
        edit(&mut v);
        let p = write_json(d, name, &v);
        let mut all = vec![p.as_str()];
        all.extend_from_slice(needles);
        expect_error(&["gate", "--speed", &p], &all);
    };
    case(
        "inf.json",
        &|v| v["comparisons"][0]["ci_high"] = "inf".into(),
        &["comparisons[0]", "ci_high: recorded inf"],
    );
    case(
        "huge.json",
        &|v| v["comparisons"][0]["ci_high"] = 1e308.into(),
        &["ci_high: recorded 1e308"],
    );
    case(
        "wide.json",
        &|v| {
            v["comparisons"][0]["ratio"] = 0.1.into();
            v["comparisons"][0]["ci_low"] = 0.1.into();
            v["comparisons"][0]["ci_high"] = 5.0.into();
        },
        &["comparisons[0]", "ratio: recorded 0.1"],
    );
    case(
        "noresults.json",
        &|v| v["results"] = serde_json::json!([]),
        &["results: empty"],
    );
    // samples of lockstep 100× slower than llama.cpp under the comparisons of an even race
    let slow = json(&bench_of(&[TG8], &[1.0, 1.1, 0.9, 1.0, 1.05], &LLAMA));
    case(
        "slow.json",
        &|v| v["results"] = slow["results"].clone(),
        &["comparisons[0]", "the samples give"],
    );
    // recorded consistently, the same samples fail the gate
    let p = write_json(d, "slow-consistent.json", &slow);
    let (code, stdout, _) = lockstep(&["gate", "--speed", &p]);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("FAIL m tg8: lockstep / llama.cpp"),
        "{stdout}"
    );
    for (name, bad) in [
        ("zero.json", serde_json::json!(0.0)),
        ("neg.json", serde_json::json!(-120.0)),
        ("strinf.json", serde_json::json!("inf")),
    ] {
        case(
            name,
            &|v| v["results"][1]["samples_ts"][0] = bad.clone(),
            &[
                "results[1] (llama.cpp m tg8).samples_ts[0]",
                "not a finite number above 0",
            ],
        );
    }
    case(
        "ns0.json",
        &|v| v["results"][0]["samples_ns"][2] = 0.into(),
        &["results[0] (lockstep m tg8).samples_ns[2]: 0 ns"],
    );
    case(
        "nofield.json",
        &|v| {
            v["comparisons"][0]
                .as_object_mut()
                .unwrap()
                .remove("ci_high");
        },
        &["is not a lockstep bench.json"],
    );
    expect_error(
        &["gate", "--speed", "/dev/zero"],
        &["/dev/zero", "not a regular file"],
    );
    let big = d.join("big.json");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(lockstep::bench::MAX_BENCH_JSON_BYTES + 1)
        .unwrap();
    expect_error(
        &["gate", "--speed", big.to_str().unwrap()],
        &["big.json", "more than the"],
    );
}

#[test]
fn the_speed_gate_against_a_baseline_file_refuses_bad_samples_and_dropped_tests() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let two = bench_of(&[TG8, PP16], &OURS, &LLAMA);
    let cur = write_json(d, "cur.json", &json(&two));
    let (code, stdout, stderr) = lockstep(&["gate", "--speed", &cur, "--baseline", &cur]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("4 checks, 0 failed"), "{stdout}");
    // zero, "inf" or negative tokens/s in the baseline file: an error naming it, not a ratio of inf or 1
    for (name, bad) in [
        ("b0.json", serde_json::json!(0.0)),
        ("binf.json", serde_json::json!("inf")),
        ("bneg.json", serde_json::json!(-3.0)),
    ] {
        let mut v = json(&two);
        for k in 0..5 {
            v["results"][0]["samples_ts"][k] = bad.clone();
        }
        let base = write_json(d, name, &v);
        expect_error(
            &["gate", "--speed", &cur, "--baseline", &base],
            &[&base, "results[0] (lockstep m tg8).samples_ts[0]"],
        );
    }
    // a current bench with results [] cannot halve the checks
    let mut v = json(&two);
    v["results"] = serde_json::json!([]);
    let empty = write_json(d, "empty.json", &v);
    expect_error(
        &["gate", "--speed", &empty, "--baseline", &cur],
        &[&empty, "results: empty"],
    );
    // nor one that lost a test of the baseline
    let one = write_json(d, "one.json", &json(&bench_of(&[TG8], &OURS, &LLAMA)));
    expect_error(
        &["gate", "--speed", &one, "--baseline", &cur],
        &["the current bench has no lockstep row for m pp16"],
    );
}

#[test]
fn speed_limits_out_of_range_or_unknown_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let b = write_json(
        dir.path(),
        "b.json",
        &json(&bench_of(&[TG8], &OURS, &LLAMA)),
    );
    for (text, needle) in [
        (
            "max_slowdown = nan\nmin_ratio_to_llama_cpp = 0.5\nmax_slowdown_vs_floors = 0.5\n",
            "max_slowdown: NaN",
        ),
        (
            "max_slowdown = 0.1\nmin_ratio_to_llama_cpp = inf\nmax_slowdown_vs_floors = 0.5\n",
            "min_ratio_to_llama_cpp: inf",
        ),
        (
            "max_slowdown = 0.1\nmin_ratio_to_llama_cpp = 0\nmax_slowdown_vs_floors = 0.5\n",
            "min_ratio_to_llama_cpp: 0",
        ),
        (
            "max_slowdown = 1.5\nmin_ratio_to_llama_cpp = 0.5\nmax_slowdown_vs_floors = 0.5\n",
            "max_slowdown: 1.5",
        ),
        (
            "max_slowdown = 0.1\nmin_ratio_to_llama_cpp = 0.5\nmax_slowdown_vs_floors = 0.5\nmin_ratio = 9\n",
            "unknown field",
        ),
    ] {
        let p = dir.path().join("speed.toml");
        std::fs::write(&p, text).unwrap();
        let p = p.to_str().unwrap();
        expect_error(&["gate", "--speed", &b, "--speed-limits", p], &[p, needle]);
    }
    expect_error(
        &["gate", "--speed", &b, "--speed-limits", "/dev/zero"],
        &["/dev/zero", "not a regular file"],
    );
}

/// A synthetic model, and a fake llama-bench (a shell script) that logs its arguments to `args.log`,
/// then behaves as `FAKE_LLAMA` says: `ok` prints a record of the test asked for (1 ms), `zero` a record of
/// 0 ns, `pp4096` a record of another test, `hang` records its pid and a helper's and sleeps.
fn fake_setup(dir: &Path) -> (PathBuf, PathBuf) {
    let model = dir.join("m.gguf");
    std::fs::write(
        &model,
        lockstep_engine::synth::SynthModel::default()
            .build()
            .unwrap(),
    )
    .unwrap();
    let script = dir.join("llama-bench");
    std::fs::write(
        &script,
        format!(
            r#"#!/bin/sh
echo "$@" >> {log}
p=0; n=0; d=0
while [ $# -gt 0 ]; do
  case "$1" in -p) p=$2; shift;; -n) n=$2; shift;; -d) d=$2; shift;; esac
  shift
done
case "$FAKE_LLAMA" in
  zero) ns=0;;
  pp4096) p=4096; ns=1000000;;
  hang) sleep 300 & echo $$ $! > {pids}; wait; exit 0;;
  *) ns=1000000;;
esac
echo "[{{\"n_prompt\": $p, \"n_gen\": $n, \"n_depth\": $d, \"samples_ns\": [$ns], \"model_type\": \"fake|<script>\"}}]"
"#,
            log = dir.join("args.log").display(),
            pids = dir.join("pids").display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    (model, script)
}

fn bench_cmd(model: &Path, script: &Path, reports: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(exe());
    c.current_dir(root())
        .args(["--threads", "1", "bench", "--model"])
        .arg(model)
        .args(["-p", "16", "-n", "0", "-r", "1", "--llama-bench"])
        .arg(script)
        .arg("--reports")
        .arg(reports)
        .args(extra);
    c
}

#[test]
fn bench_refuses_bad_outputs_and_options_before_measuring() {
    let dir = tempfile::tempdir().unwrap();
    let (model, script) = fake_setup(dir.path());
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let log = dir.path().join("args.log");
    for (extra, reports, needle) in [
        (vec![], file.clone(), "--reports"),
        (
            vec!["-d", "18446744073709551615"],
            dir.path().join("r"),
            "overflows",
        ),
        (
            vec!["--llama-bench-args", "-p 4096"],
            dir.path().join("r"),
            "-p is set by lockstep bench itself",
        ),
        (
            vec!["-d", "100000"],
            dir.path().join("r"),
            "longer than the model's context",
        ),
        (
            vec!["-p", "16,16"],
            dir.path().join("r"),
            "test pp16 is asked for twice",
        ),
        (
            vec!["--engine-timeout", "0"],
            dir.path().join("r"),
            "--engine-timeout",
        ),
    ] {
        let t0 = Instant::now();
        let out = bench_cmd(&model, &script, &reports, &extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.contains(needle), "{extra:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(
            !stderr.contains("[bench]"),
            "measured before failing: {stderr}"
        );
        assert!(t0.elapsed() < Duration::from_secs(30));
        assert!(!log.exists(), "llama-bench ran before the check");
    }
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
}

#[test]
fn bench_passes_the_documented_llama_bench_args_and_refuses_wrong_records() {
    let dir = tempfile::tempdir().unwrap();
    let (model, script) = fake_setup(dir.path());
    // a model path with a pipe, a newline and HTML in it
    let hostile = dir.path().join("a|b\n<script>x.gguf");
    std::fs::copy(&model, &hostile).unwrap();
    let reports = dir.path().join("reports");
    let out = bench_cmd(
        &hostile,
        &script,
        &reports,
        &["--llama-bench-args", "-fa 0"],
    )
    .env("FAKE_LLAMA", "ok")
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let log = std::fs::read_to_string(dir.path().join("args.log")).unwrap();
    assert!(log.trim_end().ends_with("-o json -fa 0"), "{log}");
    let bench_dir = std::fs::read_dir(&reports)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let r = lockstep::bench::read_bench(&bench_dir).unwrap();
    assert_eq!(r.results.len(), 2);
    let md = std::fs::read_to_string(bench_dir.join("bench.md")).unwrap();
    assert!(!md.contains("<script>"), "{md}");
    let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| ")).collect();
    // results: header + 2 rows; peak RSS: header + 1 row; ratios: header + 1 row; prefill and the FMA
    // peak: header + 2 rows — no row split or added by the model path
    assert_eq!(rows.len(), 10, "{md}");
    assert!(rows.iter().all(|l| l.ends_with(" |")), "{md}");
    assert!(md.contains("a\\|b &lt;script&gt;"), "{md}");
    assert!(md.contains("fake\\|&lt;script&gt;"), "{md}");

    for (mode, needle) in [
        ("zero", "samples_ns[0] is 0 ns"),
        ("pp4096", "record is of test pp4096"),
    ] {
        let out = bench_cmd(&model, &script, &dir.path().join(mode), &[])
            .env("FAKE_LLAMA", mode)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(needle) && stderr.contains("llama.cpp on"),
            "{stderr}"
        );
        assert!(!dir.path().join(mode).read_dir().unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("bench-")));
    }
}

/// Running (not gone, not a zombie awaiting its reaper).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
        let state = st.rsplit_once(')').map(|(_, r)| r.trim_start());
        !state.is_some_and(|r| r.starts_with('Z') || r.starts_with('X'))
    })
}

#[test]
fn an_interrupted_bench_leaves_no_child_behind() {
    let dir = tempfile::tempdir().unwrap();
    let (model, script) = fake_setup(dir.path());
    let mut child = bench_cmd(&model, &script, &dir.path().join("r"), &[])
        .env("FAKE_LLAMA", "hang")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pids_file = dir.path().join("pids");
    let t0 = Instant::now();
    let pids: Vec<i32> = loop {
        let text = std::fs::read_to_string(&pids_file).unwrap_or_default();
        let v: Vec<i32> = text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if v.len() == 2 {
            break v;
        }
        if t0.elapsed() > Duration::from_secs(300) || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "the fake llama-bench never started:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(pids.iter().all(|&p| alive(p)));
    // SAFETY: signalling the lockstep process this test started.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t1 = Instant::now();
    while pids.iter().any(|&p| alive(p)) && t1.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let survivors: Vec<i32> = pids.into_iter().filter(|&p| alive(p)).collect();
    for &p in &survivors {
        // SAFETY: cleaning up what this test started before failing it.
        unsafe {
            libc::kill(p, libc::SIGKILL);
        }
    }
    assert!(
        survivors.is_empty(),
        "processes {survivors:?} outlived the interrupted bench"
    );
}

#[test]
fn a_hung_sample_is_killed_with_its_helpers_at_the_engine_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (model, script) = fake_setup(dir.path());
    let t0 = Instant::now();
    let out = bench_cmd(
        &model,
        &script,
        &dir.path().join("r"),
        &["--engine-timeout", "2"],
    )
    .env("FAKE_LLAMA", "hang")
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("did not finish within 2.0 s") && stderr.contains("llama.cpp on"),
        "{stderr}"
    );
    assert!(t0.elapsed() < Duration::from_secs(200));
    let text = std::fs::read_to_string(dir.path().join("pids")).unwrap();
    let pids: Vec<i32> = text
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let survivors: Vec<i32> = pids.into_iter().filter(|&p| alive(p)).collect();
    for &p in &survivors {
        // SAFETY: cleaning up what this test started before failing it.
        unsafe {
            libc::kill(p, libc::SIGKILL);
        }
    }
    assert!(survivors.is_empty(), "{survivors:?} outlived the timeout");
}
