//! Gates: the thresholds of `ci/thresholds.toml` ([`thresholds`]), the verdict of one cell and the one-line
//! reasons `lockstep gate` prints for failing cells ([`verdict`]), and the cross-oracle yardstick its reference rules
//! against llama.cpp are derived from ([`yardstick`]).

pub mod thresholds;
pub mod verdict;
pub mod yardstick;

pub use thresholds::{
    CellThresholds, Rule, ThresholdRange, Thresholds, ANY, MAX_FLOOR_HEADROOM, THRESHOLD_RANGES,
};
pub use verdict::{
    cell_metrics, engine_error_verdict, evaluate, failure_line, failure_line_with, failure_reasons,
    failure_value, first_divergent, first_inexact, fmt_metric, is_out_stage, lowest_index,
    seq_position, CellMetrics, Divergence, Failure, OutCosine, PhasePosition, Verdict,
    ENGINE_FAILED_MARK,
};
