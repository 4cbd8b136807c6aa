//! `lockstep quality` end to end on synthetic models: the report, a failing variant kept in the table, the
//! base cache, and clear errors for bad input.

use std::path::{Path, PathBuf};
use std::process::Command;

use lockstep_engine::quant::GgmlType;
use lockstep_engine::synth::SynthModel;

fn tiny(dir: &Path, name: &str, t: SynthModel) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, t.build().unwrap()).unwrap();
    p
}

/// Runs `lockstep quality` with a private cache; returns (exit code, stdout, stderr).
fn quality(cache: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .env("LOCKSTEP_CACHE", cache)
        .arg("quality")
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "panicked:\n{stderr}");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
    )
}

fn corpus(dir: &Path) -> PathBuf {
    let words = [
        "hello", "the", "world", "tell", "a", "tale", "of", "hell", "and", "light",
    ];
    let text: Vec<&str> = (0..900)
        .map(|i| words[(i * 7 + i / 3) % words.len()])
        .collect();
    let p = dir.join("text.txt");
    std::fs::write(&p, text.join(" ") + "\n").unwrap();
    p
}

#[test]
fn quality_end_to_end_on_synthetic_variants() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let f32 = SynthModel {
        matrix_type: GgmlType::F32,
        embd_type: GgmlType::F32,
        ..SynthModel::default()
    };
    tiny(d, "tiny-F32.gguf", f32.clone());
    tiny(d, "tiny-SAME.gguf", f32);
    tiny(
        d,
        "tiny-Q8_0.gguf",
        SynthModel {
            matrix_type: GgmlType::Q8_0,
            embd_type: GgmlType::Q8_0,
            ..SynthModel::default()
        },
    );
    tiny(d, "tiny-Q4_1.gguf", SynthModel::default());
    std::fs::write(d.join("tiny-BAD.gguf"), b"GGUF not really").unwrap();
    let text = corpus(d);
    let reports = d.join("reports");
    let cache = d.join("cache");
    let args = [
        "--variants-dir",
        d.to_str().unwrap(),
        "--types",
        "SAME,Q8_0,Q4_1,BAD",
        "--corpus",
        text.to_str().unwrap(),
        "--ctx",
        "64",
        "--chunks",
        "4",
        "--max-kept",
        "16",
        "--reports",
        reports.to_str().unwrap(),
    ];
    let (code, stdout, stderr) = quality(&cache, &args);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("| Q8_0 |") && stdout.contains("Mean KLD"),
        "{stdout}"
    );
    assert!(stderr.contains("base: computing"), "{stderr}");

    let run = std::fs::read_dir(&reports)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    for f in ["quality.json", "quality.md", "quality.csv"] {
        assert!(run.join(f).is_file(), "{f} missing");
    }
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("quality.json")).unwrap()).unwrap();
    let vars = j["models"][0]["variants"].as_array().unwrap();
    let by = |l: &str| vars.iter().find(|v| v["label"] == l).unwrap();
    // 4 chunks × (64 − 1 − 32) scored tokens
    assert_eq!(by("Q8_0")["stats"]["count"], 4 * 31);
    // the base against itself: no divergence, the same top token everywhere
    let same = &by("SAME")["stats"];
    assert!(
        same["kld"]["value"].as_f64().unwrap().abs() < 1e-6,
        "{same}"
    );
    assert_eq!(same["same_top_p"]["value"], 1.0);
    let kld = |l: &str| by(l)["stats"]["kld"]["value"].as_f64().unwrap();
    assert!(kld("Q8_0") > 0.0 && kld("Q4_1") > kld("Q8_0"));
    // the gap to the full-row KL is measured and the cached KLD is a lower bound of it
    let gap = &by("Q4_1")["kl_gap"];
    assert!(gap["mean_kept"].as_f64().unwrap() <= gap["mean_full"].as_f64().unwrap() + 1e-9);
    // a broken variant stays in the table with its error; the run goes on
    let bad = by("BAD");
    assert!(bad["stats"].is_null());
    assert!(
        bad["error"].as_str().unwrap().contains("tiny-BAD.gguf"),
        "{bad}"
    );
    assert_eq!(vars.len(), 4);

    // a second run reads the base from the cache
    let (code, _, stderr) = quality(&cache, &args);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("base: cached"), "{stderr}");

    // a damaged cache file (cut in half) is said to be damaged, naming it, discarded and computed again:
    // the run does not go on with bad numbers
    let base_file = std::fs::read_dir(cache.join("quality"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "bin"))
        .unwrap();
    let bytes = std::fs::read(&base_file).unwrap();
    std::fs::write(&base_file, &bytes[..bytes.len() / 2]).unwrap();
    let (code, _, stderr) = quality(&cache, &args);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(&base_file.display().to_string())
            && stderr.contains("truncated")
            && stderr.contains("computing the base again")
            && stderr.contains("base: computing"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&base_file).unwrap(), bytes);

    // a change that leaves every value in range (each row's ln Σ exp raised by 1) is caught by the
    // cache's sha256; without it SAME (the base itself) would score a large KLD and the run exit 0
    let mut bad = bytes.clone();
    let hlen = u32::from_le_bytes(bad[8..12].try_into().unwrap()) as usize;
    let mut at = 12 + hlen + 4 * 64 * 4;
    for _ in 0..4 * 31 {
        let n = u32::from_le_bytes(bad[at..at + 4].try_into().unwrap()) as usize;
        let lse = f64::from_le_bytes(bad[at + 4..at + 12].try_into().unwrap());
        bad[at + 4..at + 12].copy_from_slice(&(lse + 1.0).to_le_bytes());
        at += 4 + 8 + 8 + 4 + n * 2 + n * 4;
    }
    std::fs::write(&base_file, &bad).unwrap();
    let before: Vec<PathBuf> = std::fs::read_dir(&reports)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let (code, _, stderr) = quality(&cache, &args);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("do not match their sha256") && stderr.contains("base: computing"),
        "{stderr}"
    );
    let new: Vec<PathBuf> = std::fs::read_dir(&reports)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !before.contains(p))
        .collect();
    assert_eq!(new.len(), 1, "{new:?}");
    let newest = &new[0];
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(newest.join("quality.json")).unwrap())
            .unwrap();
    let same = j["models"][0]["variants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["label"] == "SAME")
        .unwrap()["stats"]["kld"]["value"]
        .as_f64()
        .unwrap();
    assert!(same.abs() < 1e-6, "SAME scored a KLD of {same}");
}

#[test]
fn quality_bad_input_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let base = tiny(
        d,
        "m-F32.gguf",
        SynthModel {
            matrix_type: GgmlType::F32,
            embd_type: GgmlType::F32,
            ..SynthModel::default()
        },
    );
    let b = base.to_str().unwrap();
    let text = corpus(d);
    let t = text.to_str().unwrap();
    let cache = d.join("cache");
    let reports = d.join("reports");
    let r = reports.to_str().unwrap();
    let run = |args: &[&str]| quality(&cache, args);

    // a corpus that is not UTF-8
    let bin = d.join("bin.txt");
    std::fs::write(&bin, [b'a', 0xff, 0xfe, b'b']).unwrap();
    let (code, _, e) = run(&[
        "--base",
        b,
        "--variant",
        b,
        "--corpus",
        bin.to_str().unwrap(),
        "--reports",
        r,
    ]);
    assert_eq!(code, 2);
    assert!(e.contains("bin.txt") && e.contains("UTF-8"), "{e}");
    // a corpus too short for the context
    let short = d.join("short.txt");
    std::fs::write(&short, "hello").unwrap();
    let (code, _, e) = run(&[
        "--base",
        b,
        "--variant",
        b,
        "--corpus",
        short.to_str().unwrap(),
        "--reports",
        r,
    ]);
    assert_eq!(code, 2);
    assert!(e.contains("tokens"), "{e}");
    // a missing base
    let (code, _, e) = run(&[
        "--base",
        "/nonexistent/x-F32.gguf",
        "--variant",
        b,
        "--corpus",
        t,
        "--reports",
        r,
    ]);
    assert_eq!(code, 2);
    assert!(e.contains("/nonexistent/x-F32.gguf"), "{e}");
    // a variant with another vocabulary: its row says so
    let other = SynthModel::default();
    let mut bytes = other.build().unwrap();
    // same model, but a file that is not GGUF at all is the simplest foreign file
    bytes.truncate(100);
    let broken = d.join("m-TRUNC.gguf");
    std::fs::write(&broken, bytes).unwrap();
    let (code, _, e) = run(&[
        "--base",
        b,
        "--variant",
        broken.to_str().unwrap(),
        "--corpus",
        t,
        "--ctx",
        "64",
        "--chunks",
        "2",
        "--max-kept",
        "8",
        "--reports",
        r,
    ]);
    // its only variant failed: the run is an error (exit 2), after the report with the error is written
    assert_eq!(code, 2, "{e}");
    assert!(e.contains("TRUNC: error"), "{e}");
    assert!(e.contains("every variant failed (1 of 1)"), "{e}");
    assert_eq!(std::fs::read_dir(&reports).unwrap().count(), 1);
    // nothing half-written is left in the reports directory
    for entry in std::fs::read_dir(&reports).unwrap() {
        let name = entry.unwrap().file_name();
        assert!(!name.to_string_lossy().starts_with('.'), "{name:?}");
    }
}
