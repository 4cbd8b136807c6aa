//! `lockstep publish` in a real browser: headless Chromium (Debian's `chromium` package; `ci/test.sh`
//! installs it when missing) loads every page of a site made from runs of the tiny seeded models (one
//! with a broken RMSNorm epsilon, so failing cells, bisect verdicts and the rounding probe are on it) and
//! two bench runs; no page may log anything to the console (the pages have no script: any message is an
//! error, a failed load included), every `href` and `src` must resolve to a file of the site (and an
//! `#anchor` to an `id` on its page), and a screenshot of the index is written to
//! `target/tmp/publish/index.png` (with the site beside it, to look at).
//!
//! `#[ignore]`d: it needs Chromium, which a plain `cargo test` may not have; `ci/test.sh` runs it. Without
//! Chromium it fails saying so — never a silent pass.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;
use lockstep::engine::{Engine, LockstepEngine};
use lockstep::matrix::{Cell, Filters};
use lockstep::run::{run_with, RunOptions};
use lockstep_engine::gguf::GgufFile;
use lockstep_engine::{Model, Simd};

mod common;
use common::root;

fn chromium() -> PathBuf {
    for c in ["chromium", "chromium-browser", "google-chrome"] {
        if let Ok(o) = Command::new("which").arg(c).output() {
            if o.status.success() {
                return PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
            }
        }
    }
    panic!("no chromium on the PATH: `apt-get install -y chromium` (ci/test.sh does it)");
}

/// Patch `llama.attention.layer_norm_rms_epsilon` in a GGUF's bytes.
fn with_eps(mut bytes: Vec<u8>, eps: f32) -> Vec<u8> {
    let key = b"llama.attention.layer_norm_rms_epsilon";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    bytes[at + 4..at + 8].copy_from_slice(&eps.to_le_bytes());
    bytes
}

fn make_reports(reports: &Path) {
    let opts = RunOptions {
        golden_dir: root().join("golden"),
        matrix: root().join("ci/matrix.toml"),
        thresholds: root().join("ci/thresholds.toml"),
        reports_root: reports.to_path_buf(),
        filters: Filters {
            model: vec!["synth-llama".into(), "synth-qwen2".into()],
            ..Filters::default()
        },
        external: None,
        force_external: false,
        progress: false,
        threads: rayon::current_num_threads(),
        ggml_target: None,
        floors: root().join("ci/floors.json"),
        shard: None,
        select: Default::default(),
        serve: None,
    };
    let mut factory = |cell: &Cell, model: &Path, _: &str| -> Result<Box<dyn Engine>> {
        let simd = Simd::parse(&cell.simd)?;
        if cell.model == "synth-llama" {
            let m = Model::from_gguf(GgufFile::from_bytes(
                with_eps(std::fs::read(model)?, 1e-2),
                "broken-eps.gguf",
            )?)?;
            Ok(Box::new(
                LockstepEngine::from_model(m, model.to_path_buf()).with_simd(simd),
            ))
        } else {
            Ok(Box::new(LockstepEngine::load(model)?.with_simd(simd)))
        }
    };
    let (_, r) = run_with(&opts, &mut factory).unwrap();
    assert!(r.cells.iter().any(|c| !c.verdict.pass));
    // two bench runs, lockstep against itself as the baseline (no llama.cpp needed): two points a chart
    for _ in 0..2 {
        let st = Command::new(env!("CARGO_BIN_EXE_lockstep"))
            .args([
                "bench",
                "--model",
                "synth-llama",
                "-p",
                "16",
                "-n",
                "4",
                "-r",
                "2",
            ])
            .args([
                "--no-llama",
                "--baseline-bin",
                env!("CARGO_BIN_EXE_lockstep"),
            ])
            .arg("--reports")
            .arg(reports)
            .status()
            .unwrap();
        assert!(st.success());
        // bench run ids have a one-second resolution
        std::thread::sleep(std::time::Duration::from_millis(1100));
    }
}

/// Every `href="..."` and `src="..."` value of an HTML page (the site writes attributes double-quoted).
fn links(html: &str) -> Vec<String> {
    let mut out = Vec::new();
    for attr in ["href=\"", "src=\""] {
        for part in html.split(attr).skip(1) {
            out.push(part[..part.find('"').unwrap()].replace("&amp;", "&"));
        }
    }
    out
}

fn html_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            html_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "html") {
            out.push(p);
        }
    }
}

#[test]
#[ignore = "needs chromium (Debian package): run by ci/test.sh"]
fn every_page_loads_without_console_errors_and_every_link_resolves() {
    let chrome = chromium();
    let work = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("publish");
    let _ = std::fs::remove_dir_all(&work);
    let reports = work.join("reports");
    make_reports(&reports);
    let site = work.join("site");
    let p = lockstep::publish::publish(&reports, &site).unwrap();
    assert_eq!((p.runs, p.benches), (1, 2));

    let mut pages = Vec::new();
    html_files(&site, &mut pages);
    pages.sort();
    assert!(pages.len() >= 3, "{pages:?}");
    let mut checked = BTreeSet::new();
    for page in &pages {
        let html = std::fs::read_to_string(page).unwrap();
        for l in links(&html) {
            assert!(
                !l.contains("://") && !l.starts_with('/'),
                "{}: link {l} is not relative",
                page.display()
            );
            let (file, anchor) = l.split_once('#').unwrap_or((&l, ""));
            let target = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            let target = target
                .canonicalize()
                .unwrap_or_else(|_| panic!("{}: link {l} resolves to nothing", page.display()));
            assert!(
                target.starts_with(site.canonicalize().unwrap()),
                "{}: {l} leaves the site",
                page.display()
            );
            if !anchor.is_empty() {
                let t = std::fs::read_to_string(&target).unwrap();
                assert!(
                    t.contains(&format!("id=\"{anchor}\"")),
                    "{}: anchor {l} is not on its page",
                    page.display()
                );
            }
            checked.insert(target);
        }
        // load it: any console message (there is no script) is an error
        let out = Command::new(&chrome)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--enable-logging=stderr",
                "--v=0",
                "--dump-dom",
            ])
            .arg(format!("file://{}", page.display()))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let console: Vec<&str> = stderr.lines().filter(|l| l.contains(":CONSOLE")).collect();
        assert!(out.status.success(), "{}: {stderr}", page.display());
        assert!(
            console.is_empty(),
            "{}: console: {console:?}",
            page.display()
        );
        let dom = String::from_utf8_lossy(&out.stdout);
        assert!(
            dom.contains("<h1>") && dom.contains("</html>"),
            "{}",
            page.display()
        );
    }
    // the run page's plots and the bench page's charts were among the links
    let svgs = checked
        .iter()
        .filter(|p| p.extension().is_some_and(|x| x == "svg"))
        .count();
    assert!(svgs >= 3, "only {svgs} SVG links");

    // the index, and a run page with its plots, as pictures to look at
    let run_page = pages
        .iter()
        .find(|p| p.parent().unwrap().parent().unwrap().ends_with("runs"))
        .unwrap();
    for (page, shot, size) in [
        (site.join("index.html"), work.join("index.png"), "1280,800"),
        (run_page.clone(), work.join("run.png"), "1280,4000"),
    ] {
        let st = Command::new(&chrome)
            .args(["--headless", "--no-sandbox", "--disable-gpu"])
            .arg(format!("--window-size={size}"))
            .arg(format!("--screenshot={}", shot.display()))
            .arg(format!("file://{}", page.display()))
            .output()
            .unwrap();
        assert!(st.status.success());
        let png = std::fs::read(&shot).unwrap();
        assert!(
            png.starts_with(b"\x89PNG") && png.len() > 5000,
            "{}",
            shot.display()
        );
        eprintln!("screenshot of {}: {}", page.display(), shot.display());
    }
}
