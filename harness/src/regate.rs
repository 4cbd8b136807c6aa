//! `lockstep gate REPORT`: an existing report.json gated again — with the verdicts it records, or
//! re-evaluated against another thresholds file — as one line per failing cell and a count.

use std::path::Path;

use anyhow::{Context, Result};

use crate::gate::CellThresholds;
use crate::report::Report;

/// What gating a report found: the lines to print (one per failing cell, the run's incompleteness, the
/// count last) and the number of failures (a run that stopped early counts as one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateOutcome {
    /// The lines, in print order: [`crate::report::failure_lines`], then `INCOMPLETE: ...` when the run
    /// stopped early, then `<n> cells, <p> passed, <f> failed`.
    pub lines: Vec<String>,
    /// Failing cells, plus one when the run stopped early; 0 = the report passes.
    pub n_fail: usize,
}

/// Every cell of `report` evaluated again against `thresholds` ([`crate::gate::evaluate`]; a cell that
/// recorded an engine error gets [`crate::gate::engine_error_verdict`]; a bisect finding is applied with
/// [`crate::judge::settle`]), then the SIMD-identity check of twin cells.
///
/// Errors: a cell the thresholds file has no thresholds for.
pub fn regate(report: &mut Report, thresholds: &crate::gate::Thresholds) -> Result<()> {
    regate_with(report, |c| thresholds.for_cell(&c.cell).map(Some))
}

/// [`regate`] with each cell's thresholds from `cell_thresholds` (`None`: the cell keeps its verdict).
fn regate_with(
    report: &mut Report,
    mut cell_thresholds: impl FnMut(&crate::report::CellReport) -> Result<Option<CellThresholds>>,
) -> Result<()> {
    for c in &mut report.cells {
        let Some(ct) = cell_thresholds(c)? else {
            continue;
        };
        if let Some(e) = &c.error {
            c.verdict = crate::gate::engine_error_verdict(e, &ct);
            continue;
        }
        c.verdict = crate::gate::evaluate(&c.cell, &c.comparison, &ct);
        if let Some(f) = &mut c.finding {
            crate::judge::settle(&mut c.verdict, f, Some(&c.comparison), &ct);
        }
    }
    crate::report::gate_simd_identity(&mut report.cells);
    Ok(())
}

/// The outcome of `report`'s recorded verdicts (see [`GateOutcome`]).
pub fn outcome(report: &Report) -> GateOutcome {
    let mut lines = crate::report::failure_lines(report);
    if let Some(inc) = &report.incomplete {
        lines.push(format!(
            "INCOMPLETE: the run stopped at cell {} ({} cells not run): {}",
            inc.failed_cell, inc.cells_not_run, inc.error
        ));
    }
    let n_fail = report.cells.iter().filter(|c| !c.verdict.pass).count()
        + usize::from(report.incomplete.is_some());
    lines.push(format!(
        "{} cells, {} passed, {} failed",
        report.cells.len(),
        report.cells.len().saturating_sub(n_fail),
        n_fail
    ));
    GateOutcome { lines, n_fail }
}

/// Read the report.json at `path` ([`crate::report::read_report`]), [`regate`] it when a `thresholds`
/// file is given (else [`check_recorded_verdicts`]), and return its [`outcome`].
///
/// Errors: an unreadable or invalid report or thresholds file; a cell without thresholds; without
/// `thresholds`, a recorded verdict its metrics and recorded thresholds do not give.
pub fn gate_file(path: &Path, thresholds: Option<&Path>) -> Result<GateOutcome> {
    Ok(gate_file_report(path, thresholds)?.0)
}

/// [`gate_file`], also returning the report as gated (its verdicts re-evaluated when `thresholds` is
/// given), for the outputs rendered from it (JUnit, the step summary).
pub fn gate_file_report(path: &Path, thresholds: Option<&Path>) -> Result<(GateOutcome, Report)> {
    let mut r = crate::report::read_report(path)?;
    match thresholds {
        Some(t) => regate(&mut r, &crate::gate::Thresholds::load(t)?)?,
        None => check_recorded_verdicts(&r).with_context(|| format!("{}", path.display()))?,
    }
    Ok((outcome(&r), r))
}

/// Whether two verdicts are the same judgement: the same pass flag, near-tie tolerance and first
/// divergent stage, and the same failed thresholds (metric, value, threshold; NaN equal to NaN, a metric
/// that could not be measured is NaN in both), in order. A failure's `detail` is prose and is not
/// compared: `lockstep run` names token ids with their text pieces there, which needs the engine's
/// vocabulary that `merge` and `gate` do not have.
pub fn same_verdict(a: &crate::gate::Verdict, b: &crate::gate::Verdict) -> bool {
    let same_number = |x: f64, y: f64| x == y || (x.is_nan() && y.is_nan());
    a.pass == b.pass
        && same_number(a.margin_tolerance, b.margin_tolerance)
        && (a.first_divergent == b.first_divergent
            || serde_json::to_string(&a.first_divergent).ok()
                == serde_json::to_string(&b.first_divergent).ok())
        && a.failures.len() == b.failures.len()
        && a.failures.iter().zip(&b.failures).all(|(x, y)| {
            x.metric == y.metric
                && same_number(x.value, y.value)
                && same_number(x.threshold, y.threshold)
        })
}

/// Check that every cell's recorded verdict is what its metrics give with the thresholds it recorded
/// (a report that predates recorded thresholds is taken as it is): a report edited after it
/// was written — a failing cell turned `"pass": true`, its metrics unchanged — is refused instead of
/// gated as passing.
///
/// Errors: the first cell whose verdict differs, named with the run id.
pub fn check_recorded_verdicts(report: &Report) -> Result<()> {
    // an older report: its verdicts cannot be re-derived (and the SIMD check must see every cell judged)
    if report.cells.iter().any(|c| c.thresholds.is_none()) {
        return Ok(());
    }
    let mut again = report.clone();
    regate_with(&mut again, |c| Ok(c.thresholds.clone()))?;
    for (stored, judged) in report.cells.iter().zip(&again.cells) {
        if !same_verdict(&stored.verdict, &judged.verdict) {
            anyhow::bail!(
                "run {}, cell {}: its recorded verdict ({}) is not what its metrics give with its \
                 recorded thresholds ({}): the report was edited after it was written",
                report.run_id,
                stored.cell.id(),
                if stored.verdict.pass { "pass" } else { "fail" },
                if judged.verdict.pass { "pass" } else { "fail" },
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Environment, Incomplete, REPORT_SCHEMA_VERSION};

    fn empty_report() -> Report {
        Report {
            schema_version: REPORT_SCHEMA_VERSION,
            run_id: "20260101-000000-abcd".into(),
            created_unix: 0,
            environment: Environment::detect(1, Path::new("/nonexistent/manifest.json")),
            metric_definitions: crate::report::metric_definitions(),
            thresholds_file: None,
            inputs: None,
            incomplete: None,
            shard: None,
            merged_from: Vec::new(),
            cells: Vec::new(),
        }
    }

    #[test]
    fn a_complete_report_without_failures_passes() {
        let o = outcome(&empty_report());
        assert_eq!(o.n_fail, 0);
        assert_eq!(o.lines, ["0 cells, 0 passed, 0 failed"]);
    }

    #[test]
    fn an_incomplete_report_never_passes() {
        let mut r = empty_report();
        r.incomplete = Some(Incomplete {
            failed_cell: "m/p/ggml".into(),
            error: "boom".into(),
            cells_not_run: 3,
        });
        let o = outcome(&r);
        assert_eq!(o.n_fail, 1);
        assert_eq!(
            o.lines,
            [
                "INCOMPLETE: the run stopped at cell m/p/ggml (3 cells not run): boom",
                "0 cells, 0 passed, 1 failed",
            ]
        );
    }

    #[test]
    fn a_report_file_is_read_and_gated() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("report.json");
        let e = gate_file(&p, None).unwrap_err();
        assert!(format!("{e:#}").contains("report.json"), "{e:#}");
        let mut r = empty_report();
        r.incomplete = Some(Incomplete {
            failed_cell: "c".into(),
            error: "e".into(),
            cells_not_run: 0,
        });
        std::fs::write(&p, crate::report::to_json_pretty(&r).unwrap()).unwrap();
        assert_eq!(gate_file(&p, None).unwrap(), outcome(&r));
    }
}
