//! The Markdown summary of a run for a CI page: `$GITHUB_STEP_SUMMARY` (GitHub Actions appends the file
//! a step writes there to the job's summary page). Written by `lockstep run` and `lockstep gate` when that
//! variable is set.

use std::io::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

use super::Report;
use crate::format::{md_code, md_text};

/// The environment variable GitHub Actions sets to the step's summary file.
pub const STEP_SUMMARY_ENV: &str = "GITHUB_STEP_SUMMARY";

/// Render the summary of `r`: a heading with the verdict and counts, the commit and CPU, where the
/// report is (`report_path`, as given), and a table of the failing cells (cell id, failure line), every
/// outside string escaped ([`md_text`], [`md_code`]).
pub fn render_step_summary(r: &Report, title: &str, report_path: &str) -> String {
    let n = r.cells.len();
    let failing: Vec<(String, String)> = r
        .cells
        .iter()
        .filter_map(|c| Some((c.cell.id(), super::cell_failure_line(c)?)))
        .collect();
    let pass = failing.is_empty() && r.incomplete.is_none();
    let mut s = format!(
        "### {} {}: {} — {n} cells, {} passed, {} failed\n\n",
        if pass { "✅" } else { "❌" },
        md_text(title),
        if pass { "PASS" } else { "FAIL" },
        n - failing.len(),
        failing.len()
    );
    s.push_str(&format!(
        "Run {} at commit {} on {}; report {}.\n\n",
        md_code(&r.run_id),
        md_code(
            &r.environment
                .git_commit
                .chars()
                .take(12)
                .collect::<String>()
        ),
        md_text(&r.environment.cpu_model),
        md_code(report_path)
    ));
    if let Some(inc) = &r.incomplete {
        s.push_str(&format!(
            "**INCOMPLETE**: the run stopped at cell {} ({} cells not run): {}\n\n",
            md_code(&inc.failed_cell),
            inc.cells_not_run,
            md_text(&inc.error)
        ));
    }
    if !failing.is_empty() {
        s.push_str("| failing cell | why |\n|---|---|\n");
        for (id, line) in &failing {
            // the line starts with the cell id: keep the reason only
            let why = line.strip_prefix(&format!("FAIL {id}: ")).unwrap_or(line);
            s.push_str(&format!("| {} | {} |\n", md_code(id), md_text(why)));
        }
        s.push('\n');
    }
    s
}

/// Append `text` to the file `$GITHUB_STEP_SUMMARY` names, when it is set and not empty; does nothing
/// otherwise. Returns whether it wrote.
///
/// Errors: the file cannot be opened or written (naming it).
pub fn append_step_summary(text: &str) -> Result<bool> {
    let Some(p) = std::env::var_os(STEP_SUMMARY_ENV).filter(|p| !p.is_empty()) else {
        return Ok(false);
    };
    append_to(Path::new(&p), text)?;
    Ok(true)
}

/// Check the step summary target before any work: when `$GITHUB_STEP_SUMMARY` is set, it names a regular
/// file or nothing yet (it is appended to at the end) — never a FIFO, a device or a directory.
///
/// Errors name the variable, the path and what it is.
pub fn check_step_summary() -> Result<()> {
    let Some(p) = std::env::var_os(STEP_SUMMARY_ENV).filter(|p| !p.is_empty()) else {
        return Ok(());
    };
    let p = Path::new(&p);
    match std::fs::metadata(p) {
        Ok(m) if !m.is_file() => {
            // the same refusal (and words) as the append at the end
            crate::input::open_append(p, &format!("the step summary (${STEP_SUMMARY_ENV})"))
                .map(drop)
        }
        _ => Ok(()),
    }
}

/// Append `text` to `path` (created when missing).
fn append_to(path: &Path, text: &str) -> Result<()> {
    // never a FIFO (the append would block until a reader comes) nor a device
    let mut f =
        crate::input::open_append(path, &format!("the step summary (${STEP_SUMMARY_ENV})"))?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("cannot write the step summary {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_adds_to_what_is_there() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("summary.md");
        std::fs::write(&p, "before\n").unwrap();
        append_to(&p, "after\n").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "before\nafter\n");
    }
}
