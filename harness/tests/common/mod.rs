//! Test engines shared by the integration tests (`mod common;`).

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use anyhow::Result;
use lockstep::engine::{Engine, EngineInfo, LockstepEngine};
use lockstep_engine::hooks::StageSink;
use lockstep_engine::GgmlTarget;
use lockstep_engine::{NumericsMode, Stage};
use ndarray::Array2;

/// Our engine, with a sink wrapper that corrupts one stage.
pub struct Corrupting {
    /// The engine.
    pub inner: LockstepEngine,
    /// The stage whose middle element is overwritten.
    pub target: Stage,
    /// What it is overwritten with.
    pub value: f32,
}

struct CorruptSink<'a> {
    inner: &'a mut dyn StageSink,
    target: Stage,
    value: f32,
}

impl StageSink for CorruptSink<'_> {
    fn on_stage(
        &mut self,
        stage: Stage,
        positions: std::ops::Range<usize>,
        width: usize,
        data: &mut [f32],
    ) {
        if stage == self.target {
            data[width / 2] = self.value;
        }
        if self.inner.wants(stage) {
            self.inner.on_stage(stage, positions, width, data);
        }
    }
}

impl Engine for Corrupting {
    fn info(&self) -> EngineInfo {
        self.inner.info()
    }
    fn tokenize(&mut self, text: &str, a: bool, p: bool) -> Result<Vec<u32>> {
        self.inner.tokenize(text, a, p)
    }
    fn stages(&self) -> Vec<(String, usize)> {
        self.inner.stages()
    }
    fn replaces_stages(&self) -> bool {
        // the corrupting sink passes every stage on: what bisect injects reaches the inner engine
        self.inner.replaces_stages()
    }
    fn reset(&mut self, mode: NumericsMode, target: GgmlTarget, n_ctx: usize) -> Result<()> {
        self.inner.reset(mode, target, n_ctx)
    }
    fn forward(&mut self, tokens: &[u32], sink: &mut dyn StageSink) -> Result<Array2<f32>> {
        let mut s = CorruptSink {
            inner: sink,
            target: self.target,
            value: self.value,
        };
        self.inner.forward(tokens, &mut s)
    }
}

/// The repository root (the checkout this test was built from).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Wait up to `secs` for a [`hanging_script`]'s `pids` file to appear, i.e. for the engine to start.
pub fn wait_for_start(pids: &Path, secs: u64) {
    let t0 = std::time::Instant::now();
    while !pids.exists() && t0.elapsed() < std::time::Duration::from_secs(secs) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(pids.exists(), "the external engine never started");
}

/// A hanging "external engine" in `dir`: a shell script that starts a helper (`sleep 300 &`), appends
/// its own pid and the helper's to `dir/pids`, and waits. Returns (script, pids file).
pub fn hanging_script(dir: &Path) -> (PathBuf, PathBuf) {
    let pids = dir.join("pids");
    let script = dir.join("hang.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nsleep 300 &\necho $$ $! >> {}\nwait\n",
            pids.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    (script, pids)
}

/// Every pid a [`hanging_script`] recorded that is still running (a zombie awaiting its reaper is not).
pub fn still_running(pids: &Path) -> Vec<i32> {
    std::fs::read_to_string(pids)
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse::<i32>().unwrap())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
                !st.rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with(['Z', 'X']))
            })
        })
        .collect()
}

/// The end of a Ctrl-C test: `lockstep run` (its output `out`) was interrupted while its second cell (a
/// ggml one) hung in an engine whose processes `pids` lists. The run exits 130 saying where it saved, no
/// engine process outlives it, and `reports` holds one report with the finished reference cell, marked
/// incomplete at the ggml cell. Returns that report.
#[allow(dead_code)] // not every test binary that includes `common` interrupts a run
pub fn assert_saved_before_the_interrupt(
    out: &std::process::Output,
    pids: &Path,
    reports: &Path,
) -> lockstep::report::Report {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("saved in"), "{stderr}");
    std::thread::sleep(std::time::Duration::from_millis(200));
    let left = still_running(pids);
    assert!(left.is_empty(), "processes {left:?} outlived Ctrl-C");
    let dirs: Vec<PathBuf> = std::fs::read_dir(reports)
        .unwrap()
        .map(|d| d.unwrap().path())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let r = lockstep::report::read_report(&dirs[0]).unwrap();
    assert_eq!(r.cells.len(), 1, "the cell finished before Ctrl-C is saved");
    assert_eq!(r.cells[0].cell.mode, NumericsMode::Reference);
    let inc = r.incomplete.as_ref().expect("marked incomplete");
    assert!(
        inc.failed_cell.contains("/ggml/") && inc.error.contains("interrupted"),
        "{inc:?}"
    );
    r
}

/// The Python interpreter for the numpy-only session engines (oracles/lockstep_session): `$LOCKSTEP_PYTHON`,
/// else `python3`; panics, saying what to set, when it cannot import numpy (ci/test.sh makes numpy importable).
#[allow(dead_code)] // not every test binary that includes `common` runs Python
pub fn python_with_numpy() -> String {
    let py = std::env::var("LOCKSTEP_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = std::process::Command::new(&py)
        .args(["-c", "import numpy"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "`{py} -c 'import numpy'` fails: set LOCKSTEP_PYTHON to a Python 3 with numpy (ci/test.sh installs \
         numpy for python3 under the cache)"
    );
    py
}
