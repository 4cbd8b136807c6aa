//! `lockstep quality` against hostile input (issue 29): every option checked before anything is scored,
//! unknown type names, an unwritable report target, huge or endless corpora, an overflowing `--ctx`,
//! hostile names in the Markdown table, a label too long for a file name, and an interrupt during the
//! llama-perplexity cross-check (no child and no scratch directory left).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lockstep_engine::quant::GgmlType;
use lockstep_engine::synth::SynthModel;

fn tiny(dir: &Path, name: &str, t: SynthModel) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, t.build().unwrap()).unwrap();
    p
}

fn f32_model() -> SynthModel {
    SynthModel {
        matrix_type: GgmlType::F32,
        embd_type: GgmlType::F32,
        ..SynthModel::default()
    }
}

fn q8_model() -> SynthModel {
    SynthModel {
        matrix_type: GgmlType::Q8_0,
        embd_type: GgmlType::Q8_0,
        ..SynthModel::default()
    }
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

/// Runs `lockstep quality` with a private cache, killed after `limit`; returns (exit code, stdout,
/// stderr). A run still going at the limit fails the test (an endless read, a hang).
fn quality_within(cache: &Path, args: &[&str], limit: Duration) -> (i32, String, String) {
    let out_dir = tempfile::tempdir().unwrap();
    let (o, e) = (out_dir.path().join("o"), out_dir.path().join("e"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .env("LOCKSTEP_CACHE", cache)
        .arg("quality")
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&o).unwrap())
        .stderr(std::fs::File::create(&e).unwrap())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "lockstep quality {args:?} still running after {limit:?}; stderr:\n{}",
                std::fs::read_to_string(&e).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = std::fs::read_to_string(&e).unwrap();
    assert!(!stderr.contains("panicked"), "panicked:\n{stderr}");
    (
        status.code().unwrap_or(-1),
        std::fs::read_to_string(&o).unwrap(),
        stderr,
    )
}

fn quality(cache: &Path, args: &[&str]) -> (i32, String, String) {
    quality_within(cache, args, Duration::from_secs(300))
}

/// A directory of variants `m-F32.gguf`, `m-Q8_0.gguf`, a corpus, and where the cache and reports go.
struct Setup {
    _dir: tempfile::TempDir,
    d: PathBuf,
    text: PathBuf,
    cache: PathBuf,
    reports: PathBuf,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    tiny(&d, "m-F32.gguf", f32_model());
    tiny(&d, "m-Q8_0.gguf", q8_model());
    Setup {
        text: corpus(&d),
        cache: d.join("cache"),
        reports: d.join("reports"),
        d,
        _dir: dir,
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Nothing was measured: the base was not computed and no report written.
fn nothing_scored(st: &Setup, stderr: &str) {
    assert!(!stderr.contains("base: computing"), "{stderr}");
    assert!(
        !st.reports.exists() || std::fs::read_dir(&st.reports).unwrap().count() == 0,
        "a report was written"
    );
}

/// A fake llama-perplexity: prints a statistics block (or, with `slow`, records its pid and its helper's
/// and hangs).
fn fake_llama(dir: &Path, slow: bool) -> (PathBuf, PathBuf) {
    if slow {
        let (script, pids) = common::hanging_script(dir);
        return (script, pids);
    }
    let script = dir.join("llama-perplexity");
    std::fs::write(
        &script,
        "#!/bin/sh\necho 'Mean    KLD:   0.004321 ±   0.000123'\necho 'Same top p: 97.654 ± 0.123 %'\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    (script, dir.join("no-pids"))
}

/// `--types Q8_0,BOGUS` and `--check-types BOGUS` are refused before anything is scored, naming the type
/// and listing the known ones; so are a repeated type and `--types` without a directory.
#[test]
fn unknown_types_are_refused_before_scoring() {
    let st = setup();
    let base = [
        "--variants-dir",
        s(&st.d),
        "--corpus",
        s(&st.text),
        "--ctx",
        "64",
        "--chunks",
        "2",
        "--max-kept",
        "8",
        "--reports-dir",
        s(&st.reports),
    ];
    let run = |extra: &[&str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        quality(&st.cache, &a)
    };
    let (code, _, e) = run(&["--types", "Q8_0,BOGUS"]);
    assert_eq!(code, 2, "{e}");
    assert!(
        e.contains("BOGUS") && e.contains("F32, Q8_0") && e.contains("unknown type"),
        "{e}"
    );
    nothing_scored(&st, &e);
    let (code, _, e) = run(&["--types", "Q8_0,q8_0"]);
    assert_eq!(code, 2, "{e}");
    assert!(e.contains("given twice"), "{e}");
    nothing_scored(&st, &e);
    let (llama, _) = fake_llama(&st.d, false);
    let (code, _, e) = run(&[
        "--types",
        "Q8_0",
        "--check-llama-perplexity",
        s(&llama),
        "--check-types",
        "Q8_0,BOGUS",
    ]);
    assert_eq!(code, 2, "{e}");
    assert!(
        e.contains("--check-types BOGUS") && e.contains("Q8_0"),
        "{e}"
    );
    nothing_scored(&st, &e);
    // --check-types without the binary, --types without the directory: usage errors
    let (code, _, e) = run(&["--check-types", "Q8_0"]);
    assert_eq!(code, 2, "{e}");
    assert!(e.contains("--check-llama-perplexity"), "{e}");
    // a binary that is not executable
    let (code, _, e) = run(&["--check-llama-perplexity", s(&st.text)]);
    assert_eq!(code, 2, "{e}");
    assert!(
        e.contains("not an executable file") && e.contains("text.txt"),
        "{e}"
    );
    nothing_scored(&st, &e);
    // a --variant that does not exist
    let (code, _, e) = run(&["--variant", "/nonexistent/m-Q4_0.gguf"]);
    assert_eq!(code, 2, "{e}");
    assert!(e.contains("/nonexistent/m-Q4_0.gguf"), "{e}");
    nothing_scored(&st, &e);
}

/// When every variant fails, the run is not a success; when one of two fails, it is (its row says why).
#[test]
fn every_variant_failing_is_not_success() {
    let st = setup();
    std::fs::write(st.d.join("m-BAD.gguf"), b"GGUF not really").unwrap();
    std::fs::write(st.d.join("m-WORSE.gguf"), b"nope").unwrap();
    let args = |types: &'static str| {
        vec![
            "--variants-dir".to_string(),
            s(&st.d).to_string(),
            "--types".into(),
            types.into(),
            "--corpus".into(),
            s(&st.text).to_string(),
            "--ctx".into(),
            "64".into(),
            "--chunks".into(),
            "2".into(),
            "--max-kept".into(),
            "8".into(),
            "--reports-dir".into(),
            s(&st.reports).to_string(),
        ]
    };
    let a = args("BAD,WORSE");
    let (code, _, e) = quality(&st.cache, &a.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(code, 2, "{e}");
    assert!(e.contains("every variant failed (2 of 2)"), "{e}");
    let a = args("BAD,Q8_0");
    let (code, out, e) = quality(&st.cache, &a.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(code, 0, "{e}");
    assert!(out.contains("| Q8_0 |") && out.contains("**BAD**"), "{out}");
}

/// A report target that cannot be written is refused in milliseconds, before the base is computed.
#[test]
fn an_unwritable_report_target_is_refused_before_measuring() {
    let st = setup();
    let file = st.d.join("a-file");
    std::fs::write(&file, "x").unwrap();
    for (target, says) in [
        (file.clone(), "not a directory"),
        (file.join("sub"), "a-file/sub"),
        (PathBuf::from("/dev/null"), "/dev/null"),
    ] {
        let (code, _, e) = quality(
            &st.cache,
            &[
                "--variants-dir",
                s(&st.d),
                "--types",
                "Q8_0",
                "--corpus",
                s(&st.text),
                "--ctx",
                "64",
                "--reports-dir",
                s(&target),
            ],
        );
        assert_eq!(code, 2, "{e}");
        assert!(e.contains("--reports") && e.contains(says), "{e}");
        assert!(!e.contains("base: computing"), "{e}");
    }
}

/// `--ctx` beyond the model (and beyond u64) is a clear error naming `--ctx`, never an overflow.
#[test]
fn an_overflowing_ctx_is_a_clear_error() {
    let st = setup();
    for (ctx, says) in [
        (
            "18446744073709551615",
            "larger than the model's context of 256",
        ),
        (
            "9223372036854775808",
            "larger than the model's context of 256",
        ),
        ("257", "larger than the model's context of 256"),
        ("3", "too small"),
        ("0", "too small"),
    ] {
        let (code, _, e) = quality(
            &st.cache,
            &[
                "--variants-dir",
                s(&st.d),
                "--types",
                "Q8_0",
                "--corpus",
                s(&st.text),
                "--ctx",
                ctx,
                "--reports-dir",
                s(&st.reports),
            ],
        );
        assert_eq!(code, 2, "--ctx {ctx}: {e}");
        assert!(
            e.contains(&format!("--ctx {ctx}")) && e.contains(says),
            "{e}"
        );
        nothing_scored(&st, &e);
    }
}

/// An endless corpus (`/dev/zero`), a FIFO, a directory and a file over the size limit are refused before
/// they are read (not read until memory runs out, not blocking on a FIFO).
#[test]
fn endless_and_huge_corpora_are_refused() {
    let st = setup();
    let fifo = st.d.join("fifo.txt");
    let c = std::ffi::CString::new(s(&fifo)).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let huge = st.d.join("huge.txt");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(lockstep::quality::MAX_CORPUS_BYTES + 1)
        .unwrap();
    let sub = st.d.join("dir.d");
    std::fs::create_dir(&sub).unwrap();
    for (path, says) in [
        (PathBuf::from("/dev/zero"), "not a regular file"),
        (fifo, "not a regular file"),
        (sub, "not a regular file"),
        (huge, "more than the 268435456 bytes"),
    ] {
        let (code, _, e) = quality_within(
            &st.cache,
            &[
                "--variants-dir",
                s(&st.d),
                "--types",
                "Q8_0",
                "--corpus",
                s(&path),
                "--ctx",
                "64",
                "--reports-dir",
                s(&st.reports),
            ],
            Duration::from_secs(60),
        );
        assert_eq!(code, 2, "{e}");
        assert!(e.contains(s(&path)) && e.contains(says), "{e}");
        nothing_scored(&st, &e);
    }
}

/// Count the unescaped `|` of a Markdown line.
fn pipes(line: &str) -> usize {
    let (mut n, mut esc) = (0, false);
    for c in line.chars() {
        if esc {
            esc = false;
        } else if c == '\\' {
            esc = true;
        } else if c == '|' {
            n += 1;
        }
    }
    n
}

/// `|`, a newline and `<script>` in the model path and in a variant's label stay inside their cells of
/// quality.md (and the CSV has one line per variant).
#[test]
fn hostile_names_stay_inside_the_markdown_table() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("we|ird\n<script>alert(1)");
    std::fs::create_dir(&d).unwrap();
    let base = tiny(&d, "m|x-F32.gguf", f32_model());
    let variant = tiny(&d, "m-Q8|<b>x\ny.gguf", q8_model());
    let text = corpus(dir.path());
    let reports = dir.path().join("reports");
    let cache = dir.path().join("cache");
    let (code, out, e) = quality(
        &cache,
        &[
            "--base",
            s(&base),
            "--variant",
            s(&variant),
            "--corpus",
            s(&text),
            "--ctx",
            "64",
            "--chunks",
            "2",
            "--max-kept",
            "8",
            "--reports-dir",
            s(&reports),
        ],
    );
    assert_eq!(code, 0, "{e}");
    let run = std::fs::read_dir(&reports)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let md = std::fs::read_to_string(run.join("quality.md")).unwrap();
    assert_eq!(md, out.split("\nreport: ").next().unwrap());
    // HTML only where CommonMark shows it as text: inside the base path's code span
    for l in md.lines().filter(|l| !l.starts_with("Base ")) {
        assert!(!l.contains("<script>") && !l.contains("<b>"), "{l}");
    }
    // the main table: header, delimiter, one row, all with the same number of cells
    let table: Vec<&str> = md
        .lines()
        .skip_while(|l| !l.starts_with("| type | MiB |"))
        .take_while(|l| l.starts_with('|'))
        .collect();
    assert_eq!(table.len(), 3, "{md}");
    let n = pipes(table[0]);
    for l in &table {
        assert_eq!(pipes(l), n, "{l}");
    }
    assert!(table[2].contains(r"Q8\|&lt;b&gt;x y"), "{}", table[2]);
    // the base path is one code span on one line
    let base_line = md.lines().find(|l| l.starts_with("Base ")).unwrap();
    assert!(
        base_line.starts_with("Base `")
            && base_line.contains("<script>alert(1)/m\\|x-F32.gguf` (sha256"),
        "{base_line}"
    );
    let csv = std::fs::read_to_string(run.join("quality.csv")).unwrap();
    assert_eq!(csv.lines().count(), 2, "{csv}");
}

/// A variant label near the file-name limit (245 characters) still gets its llama-perplexity cross-check:
/// the capture files named after it are bounded (`output::file_stem`).
#[test]
fn a_long_label_does_not_break_a_file_name() {
    let st = setup();
    let label = "Q".repeat(245);
    tiny(&st.d, &format!("m-{label}.gguf"), q8_model());
    let (llama, _) = fake_llama(&st.d, false);
    let (code, _, e) = quality(
        &st.cache,
        &[
            "--variants-dir",
            s(&st.d),
            "--types",
            &label,
            "--corpus",
            s(&st.text),
            "--ctx",
            "64",
            "--chunks",
            "2",
            "--max-kept",
            "8",
            "--reports-dir",
            s(&st.reports),
            "--check-llama-perplexity",
            s(&llama),
            "--check-types",
            &label,
        ],
    );
    assert_eq!(code, 0, "{e}");
    let run = std::fs::read_dir(&st.reports)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("quality.json")).unwrap()).unwrap();
    let cc = &j["cross_check"][0];
    assert!(cc["error"].is_null(), "{cc}");
    assert_eq!(cc["llama"]["kld"]["value"], 0.004321, "{cc}");
    // the scratch directory is gone
    let left: Vec<_> = std::fs::read_dir(st.cache.join("quality"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with('.'))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// SIGINT while llama-perplexity runs: the whole child group is killed (the script and its helper) and
/// the `.llama-kld-*` scratch directory removed; lockstep exits 130.
#[test]
fn an_interrupt_kills_llama_perplexity_and_removes_its_directory() {
    let st = setup();
    let (llama, pids) = fake_llama(&st.d, true);
    let out_dir = tempfile::tempdir().unwrap();
    let err = out_dir.path().join("e");
    let mut child = Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .env("LOCKSTEP_CACHE", &st.cache)
        .args([
            "quality",
            "--variants-dir",
            s(&st.d),
            "--types",
            "Q8_0",
            "--corpus",
            s(&st.text),
            "--ctx",
            "64",
            "--chunks",
            "2",
            "--max-kept",
            "8",
            "--reports-dir",
            s(&st.reports),
            "--check-llama-perplexity",
            s(&llama),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    common::wait_for_start(&pids, 300);
    let scratch = || -> Vec<PathBuf> {
        std::fs::read_dir(st.cache.join("quality"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(".llama-kld-")
            })
            .collect()
    };
    assert_eq!(
        scratch().len(),
        1,
        "no scratch directory while llama-perplexity runs"
    );
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "lockstep did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    std::thread::sleep(Duration::from_millis(300));
    let alive = common::still_running(&pids);
    for &pid in &alive {
        // SAFETY: clean up what the failing run left before failing the test.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
    let stderr = std::fs::read_to_string(&err).unwrap();
    assert!(alive.is_empty(), "left running: {alive:?}\n{stderr}");
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(scratch().is_empty(), "{:?}", scratch());
}
