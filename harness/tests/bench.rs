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
