//! Samples as child processes: every sample of every engine is one process, bounded in output and time
//! and killed with its process group; ours is `lockstep bench-sample`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use lockstep_engine::{NumericsMode, Simd};

use super::{EngineSettings, Test};

/// What one sample of one engine gives: its nanoseconds, llama-bench's record when it is llama.cpp, and
/// the sample process's peak RSS in bytes ([`crate::process::Output::peak_rss_bytes`], its `VmHWM`).
pub(crate) struct SampleOut {
    /// Nanoseconds of the timed part.
    pub(crate) ns: u64,
    /// llama-bench's JSON record (llama.cpp only).
    pub(crate) record: Option<serde_json::Value>,
    /// Peak resident set of the sample's process, bytes (`None` where the platform gives none).
    pub(crate) peak_rss_bytes: Option<u64>,
}

/// Runs one sample of one engine.
pub(crate) type SampleFn = Box<dyn Fn(&Path, Test) -> Result<SampleOut>>;

/// One engine of the bench: its settings as the report records them, and how to take one sample.
pub(crate) struct Sampler {
    /// The engine and its settings.
    pub(crate) settings: EngineSettings,
    /// Takes one sample.
    pub(crate) run: SampleFn,
}

/// Where a bench's children keep their output, and how long one sample may take.
#[derive(Clone)]
pub(crate) struct ChildSetup {
    /// Directory for the children's captured output.
    pub(crate) scratch: PathBuf,
    /// Time one sample's process may take before its group is killed.
    pub(crate) timeout: std::time::Duration,
}

/// Run one sample's child process through [`crate::process::run_bounded`] (its own process group,
/// killed on timeout and on an interrupt); a non-zero exit is an error carrying its stderr. Returns its
/// stdout and its peak RSS in bytes.
pub(crate) fn run_child(
    cmd: Command,
    setup: &ChildSetup,
    what: &str,
    shown: &Path,
) -> Result<(Vec<u8>, Option<u64>)> {
    let out = crate::process::run_bounded(cmd, setup.timeout, &setup.scratch, what)?;
    if !out.status.success() {
        bail!(
            "{} failed ({}): {}",
            shown.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok((out.stdout, out.peak_rss_bytes))
}

/// Parse what `lockstep bench-sample` printed: one positive count of nanoseconds.
///
/// Errors (naming `bin`): anything but a decimal integer, or 0 (a sample of no time would be infinite
/// tokens/s).
pub fn parse_sample_ns(stdout: &[u8], bin: &str) -> Result<u64> {
    let text = String::from_utf8_lossy(stdout);
    let ns: u64 = text.trim().parse().with_context(|| {
        format!(
            "{bin} bench-sample printed {:?}, not nanoseconds",
            text.trim().chars().take(200).collect::<String>()
        )
    })?;
    if ns == 0 {
        bail!(
            "{bin} bench-sample printed a sample of 0 ns (no time cannot be turned into tokens/s)"
        );
    }
    Ok(ns)
}

pub(crate) fn lockstep_sampler(
    engine: &str,
    bin: &Path,
    mode: NumericsMode,
    simd: Simd,
    threads: usize,
    setup: &ChildSetup,
) -> Sampler {
    let b = bin.to_path_buf();
    let setup = setup.clone();
    let what = format!("{engine}-bench-sample");
    Sampler {
        settings: EngineSettings {
            engine: engine.into(),
            mode: Some(mode.to_string()),
            simd: Some(simd.to_string()),
            binary: bin.display().to_string(),
        },
        run: Box::new(move |model: &Path, t: Test| {
            let mut cmd = Command::new(&b);
            cmd.arg("--threads")
                .arg(threads.to_string())
                .arg("bench-sample")
                .arg("--model")
                .arg(model)
                .args(["--mode", mode.name(), "--simd", simd.name()])
                .args(["-p", &t.n_prompt.to_string(), "-n", &t.n_gen.to_string()])
                .args(["-d", &t.n_depth.to_string()]);
            let (stdout, peak_rss_bytes) = run_child(cmd, &setup, &what, &b)?;
            Ok(SampleOut {
                ns: parse_sample_ns(&stdout, &b.display().to_string())?,
                record: None,
                peak_rss_bytes,
            })
        }),
    }
}
