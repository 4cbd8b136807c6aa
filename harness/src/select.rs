//! Choosing cells the way nextest chooses tests: by id pattern (`--cell`), by the last report's failures
//! (`--rerun-failed`), and marking the ones known to fail (`--expected-failures`, an XFAIL list with a
//! reason and an expiry date per entry).
//!
//! A cell's id is `model/prompt/quant/mode/simd-<simd>/oracle/engine` ([`Cell::id`]); its *key* is the id
//! without the last (engine) component ([`cell_key`]), since a report names a cell after the engine that ran
//! it (a session engine's own name) while the matrix names it `lockstep` or `external`.
//!
//! An expected failure is never a skip: the cell runs, is gated as always, and its report keeps the
//! gate's verdict; it is shown as `XFAIL` with its reason and does not fail the run. A listed cell that
//! passes is an `XPASS`, which fails the run (the entry is stale: remove it), and an entry past its expiry
//! date is an error before any cell runs.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::matrix::Cell;
pub use crate::report::ExpectedFailure;
use crate::report::{CellReport, Report};

/// The id of a cell without its last (engine) component: `model/prompt/quant/mode/simd-x/oracle`.
pub fn cell_key(id: &str) -> &str {
    id.rsplit_once('/').map_or(id, |(k, _)| k)
}

/// One `--cell` pattern: a glob (`*`, `?`, `[...]`, `{a,b}`; `*` also crosses `/`) matched against the whole
/// cell id when it holds a glob character, otherwise a substring of the id.
#[derive(Clone, Debug)]
pub struct CellPattern {
    text: String,
    glob: Option<globset::GlobMatcher>,
}

impl CellPattern {
    /// Parse a pattern. Errors: an empty pattern, or a glob that does not parse (the error names it).
    pub fn parse(text: &str) -> Result<Self> {
        if text.trim().is_empty() {
            bail!("an empty cell pattern matches every cell; leave --cell out instead");
        }
        let glob = if text.contains(['*', '?', '[', '{']) {
            Some(
                globset::GlobBuilder::new(text)
                    .literal_separator(false)
                    .build()
                    .with_context(|| format!("cell pattern {text:?} is not a valid glob"))?
                    .compile_matcher(),
            )
        } else {
            None
        };
        Ok(Self {
            text: text.to_string(),
            glob,
        })
    }

    /// The pattern as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether the cell id `id` (or its key, [`cell_key`]) matches.
    pub fn matches(&self, id: &str) -> bool {
        match &self.glob {
            Some(g) => g.is_match(id) || g.is_match(cell_key(id)),
            None => id.contains(&self.text),
        }
    }
}

/// The cells of `cells` whose id matches any of `patterns` (all of them when `patterns` is empty), in
/// order. Errors: a pattern that matches no cell (a typo must not give an empty or partial run), with a few
/// ids that exist.
pub fn filter_by_patterns(cells: Vec<Cell>, patterns: &[CellPattern]) -> Result<Vec<Cell>> {
    if patterns.is_empty() {
        return Ok(cells);
    }
    for p in patterns {
        if !cells.iter().any(|c| p.matches(&c.id())) {
            let some: Vec<String> = cells.iter().take(3).map(Cell::id).collect();
            bail!(
                "--cell {:?} matches none of the {} cells the other filters select (e.g. {}); `lockstep run \
                 --list` lists them",
                p.as_str(),
                cells.len(),
                if some.is_empty() {
                    "none".to_string()
                } else {
                    some.join(", ")
                }
            );
        }
    }
    Ok(cells
        .into_iter()
        .filter(|c| {
            let id = c.id();
            patterns.iter().any(|p| p.matches(&id))
        })
        .collect())
}

/// The report directories under `reports_root` (names starting with a digit, as run ids do), newest last:
/// by the time their `report.json` was written (run ids start with the UTC time to the second only), then by
/// name.
fn report_dirs(reports_root: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(reports_root).with_context(|| {
        format!(
            "--rerun-failed: the reports directory {} cannot be read",
            reports_root.display()
        )
    })?;
    let mut dirs: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.join(crate::report::REPORT_JSON).is_file()
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(|c: char| c.is_ascii_digit()))
        })
        .collect();
    let written = |p: &PathBuf| {
        std::fs::metadata(p.join(crate::report::REPORT_JSON))
            .and_then(|m| m.modified())
            .ok()
    };
    dirs.sort_by(|a, b| written(a).cmp(&written(b)).then_with(|| a.cmp(b)));
    Ok(dirs)
}

/// The newest report under `reports_root` ([`report_dirs`]), read. Errors: no report there.
pub fn last_report(reports_root: &Path) -> Result<(PathBuf, Report)> {
    let dir = report_dirs(reports_root)?.pop().with_context(|| {
        format!(
            "--rerun-failed: no report under {} (a directory named by a run id holding report.json); run \
             once without it first",
            reports_root.display()
        )
    })?;
    let r = crate::report::read_report(&dir)?;
    Ok((dir, r))
}

/// The keys ([`cell_key`]) of the cells a report failed: every cell whose verdict fails and is not an
/// expected failure, an unexpected pass (XPASS), and the cell an incomplete run stopped at.
pub fn failed_keys(r: &Report) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = r
        .cells
        .iter()
        .filter(|c| Outcome::of(c).fails_run())
        .map(|c| cell_key(&c.cell.id()).to_string())
        .collect();
    if let Some(inc) = &r.incomplete {
        out.insert(cell_key(&inc.failed_cell).to_string());
    }
    out
}

/// `--rerun-failed`: the cells of `cells` the last report failed ([`failed_keys`]); a failed cell the
/// matrix (as filtered) no longer has is named on stderr.
pub fn only_failed(cells: Vec<Cell>, report_dir: &Path, failed: &BTreeSet<String>) -> Vec<Cell> {
    let have: BTreeSet<String> = cells
        .iter()
        .map(|c| cell_key(&c.id()).to_string())
        .collect();
    for k in failed.difference(&have) {
        eprintln!(
            "warning: --rerun-failed: cell {k} failed in {} but the filtered matrix has no such cell",
            report_dir.display()
        );
    }
    cells
        .into_iter()
        .filter(|c| failed.contains(cell_key(&c.id())))
        .collect()
}

/// How `lockstep run` narrows and reads its cells beyond the matrix filters.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    /// `--cell`: keep the cells matching any of these (none: every cell).
    pub patterns: Vec<CellPattern>,
    /// `--rerun-failed`: keep only the cells the newest report under the reports directory failed.
    pub rerun_failed: bool,
    /// The expected-failure list (`--expected-failures`); empty when none is given.
    pub expected: ExpectedFailures,
}

impl Selection {
    /// Narrow the matrix's (filtered) cells: by `--cell` patterns, then to the last report's failures.
    /// Errors: a pattern matching nothing; `--rerun-failed` without a report under `reports_root`.
    pub fn apply(&self, cells: Vec<Cell>, reports_root: &Path) -> Result<Vec<Cell>> {
        let cells = filter_by_patterns(cells, &self.patterns)?;
        if !self.rerun_failed {
            return Ok(cells);
        }
        let (dir, last) = last_report(reports_root)?;
        let failed = failed_keys(&last);
        eprintln!(
            "--rerun-failed: {} failed cells in {}",
            failed.len(),
            dir.display()
        );
        Ok(only_failed(cells, &dir, &failed))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpectedFile {
    #[serde(default)]
    expected: Vec<RawEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    cell: String,
    reason: String,
    expires: toml::value::Datetime,
}

/// The expected-failure list (`ci/expected-failures.toml`): `[[expected]]` tables with `cell` (pattern),
/// `reason` and `expires` (a TOML date).
#[derive(Clone, Debug, Default)]
pub struct ExpectedFailures {
    entries: Vec<(CellPattern, ExpectedFailure)>,
}

/// Today's UTC date as `(year, month, day)`.
pub fn today_utc() -> (i64, u32, u32) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, m, d, ..) = crate::format::civil(now);
    (y, m, d)
}

impl ExpectedFailures {
    /// Read and check the file at `path` against the date `today`. Errors (naming the file and the entry):
    /// unreadable or malformed TOML, an unknown key, an empty reason, a pattern that does not parse, an
    /// `expires` that is not a plain date, and an entry whose `expires` is before `today`.
    pub fn load(path: &Path, today: (i64, u32, u32)) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("expected failures {} cannot be read", path.display()))?;
        Self::parse(&text, &path.display().to_string(), today)
    }

    /// [`ExpectedFailures::load`] on text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str, today: (i64, u32, u32)) -> Result<Self> {
        let file: ExpectedFile =
            toml::from_str(text).with_context(|| format!("expected failures {origin}"))?;
        let mut entries = Vec::new();
        for (i, e) in file.expected.into_iter().enumerate() {
            let at = format!("{origin}: [[expected]] entry {} (cell {:?})", i + 1, e.cell);
            let pattern = CellPattern::parse(&e.cell).with_context(|| at.clone())?;
            if e.reason.trim().is_empty() {
                bail!("{at}: `reason` is empty; say why the cell fails and where it is tracked");
            }
            let date = match (e.expires.date, e.expires.time) {
                (Some(d), None) => d,
                _ => bail!(
                    "{at}: `expires = {}` is not a plain date; write it as YYYY-MM-DD",
                    e.expires
                ),
            };
            let expires = (
                i64::from(date.year),
                u32::from(date.month),
                u32::from(date.day),
            );
            if expires < today {
                bail!(
                    "{at}: expired on {} (today is {:04}-{:02}-{:02}); reason was {:?}. Fix the cell, or \
                     renew the entry with a new date and reason",
                    e.expires,
                    today.0,
                    today.1,
                    today.2,
                    e.reason
                );
            }
            entries.push((
                pattern,
                ExpectedFailure {
                    cell: e.cell,
                    reason: e.reason,
                    expires: e.expires.to_string(),
                },
            ));
        }
        Ok(Self { entries })
    }

    /// The first entry covering cell id `id`.
    pub fn find(&self, id: &str) -> Option<&ExpectedFailure> {
        self.entries
            .iter()
            .find(|(p, _)| p.matches(id))
            .map(|(_, e)| e)
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A cell's outcome for the run's exit code: its gate verdict, read with its expected-failure entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Passed, and not expected to fail.
    Pass,
    /// Failed, and not expected to.
    Fail,
    /// Failed as its expected-failure entry says: does not fail the run.
    XFail,
    /// Passed although an entry expects it to fail: fails the run (the entry is stale).
    XPass,
}

impl Outcome {
    /// The outcome of a cell report.
    pub fn of(c: &CellReport) -> Self {
        match (c.verdict.pass, c.expected_failure.is_some()) {
            (true, false) => Self::Pass,
            (false, false) => Self::Fail,
            (false, true) => Self::XFail,
            (true, true) => Self::XPass,
        }
    }

    /// Whether this outcome fails the run.
    pub fn fails_run(self) -> bool {
        matches!(self, Self::Fail | Self::XPass)
    }

    /// `PASS`, `FAIL`, `XFAIL`, `XPASS`.
    pub fn word(self) -> &'static str {
        match self {
            Self::Pass => "PASS",
            Self::Fail => "FAIL",
            Self::XFail => "XFAIL",
            Self::XPass => "XPASS",
        }
    }
}

/// The run's closing summary, as nextest ends: counts by outcome, then one short line per failing,
/// unexpectedly passing and expected-failing cell (`FAIL <id>: <first failing metric>`, `XPASS <id>:
/// listed as expected to fail (<reason>)`, `XFAIL <id>: <reason>`). Each line is at most `width` columns
/// (longer text is cut with `…`; report.md has the full story).
pub fn summary_lines(r: &Report, width: usize) -> Vec<String> {
    let count = |o: Outcome| r.cells.iter().filter(|c| Outcome::of(c) == o).count();
    let mut out = vec![format!(
        "Summary: {} cells: {} passed, {} failed, {} expected failures (XFAIL), {} unexpected passes (XPASS){}",
        r.cells.len(),
        count(Outcome::Pass),
        count(Outcome::Fail),
        count(Outcome::XFail),
        count(Outcome::XPass),
        r.incomplete
            .as_ref()
            .map_or(String::new(), |i| format!(
                "; stopped at {} ({} cells not run)",
                i.failed_cell, i.cells_not_run
            ))
    )];
    for o in [Outcome::Fail, Outcome::XPass, Outcome::XFail] {
        let lines = r.cells.iter().filter(|c| Outcome::of(c) == o).map(|c| {
            let why = match o {
                Outcome::Fail => c.verdict.failures.first().map_or_else(
                    || "failed".to_string(),
                    |f| {
                        // an engine error has no value to show: its message is the reason
                        if f.metric == "engine_error" {
                            format!("{} — {}", crate::gate::failure_value(f), f.detail)
                        } else {
                            crate::gate::failure_value(f)
                        }
                    },
                ),
                Outcome::XPass => format!(
                    "passed but listed as expected to fail ({}); remove the entry",
                    c.expected_failure.as_ref().map_or("", |e| e.cell.as_str())
                ),
                _ => c
                    .expected_failure
                    .as_ref()
                    .map_or(String::new(), |e| e.reason.clone()),
            };
            (c.cell.id(), c.cell.model.clone(), why)
        });
        for line in folded_lines(o.word(), lines) {
            out.push(cut(&line, width));
        }
    }
    out
}

/// The summary's lines of one outcome: `<word> <cell id>: <why>`, where every run of two or more cells of
/// one model with the same reason (an engine that cannot run the model, a missing golden) folds into one
/// line, `<word> <model> (<n> cells): <why>` — 80 refused cells are one line, not 80 (the report and
/// `run --rerun-failed` keep each).
fn folded_lines(word: &str, cells: impl Iterator<Item = (String, String, String)>) -> Vec<String> {
    let mut groups: Vec<(Vec<String>, String, String)> = Vec::new();
    for (id, model, why) in cells {
        match groups.last_mut() {
            Some((ids, m, w)) if *m == model && *w == why => ids.push(id),
            _ => groups.push((vec![id], model, why)),
        }
    }
    groups
        .into_iter()
        .map(|(ids, model, why)| {
            if ids.len() > 1 {
                format!("  {word} {model} ({} cells): {why}", ids.len())
            } else {
                format!("  {word} {}: {why}", ids.join(", "))
            }
        })
        .collect()
}

/// `s` cut to `width` characters, ending in `…` when cut.
fn cut(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(width.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// The width to wrap failure lines at: `COLUMNS` when set (≥ 40), else the terminal's width when stdout is
/// a terminal, else `None` — a log or a pipe gets each failure on one line, for grep.
pub fn terminal_width() -> Option<usize> {
    use std::io::IsTerminal;
    if let Some(c) = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse::<usize>().ok())
        .filter(|&c| c >= 40)
    {
        return Some(c);
    }
    if !std::io::stdout().is_terminal() {
        return None;
    }
    // SAFETY: TIOCGWINSZ writes one `winsize` into the struct we own; a failure leaves it zeroed.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) } == 0;
    Some(if ok && ws.ws_col >= 40 {
        usize::from(ws.ws_col)
    } else {
        100
    })
}

/// The summary's line width: [`terminal_width`], else 120.
pub fn summary_width() -> usize {
    terminal_width().unwrap_or(120)
}

/// A failure line for the terminal: wrapped at `width` ([`wrap_line`]) when there is one, else as is.
pub fn fit_line(s: &str, width: Option<usize>) -> String {
    match width {
        Some(w) => wrap_line(s, w),
        None => s.to_string(),
    }
}

/// Wrap a long line (a cell's failure line) for a terminal: at most `width` columns, continuation lines
/// indented by four spaces ([`textwrap`]).
pub fn wrap_line(s: &str, width: usize) -> String {
    let opts = textwrap::Options::new(width.max(20)).subsequent_indent("    ");
    textwrap::fill(s, opts)
}

#[cfg(test)]
mod tests;
