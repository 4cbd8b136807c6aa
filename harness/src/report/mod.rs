//! Run reports: `reports/<run id>/{report.json, report.md, results.csv}`.
//!
//! One module per concept: the report's data (this file), the machine it ran on ([`environment`]), its
//! renderings ([`markdown`], [`csv`], [`plot`]; for CI systems [`junit`] and the step [`summary`]), JSON with non-finite numbers ([`json`]) and the atomic report
//! directory ([`files`]). Number formatting shared with the gate is in [`crate::format`].
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

mod csv;
mod environment;
mod files;
mod json;
mod junit;
mod markdown;
mod plot;
mod summary;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::compare::CellComparison;
use crate::gate::Verdict;
use crate::matrix::Cell;
use lockstep_engine::NumericsMode;

pub use csv::{render_csv, CSV_HEADER};
pub(crate) use environment::git;
pub use environment::{Environment, SIMD_FLAGS};
pub use files::{
    check_reports_dir, clean_stale_partials, new_run_id, read_report, write_files_atomically,
    write_report, STALE_PARTIAL_AGE,
};
pub use json::{from_json, to_json_pretty};
pub use junit::render_junit;
pub use markdown::{cell_anchor, render_markdown, shown_cells, PASSING_SAMPLE_PER_GROUP};
pub use plot::{error_vs_depth_svg, has_depth, no_plot_sentence, plot_file_name};
pub use summary::{append_step_summary, check_step_summary, render_step_summary, STEP_SUMMARY_ENV};

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
    /// Set when the run is one shard of a split matrix (`lockstep run --shard I/N`): which one, and the
    /// whole matrix it is part of ([`crate::shard`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<ShardInfo>,
    /// Set on a report merged from shards (`lockstep merge`): the shards' run ids, in shard order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub merged_from: Vec<String>,
    /// One entry per matrix cell, in matrix order.
    pub cells: Vec<CellReport>,
}

/// What a shard's report records about its split (`shard` in report.json).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    /// This shard, 1-based.
    pub index: usize,
    /// Shards in the split.
    pub count: usize,
    /// The id of every cell of the whole expanded matrix, in matrix order: what the merged report must
    /// hold, and its order.
    pub matrix_cells: Vec<String>,
    /// What balanced the split: `cell count`, or `costs <file> (sha256 <hex>)`.
    pub balanced_by: String,
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
    /// For an external engine: seconds one call (one answer of a session engine) may take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_timeout_s: Option<f64>,
    /// For a session engine (`--engine-serve`): its command, as given; the name it reported in `load` is
    /// each cell's engine field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_serve: Option<String>,
    /// For a session engine dumping under its own names: the stage map file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_map: Option<FileRef>,
    /// Set when the engine's KV cache was not exercised ([`ONE_SHOT_KV_NOTE`]: a one-shot
    /// `--engine-cmd`, which re-runs every decode step from position 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_note: Option<String>,
    /// The golden directory.
    pub golden_dir: String,
    /// Its `manifest.json`.
    pub golden_manifest: FileRef,
    /// The matrix file.
    pub matrix: FileRef,
    /// The thresholds file.
    pub thresholds: FileRef,
}

/// What the report says of a one-shot external engine (`--engine-cmd`): its decode steps are re-run from
/// position 0 as one batch, so its KV cache is never exercised.
pub const ONE_SHOT_KV_NOTE: &str = "the KV cache was not exercised: a one-shot --engine-cmd re-runs every \
     teacher-forced decode step from position 0 as one batch, so bugs of the engine's KV cache (write \
     position, RoPE position at decode, cache precision, sliding-window eviction) cannot show; run the \
     engine with --engine-serve (the session protocol) to test them";

/// Why a run stopped before its last cell.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Incomplete {
    /// The cell that failed.
    pub failed_cell: String,
    /// The error, with its causes.
    pub error: String,
    /// Cells of the matrix after the failed one, not run.
    pub cells_not_run: usize,
}

/// One entry of the expected-failure file (`--expected-failures`, read by `crate::select`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectedFailure {
    /// The cells it covers: a [`CellPattern`].
    pub cell: String,
    /// Why the cell fails, and where it is tracked (shown with every XFAIL).
    pub reason: String,
    /// The last day (UTC, `YYYY-MM-DD`) the entry holds; after it the run refuses to start.
    pub expires: String,
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
    /// Ggml mode: the ggml-cpu build mirrored (`avx2`, `avx512-nobf16`, `avx512`), from the golden's
    /// recorded host CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ggml_target: Option<String>,
    /// The full comparison.
    pub comparison: CellComparison,
    /// Engine speed.
    pub speed: Speed,
    /// The gate's verdict.
    pub verdict: Verdict,
    /// The thresholds the verdict applied (absent in reports of older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thresholds: Option<crate::gate::CellThresholds>,
    /// Where the engine first computes something else and what kind of difference it is — `lockstep
    /// bisect`'s verdict ([`crate::judge::judge`]); absent in reports of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finding: Option<crate::judge::Finding>,
    /// Per layer, the largest local NMSE of any of its stages over the prefill positions (bisect's pass with
    /// the golden's own input injected; 0 where every stage is exact at storage precision), for the
    /// error-vs-depth plot. Empty when no local pass ran (an exact accumulated pass, an external engine).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub local_nmse_by_layer: Vec<f64>,
    /// sha256 of every stage and the logits the engine computed in the compared pass
    /// ([`crate::compare::EngineOutput::sha256`]); absent in reports of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_sha256: Option<String>,
    /// Set when the engine cannot run this cell's model at all (a weight type it has no kernels for,
    /// [`lockstep_engine::Error::Unsupported`]): the engine's error, naming the file, tensor and type. The
    /// cell then fails with the metric `engine_error` ([`crate::gate::engine_error_verdict`]); its comparison
    /// holds the golden's tokens only and its speed is zero. Absent for every cell that ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A reference cell that failed, rerun with llama.cpp's input rounding ([`crate::probe`]): how much of
    /// its gap that rounding explains. Informative, never part of the verdict; absent elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rounding_probe: Option<crate::probe::RoundingProbe>,
    /// Wall-clock seconds the whole cell took (both passes, the judge, the probe): the cost
    /// `lockstep run --shard` balances on ([`crate::shard`]). Absent in reports of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
    /// The expected-failure entry covering this cell (`--expected-failures`, [`crate::select`]): the cell
    /// keeps its gate verdict, and its failure is shown as XFAIL with the entry's reason instead of failing
    /// the run (a pass is an XPASS, which fails it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_failure: Option<ExpectedFailure>,
}

/// One SIMD cell set beside its scalar twin (the cell that differs only in `simd = off`).
#[derive(Clone, Debug, PartialEq)]
pub struct SimdPair {
    /// Index of the SIMD cell in the report.
    pub simd_cell: usize,
    /// Index of its `simd = off` twin.
    pub scalar_cell: usize,
    /// The two output digests are equal: every stage and the logits are bit-identical.
    pub identical: bool,
}

/// Pair every cell whose `simd` is not `off` with its `off` twin (same model, prompt, quant, mode, oracle
/// and engine), where both were run and recorded an output digest.
pub fn simd_pairs(cells: &[CellReport]) -> Vec<SimdPair> {
    let mut pairs = Vec::new();
    for (i, c) in cells.iter().enumerate() {
        if c.cell.simd == "off" {
            continue;
        }
        let twin = Cell {
            simd: "off".into(),
            ..c.cell.clone()
        };
        let Some(j) = cells.iter().position(|o| o.cell == twin) else {
            continue;
        };
        if let (Some(a), Some(b)) = (&c.output_sha256, &cells[j].output_sha256) {
            pairs.push(SimdPair {
                simd_cell: i,
                scalar_cell: j,
                identical: a == b,
            });
        }
    }
    pairs
}

/// Hold every ggml-mode SIMD cell to bit-identity with its scalar twin: a cell whose output differs fails
/// (metric `simd_bits`). In ggml mode both kernel sets mirror the same llama.cpp kernels, so any
/// difference is a bug in a SIMD kernel. Reference-mode pairs are only reported (SIMD may reorder sums
/// there; the golden thresholds hold them).
pub fn gate_simd_identity(cells: &mut [CellReport]) {
    for p in simd_pairs(cells) {
        let scalar_sha = short_sha(cells[p.scalar_cell].output_sha256.as_deref());
        let c = &mut cells[p.simd_cell];
        if p.identical || c.cell.mode != NumericsMode::Ggml {
            continue;
        }
        c.verdict.pass = false;
        c.verdict.failures.push(crate::gate::Failure {
            metric: "simd_bits".into(),
            value: 0.0,
            threshold: 1.0,
            detail: format!(
                "ggml mode with SIMD {} is not bit-identical to SIMD off (output sha256 {} vs {})",
                c.cell.simd,
                short_sha(c.output_sha256.as_deref()),
                scalar_sha
            ),
        });
    }
}

/// The first 12 hex digits of a digest, or `-`.
pub fn short_sha(s: Option<&str>) -> String {
    s.map_or_else(|| "-".into(), |s| s.chars().take(12).collect())
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

/// The failure line of a failing cell ([`crate::gate::failure_line_with`]), `None` when it passed: its
/// failed thresholds, then its verdict as its bisect finding gives it ([`crate::judge::Finding::headline`]:
/// the verdict's name and stage, the same that report.md's first-divergent table, the HTML run page and
/// `lockstep bisect` show); a cell without a finding (an engine error, an older report) gives its verdict's
/// marker.
pub fn cell_failure_line(c: &CellReport) -> Option<String> {
    crate::gate::failure_line_with(
        &c.cell,
        &c.verdict,
        c.finding.as_ref().map(crate::judge::Finding::headline),
    )
}

/// The failure lines of every failing cell of a report ([`cell_failure_line`]), in cell order.
pub fn failure_lines(report: &Report) -> Vec<String> {
    report.cells.iter().filter_map(cell_failure_line).collect()
}
