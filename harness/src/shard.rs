//! `lockstep run --shard I/N` and `lockstep merge`: the expanded matrix split into N deterministic parts
//! that separate machines (a CI job matrix) run, and their reports merged into the one report the whole
//! run would have written.
//!
//! # The split
//!
//! Cells that differ only in their SIMD setting form one *unit* and always land in the same shard, so that
//! each shard's SIMD-vs-scalar check ([`crate::report::gate_simd_identity`]) sees every pair and a merged
//! report needs no re-gating. Units are balanced by their measured cost: with a cost table (an earlier
//! run's `report.json`, whose cells record their wall time, or a JSON object `{"<cell id>": seconds}`), a
//! unit costs the sum of its cells' seconds, a cell missing from the table the mean of those present;
//! without one, a unit costs its number of cells. The units, heaviest first (ties in matrix order), go one
//! by one to the shard with the least cost so far (ties to the lowest index): the greedy *longest
//! processing time first* rule, within 4/3 of the best possible makespan. Every input of the split is the
//! expanded matrix and the cost table, so every shard, on any machine, computes the same split. Each shard
//! runs its cells in matrix order.
//!
//! # The merge
//!
//! [`merge`] takes the reports of shards 1..N of one split (each exactly once), checks that they ran the
//! same inputs (golden manifest, matrix and thresholds files, engine, build) and together cover the
//! whole matrix each shard recorded ([`ShardInfo::matrix_cells`]), and puts their cells back in matrix
//! order. The result equals the unsharded run's report except for the run id, the start time, and the
//! measured times (cell speed and wall seconds).
//!
//! A shard's verdicts are not taken on trust: every cell is judged again from its recorded metrics with
//! the thresholds file ([`check_verdicts`], as `lockstep gate --thresholds` judges), and a cell whose
//! recorded verdict or thresholds its metrics and the file do not give is refused, naming the shard and
//! the cell (an edited `"pass": true` never merges into a passing report).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::matrix::Cell;
pub use crate::report::ShardInfo;
use crate::report::{Incomplete, Report};

/// Which part of a split to run: shard `index` (1-based) of `count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardSpec {
    /// 1..=count.
    pub index: usize,
    /// Number of shards, ≥ 1.
    pub count: usize,
}

impl std::str::FromStr for ShardSpec {
    type Err = String;

    /// Parse `I/N` (1 ≤ I ≤ N ≤ 1000), as `--shard 2/3`.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let bad = || format!("{s:?} is not a shard I/N with 1 <= I <= N <= 1000 (e.g. 2/3)");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let index: usize = i.trim().parse().map_err(|_| bad())?;
        let count: usize = n.trim().parse().map_err(|_| bad())?;
        if index == 0 || count == 0 || index > count || count > 1000 {
            return Err(bad());
        }
        Ok(ShardSpec { index, count })
    }
}

impl std::fmt::Display for ShardSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// Seconds per cell id, for balancing ([`CostTable::load`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CostTable {
    /// Cell id → measured seconds (finite, ≥ 0).
    pub seconds: BTreeMap<String, f64>,
    /// Where it came from, with the file's sha256 (for the report).
    pub source: String,
}

impl CostTable {
    /// Read a cost table: a `report.json` (each cell's recorded wall `seconds`, else its prefill + decode
    /// seconds for reports written before cells recorded it) or a JSON object mapping cell ids to seconds.
    ///
    /// Errors: an unreadable file, invalid JSON, a cost that is negative or not a finite number (naming
    /// the file and the cell), or a table without any cost.
    pub fn load(path: &Path) -> Result<CostTable> {
        let text =
            crate::input::read_string(path, "the cost table", crate::input::MAX_REPORT_BYTES)?;
        let sha = crate::hash::sha256_hex(text.as_bytes());
        let value: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("the cost table {} is not JSON", path.display()))?;
        let mut seconds = BTreeMap::new();
        if value.get("cells").is_some() {
            let r = crate::report::read_report(path)?;
            for c in &r.cells {
                let s = c
                    .seconds
                    .unwrap_or(c.speed.prefill_seconds + c.speed.decode_seconds);
                seconds.insert(c.cell.id(), s);
            }
        } else {
            let obj = value.as_object().with_context(|| {
                format!(
                    "the cost table {} is neither a report.json nor an object of cell id -> seconds",
                    path.display()
                )
            })?;
            for (k, v) in obj {
                let s = v.as_f64().with_context(|| {
                    format!(
                        "the cost table {}: cell {k}: {v} is not a number",
                        path.display()
                    )
                })?;
                seconds.insert(k.clone(), s);
            }
        }
        for (k, s) in &seconds {
            if !s.is_finite() || *s < 0.0 {
                bail!(
                    "the cost table {}: cell {k} costs {s} seconds (must be finite and >= 0)",
                    path.display()
                );
            }
        }
        if seconds.is_empty() {
            bail!("the cost table {} holds no cell", path.display());
        }
        Ok(CostTable {
            seconds,
            source: format!("costs {} (sha256 {})", path.display(), sha),
        })
    }
}

/// The cells with everything but the SIMD setting equal: one unit of the split.
fn unit_key(c: &Cell) -> Cell {
    Cell {
        simd: String::new(),
        ..c.clone()
    }
}

/// The indices (into `cells`, ascending: matrix order) of the cells shard `spec` runs. See the module
/// docs for the rule. `cells` is the whole expanded matrix.
pub fn assign(cells: &[Cell], spec: ShardSpec, costs: Option<&CostTable>) -> Vec<usize> {
    // units in order of first appearance
    let mut units: Vec<(Cell, Vec<usize>)> = Vec::new();
    let mut index_of: BTreeMap<Cell, usize> = BTreeMap::new();
    for (i, c) in cells.iter().enumerate() {
        let k = unit_key(c);
        match index_of.get(&k) {
            Some(&u) => units[u].1.push(i),
            None => {
                index_of.insert(k.clone(), units.len());
                units.push((k, vec![i]));
            }
        }
    }
    // a cell the table does not know costs the mean of those it knows
    let known: Vec<f64> = costs.map_or_else(Vec::new, |t| {
        cells
            .iter()
            .filter_map(|c| t.seconds.get(&c.id()).copied())
            .collect()
    });
    let default = if known.is_empty() {
        1.0
    } else {
        known.iter().sum::<f64>() / known.len() as f64
    };
    let cost_of = |i: usize| -> f64 {
        costs
            .and_then(|t| t.seconds.get(&cells[i].id()).copied())
            .unwrap_or(if costs.is_some() { default } else { 1.0 })
    };
    let mut order: Vec<(f64, usize)> = units
        .iter()
        .enumerate()
        .map(|(u, (_, members))| (members.iter().map(|&i| cost_of(i)).sum(), u))
        .collect();
    // heaviest first; ties in matrix order
    order.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut load = vec![0.0f64; spec.count];
    let mut mine = Vec::new();
    for (cost, u) in order {
        let (s, _) = load
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.total_cmp(b.1).then(a.0.cmp(&b.0)))
            .expect("count >= 1");
        load[s] += cost;
        if s + 1 == spec.index {
            mine.extend(units[u].1.iter().copied());
        }
    }
    mine.sort_unstable();
    mine
}

/// Merge the reports of every shard of one split into the report of the whole run (see the module
/// docs). The merged report gets a new run id, the earliest start time of the shards, no `shard`, and the
/// shards' run ids in `merged_from`.
///
/// Errors (naming the run ids): a report that is not a shard; shards of different splits, matrices,
/// inputs, builds or schema versions (the machines may differ: see [`merged_environment`]); a shard missing or given twice; a cell outside the recorded
/// matrix or run by two shards; cells of the matrix that no shard ran while no shard stopped early; a
/// cell whose recorded verdict `thresholds` and its metrics do not give ([`check_verdicts`]).
pub fn merge(shards: Vec<Report>, thresholds: &crate::gate::Thresholds) -> Result<Report> {
    if shards.is_empty() {
        bail!("nothing to merge: give the report.json of every shard");
    }
    check_verdicts(&shards, thresholds)?;
    let info = |r: &Report| -> Result<ShardInfo> {
        r.shard.clone().with_context(|| {
            format!(
                "report {} is not a shard (it was not run with --shard I/N)",
                r.run_id
            )
        })
    };
    let first = &shards[0];
    let first_info = info(first)?;
    let mut seen = BTreeMap::new();
    for r in &shards {
        let s = info(r)?;
        let same = |what: &str, ok: bool| -> Result<()> {
            if ok {
                Ok(())
            } else {
                bail!(
                    "shards {} and {} differ in {what}: they are not parts of one run",
                    first.run_id,
                    r.run_id
                )
            }
        };
        same("their split (count)", s.count == first_info.count)?;
        same(
            "their matrix (cells)",
            s.matrix_cells == first_info.matrix_cells,
        )?;
        same(
            "how the split was balanced",
            s.balanced_by == first_info.balanced_by,
        )?;
        same("schema version", r.schema_version == first.schema_version)?;
        same(
            "inputs (golden manifest, matrix, thresholds, engine)",
            r.inputs == first.inputs,
        )?;
        // the build must be one; the machines may differ (a CI job matrix draws runners from a fleet)
        let build = |e: &crate::report::Environment| {
            (
                e.git_commit.clone(),
                e.git_dirty,
                e.lockstep_version.clone(),
                e.rustc.clone(),
                e.golden_manifest_sha256.clone(),
            )
        };
        same(
            "build (commit, lockstep version, rustc, golden manifest)",
            build(&r.environment) == build(&first.environment),
        )?;
        same(
            "thresholds file",
            r.thresholds_file == first.thresholds_file,
        )?;
        same(
            "metric definitions",
            r.metric_definitions == first.metric_definitions,
        )?;
        if let Some(other) = seen.insert(s.index, r.run_id.clone()) {
            bail!(
                "shard {}/{} is given twice (runs {other} and {})",
                s.index,
                s.count,
                r.run_id
            );
        }
    }
    let missing: Vec<String> = (1..=first_info.count)
        .filter(|i| !seen.contains_key(i))
        .map(|i| format!("{i}/{}", first_info.count))
        .collect();
    if !missing.is_empty() {
        bail!("shard(s) {} missing from the merge", missing.join(", "));
    }
    let position: BTreeMap<&str, usize> = first_info
        .matrix_cells
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i))
        .collect();
    let mut placed: Vec<(usize, crate::report::CellReport)> = Vec::new();
    let mut owner: BTreeMap<usize, &str> = BTreeMap::new();
    for r in &shards {
        for c in &r.cells {
            let id = c.cell.id();
            let &p = position.get(id.as_str()).with_context(|| {
                format!(
                    "shard {} ran cell {id}, which is not in the matrix it recorded",
                    r.run_id
                )
            })?;
            if let Some(o) = owner.insert(p, &r.run_id) {
                bail!("cell {id} was run by two shards ({o} and {})", r.run_id);
            }
            placed.push((p, c.clone()));
        }
    }
    placed.sort_by_key(|(p, _)| *p);
    // shards that stopped early: the merged run stopped early too (the first one, in shard order)
    let mut stopped: Vec<(&usize, &Incomplete)> = shards
        .iter()
        .filter_map(|r| Some((&r.shard.as_ref()?.index, r.incomplete.as_ref()?)))
        .collect();
    stopped.sort_by_key(|(i, _)| **i);
    let not_run = first_info.matrix_cells.len() - placed.len();
    let incomplete = match stopped.first() {
        Some((i, inc)) => Some(Incomplete {
            failed_cell: inc.failed_cell.clone(),
            error: format!(
                "shard {i}/{}: {}{}",
                first_info.count,
                inc.error,
                if stopped.len() > 1 {
                    format!(" (and {} more shard(s) stopped early)", stopped.len() - 1)
                } else {
                    String::new()
                }
            ),
            cells_not_run: not_run.saturating_sub(1),
        }),
        None if not_run > 0 => {
            let ids: BTreeSet<usize> = owner.keys().copied().collect();
            let absent = (0..first_info.matrix_cells.len())
                .find(|p| !ids.contains(p))
                .map(|p| first_info.matrix_cells[p].clone())
                .unwrap_or_default();
            bail!(
                "{not_run} cell(s) of the matrix were run by no shard (first: {absent}), though no shard \
                 stopped early: the shards were not run with the same matrix and filters"
            );
        }
        None => None,
    };
    let mut merged_from: Vec<(usize, String)> = shards
        .iter()
        .map(|r| (r.shard.as_ref().map_or(0, |s| s.index), r.run_id.clone()))
        .collect();
    merged_from.sort();
    Ok(Report {
        schema_version: first.schema_version,
        run_id: crate::report::new_run_id(),
        created_unix: shards.iter().map(|r| r.created_unix).min().unwrap_or(0),
        environment: merged_environment(&shards),
        metric_definitions: first.metric_definitions.clone(),
        thresholds_file: first.thresholds_file.clone(),
        inputs: first.inputs.clone(),
        incomplete,
        shard: None,
        merged_from: merged_from.into_iter().map(|(_, id)| id).collect(),
        cells: placed.into_iter().map(|(_, c)| c).collect(),
    })
}

/// Judge every cell of every shard again from its recorded metrics with `thresholds` (as
/// [`crate::regate::regate`] does for `lockstep gate --thresholds`: the gate's evaluation, an engine
/// error's verdict, the bisect finding, the SIMD-identity check) and compare with what the shard recorded.
///
/// Errors, naming the shard (index and run id) and the cell: a recorded verdict the metrics do not give
/// (a shard edited after it ran: a failing cell turned `"pass": true`, a failure dropped), recorded cell
/// thresholds other than the file's; a cell the file has no thresholds for.
pub fn check_verdicts(shards: &[Report], thresholds: &crate::gate::Thresholds) -> Result<()> {
    for r in shards {
        let name = match &r.shard {
            Some(s) => format!("shard {}/{} (run {})", s.index, s.count, r.run_id),
            None => format!("report {}", r.run_id),
        };
        let mut again = r.clone();
        crate::regate::regate(&mut again, thresholds)
            .with_context(|| format!("{name}: judging its cells again"))?;
        for (stored, judged) in r.cells.iter().zip(&again.cells) {
            let id = stored.cell.id();
            let word = |pass: bool| if pass { "pass" } else { "fail" };
            if !crate::regate::same_verdict(&stored.verdict, &judged.verdict) {
                bail!(
                    "{name}, cell {id}: its recorded verdict ({}, {} failed threshold(s)) is not what its \
                     metrics give with {} ({}, {} failed threshold(s)): the shard was edited after it ran \
                     or judged with other thresholds; run the shard again",
                    word(stored.verdict.pass),
                    stored.verdict.failures.len(),
                    thresholds.origin,
                    word(judged.verdict.pass),
                    judged.verdict.failures.len()
                );
            }
            if let Some(t) = &stored.thresholds {
                if *t != thresholds.for_cell(&stored.cell)? {
                    bail!(
                        "{name}, cell {id}: its recorded thresholds are not those {} gives the cell: the \
                         shard was edited after it ran or judged with other thresholds; run the shard again",
                        thresholds.origin
                    );
                }
            }
        }
    }
    Ok(())
}

/// The merged report's environment: shard 1's; when the shards ran on different CPUs (a CI fleet), the
/// CPU models joined with ` | ` in shard order and only the flags every shard had, so the report does
/// not claim one machine.
fn merged_environment(shards: &[Report]) -> crate::report::Environment {
    let mut ordered: Vec<&Report> = shards.iter().collect();
    ordered.sort_by_key(|r| r.shard.as_ref().map_or(0, |s| s.index));
    let mut env = ordered[0].environment.clone();
    let mut models: Vec<&str> = Vec::new();
    for r in &ordered {
        if !models.contains(&r.environment.cpu_model.as_str()) {
            models.push(&r.environment.cpu_model);
        }
    }
    if models.len() > 1 {
        env.cpu_model = models.join(" | ");
        env.cpu_flags
            .retain(|f| ordered.iter().all(|r| r.environment.cpu_flags.contains(f)));
    }
    env
}

/// `lockstep merge`: read every shard's report.json, [`merge`] them and write the merged report into
/// `reports_root/<new run id>/` (atomically, with its Markdown, CSV and plots as `lockstep run` writes
/// them). Returns the directory and the report.
///
/// `thresholds` is the thresholds file the shards were run with (its sha256 must be the one they
/// recorded); every cell is judged again with it ([`check_verdicts`]).
///
/// Errors: an unreadable report (naming the file), an unreadable thresholds file or one other than the
/// shards', and those of [`merge`].
pub fn merge_files(
    paths: &[PathBuf],
    reports_root: &Path,
    thresholds: &Path,
) -> Result<(PathBuf, Report)> {
    let shards = paths
        .iter()
        .map(|p| crate::report::read_report(&report_json_of(p)))
        .collect::<Result<Vec<_>>>()?;
    // the shards were judged with one file (merge checks they agree): this must be it
    let sha = crate::hash::sha256_file(thresholds)
        .with_context(|| format!("--thresholds {}", thresholds.display()))?;
    for r in &shards {
        if let Some(recorded) = r.inputs.as_ref().map(|i| &i.thresholds) {
            if recorded.sha256 != sha {
                bail!(
                    "--thresholds {} (sha256 {}) is not the thresholds file shard run {} was judged with \
                     ({}, sha256 {}): give that file, so its verdicts can be checked",
                    thresholds.display(),
                    &sha[..12],
                    r.run_id,
                    recorded.path,
                    recorded.sha256.chars().take(12).collect::<String>()
                );
            }
        }
    }
    let merged = merge(shards, &crate::gate::Thresholds::load(thresholds)?)?;
    crate::report::check_reports_dir(reports_root)?;
    let dir = crate::report::write_report(reports_root, &merged)?;
    Ok((dir, merged))
}

/// A report directory names its `report.json`; a file is taken as is.
fn report_json_of(p: &Path) -> PathBuf {
    if p.is_dir() {
        p.join(crate::report::REPORT_JSON)
    } else {
        p.to_path_buf()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_engine::NumericsMode;

    fn cell(model: &str, mode: NumericsMode, simd: &str) -> Cell {
        Cell {
            model: model.into(),
            prompt: "p".into(),
            quant: "Q".into(),
            mode,
            simd: simd.into(),
            oracle: "o".into(),
            engine: "lockstep".into(),
        }
    }

    fn matrix() -> Vec<Cell> {
        let mut v = Vec::new();
        for m in ["a", "b", "c", "d"] {
            for mode in [NumericsMode::Reference, NumericsMode::Ggml] {
                for s in ["off", "avx2"] {
                    v.push(cell(m, mode, s));
                }
            }
        }
        v
    }

    #[test]
    fn shard_spec_parses_and_refuses() {
        assert_eq!(
            "2/3".parse::<ShardSpec>().unwrap(),
            ShardSpec { index: 2, count: 3 }
        );
        for bad in ["0/3", "4/3", "3", "a/b", "1/0", "", "1/1001"] {
            assert!(bad.parse::<ShardSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn shards_partition_the_matrix_and_keep_simd_twins_together() {
        let cells = matrix();
        for n in 1..=5 {
            let spec = |i| ShardSpec { index: i, count: n };
            let parts: Vec<Vec<usize>> = (1..=n).map(|i| assign(&cells, spec(i), None)).collect();
            let mut all: Vec<usize> = parts.iter().flatten().copied().collect();
            all.sort_unstable();
            assert_eq!(all, (0..cells.len()).collect::<Vec<_>>(), "n = {n}");
            for p in &parts {
                for &i in p {
                    let twins = cells
                        .iter()
                        .enumerate()
                        .filter(|(_, c)| unit_key(c) == unit_key(&cells[i]))
                        .map(|(j, _)| j);
                    for j in twins {
                        assert!(p.contains(&j), "cell {i} and its twin {j} split, n = {n}");
                    }
                }
            }
            // by count: 8 units of 2 cells, as even as units allow
            let sizes: Vec<usize> = parts.iter().map(Vec::len).collect();
            let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            assert!(hi - lo <= 2, "n = {n}: {sizes:?}");
        }
    }

    #[test]
    fn costs_balance_the_split() {
        let cells = matrix();
        // model `a` in reference mode is expensive: 10 s per cell, every other cell 1 s
        let seconds = cells
            .iter()
            .map(|c| {
                let heavy = c.model == "a" && c.mode == NumericsMode::Reference;
                (c.id(), if heavy { 10.0 } else { 1.0 })
            })
            .collect();
        let t = CostTable {
            seconds,
            source: "test".into(),
        };
        let cost = |idx: &[usize]| -> f64 { idx.iter().map(|&i| t.seconds[&cells[i].id()]).sum() };
        let parts: Vec<Vec<usize>> = (1..=2)
            .map(|i| assign(&cells, ShardSpec { index: i, count: 2 }, Some(&t)))
            .collect();
        // the 20-s unit alone on one shard, the seven 2-s units on the other: the best makespan
        let c: Vec<f64> = parts.iter().map(|p| cost(p)).collect();
        assert_eq!(c, vec![20.0, 14.0], "{parts:?}");
        // counting cells instead puts three more units beside the heavy one
        let by_count = assign(&cells, ShardSpec { index: 1, count: 2 }, None);
        assert_eq!(cost(&by_count), 26.0);
    }

    #[test]
    fn cost_table_refuses_bad_numbers_naming_the_cell() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("c.json");
        std::fs::write(&p, r#"{"x/y": -1}"#).unwrap();
        let e = format!("{:#}", CostTable::load(&p).unwrap_err());
        assert!(e.contains("x/y") && e.contains("c.json"), "{e}");
        std::fs::write(&p, r#"{"x/y": "fast"}"#).unwrap();
        let e = format!("{:#}", CostTable::load(&p).unwrap_err());
        assert!(e.contains("x/y") && e.contains("not a number"), "{e}");
        std::fs::write(&p, r#"{"x/y": 2.5}"#).unwrap();
        assert_eq!(CostTable::load(&p).unwrap().seconds["x/y"], 2.5);
    }
}
