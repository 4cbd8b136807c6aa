//! Run reports: `reports/<run id>/{report.json, report.md, results.csv}`.
//!
//! Data first, tables second: `report.json` holds everything (environment, metric definitions, every
//! cell's full comparison and verdict) under a versioned schema ([`REPORT_SCHEMA_VERSION`]);
//! `results.csv` is the same numbers in long form, one row per cell × stage × phase × metric;
//! `report.md` is rendered from the same [`Report`] for people.
//!
//! # Non-finite numbers in report.json
//!
//! JSON has no infinities (NMSE is +∞ where a reference row is all zeros). Every `f64`/`f32` that is not
//! finite is written as the JSON **string** `"inf"`, `"-inf"` or `"nan"`, and read back as that number
//! by [`read_report`] / [`from_json`]. Plain `serde_json::to_string` on a [`Report`] would instead write
//! `null`, which does not read back: use [`to_json_pretty`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::compare::{CellComparison, CompareOptions, Phase, StageComparison};
use crate::gate::{cell_metrics, is_out_stage, Verdict};
use crate::matrix::Cell;

/// The `report.json` schema this module writes and reads.
pub const REPORT_SCHEMA_VERSION: u32 = 1;

/// File names inside a report directory.
pub const REPORT_JSON: &str = "report.json";
/// The Markdown rendering.
pub const REPORT_MD: &str = "report.md";
/// The long-form CSV.
pub const RESULTS_CSV: &str = "results.csv";

/// Everything one `lockstep run` measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Must equal [`REPORT_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Run id, also the report directory's name ([`new_run_id`]).
    pub run_id: String,
    /// When the run started, seconds since the Unix epoch (UTC).
    pub created_unix: u64,
    /// The machine and build.
    pub environment: Environment,
    /// Metric name → definition ([`metric_definitions`]).
    pub metric_definitions: BTreeMap<String, String>,
    /// Options every comparison ran with.
    pub compare_options: CompareOptions,
    /// The thresholds file the verdicts come from.
    pub thresholds_file: Option<String>,
    /// What the run was given: the engine actually run, and the golden directory, matrix and thresholds
    /// files with their sha256 (absent in reports of older lockstep versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<RunInputs>,
    /// Set when the run stopped early: the cells before the failure are kept, and this says which cell
    /// failed and why. A report with this set never passes a gate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<Incomplete>,
    /// One entry per matrix cell, in matrix order.
    pub cells: Vec<CellReport>,
}

/// A file a run read, by path and content.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRef {
    /// The path as given (or defaulted).
    pub path: String,
    /// sha256 of its bytes, lowercase hex.
    pub sha256: String,
}

/// The inputs of a run (provenance).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunInputs {
    /// `lockstep` (in process) or `external`.
    pub engine: String,
    /// For an external engine: the forward command template, as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_cmd: Option<String>,
    /// For an external engine: the tokenize command template, as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_tokenize_cmd: Option<String>,
    /// For an external engine: seconds one call may take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_timeout_s: Option<f64>,
    /// The golden directory.
    pub golden_dir: String,
    /// Its `manifest.json`.
    pub golden_manifest: FileRef,
    /// The matrix file.
    pub matrix: FileRef,
    /// The thresholds file.
    pub thresholds: FileRef,
}

/// Why a run stopped before its last cell.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Incomplete {
    /// The cell that failed.
    pub failed_cell: String,
    /// The error, with its causes.
    pub error: String,
    /// Cells of the matrix not run.
    pub cells_not_run: usize,
}

/// The machine and build a run happened on. Facts that cannot be read are `"unknown"`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Environment {
    /// CPU model name (`/proc/cpuinfo` `model name`).
    pub cpu_model: String,
    /// The SIMD-relevant CPU flags present ([`SIMD_FLAGS`], in that order).
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

const UNKNOWN: &str = "unknown";

fn run_text(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The directory git is asked about: the lockstep source tree if it still exists, else the current
/// directory.
fn source_dir() -> String {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    if Path::new(dir).is_dir() {
        dir.to_string()
    } else {
        ".".to_string()
    }
}

fn git(args: &[&str]) -> Option<String> {
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
        let cpu_model = field("model name")
            .or_else(|| field("Hardware"))
            .or_else(|| field("cpu model"))
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| UNKNOWN.to_string());
        let flags_line = field("flags")
            .or_else(|| field("Features"))
            .unwrap_or_default();
        let present: BTreeSet<&str> = flags_line.split_whitespace().collect();
        let cpu_flags = SIMD_FLAGS
            .iter()
            .filter(|f| present.contains(*f))
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
            golden_manifest_sha256: crate::golden::sha256_file(golden_manifest)
                .unwrap_or_else(|_| UNKNOWN.to_string()),
        }
    }
}

/// Wall-clock speed of one cell's engine run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Speed {
    /// Prompt tokens processed in the prefill.
    pub prefill_tokens: usize,
    /// Seconds the prefill took.
    pub prefill_seconds: f64,
    /// Decode steps run.
    pub decode_tokens: usize,
    /// Seconds all decode steps took together.
    pub decode_seconds: f64,
}

impl Speed {
    /// Prefill tokens per second; NaN when no time was measured.
    pub fn prefill_tok_s(&self) -> f64 {
        rate(self.prefill_tokens, self.prefill_seconds)
    }

    /// Decode tokens per second; NaN when no time was measured.
    pub fn decode_tok_s(&self) -> f64 {
        rate(self.decode_tokens, self.decode_seconds)
    }
}

fn rate(tokens: usize, seconds: f64) -> f64 {
    if seconds > 0.0 && seconds.is_finite() {
        tokens as f64 / seconds
    } else {
        f64::NAN
    }
}

/// One cell's result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CellReport {
    /// The matrix cell.
    pub cell: Cell,
    /// sha256 of the model file run.
    pub model_sha256: String,
    /// The golden, relative to the golden directory ([`crate::matrix::golden_path_for`]).
    pub golden_path: String,
    /// sha256 of the golden file.
    pub golden_sha256: String,
    /// Ggml mode: the ggml-cpu build mirrored (`avx2`, `avx512`), from the golden's recorded host CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ggml_target: Option<String>,
    /// The full comparison.
    pub comparison: CellComparison,
    /// Engine speed.
    pub speed: Speed,
    /// The gate's verdict.
    pub verdict: Verdict,
}

/// Definitions of every metric a report shows (the text of `metrics.rs`'s module doc, plus the gate's
/// cell-level aggregates). Keys are metric names.
pub fn metric_definitions() -> BTreeMap<String, String> {
    const DEFS: &[(&str, &str)] = &[
        ("conventions", "a = the engine's row, b = the reference's (golden) row; sums in f64; per stage and position, then aggregated over positions as count, mean, min, max, p50/p90/p99 (nearest rank)"),
        ("cosine", "a·b / (‖a‖‖b‖); 1 when both rows are all zeros, 0 when exactly one is"),
        ("max_abs", "maxᵢ |aᵢ − bᵢ|"),
        ("mean_abs", "meanᵢ |aᵢ − bᵢ|"),
        ("rmse", "√(meanᵢ (aᵢ − bᵢ)²)"),
        ("nmse", "Σ(aᵢ − bᵢ)² / Σbᵢ² (llama.cpp test-backend-ops, b = reference); 0 when both are zero, +∞ when only the reference is"),
        ("bit_exact", "every aᵢ == bᵢ"),
        ("kl", "KL(P_ref ‖ P_eng) = Σ P (log P − log Q), nats, P = softmax(reference logits), Q = softmax(engine logits); positions with a full reference row only"),
        ("top1", "argmax agreement of reference and engine logits"),
        ("margin", "reference top-1 logit − reference logit of the engine's top-1 (≥ 0); a disagreement with margin below the tolerance is a near tie, counted apart and not as a failure"),
        ("top5", "top-k overlap |topk(ref) ∩ topk(eng)| / k, k = 5 (top10: k = 10)"),
        ("entropy", "H = −Σ p log p of each side, nats (a flattened distribution is a bug signal that cosine hides)"),
        ("dp_top", "P(t*) − Q(t*) for the reference's top token t*"),
        ("top1_agreement", "(positions whose top-1 agree + near ties) / positions, prefill and decode logits together"),
        ("mean_kl", "mean KL over every position with a full reference row, prefill and decode"),
        ("min_cosine_out", "smallest cosine at any position, prefill and decode, of every blk.N.out and output_norm"),
        ("first_divergent", "the first stage in forward order (prefill, then decode) whose cosine falls below the stage threshold, with the first position where it does"),
        ("position", "sequence position: prompt position in the prefill, T + step for decode step `step` (T = prompt tokens)"),
        ("tok_s", "tokens per second of wall-clock time: prefill = prompt tokens / prefill time, decode = steps / total decode time"),
    ];
    DEFS.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

// ---------------------------------------------------------------------------------------------------
// Number formatting.

fn non_finite(v: f64) -> Option<&'static str> {
    if v.is_nan() {
        Some("nan")
    } else if v == f64::INFINITY {
        Some("inf")
    } else if v == f64::NEG_INFINITY {
        Some("-inf")
    } else {
        None
    }
}

/// `v` with `decimals` decimals, trailing zeros (and a trailing point) trimmed: `0.9999`,
/// `0.99912346`, `1`. Non-finite values as `inf`, `-inf`, `nan`.
pub fn fmt_fixed(v: f64, decimals: usize) -> String {
    if let Some(s) = non_finite(v) {
        return s.to_string();
    }
    let s = format!("{v:.decimals$}");
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    if s == "-0" {
        "0".to_string()
    } else {
        s
    }
}

/// `v` in scientific notation with `digits` mantissa decimals, trailing zeros trimmed: `1.234e-5`,
/// `1e-3`, `0`. Non-finite values as `inf`, `-inf`, `nan`.
pub fn fmt_sci(v: f64, digits: usize) -> String {
    if let Some(s) = non_finite(v) {
        return s.to_string();
    }
    if v == 0.0 {
        return "0".to_string();
    }
    let s = format!("{v:.digits$e}");
    match s.split_once('e') {
        Some((m, e)) if m.contains('.') => {
            format!("{}e{e}", m.trim_end_matches('0').trim_end_matches('.'))
        }
        _ => s,
    }
}

/// NMSE, KL and margins for tables: 3 mantissa decimals, not trimmed (`1.960e-3`); `0` for zero;
/// non-finite values as `inf`, `-inf`, `nan`.
pub fn fmt_e3(v: f64) -> String {
    match non_finite(v) {
        Some(s) => s.to_string(),
        None if v == 0.0 => "0".to_string(),
        None => format!("{v:.3e}"),
    }
}

/// A cosine for tables: 8 decimals, not trimmed (columns line up): `0.99998765`.
pub fn fmt_cos(v: f64) -> String {
    match non_finite(v) {
        Some(s) => s.to_string(),
        None => format!("{v:.8}"),
    }
}

/// How a CSV value is written: shortest representation that reads back exactly.
#[derive(Clone, Copy)]
enum Num {
    /// Plain decimal (cosines, fractions, seconds, rates).
    Fixed(f64),
    /// Scientific (NMSE, KL, RMSE, abs errors, entropies).
    Sci(f64),
    /// An integer (counts, flags, positions).
    Int(u64),
}

impl Num {
    fn csv(self) -> String {
        match self {
            Num::Fixed(v) => non_finite(v).map_or_else(|| format!("{v}"), str::to_string),
            Num::Sci(0.0) => "0".to_string(),
            Num::Sci(v) => non_finite(v).map_or_else(|| format!("{v:e}"), str::to_string),
            Num::Int(v) => v.to_string(),
        }
    }
}

fn opt_or_dash(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    match v {
        Some(x) if !x.is_nan() => f(x),
        _ => "—".to_string(),
    }
}

// ---------------------------------------------------------------------------------------------------
// Markdown.

/// `YYYY-MM-DD HH:MM:SS UTC` of a Unix time.
pub fn fmt_utc(unix: u64) -> String {
    let (y, mo, d, h, mi, s) = civil(unix);
    format!("{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02} UTC")
}

/// (year, month, day, hour, minute, second) of a Unix time, UTC (proleptic Gregorian calendar).
fn civil(unix: u64) -> (i64, u32, u32, u32, u32, u32) {
    let days = (unix / 86_400) as i64;
    let secs = unix % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        y,
        m,
        d,
        (secs / 3600) as u32,
        (secs % 3600 / 60) as u32,
        (secs % 60) as u32,
    )
}

fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

fn md_escape(s: &str) -> String {
    s.replace('|', "\\|")
}

/// The layer sets of a grouped stage pattern, compacted: `0..29`, `0..3,5,7..9`.
fn compact_ranges(layers: &BTreeSet<usize>) -> String {
    let mut parts = Vec::new();
    let mut it = layers.iter().copied().peekable();
    while let Some(start) = it.next() {
        let mut end = start;
        while it.peek() == Some(&(end + 1)) {
            end = it.next().unwrap_or(end);
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}..{end}")
        });
    }
    parts.join(",")
}

/// `blk.N.rest` → (`blk.{N}.rest`, Some(N)); other ids unchanged.
fn stage_pattern(stage: &str) -> (String, Option<usize>) {
    match crate::compare::layer_of(stage) {
        Some(n) => {
            let rest = &stage["blk.".len() + n.to_string().len()..];
            (format!("blk.{{N}}{rest}"), Some(n))
        }
        None => (stage.to_string(), None),
    }
}

fn phase_list(phases: &BTreeSet<Phase>) -> String {
    phases
        .iter()
        .map(Phase::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn seq_position(cmp: &CellComparison, s: &StageComparison, row: usize) -> usize {
    match s.phase {
        Phase::Prefill => row,
        Phase::Decode => cmp.golden_tokens.len() + row,
    }
}

/// Top-1 counts of a cell as its comparison partitioned them — with the margin tolerance the cell was
/// compared with (its thresholds' `margin_tolerance`): (exact agreements, near ties, positions).
fn top1_counts(cmp: &CellComparison) -> (usize, usize, usize) {
    cmp.logits.iter().fold((0, 0, 0), |(a, t, n), lc| {
        (
            a + lc.top1_agree,
            t + lc.near_ties.len(),
            n + lc.n_positions,
        )
    })
}

/// Render the report as Markdown: title and environment, metric definitions, one summary row per cell,
/// failure lines, first divergent stages, the 10 worst stages, error vs depth per cell, near ties, stages
/// not compared, and the model and golden hashes.
pub fn render_markdown(r: &Report) -> String {
    let mut md = String::new();
    let env = &r.environment;
    let n_fail = r.cells.iter().filter(|c| !c.verdict.pass).count();
    let _ = writeln!(md, "# lockstep report `{}`\n", r.run_id);
    let flags = if env.cpu_flags.is_empty() {
        "no SIMD flags".to_string()
    } else {
        env.cpu_flags.join(" ")
    };
    let dirty = if env.git_dirty { " (dirty)" } else { "" };
    let _ = writeln!(
        md,
        "{} · CPU {} ({flags}) · {} threads · lockstep {} at {}{dirty} · {} · {} · golden manifest sha256 `{}` · thresholds {}\n",
        fmt_utc(r.created_unix),
        env.cpu_model,
        env.threads,
        env.lockstep_version,
        short(&env.git_commit),
        env.rustc,
        env.os,
        short(&env.golden_manifest_sha256),
        r.thresholds_file.as_deref().map_or("(none)".to_string(), |t| format!("`{t}`")),
    );
    if let Some(i) = &r.inputs {
        let engine = match (&i.engine_cmd, &i.engine_tokenize_cmd) {
            (Some(f), Some(t)) => format!("external: `{f}` / tokenize `{t}`"),
            _ => i.engine.clone(),
        };
        let _ = writeln!(
            md,
            "Engine {engine} · goldens `{}` (manifest sha256 `{}`) · matrix `{}` (`{}`) · thresholds `{}` (`{}`)\n",
            i.golden_dir,
            short(&i.golden_manifest.sha256),
            i.matrix.path,
            short(&i.matrix.sha256),
            i.thresholds.path,
            short(&i.thresholds.sha256),
        );
    }
    if let Some(inc) = &r.incomplete {
        let _ = writeln!(
            md,
            "**INCOMPLETE**: the run stopped at cell `{}` ({} cells not run): {}\n",
            inc.failed_cell, inc.cells_not_run, inc.error
        );
    }
    let _ = writeln!(
        md,
        "**{}**: {} of {} cells pass.\n",
        if n_fail == 0 && r.incomplete.is_none() {
            "PASS"
        } else {
            "FAIL"
        },
        r.cells.len() - n_fail,
        r.cells.len()
    );

    // Metric definitions.
    let _ = writeln!(md, "## Metrics\n");
    // Conventions first, then the metrics alphabetically.
    let defs = &r.metric_definitions;
    for (k, v) in defs
        .iter()
        .filter(|(k, _)| *k == "conventions")
        .chain(defs.iter().filter(|(k, _)| *k != "conventions"))
    {
        let _ = writeln!(md, "- **{k}**: {v}");
    }
    md.push('\n');

    // Summary: one row per cell.
    let _ = writeln!(md, "## Cells\n");
    let _ = writeln!(
        md,
        "| model | prompt | quant | mode | simd | oracle | engine | tokens | top-1 | mean KL | max KL | top-5 mean | min cos out | prefill tok/s | decode tok/s | verdict |"
    );
    let _ = writeln!(
        md,
        "|---|---|---|---|---|---|---|---|--:|--:|--:|--:|--:|--:|--:|---|"
    );
    for c in &r.cells {
        let m = cell_metrics(&c.comparison, r.compare_options.margin_tolerance);
        let (agree, n_ties, positions) = top1_counts(&c.comparison);
        let ties = match n_ties {
            0 => String::new(),
            1 => " (+1 near tie)".to_string(),
            n => format!(" (+{n} near ties)"),
        };
        let cell = &c.cell;
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {}/{}{ties} | {} | {} | {} | {} | {} | {} | {} |",
            cell.model,
            cell.prompt,
            cell.quant,
            cell.mode,
            cell.simd,
            cell.oracle,
            cell.engine,
            if m.tokens_match { "match" } else { "**differ**" },
            agree,
            positions,
            opt_or_dash(m.mean_kl, fmt_e3),
            opt_or_dash(m.max_kl.map(|x| x.0), fmt_e3),
            opt_or_dash(m.top5_mean, |v| format!("{v:.4}")),
            opt_or_dash(m.min_cosine_out.as_ref().map(|o| o.cosine), fmt_cos),
            opt_or_dash(Some(c.speed.prefill_tok_s()), |v| format!("{v:.1}")),
            opt_or_dash(Some(c.speed.decode_tok_s()), |v| format!("{v:.1}")),
            if c.verdict.pass { "PASS" } else { "**FAIL**" },
        );
    }
    md.push('\n');

    // Failures.
    let lines = crate::gate::failure_lines(r);
    if !lines.is_empty() {
        let _ = writeln!(md, "## Failures\n");
        for l in &lines {
            let _ = writeln!(md, "- {l}");
        }
        md.push('\n');
    }

    // First divergent stage per cell.
    let _ = writeln!(md, "## First divergent stage\n");
    let _ = writeln!(md, "| cell | stage | phase | position | cosine | NMSE |");
    let _ = writeln!(md, "|---|---|---|--:|--:|--:|");
    for c in &r.cells {
        match &c.verdict.first_divergent {
            Some(d) => {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} |",
                    c.cell.id(),
                    d.stage,
                    d.phase,
                    d.position,
                    fmt_cos(d.cosine),
                    fmt_e3(d.nmse)
                );
            }
            None => {
                let _ = writeln!(md, "| {} | none | | | | |", c.cell.id());
            }
        }
    }
    md.push('\n');

    // Worst stages across cells.
    let mut all: Vec<(&CellReport, &StageComparison)> = r
        .cells
        .iter()
        .flat_map(|c| c.comparison.stages.iter().map(move |s| (c, s)))
        .collect();
    all.sort_by(|a, b| {
        a.1.cosine
            .min
            .total_cmp(&b.1.cosine.min)
            .then(b.1.nmse.p50.total_cmp(&a.1.nmse.p50))
    });
    let _ = writeln!(md, "## Worst stages (lowest min cosine, all cells)\n");
    if all.is_empty() {
        let _ = writeln!(md, "No stage was compared.\n");
    } else {
        let _ = writeln!(
            md,
            "| # | cell | stage | phase | min cosine | at position | NMSE p50 | NMSE max |"
        );
        let _ = writeln!(md, "|--:|---|---|---|--:|--:|--:|--:|");
        for (i, (c, s)) in all.iter().take(10).enumerate() {
            let row = crate::gate::lowest_index(&s.cosine_by_position).unwrap_or(s.worst_position);
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                i + 1,
                c.cell.id(),
                s.stage,
                s.phase,
                fmt_cos(s.cosine.min),
                seq_position(&c.comparison, s, row),
                fmt_e3(s.nmse.p50),
                fmt_e3(s.nmse.max)
            );
        }
        md.push('\n');
    }

    // Error vs depth.
    let _ = writeln!(md, "## Error vs depth (blk.N.out, output_norm)\n");
    for c in &r.cells {
        let _ = writeln!(md, "### {}\n", c.cell.id());
        // layer key: Some(N) for blk.N.out, None for output_norm (sorted last).
        let mut rows: BTreeMap<(bool, usize), [Option<&StageComparison>; 2]> = BTreeMap::new();
        for s in c
            .comparison
            .stages
            .iter()
            .filter(|s| is_out_stage(&s.stage))
        {
            let key = match crate::compare::layer_of(&s.stage) {
                Some(n) => (false, n),
                None => (true, 0),
            };
            rows.entry(key).or_default()[usize::from(s.phase == Phase::Decode)] = Some(s);
        }
        if rows.is_empty() {
            let _ = writeln!(md, "No blk.N.out or output_norm stage was compared.\n");
            continue;
        }
        let _ = writeln!(
            md,
            "| layer | min cos prefill | min cos decode | NMSE mean prefill | NMSE mean decode |"
        );
        let _ = writeln!(md, "|---|--:|--:|--:|--:|");
        for ((is_norm, n), [p, d]) in &rows {
            let label = if *is_norm {
                "output_norm".to_string()
            } else {
                n.to_string()
            };
            let cos = |s: &Option<&StageComparison>| {
                s.map_or("—".to_string(), |s| fmt_cos(s.cosine.min))
            };
            let nmse =
                |s: &Option<&StageComparison>| s.map_or("—".to_string(), |s| fmt_e3(s.nmse.mean));
            let _ = writeln!(
                md,
                "| {label} | {} | {} | {} | {} |",
                cos(p),
                cos(d),
                nmse(p),
                nmse(d)
            );
        }
        md.push('\n');
    }

    // Near ties.
    let _ = writeln!(
        md,
        "## Near ties (top-1 disagreements with a reference margin below the cell's tolerance)\n"
    );
    let mut any_tie = false;
    for c in &r.cells {
        let ties = c
            .comparison
            .logits
            .iter()
            .flat_map(|lc| lc.near_ties.iter().map(move |p| (lc.phase, p)));
        for (phase, t) in ties {
            if !any_tie {
                let _ = writeln!(
                    md,
                    "| cell | phase | position | ref top | engine top | margin | ref top-2 gap |"
                );
                let _ = writeln!(md, "|---|---|--:|--:|--:|--:|--:|");
                any_tie = true;
            }
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} |",
                c.cell.id(),
                phase,
                t.position,
                t.ref_top,
                t.eng_top,
                fmt_e3(t.margin),
                fmt_e3(t.ref_gap)
            );
        }
    }
    if !any_tie {
        let _ = writeln!(md, "None.");
    }
    md.push('\n');

    // Not compared, grouped by reason.
    let _ = writeln!(md, "## Not compared\n");
    #[derive(Default)]
    struct Group {
        layers: BTreeSet<usize>,
        phases: BTreeSet<Phase>,
        cells: BTreeSet<usize>,
        count: usize,
    }
    let mut by_reason: BTreeMap<&str, BTreeMap<String, Group>> = BTreeMap::new();
    for (ci, c) in r.cells.iter().enumerate() {
        for nc in &c.comparison.not_compared {
            let (pattern, layer) = stage_pattern(&nc.stage);
            let g = by_reason
                .entry(nc.reason.as_str())
                .or_default()
                .entry(pattern)
                .or_default();
            g.layers.extend(layer);
            g.phases.insert(nc.phase);
            g.cells.insert(ci);
            g.count += 1;
        }
    }
    if by_reason.is_empty() {
        let _ = writeln!(md, "Every stage was compared.");
    }
    for (reason, groups) in &by_reason {
        let total: usize = groups.values().map(|g| g.count).sum();
        let cells: BTreeSet<usize> = groups
            .values()
            .flat_map(|g| g.cells.iter().copied())
            .collect();
        let items: Vec<String> = groups
            .iter()
            .map(|(pattern, g)| {
                let name = if g.layers.is_empty() {
                    pattern.clone()
                } else {
                    pattern.replace("{N}", &format!("{{{}}}", compact_ranges(&g.layers)))
                };
                let in_cells = if g.cells.len() == r.cells.len() {
                    String::new()
                } else {
                    format!(", {} cell(s)", g.cells.len())
                };
                format!("`{name}` ({}{in_cells})", phase_list(&g.phases))
            })
            .collect();
        let _ = writeln!(
            md,
            "- **{}** — {total} stage×phase in {} of {} cells: {}",
            md_escape(reason),
            cells.len(),
            r.cells.len(),
            items.join(", ")
        );
    }
    md.push('\n');

    // Inputs.
    let _ = writeln!(md, "## Inputs\n");
    let _ = writeln!(md, "| cell | model sha256 | golden | golden sha256 |");
    let _ = writeln!(md, "|---|---|---|---|");
    for c in &r.cells {
        let _ = writeln!(
            md,
            "| {} | `{}` | {} | `{}` |",
            c.cell.id(),
            short(&c.model_sha256),
            c.golden_path,
            short(&c.golden_sha256)
        );
    }
    md
}

// ---------------------------------------------------------------------------------------------------
// CSV.

/// The header of `results.csv`.
pub const CSV_HEADER: &str =
    "cell_id,model,prompt,quant,mode,simd,oracle,engine,phase,stage,layer,metric,value";

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Render `results.csv`: one row per cell × stage × phase × metric, plus logits rows (`stage` =
/// `logits`), cell-level gate aggregates (`stage` = `cell`), tokens (`stage` = `tokens`), speed
/// (`stage` = `speed`) and the verdict (`stage` = `verdict`). Values are the shortest text that reads
/// back to the same f64 (scientific for NMSE, KL, RMSE, absolute errors, entropies); non-finite values
/// are `inf`, `-inf`, `nan`. `layer` is empty for stages without a block index; positions are sequence
/// positions (decode step i = prompt length + i).
pub fn render_csv(r: &Report) -> String {
    let mut out = String::new();
    out.push_str(CSV_HEADER);
    out.push('\n');
    for c in &r.cells {
        let cell = &c.cell;
        let prefix: Vec<String> = [
            cell.id(),
            cell.model.clone(),
            cell.prompt.clone(),
            cell.quant.clone(),
            cell.mode.clone(),
            cell.simd.clone(),
            cell.oracle.clone(),
            cell.engine.clone(),
        ]
        .iter()
        .map(|s| csv_field(s))
        .collect();
        let prefix = prefix.join(",");
        let mut row = |phase: &str, stage: &str, layer: Option<usize>, metric: &str, v: Num| {
            let _ = writeln!(
                out,
                "{prefix},{phase},{},{},{metric},{}",
                csv_field(stage),
                layer.map_or(String::new(), |l| l.to_string()),
                v.csv()
            );
        };
        let cmp = &c.comparison;
        row(
            "prefill",
            "tokens",
            None,
            "match",
            Num::Int(u64::from(cmp.tokens_match())),
        );
        row(
            "prefill",
            "tokens",
            None,
            "golden_count",
            Num::Int(cmp.golden_tokens.len() as u64),
        );
        row(
            "prefill",
            "tokens",
            None,
            "engine_count",
            Num::Int(cmp.engine_tokens.len() as u64),
        );
        for s in &cmp.stages {
            let ph = s.phase.to_string();
            let row_for = |m: &str, v: Num| (m.to_string(), v);
            let worst =
                crate::gate::lowest_index(&s.cosine_by_position).unwrap_or(s.worst_position);
            for (m, v) in [
                row_for("cosine_min", Num::Fixed(s.cosine.min)),
                row_for("cosine_mean", Num::Fixed(s.cosine.mean)),
                row_for("cosine_p50", Num::Fixed(s.cosine.p50)),
                row_for("nmse_mean", Num::Sci(s.nmse.mean)),
                row_for("nmse_p50", Num::Sci(s.nmse.p50)),
                row_for("nmse_max", Num::Sci(s.nmse.max)),
                row_for("rmse_mean", Num::Sci(s.rmse.mean)),
                row_for("mean_abs_mean", Num::Sci(s.mean_abs.mean)),
                row_for("max_abs", Num::Sci(s.max_abs)),
                row_for("bit_exact", Num::Int(u64::from(s.bit_exact))),
                row_for("positions", Num::Int(s.cosine.count as u64)),
                row_for(
                    "worst_position",
                    Num::Int(seq_position(cmp, s, worst) as u64),
                ),
            ] {
                row(&ph, &s.stage, s.layer, &m, v);
            }
        }
        for lc in &cmp.logits {
            let ph = lc.phase.to_string();
            let mut rows = vec![
                ("positions", Num::Int(lc.n_positions as u64)),
                ("top1_agree", Num::Int(lc.top1_agree as u64)),
                ("near_ties", Num::Int(lc.near_ties.len() as u64)),
                ("mismatches", Num::Int(lc.mismatches.len() as u64)),
            ];
            if let Some(kl) = &lc.kl {
                rows.extend([
                    ("kl_mean", Num::Sci(kl.mean)),
                    ("kl_p50", Num::Sci(kl.p50)),
                    ("kl_p90", Num::Sci(kl.p90)),
                    ("kl_max", Num::Sci(kl.max)),
                    ("kl_positions", Num::Int(kl.count as u64)),
                ]);
            }
            rows.extend([
                ("top5_mean", Num::Fixed(lc.top5.mean)),
                ("top5_min", Num::Fixed(lc.top5.min)),
                ("top10_mean", Num::Fixed(lc.top10.mean)),
            ]);
            if let Some(e) = &lc.entropy_ref {
                rows.push(("entropy_ref_mean", Num::Sci(e.mean)));
            }
            rows.push(("entropy_eng_mean", Num::Sci(lc.entropy_eng.mean)));
            if let Some(d) = &lc.dp_top {
                rows.extend([
                    ("dp_top_mean", Num::Sci(d.mean)),
                    ("dp_top_max", Num::Sci(d.max)),
                ]);
            }
            for (m, v) in rows {
                row(&ph, "logits", None, m, v);
            }
        }
        let m = cell_metrics(cmp, r.compare_options.margin_tolerance);
        let (agree, ties, positions) = top1_counts(cmp);
        let agreement = if positions == 0 {
            f64::NAN
        } else {
            (agree + ties) as f64 / positions as f64
        };
        row("", "cell", None, "top1_agreement", Num::Fixed(agreement));
        if let Some(kl) = m.mean_kl {
            row("", "cell", None, "mean_kl", Num::Sci(kl));
        }
        if let Some((kl, _, _)) = m.max_kl {
            row("", "cell", None, "max_kl", Num::Sci(kl));
        }
        if let Some(t5) = m.top5_mean {
            row("", "cell", None, "top5_mean", Num::Fixed(t5));
        }
        if let Some(o) = &m.min_cosine_out {
            row("", "cell", None, "min_cosine_out", Num::Fixed(o.cosine));
        }
        let sp = &c.speed;
        row(
            "prefill",
            "speed",
            None,
            "tokens",
            Num::Int(sp.prefill_tokens as u64),
        );
        row(
            "prefill",
            "speed",
            None,
            "seconds",
            Num::Fixed(sp.prefill_seconds),
        );
        row(
            "prefill",
            "speed",
            None,
            "tok_s",
            Num::Fixed(sp.prefill_tok_s()),
        );
        row(
            "decode",
            "speed",
            None,
            "tokens",
            Num::Int(sp.decode_tokens as u64),
        );
        row(
            "decode",
            "speed",
            None,
            "seconds",
            Num::Fixed(sp.decode_seconds),
        );
        row(
            "decode",
            "speed",
            None,
            "tok_s",
            Num::Fixed(sp.decode_tok_s()),
        );
        row(
            "",
            "verdict",
            None,
            "pass",
            Num::Int(u64::from(c.verdict.pass)),
        );
        row(
            "",
            "verdict",
            None,
            "failures",
            Num::Int(c.verdict.failures.len() as u64),
        );
    }
    out
}

// ---------------------------------------------------------------------------------------------------
// JSON with non-finite numbers.

/// Serialize to pretty JSON, writing non-finite floats as the strings `"inf"`, `"-inf"`, `"nan"`.
pub fn to_json_pretty<T: Serialize + ?Sized>(value: &T) -> Result<String> {
    let mut buf = Vec::new();
    let mut ser = serde_json::Serializer::pretty(&mut buf);
    value
        .serialize(json::Ser(&mut ser))
        .context("cannot serialize to JSON")?;
    buf.push(b'\n');
    String::from_utf8(buf).context("serialized JSON is not UTF-8")
}

/// Deserialize JSON written by [`to_json_pretty`]: a float field also accepts `"inf"`, `"-inf"`,
/// `"nan"`. Numbers are parsed exactly (serde_json's `float_roundtrip` feature, enabled in the
/// workspace), so every finite f64 reads back bit for bit.
pub fn from_json<T: DeserializeOwned>(text: &str) -> Result<T> {
    let value = parse_value(text).map_err(|e| anyhow::anyhow!("invalid JSON: {e}"))?;
    from_value(value)
}

/// Parse a JSON document (serde_json, exact floats, nesting limited by serde_json's recursion limit).
fn parse_value(text: &str) -> std::result::Result<serde_json::Value, serde_json::Error> {
    serde_json::from_str(text)
}

fn from_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T> {
    Ok(T::deserialize(json::De(value))?)
}

/// A serde adapter that maps non-finite floats to strings and back.
mod json {
    use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
    use serde::ser::{self, Serialize, Serializer};
    use serde_json::Value;

    use super::non_finite;

    fn parse_non_finite(s: &str) -> Option<f64> {
        match s {
            "inf" => Some(f64::INFINITY),
            "-inf" => Some(f64::NEG_INFINITY),
            "nan" => Some(f64::NAN),
            _ => None,
        }
    }

    /// Wraps a serializer; every nested value is serialized through the wrapper too.
    pub struct Ser<S>(pub S);

    struct Wrap<'a, T: ?Sized>(&'a T);

    impl<T: ?Sized + Serialize> Serialize for Wrap<'_, T> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            self.0.serialize(Ser(s))
        }
    }

    /// Wraps a compound serializer (seq, map, struct ...).
    pub struct Compound<C>(C);

    macro_rules! forward {
        ($($name:ident($t:ty)),* $(,)?) => {
            $(fn $name(self, v: $t) -> Result<S::Ok, S::Error> { self.0.$name(v) })*
        };
    }

    impl<S: Serializer> Serializer for Ser<S> {
        type Ok = S::Ok;
        type Error = S::Error;
        type SerializeSeq = Compound<S::SerializeSeq>;
        type SerializeTuple = Compound<S::SerializeTuple>;
        type SerializeTupleStruct = Compound<S::SerializeTupleStruct>;
        type SerializeTupleVariant = Compound<S::SerializeTupleVariant>;
        type SerializeMap = Compound<S::SerializeMap>;
        type SerializeStruct = Compound<S::SerializeStruct>;
        type SerializeStructVariant = Compound<S::SerializeStructVariant>;

        forward!(
            serialize_bool(bool),
            serialize_i8(i8),
            serialize_i16(i16),
            serialize_i32(i32),
            serialize_i64(i64),
            serialize_i128(i128),
            serialize_u8(u8),
            serialize_u16(u16),
            serialize_u32(u32),
            serialize_u64(u64),
            serialize_u128(u128),
            serialize_char(char),
            serialize_str(&str),
            serialize_bytes(&[u8]),
            serialize_unit_struct(&'static str),
        );

        fn serialize_f32(self, v: f32) -> Result<S::Ok, S::Error> {
            match non_finite(f64::from(v)) {
                Some(s) => self.0.serialize_str(s),
                None => self.0.serialize_f32(v),
            }
        }
        fn serialize_f64(self, v: f64) -> Result<S::Ok, S::Error> {
            match non_finite(v) {
                Some(s) => self.0.serialize_str(s),
                None => self.0.serialize_f64(v),
            }
        }
        fn serialize_none(self) -> Result<S::Ok, S::Error> {
            self.0.serialize_none()
        }
        fn serialize_some<T: ?Sized + Serialize>(self, v: &T) -> Result<S::Ok, S::Error> {
            self.0.serialize_some(&Wrap(v))
        }
        fn serialize_unit(self) -> Result<S::Ok, S::Error> {
            self.0.serialize_unit()
        }
        fn serialize_unit_variant(
            self,
            name: &'static str,
            i: u32,
            variant: &'static str,
        ) -> Result<S::Ok, S::Error> {
            self.0.serialize_unit_variant(name, i, variant)
        }
        fn serialize_newtype_struct<T: ?Sized + Serialize>(
            self,
            name: &'static str,
            v: &T,
        ) -> Result<S::Ok, S::Error> {
            self.0.serialize_newtype_struct(name, &Wrap(v))
        }
        fn serialize_newtype_variant<T: ?Sized + Serialize>(
            self,
            name: &'static str,
            i: u32,
            variant: &'static str,
            v: &T,
        ) -> Result<S::Ok, S::Error> {
            self.0.serialize_newtype_variant(name, i, variant, &Wrap(v))
        }
        fn serialize_seq(self, len: Option<usize>) -> Result<Self::SerializeSeq, S::Error> {
            self.0.serialize_seq(len).map(Compound)
        }
        fn serialize_tuple(self, len: usize) -> Result<Self::SerializeTuple, S::Error> {
            self.0.serialize_tuple(len).map(Compound)
        }
        fn serialize_tuple_struct(
            self,
            name: &'static str,
            len: usize,
        ) -> Result<Self::SerializeTupleStruct, S::Error> {
            self.0.serialize_tuple_struct(name, len).map(Compound)
        }
        fn serialize_tuple_variant(
            self,
            name: &'static str,
            i: u32,
            variant: &'static str,
            len: usize,
        ) -> Result<Self::SerializeTupleVariant, S::Error> {
            self.0
                .serialize_tuple_variant(name, i, variant, len)
                .map(Compound)
        }
        fn serialize_map(self, len: Option<usize>) -> Result<Self::SerializeMap, S::Error> {
            self.0.serialize_map(len).map(Compound)
        }
        fn serialize_struct(
            self,
            name: &'static str,
            len: usize,
        ) -> Result<Self::SerializeStruct, S::Error> {
            self.0.serialize_struct(name, len).map(Compound)
        }
        fn serialize_struct_variant(
            self,
            name: &'static str,
            i: u32,
            variant: &'static str,
            len: usize,
        ) -> Result<Self::SerializeStructVariant, S::Error> {
            self.0
                .serialize_struct_variant(name, i, variant, len)
                .map(Compound)
        }
        fn is_human_readable(&self) -> bool {
            self.0.is_human_readable()
        }
    }

    impl<C: ser::SerializeSeq> ser::SerializeSeq for Compound<C> {
        type Ok = C::Ok;
        type Error = C::Error;
        fn serialize_element<T: ?Sized + Serialize>(&mut self, v: &T) -> Result<(), C::Error> {
            self.0.serialize_element(&Wrap(v))
        }
        fn end(self) -> Result<C::Ok, C::Error> {
            self.0.end()
        }
    }

    impl<C: ser::SerializeTuple> ser::SerializeTuple for Compound<C> {
        type Ok = C::Ok;
        type Error = C::Error;
        fn serialize_element<T: ?Sized + Serialize>(&mut self, v: &T) -> Result<(), C::Error> {
            self.0.serialize_element(&Wrap(v))
        }
        fn end(self) -> Result<C::Ok, C::Error> {
            self.0.end()
        }
    }

    impl<C: ser::SerializeTupleStruct> ser::SerializeTupleStruct for Compound<C> {
        type Ok = C::Ok;
        type Error = C::Error;
        fn serialize_field<T: ?Sized + Serialize>(&mut self, v: &T) -> Result<(), C::Error> {
            self.0.serialize_field(&Wrap(v))
        }
        fn end(self) -> Result<C::Ok, C::Error> {
            self.0.end()
        }
    }

    impl<C: ser::SerializeTupleVariant> ser::SerializeTupleVariant for Compound<C> {
        type Ok = C::Ok;
        type Error = C::Error;
        fn serialize_field<T: ?Sized + Serialize>(&mut self, v: &T) -> Result<(), C::Error> {
            self.0.serialize_field(&Wrap(v))
        }
        fn end(self) -> Result<C::Ok, C::Error> {
            self.0.end()
        }
    }

    impl<C: ser::SerializeMap> ser::SerializeMap for Compound<C> {
        type Ok = C::Ok;
        type Error = C::Error;
        fn serialize_key<T: ?Sized + Serialize>(&mut self, k: &T) -> Result<(), C::Error> {
            self.0.serialize_key(&Wrap(k))
        }
        fn serialize_value<T: ?Sized + Serialize>(&mut self, v: &T) -> Result<(), C::Error> {
            self.0.serialize_value(&Wrap(v))
        }
        fn end(self) -> Result<C::Ok, C::Error> {
            self.0.end()
        }
    }

    impl<C: ser::SerializeStruct> ser::SerializeStruct for Compound<C> {
        type Ok = C::Ok;
        type Error = C::Error;
        fn serialize_field<T: ?Sized + Serialize>(
            &mut self,
            key: &'static str,
            v: &T,
        ) -> Result<(), C::Error> {
            self.0.serialize_field(key, &Wrap(v))
        }
        fn skip_field(&mut self, key: &'static str) -> Result<(), C::Error> {
            self.0.skip_field(key)
        }
        fn end(self) -> Result<C::Ok, C::Error> {
            self.0.end()
        }
    }

    impl<C: ser::SerializeStructVariant> ser::SerializeStructVariant for Compound<C> {
        type Ok = C::Ok;
        type Error = C::Error;
        fn serialize_field<T: ?Sized + Serialize>(
            &mut self,
            key: &'static str,
            v: &T,
        ) -> Result<(), C::Error> {
            self.0.serialize_field(key, &Wrap(v))
        }
        fn skip_field(&mut self, key: &'static str) -> Result<(), C::Error> {
            self.0.skip_field(key)
        }
        fn end(self) -> Result<C::Ok, C::Error> {
            self.0.end()
        }
    }

    /// Deserializes from a `serde_json::Value`; a float asked for where the JSON holds `"inf"`, `"-inf"`
    /// or `"nan"` reads as that number. Nested values go through the wrapper too.
    pub struct De(pub Value);

    impl<'de> de::Deserializer<'de> for De {
        type Error = serde_json::Error;

        fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
            match self.0 {
                Value::Array(a) => {
                    let len = a.len();
                    let mut seq = Seq(a.into_iter());
                    let v = visitor.visit_seq(&mut seq)?;
                    if seq.0.len() == 0 {
                        Ok(v)
                    } else {
                        Err(de::Error::invalid_length(
                            len,
                            &"fewer elements in the array",
                        ))
                    }
                }
                Value::Object(m) => visitor.visit_map(Map {
                    it: m.into_iter(),
                    value: None,
                }),
                other => other.deserialize_any(visitor),
            }
        }

        fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
            if let Value::String(s) = &self.0 {
                if let Some(x) = parse_non_finite(s) {
                    return visitor.visit_f64(x);
                }
            }
            self.deserialize_any(visitor)
        }

        fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
            self.deserialize_f64(visitor)
        }

        fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
            match self.0 {
                Value::Null => visitor.visit_none(),
                other => visitor.visit_some(De(other)),
            }
        }

        fn deserialize_newtype_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            visitor: V,
        ) -> Result<V::Value, Self::Error> {
            visitor.visit_newtype_struct(self)
        }

        fn deserialize_enum<V: Visitor<'de>>(
            self,
            name: &'static str,
            variants: &'static [&'static str],
            visitor: V,
        ) -> Result<V::Value, Self::Error> {
            // Enums in reports are unit variants (Phase); their content needs no float mapping.
            self.0.deserialize_enum(name, variants, visitor)
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 char str string bytes byte_buf unit unit_struct
            seq tuple tuple_struct map struct identifier ignored_any
        }
    }

    struct Seq(std::vec::IntoIter<Value>);

    impl<'de> SeqAccess<'de> for Seq {
        type Error = serde_json::Error;
        fn next_element_seed<T: DeserializeSeed<'de>>(
            &mut self,
            seed: T,
        ) -> Result<Option<T::Value>, Self::Error> {
            match self.0.next() {
                Some(v) => seed.deserialize(De(v)).map(Some),
                None => Ok(None),
            }
        }
        fn size_hint(&self) -> Option<usize> {
            Some(self.0.len())
        }
    }

    struct Map {
        it: serde_json::map::IntoIter,
        value: Option<Value>,
    }

    impl<'de> MapAccess<'de> for Map {
        type Error = serde_json::Error;
        fn next_key_seed<K: DeserializeSeed<'de>>(
            &mut self,
            seed: K,
        ) -> Result<Option<K::Value>, Self::Error> {
            match self.it.next() {
                Some((k, v)) => {
                    self.value = Some(v);
                    seed.deserialize(De(Value::String(k))).map(Some)
                }
                None => Ok(None),
            }
        }
        fn next_value_seed<V: DeserializeSeed<'de>>(
            &mut self,
            seed: V,
        ) -> Result<V::Value, Self::Error> {
            let v = self
                .value
                .take()
                .ok_or_else(|| de::Error::custom("a map value is missing"))?;
            seed.deserialize(De(v))
        }
        fn size_hint(&self) -> Option<usize> {
            Some(self.it.len())
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Files.

/// Write `report.json`, `report.md` and `results.csv` into `reports_root/<run_id>/`, atomically: all
/// three are written into a temporary directory `reports_root/.<run_id>.partial-XXXX`, which is then
/// renamed into place. On any error nothing is left at `reports_root/<run_id>` (and the temporary
/// directory is removed). Refuses a run id that is empty, starts with `.` or holds a path separator, and
/// a report directory that already exists. Returns the report directory.
pub fn write_report(reports_root: &Path, r: &Report) -> Result<PathBuf> {
    let id = &r.run_id;
    if id.is_empty() || id.starts_with('.') || id.contains(['/', '\\']) || id == ".." {
        bail!("run id {id:?} cannot be a directory name (empty, starts with '.', or holds a path separator)");
    }
    // Render first: nothing touches the disk if rendering fails.
    let json = to_json_pretty(r).with_context(|| format!("report {id}: report.json"))?;
    let md = render_markdown(r);
    let csv = render_csv(r);

    std::fs::create_dir_all(reports_root).with_context(|| {
        format!(
            "cannot create the reports directory {}",
            reports_root.display()
        )
    })?;
    let dest = reports_root.join(id);
    if dest.symlink_metadata().is_ok() {
        bail!(
            "{} already exists; a report directory is never overwritten",
            dest.display()
        );
    }
    clean_stale_partials(reports_root);
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{id}.partial-"))
        .tempdir_in(reports_root)
        .with_context(|| {
            format!(
                "cannot create a temporary directory in {}",
                reports_root.display()
            )
        })?;
    for (name, text) in [(REPORT_JSON, &json), (REPORT_MD, &md), (RESULTS_CSV, &csv)] {
        let p = tmp.path().join(name);
        std::fs::write(&p, text).with_context(|| format!("cannot write {}", p.display()))?;
        // Durable before the rename makes the directory visible.
        std::fs::File::open(&p)
            .and_then(|f| f.sync_all())
            .with_context(|| format!("cannot sync {}", p.display()))?;
    }
    if dest.symlink_metadata().is_ok() {
        bail!(
            "{} appeared while the report was being written; not overwritten",
            dest.display()
        );
    }
    let tmp_path = tmp.keep();
    if let Err(e) = std::fs::rename(&tmp_path, &dest) {
        let _ = std::fs::remove_dir_all(&tmp_path);
        return Err(e)
            .with_context(|| format!("cannot move {} to {}", tmp_path.display(), dest.display()));
    }
    Ok(dest)
}

/// Read a `report.json` (or the `report.json` inside a report directory). Refuses a schema version other
/// than [`REPORT_SCHEMA_VERSION`] with a message saying which.
pub fn read_report(path: &Path) -> Result<Report> {
    let file = if path.is_dir() {
        path.join(REPORT_JSON)
    } else {
        path.to_path_buf()
    };
    let text = std::fs::read_to_string(&file)
        .with_context(|| format!("{} cannot be read", file.display()))?;
    let value = parse_value(&text)
        .map_err(|e| anyhow::anyhow!("{} is not valid JSON: {e}", file.display()))?;
    match value.get("schema_version").and_then(serde_json::Value::as_u64) {
        Some(v) if v == u64::from(REPORT_SCHEMA_VERSION) => {}
        Some(v) => bail!(
            "{}: report schema_version is {v}, but this lockstep reads schema_version {REPORT_SCHEMA_VERSION}; \
             read it with the lockstep version that wrote it (environment.lockstep_version)",
            file.display()
        ),
        None => bail!("{}: no integer schema_version; is this a lockstep report.json?", file.display()),
    }
    from_value(value).with_context(|| {
        format!(
            "{} does not match report schema {REPORT_SCHEMA_VERSION}",
            file.display()
        )
    })
}

/// A new run id: `YYYYMMDD-HHMMSS-<short git commit>-<6 hex>` in UTC (`nogit` when the commit cannot be
/// read), e.g. `20261122-221501-53b3529-4f0a9c`. The suffix is a hash of the process id, the clock in
/// nanoseconds and a per-process counter, so runs started in the same second — in one process or in
/// several — get distinct ids.
pub fn new_run_id() -> String {
    use sha2::Digest;
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let (y, mo, d, h, mi, s) = civil(since.as_secs());
    let commit = git(&["rev-parse", "--short=7", "HEAD"]).unwrap_or_else(|| "nogit".to_string());
    let mut hasher = sha2::Sha256::new();
    hasher.update(std::process::id().to_le_bytes());
    hasher.update(since.as_nanos().to_le_bytes());
    hasher.update(COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    let suffix = hex::encode(&hasher.finalize()[..3]);
    format!("{y:04}{mo:02}{d:02}-{h:02}{mi:02}{s:02}-{commit}-{suffix}")
}

/// How old a `.<run id>.partial-*` directory must be before [`write_report`] removes it as the leftover
/// of a killed writer (a writer holds one for well under a second).
pub const STALE_PARTIAL_AGE: std::time::Duration = std::time::Duration::from_secs(3600);

/// Remove `.*.partial-*` directories under `reports_root` older than [`STALE_PARTIAL_AGE`] (left by a
/// writer that was killed), saying so on stderr. Younger ones may belong to a run writing right now and
/// are left alone. Returns the directories removed. Best effort: an entry that cannot be read or removed
/// is skipped.
pub fn clean_stale_partials(reports_root: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(reports_root) else {
        return removed;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !(name.starts_with('.') && name.contains(".partial-")) {
            continue;
        }
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= STALE_PARTIAL_AGE);
        if old && std::fs::remove_dir_all(e.path()).is_ok() {
            eprintln!(
                "lockstep: removed {}, left by a report writer that was killed",
                e.path().display()
            );
            removed.push(e.path());
        }
    }
    removed
}

/// Check, before a run starts, that reports can be written under `reports_root`: create it, and create
/// and remove a temporary directory in it. Errors name the directory.
pub fn check_reports_dir(reports_root: &Path) -> Result<()> {
    std::fs::create_dir_all(reports_root).with_context(|| {
        format!(
            "cannot create the reports directory {}",
            reports_root.display()
        )
    })?;
    tempfile::Builder::new()
        .prefix(".lockstep-write-check-")
        .tempdir_in(reports_root)
        .with_context(|| {
            format!(
                "the reports directory {} is not writable; a run's results would be lost",
                reports_root.display()
            )
        })?
        .close()
        .with_context(|| format!("cleaning up a write check in {}", reports_root.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_formats() {
        assert_eq!(fmt_fixed(0.9999, 8), "0.9999");
        assert_eq!(fmt_fixed(0.999123456789, 8), "0.99912346");
        assert_eq!(fmt_fixed(1.0, 8), "1");
        assert_eq!(fmt_fixed(-0.0000000001, 4), "0");
        assert_eq!(fmt_fixed(f64::INFINITY, 4), "inf");
        assert_eq!(fmt_sci(1e-3, 3), "1e-3");
        assert_eq!(fmt_sci(1.2345e-5, 3), "1.234e-5");
        assert_eq!(fmt_sci(0.0, 3), "0");
        assert_eq!(fmt_sci(f64::NEG_INFINITY, 3), "-inf");
        assert_eq!(fmt_cos(1.0), "1.00000000");
        assert_eq!(fmt_e3(1.96e-3), "1.960e-3");
        assert_eq!(fmt_e3(0.0), "0");
        assert_eq!(fmt_e3(f64::INFINITY), "inf");
        assert_eq!(Num::Sci(0.0).csv(), "0");
        assert_eq!(Num::Sci(1.5e-7).csv(), "1.5e-7");
        assert_eq!(Num::Fixed(0.25).csv(), "0.25");
        assert_eq!(Num::Fixed(f64::NAN).csv(), "nan");
        assert_eq!(
            compact_ranges(&[0, 1, 2, 3, 5, 7, 8, 9].into_iter().collect()),
            "0..3,5,7..9"
        );
        assert_eq!(
            stage_pattern("blk.12.attn_proj"),
            ("blk.{N}.attn_proj".to_string(), Some(12))
        );
        assert_eq!(
            stage_pattern("output_norm"),
            ("output_norm".to_string(), None)
        );
    }

    #[test]
    fn environment_detection_never_fails_and_run_ids_have_their_shape() {
        let env = Environment::detect(3, Path::new("/nonexistent/manifest.json"));
        assert_eq!(env.threads, 3);
        assert_eq!(env.golden_manifest_sha256, "unknown");
        assert_eq!(env.lockstep_version, env!("CARGO_PKG_VERSION"));
        assert!(!env.cpu_model.is_empty() && !env.os.is_empty() && !env.rustc.is_empty());
        assert!(env
            .cpu_flags
            .iter()
            .all(|f| SIMD_FLAGS.contains(&f.as_str())));
        let id = new_run_id();
        let parts: Vec<&str> = id.splitn(3, '-').collect();
        assert_eq!(parts.len(), 3, "{id}");
        assert!(parts[0].len() == 8 && parts[1].len() == 6, "{id}");
        assert!(
            parts[0]
                .bytes()
                .chain(parts[1].bytes())
                .all(|b| b.is_ascii_digit()),
            "{id}"
        );
        assert!(!parts[2].is_empty(), "{id}");
        // ids made in the same second (here: the same microsecond, in a loop) never collide
        let ids: BTreeSet<String> = (0..1000).map(|_| new_run_id()).collect();
        assert_eq!(ids.len(), 1000);
    }

    #[test]
    fn stale_partial_directories_are_removed_and_fresh_ones_kept() {
        let root = tempfile::tempdir().unwrap();
        let stale = root
            .path()
            .join(".20200101-000000-abc-000000.partial-AbCdEf");
        let fresh = root
            .path()
            .join(".20991231-000000-abc-000000.partial-XyZ123");
        let other = root.path().join(".hidden-but-not-partial");
        for d in [&stale, &fresh, &other] {
            std::fs::create_dir(d).unwrap();
            std::fs::write(d.join("report.json"), "{").unwrap();
        }
        let old = std::time::SystemTime::now() - STALE_PARTIAL_AGE * 2;
        for d in [&stale, &other] {
            std::fs::File::open(d).unwrap().set_modified(old).unwrap();
        }
        assert_eq!(clean_stale_partials(root.path()), vec![stale.clone()]);
        assert!(!stale.exists() && fresh.exists() && other.exists());
    }

    #[test]
    fn an_unwritable_reports_directory_is_found_before_the_run() {
        let root = tempfile::tempdir().unwrap();
        check_reports_dir(&root.path().join("new/reports")).unwrap();
        let file = root.path().join("a-file");
        std::fs::write(&file, "x").unwrap();
        let e = format!(
            "{:#}",
            check_reports_dir(&file.join("reports")).unwrap_err()
        );
        assert!(e.contains("a-file/reports"), "{e}");
    }

    #[test]
    fn utc_dates() {
        assert_eq!(fmt_utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(fmt_utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(fmt_utc(1_795_385_701), "2026-11-22 22:15:01 UTC");
    }

    #[test]
    fn non_finite_floats_round_trip_through_json() {
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct T {
            a: f64,
            b: Vec<f64>,
            c: Option<f64>,
            d: Option<f64>,
            s: String,
            m: BTreeMap<String, f32>,
            p: Phase,
        }
        let t = T {
            a: f64::INFINITY,
            b: vec![1.5, f64::NEG_INFINITY, 0.1],
            c: Some(f64::INFINITY),
            d: None,
            s: "inf".into(),
            m: [("x".to_string(), f32::INFINITY)].into_iter().collect(),
            p: Phase::Decode,
        };
        let text = to_json_pretty(&t).unwrap();
        assert!(
            text.contains("\"a\": \"inf\"") && text.contains("\"-inf\""),
            "{text}"
        );
        assert_eq!(from_json::<T>(&text).unwrap(), t);
        let nan: Vec<f64> = from_json(&to_json_pretty(&vec![f64::NAN]).unwrap()).unwrap();
        assert!(nan[0].is_nan());
        // A string field holding "inf" stays a string; a float field holding another string is an error.
        assert!(from_json::<Vec<f64>>("[\"infinity\"]").is_err());
    }

    #[test]
    fn json_reads_floats_bit_for_bit_and_refuses_bad_documents() {
        let xs = [
            0.00013416407864998739,
            0.9999988333333333,
            2.4999999999999998e-6,
            1e-300,
            5e-324,
            f64::MAX,
            -0.0,
            0.1,
        ];
        let text = serde_json::to_string(&xs).unwrap();
        let back: Vec<f64> = from_json(&text).unwrap();
        assert_eq!(
            back.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            xs.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        for bad in [
            "",
            "[1,]",
            "{\"a\" 1}",
            "01",
            "1.",
            "1e",
            "\"\\x\"",
            "\"\\ud800\"",
            "[1] x",
            "\"a",
            "nul",
            "1e999",
            "\"\\u+12a\"",
        ] {
            assert!(parse_value(bad).is_err(), "{bad:?} must not parse");
        }
        assert!(parse_value(&"[".repeat(300))
            .unwrap_err()
            .to_string()
            .contains("recursion limit"));
        assert!(parse_value("[1,\n 2,\n x]")
            .unwrap_err()
            .to_string()
            .contains("line 3 column 2"));
    }

    #[test]
    fn every_definition_names_a_metric_of_metrics_rs_or_the_gate() {
        let doc = include_str!("metrics.rs");
        let defs = metric_definitions();
        for k in [
            "cosine",
            "max_abs",
            "mean_abs",
            "rmse",
            "nmse",
            "bit_exact",
            "kl",
            "top1",
            "margin",
            "entropy",
            "dp_top",
        ] {
            assert!(defs.contains_key(k), "{k}");
            assert!(
                doc.contains(&format!("**{k}**")),
                "metrics.rs no longer defines **{k}**"
            );
        }
    }
}
