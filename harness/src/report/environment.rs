//! The machine and build a run happened on (recorded in every report).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use serde::{Deserialize, Serialize};

/// The machine and build a run happened on. Facts that cannot be read are `"unknown"`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Environment {
    /// CPU model name (`/proc/cpuinfo` `model name`), followed by `(features capped to avx2 by
    /// LOCKSTEP_CPU)` when that variable narrowed what the run saw ([`lockstep_engine::numerics::CpuCap`]).
    pub cpu_model: String,
    /// The SIMD-relevant CPU flags present ([`SIMD_FLAGS`], in that order) and let through by the cap.
    pub cpu_flags: Vec<String>,
    /// Engine worker threads.
    pub threads: usize,
    /// `git rev-parse HEAD` of the lockstep source tree.
    pub git_commit: String,
    /// Tracked files had uncommitted changes.
    pub git_dirty: bool,
    /// `rustc --version` of the toolchain on the PATH.
    pub rustc: String,
    /// OS, architecture and kernel release.
    pub os: String,
    /// The lockstep crate version.
    pub lockstep_version: String,
    /// sha256 of `golden/manifest.json`.
    pub golden_manifest_sha256: String,
}

/// CPU flags worth recording (SIMD paths a kernel may take), in report order. x86 names as in
/// `/proc/cpuinfo`; aarch64 names as in its `Features` line.
pub const SIMD_FLAGS: &[&str] = &[
    "sse3",
    "ssse3",
    "sse4_1",
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "bmi2",
    "avx512f",
    "avx512dq",
    "avx512cd",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512vbmi",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "asimd",
    "asimdhp",
    "asimddp",
    "i8mm",
    "bf16",
    "sve",
    "sve2",
];

pub(crate) const UNKNOWN: &str = "unknown";

pub(crate) fn run_text(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The directory git is asked about: the lockstep source tree if it still exists, else the current
/// directory.
pub(crate) fn source_dir() -> String {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    if Path::new(dir).is_dir() {
        dir.to_string()
    } else {
        ".".to_string()
    }
}

pub(crate) fn git(args: &[&str]) -> Option<String> {
    let dir = source_dir();
    let mut all = vec!["-C", dir.as_str()];
    all.extend_from_slice(args);
    run_text("git", &all).filter(|s| !s.is_empty() || args.contains(&"--porcelain"))
}

impl Environment {
    /// Read the facts of this machine and build. Best effort: a fact that cannot be read is
    /// `"unknown"` (or empty / false), never an error.
    pub fn detect(threads: usize, golden_manifest: &Path) -> Environment {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |name: &str| {
            cpuinfo.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == name).then(|| v.trim().to_string())
            })
        };
        let cap = lockstep_engine::numerics::CpuCap::current();
        let mut cpu_model = field("model name")
            .or_else(|| field("Hardware"))
            .or_else(|| field("cpu model"))
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| UNKNOWN.to_string());
        if cap != lockstep_engine::numerics::CpuCap::Native {
            // the run saw the CPU through LOCKSTEP_CPU: say so beside the model, and record only the
            // flags it let through
            cpu_model.push_str(&format!(
                " (features capped to {} by {})",
                cap.name(),
                lockstep_engine::numerics::CPU_CAP_ENV
            ));
        }
        let flags_line = field("flags")
            .or_else(|| field("Features"))
            .unwrap_or_default();
        let present: BTreeSet<&str> = flags_line.split_whitespace().collect();
        let cpu_flags = SIMD_FLAGS
            .iter()
            .filter(|f| present.contains(*f) && cap.allows(f))
            .map(|f| f.to_string())
            .collect();
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok();
        let os = match kernel {
            Some(k) => format!(
                "{} {} {}",
                std::env::consts::OS,
                std::env::consts::ARCH,
                k.trim()
            ),
            None => format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
        };
        let git_commit = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| UNKNOWN.to_string());
        let git_dirty =
            git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
        Environment {
            cpu_model,
            cpu_flags,
            threads,
            git_commit,
            git_dirty,
            rustc: run_text("rustc", &["--version"]).unwrap_or_else(|| UNKNOWN.to_string()),
            os,
            lockstep_version: env!("CARGO_PKG_VERSION").to_string(),
            golden_manifest_sha256: crate::hash::sha256_file(golden_manifest)
                .unwrap_or_else(|_| UNKNOWN.to_string()),
        }
    }
}
