//! Unit tests of the bench modules.

use std::path::Path;

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
        build_commit: "0c1e570".into(),
        test_time: "2026-11-29T14:20:00Z".into(),
        samples_peak_rss: Vec::new(),
        peak_rss_bytes: None,
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
                ComputeUse {
                    engine: x.engine.clone(),
                    model: x.model.clone(),
                    test: Test::of(x).name(),
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

fn report(ours: &[f64], llama: &[f64]) -> BenchReport {
    report_of(vec![result("lockstep", ours), result("llama.cpp", llama)])
}

const LIMITS: SpeedLimits = SpeedLimits {
    max_slowdown: 0.1,
    min_ratio_to_llama_cpp: 0.5,
    max_slowdown_vs_floors: 0.5,
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
        max_slowdown_vs_floors: 0.5,
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
    let l = parse_speed_limits(include_str!("../../../ci/speed.toml"), p).unwrap();
    assert!(l.max_slowdown > 0.0 && l.min_ratio_to_llama_cpp > 0.0);
    for (text, needle) in [
        (
            "max_slowdown = nan\nmin_ratio_to_llama_cpp = 0.5\nmax_slowdown_vs_floors = 0.5",
            "max_slowdown: NaN",
        ),
        (
            "max_slowdown = 0.1\nmin_ratio_to_llama_cpp = inf\nmax_slowdown_vs_floors = 0.5",
            "min_ratio_to_llama_cpp: inf",
        ),
        (
            "max_slowdown = -0.1\nmin_ratio_to_llama_cpp = 0.5\nmax_slowdown_vs_floors = 0.5",
            "max_slowdown: -0.1",
        ),
        (
            "max_slowdown = 1.0\nmin_ratio_to_llama_cpp = 0.5\nmax_slowdown_vs_floors = 0.5",
            "max_slowdown: 1",
        ),
        (
            "max_slowdown = 0.1\nmin_ratio_to_llama_cpp = 0.0\nmax_slowdown_vs_floors = 0.5",
            "min_ratio_to_llama_cpp: 0",
        ),
        (
            "max_slowdown = 0.1\nmin_ratio_to_llama_cpp = -inf\nmax_slowdown_vs_floors = 0.5",
            "min_ratio_to_llama_cpp: -inf",
        ),
        (
            "max_slowdown = 0.1\nmin_ratio_to_llama_cpp = 0.5\nmax_slowdown_vs_floors = 0.5\nmax_slowdwn = 0.5",
            "unknown field",
        ),
        ("max_slowdown = 0.1", "missing field"),
        (
            "max_slowdown = 0.1\nmin_ratio_to_llama_cpp = 0.5",
            "missing field `max_slowdown_vs_floors`",
        ),
        (
            "max_slowdown = 0.1\nmin_ratio_to_llama_cpp = 0.5\nmax_slowdown_vs_floors = 1.0",
            "max_slowdown_vs_floors: 1",
        ),
        (
            "max_slowdown = 0.1\nmin_ratio_to_llama_cpp = 0.5\nmax_slowdown_vs_floors = nan",
            "max_slowdown_vs_floors: NaN",
        ),
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
        max_slowdown_vs_floors: 0.5,
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
    let csv = render_bench_csv(&r).unwrap();
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

// ---- the FMA peak, prefill's compute entries and the speed floors ----

const PP16: Test = Test {
    n_prompt: 16,
    n_gen: 0,
    n_depth: 0,
};

/// A version-2 report of lockstep on a pp16 and a tg8 row at about `pp` and `tg` tokens/s, with the
/// compute and bandwidth entries the bench records (1 GFLOP per pp16, 1 MB per decode step).
fn report_v2(pp: &[f64], tg: &[f64]) -> BenchReport {
    let mut r = report_of(vec![
        result_of("lockstep", PP16, pp),
        result_of("lockstep", TG8, tg),
    ]);
    r.engines = vec![lockstep_engine_settings("avx512")];
    let (x, y) = (&r.results[0], &r.results[1]);
    let gflops = 1e9 * x.median_ts / 16.0 / 1e9;
    r.compute = vec![ComputeUse {
        engine: "lockstep".into(),
        model: "m".into(),
        test: "pp16".into(),
        flops: 1e9,
        gflops,
        fraction: gflops * 1e9 / r.fma_peak,
    }];
    r.bandwidth = vec![BandwidthUse {
        engine: "lockstep".into(),
        model: "m".into(),
        test: "tg8".into(),
        bytes_per_token: 1_000_000,
        fraction: y.median_ts * 1e6 / r.read_bandwidth,
    }];
    r
}

#[test]
fn compute_entries_are_recomputed_and_required_from_version_2() {
    let r = report_v2(&[400.0, 410.0, 395.0], &[50.0, 51.0, 49.0]);
    validate_bench(&r).unwrap();
    let mut bad = r.clone();
    bad.compute[0].gflops *= 2.0;
    assert!(invalid(&bad).contains("compute[0] (lockstep m pp16).gflops: recorded"));
    let mut bad = r.clone();
    bad.compute[0].fraction = 0.9;
    assert!(invalid(&bad).contains(".fraction: recorded 0.9, gflops ÷ fma_peak gives"));
    let mut bad = r.clone();
    bad.compute.clear();
    assert!(invalid(&bad).contains("compute: no entry for lockstep m pp16"));
    let mut bad = r.clone();
    bad.compute.push(bad.compute[0].clone());
    assert!(invalid(&bad).contains("a second entry"));
    let mut bad = r.clone();
    bad.compute[0].test = "tg8".into();
    assert!(invalid(&bad).contains("not a prompt test"));
    let mut bad = r.clone();
    bad.fma_peak_samples = vec![f64::NAN];
    assert!(invalid(&bad).contains("fma_peak_samples[0]: NaN"));
    let mut bad = r.clone();
    bad.fma_peak *= 1.5;
    assert!(invalid(&bad).contains("fma_peak: recorded"));
    // version 1: no peak, no compute entries; a version-1 file that has them is refused
    let mut v1 = r.clone();
    v1.schema_version = 1;
    v1.fma_peak = 0.0;
    v1.fma_peak_samples.clear();
    v1.compute.clear();
    validate_bench(&v1).unwrap();
    v1.compute = r.compute.clone();
    assert!(invalid(&v1).contains("schema_version 1 has no fma_peak"));
}

/// The settings of a lockstep engine that ran `simd`.
fn lockstep_engine_settings(simd: &str) -> EngineSettings {
    EngineSettings {
        engine: "lockstep".into(),
        mode: Some("ggml".into()),
        simd: Some(simd.into()),
        binary: "target/release/lockstep".into(),
    }
}

/// A floors file holding `r`'s floors only, under its SIMD kind.
fn floors_of(r: &BenchReport) -> SpeedFloors {
    SpeedFloors::with_host(None, HostFloors::from_bench(r).unwrap())
}

fn floors_limits() -> SpeedLimits {
    SpeedLimits {
        max_slowdown_vs_floors: 0.5,
        ..LIMITS
    }
}

#[test]
fn the_floors_gate_passes_the_same_share_and_fails_a_halved_one() {
    let r = report_v2(&[400.0, 410.0, 395.0], &[50.0, 51.0, 49.0]);
    let floors = floors_of(&r);
    assert_eq!(floors.host[0].floor.len(), 2);
    assert_eq!(floors.host[0].simd, "avx512");
    // the file round-trips through its TOML
    let text = floors.to_toml().unwrap();
    assert!(text.starts_with("# Speed floors"), "{text}");
    let back: SpeedFloors = toml::from_str(&text).unwrap();
    assert_eq!(back, floors);
    // the same speed on a machine twice as fast in both limits: the same share, passes
    let mut fast = report_v2(&[800.0, 820.0, 790.0], &[100.0, 102.0, 98.0]);
    fast.fma_peak *= 2.0;
    fast.fma_peak_samples = vec![fast.fma_peak];
    fast.read_bandwidth *= 2.0;
    fast.read_bandwidth_samples = vec![fast.read_bandwidth];
    fast.compute[0].fraction /= 2.0;
    fast.bandwidth[0].fraction /= 2.0;
    let checks = gate_floors(&fast, &floors, &floors_limits()).unwrap();
    assert_eq!(checks.len(), 2);
    assert!(checks.iter().all(|c| c.pass), "{checks:?}");
    // prefill three times slower on the same machine: its check fails, decode's passes
    let slow = report_v2(&[130.0, 135.0, 128.0], &[50.0, 51.0, 49.5]);
    let checks = gate_floors(&slow, &floors, &floors_limits()).unwrap();
    assert!(!checks[0].pass && checks[1].pass, "{checks:?}");
    assert!(checks[0]
        .line()
        .starts_with("FAIL m pp16: lockstep fraction of FMA peak / floor = 0.3"));
}

#[test]
fn the_floors_gate_drops_and_invents_no_check() {
    let r = report_v2(&[400.0, 410.0, 395.0], &[50.0, 51.0, 49.0]);
    let floors = floors_of(&r);
    let l = floors_limits();
    let err =
        |r: &BenchReport, f: &SpeedFloors| format!("{:#}", gate_floors(r, f, &l).unwrap_err());
    // a floor the bench did not measure
    let mut more = floors.clone();
    more.host[0].floor.push(SpeedFloor {
        model: "other".into(),
        ..floors.host[0].floor[0].clone()
    });
    assert!(err(&r, &more).contains("the floors hold other pp16, which the bench did not measure"));
    // a row without a floor
    let mut fewer = floors.clone();
    fewer.host[0].floor.remove(1);
    assert!(err(&r, &fewer).contains("no speed floor for m tg8"));
    // another FLOP count or another model size: the floor does not apply
    let mut other = floors.clone();
    other.host[0].floor[0].flops = Some(2e9);
    assert!(
        err(&r, &other).contains("the bench counts 1000000000 FLOPs, the floor Some(2000000000.0)")
    );
    let mut other = floors.clone();
    other.host[0].floor[1].bytes_per_token = Some(7);
    assert!(err(&r, &other).contains("a decode step reads 1000000 bytes, the floor's Some(7)"));
    // a version-1 bench has no peak
    let mut v1 = r.clone();
    v1.schema_version = 1;
    v1.fma_peak = 0.0;
    v1.fma_peak_samples.clear();
    v1.compute.clear();
    assert!(err(&v1, &floors).contains("version-1 bench"));
}

#[test]
fn speed_floors_files_are_checked_entry_by_entry() {
    let r = report_v2(&[400.0, 410.0, 395.0], &[50.0, 51.0, 49.0]);
    let floors = floors_of(&r);
    let msg = |f: &SpeedFloors| format!("{:#}", f.validate().unwrap_err());
    let mut f = floors.clone();
    f.host[0].floor[0].fraction_of_fma_peak = Some(0.0);
    assert!(msg(&f).contains("floor[0] (m pp16).fraction_of_fma_peak: 0.0 is not a fraction"));
    let mut f = floors.clone();
    f.host[0].floor[1].fraction_of_bandwidth = Some(f64::NAN);
    assert!(msg(&f).contains("fraction_of_bandwidth: NaN"));
    let mut f = floors.clone();
    f.host[0].floor[1].fraction_of_bandwidth = None;
    assert!(msg(&f).contains("fraction_of_bandwidth: missing"));
    let mut f = floors.clone();
    f.host[0].floor[0].bytes_per_token = Some(3);
    assert!(msg(&f).contains("a prompt test has no bytes_per_token"));
    let mut f = floors.clone();
    let first = f.host[0].floor[0].clone();
    f.host[0].floor.push(first);
    assert!(msg(&f).contains("a second floor of this model and test"));
    let mut f = floors.clone();
    f.host[0].floor[0].test = "xx16".into();
    assert!(msg(&f).contains("neither a pp nor a tg test"));
    let mut f = floors.clone();
    f.host[0].floor.clear();
    assert!(msg(&f).contains("floor: empty"));
    let mut f = floors.clone();
    f.schema_version = 9;
    assert!(msg(&f).contains("schema_version: 9"));
    // on disk: unknown keys and non-TOML are refused, naming the file
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("speed-floors.toml");
    std::fs::write(&p, floors.to_toml().unwrap() + "\nextra = 1\n").unwrap();
    let e = format!("{:#}", SpeedFloors::load(&p).unwrap_err());
    assert!(
        e.contains("speed-floors.toml is not a speed floors file") && e.contains("unknown field"),
        "{e}"
    );
    std::fs::write(&p, floors.to_toml().unwrap()).unwrap();
    assert_eq!(SpeedFloors::load(&p).unwrap(), floors);
}

#[test]
fn the_load_average_is_read_and_warned_about_above_the_threads() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("loadavg");
    std::fs::write(&p, "3.52 1.58 0.59 4/467 12345\n").unwrap();
    let l = super::runner::read_load_average(&p).unwrap();
    assert_eq!(l, [3.52, 1.58, 0.59]);
    let w = super::runner::load_warning(l, 2).expect("3.52 > 2 threads");
    assert!(w.contains("3.52") && w.contains("2 thread(s)"), "{w}");
    assert_eq!(super::runner::load_warning(l, 4), None);
    std::fs::write(&p, "garbage\n").unwrap();
    assert_eq!(super::runner::read_load_average(&p), None);
    assert_eq!(
        super::runner::read_load_average(&dir.path().join("missing")),
        None
    );
}

#[test]
fn bench_csv_has_llama_benchs_build_commit_and_test_time() {
    let mut r = report_of(vec![result("lockstep", &[10.0, 11.0])]);
    r.results[0].build_commit = "53b3529-dirty".into();
    let csv = render_bench_csv(&r).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let row: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(header[0], "build_commit");
    assert_eq!(row[0], "53b3529-dirty");
    let t = header.iter().position(|h| *h == "test_time").unwrap();
    assert_eq!(
        header[t + 1],
        "avg_ns",
        "test_time before the timings, as llama-bench"
    );
    assert_eq!(row[t], "2026-11-29T14:20:00Z");
    let now = super::runner::iso_utc_now();
    assert!(
        now.len() == 20 && now.ends_with('Z') && now.as_bytes()[10] == b'T',
        "{now}"
    );
}

#[test]
fn a_bench_is_held_to_the_floors_of_its_own_simd_kind() {
    let r = report_v2(&[400.0, 410.0, 395.0], &[50.0, 51.0, 49.0]);
    let avx512 = floors_of(&r);
    // a bench of the AVX2 kernels (an AVX2 host, or --simd avx2) has no floors in an AVX-512-only file
    let mut r2 = report_v2(&[150.0, 155.0, 148.0], &[45.0, 46.0, 44.0]);
    r2.engines = vec![lockstep_engine_settings("avx2")];
    let e = format!(
        "{:#}",
        gate_floors(&r2, &avx512, &floors_limits()).unwrap_err()
    );
    assert!(
        e.contains("no speed floors of SIMD kind avx2 (the file has avx512)")
            && e.contains("--simd avx2"),
        "{e}"
    );
    // writing the avx2 section keeps the avx512 one; each bench meets its own kind's floors
    let both = SpeedFloors::with_host(Some(avx512.clone()), HostFloors::from_bench(&r2).unwrap());
    both.validate().unwrap();
    let kinds: Vec<&str> = both.host.iter().map(|h| h.simd.as_str()).collect();
    assert_eq!(kinds, ["avx512", "avx2"]);
    assert_eq!(both.for_simd("avx512"), avx512.for_simd("avx512"));
    let checks = gate_floors(&r2, &both, &floors_limits()).unwrap();
    assert!(checks.iter().all(|c| c.pass), "{checks:?}");
    // the AVX2 prefill at under half the AVX-512 one would fail the avx512 floors (limit 0.5 of the
    // floor): held to its own kind, it passes; labelled avx512 it fails
    let mut as512 = r2.clone();
    as512.engines = vec![lockstep_engine_settings("avx512")];
    let checks = gate_floors(&as512, &both, &floors_limits()).unwrap();
    assert!(!checks[0].pass, "{checks:?}");
    // remaking one kind replaces it, the other stays
    let faster = report_v2(&[800.0, 810.0, 790.0], &[60.0, 61.0, 59.0]);
    let again =
        SpeedFloors::with_host(Some(both.clone()), HostFloors::from_bench(&faster).unwrap());
    assert_eq!(again.host.len(), 2);
    assert_eq!(again.for_simd("avx2"), both.for_simd("avx2"));
    assert_ne!(again.for_simd("avx512"), both.for_simd("avx512"));
    // a file with a kind twice, or an unknown kind, is refused
    let mut twice = both.clone();
    twice.host.push(twice.host[0].clone());
    assert!(format!("{:#}", twice.validate().unwrap_err())
        .contains("host[2]: a second section of SIMD kind \"avx512\""));
    let mut odd = both.clone();
    odd.host[1].simd = "neon".into();
    assert!(format!("{:#}", odd.validate().unwrap_err())
        .contains("host[1] (neon).simd: \"neon\" is not one of off, avx2, avx512"));
}

#[test]
fn the_simd_kind_of_a_bench_is_its_lockstep_engines() {
    let mut r = report_v2(&[400.0], &[50.0]);
    assert_eq!(bench_simd_kind(&r).unwrap(), "avx512");
    r.engines = vec![
        EngineSettings {
            engine: "llama.cpp".into(),
            mode: None,
            simd: None,
            binary: "llama-bench".into(),
        },
        lockstep_engine_settings("off"),
    ];
    assert_eq!(bench_simd_kind(&r).unwrap(), "off");
    r.engines.truncate(1);
    assert!(format!("{:#}", bench_simd_kind(&r).unwrap_err()).contains("no lockstep engine"));
    r.engines = vec![lockstep_engine_settings("auto")];
    assert!(format!("{:#}", bench_simd_kind(&r).unwrap_err()).contains("ran SIMD \"auto\""));
}

#[test]
fn a_version_1_floors_file_is_refused_with_how_to_remake_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("speed-floors.toml");
    std::fs::write(
        &p,
        "schema_version = 1\nsource_run = \"x\"\ncpu = \"c\"\nthreads = 2\nfma_peak = 1.0\n\
         read_bandwidth = 1.0\n\n[[floor]]\nmodel = \"m\"\ntest = \"tg8\"\nbytes_per_token = 1\n\
         fraction_of_bandwidth = 0.5\n",
    )
    .unwrap();
    let e = format!("{:#}", SpeedFloors::load(&p).unwrap_err());
    assert!(
        e.contains("schema_version 1, this lockstep reads 2") && e.contains("--write-speed-floors"),
        "{e}"
    );
}

#[test]
fn the_checked_in_speed_floors_file_reads() {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ci/speed-floors.toml");
    let f = SpeedFloors::load(&p).unwrap();
    assert!(f.for_simd("avx512").is_some(), "{:?}", f.host.len());
}

#[test]
fn peak_rss_is_checked_and_shown_beside_llama_cpps() {
    let mut r = report(&[50.0, 51.0, 49.0], &[40.0, 41.0, 39.0]);
    r.results[0].samples_peak_rss = vec![300 << 20, 310 << 20, 305 << 20];
    r.results[1].samples_peak_rss = vec![200 << 20, 200 << 20, 200 << 20];
    for x in &mut r.results {
        x.fill_stats();
    }
    assert_eq!(r.results[0].peak_rss_bytes, Some(310 << 20));
    validate_bench(&r).unwrap();
    let md = render_bench_markdown(&r);
    assert!(md.contains("host SIMD kind avx512"), "{md}");
    assert!(md.contains("## Peak RSS"), "{md}");
    assert!(
        md.contains("| model | test | lockstep | llama.cpp | lockstep / llama.cpp |"),
        "{md}"
    );
    assert!(md.contains("| m | tg8 | 310.0 | 200.0 | 1.550 |"), "{md}");
    let csv = render_bench_csv(&r).unwrap();
    let header = csv.lines().next().unwrap();
    assert!(
        header.ends_with(",median_ts,peak_rss_bytes,host_simd"),
        "{header}"
    );
    assert!(
        csv.lines()
            .nth(1)
            .unwrap()
            .ends_with(&format!(",{},avx512", 310u64 << 20)),
        "{csv}"
    );
    // a recorded peak that is not its samples' largest, a count that is not the repetitions', a 0
    let mut bad = r.clone();
    bad.results[0].peak_rss_bytes = Some(1);
    assert!(invalid(&bad).contains(".peak_rss_bytes: recorded Some(1)"));
    let mut bad = r.clone();
    bad.results[1].samples_peak_rss.pop();
    bad.results[1].fill_stats();
    assert!(invalid(&bad).contains("samples_peak_rss: 2 samples, but repetitions is 3"));
    let mut bad = r.clone();
    bad.results[1].samples_peak_rss[0] = 0;
    assert!(invalid(&bad).contains("samples_peak_rss[0]: 0 bytes"));
    // no RSS recorded (a file from before, another platform): no section, '-' in the table
    let mut none = r.clone();
    for x in &mut none.results {
        x.samples_peak_rss.clear();
        x.fill_stats();
    }
    validate_bench(&none).unwrap();
    let md = render_bench_markdown(&none);
    assert!(!md.contains("## Peak RSS") && md.contains("| - |"), "{md}");
}
