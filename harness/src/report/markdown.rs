//! `report.md`: the report for people, summary first. Its head is the verdict, the rollup per model ×
//! numerics mode × oracle (cells, passed, failed, the worst value of each gated metric) and every failing
//! cell with its reason, linked to its detail; the environment, the metric definitions and the per-cell
//! sections follow. The per-cell sections hold every failing cell and a bounded sample of the passing ones
//! ([`shown_cells`]), so a run over the whole matrix stays readable; report.json, results.csv and the
//! HTML run page hold every cell.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use crate::compare::{CellComparison, Phase, StageComparison};
use crate::format::{fmt_cos, fmt_e3, fmt_utc};
use crate::gate::{cell_metrics, is_out_stage};
use crate::judge::Finding;

use super::{CellReport, Report};

pub(crate) fn opt_or_dash(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    match v {
        Some(x) if !x.is_nan() => f(x),
        _ => "—".to_string(),
    }
}

pub(crate) fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

/// `r` with every string that comes from outside lockstep (the matrix's names, paths, engine commands and
/// error messages, stage names of an external engine's dump) passed through [`crate::format::md_text`], so that no
/// input can break report.md's tables or inject markup. Numbers and lockstep's own labels are unchanged.
fn escaped(r: &Report) -> Report {
    let mut r = r.clone();
    let e = |s: &mut String| *s = crate::format::md_text(s);
    e(&mut r.run_id);
    r.thresholds_file.iter_mut().for_each(e);
    if let Some(i) = &mut r.inputs {
        e(&mut i.engine);
        i.engine_cmd.iter_mut().for_each(e);
        i.engine_tokenize_cmd.iter_mut().for_each(e);
        i.engine_serve.iter_mut().for_each(e);
        if let Some(m) = &mut i.stage_map {
            e(&mut m.path);
        }
        e(&mut i.golden_dir);
        for f in [&mut i.golden_manifest, &mut i.matrix, &mut i.thresholds] {
            e(&mut f.path);
        }
    }
    if let Some(inc) = &mut r.incomplete {
        e(&mut inc.failed_cell);
        e(&mut inc.error);
    }
    for c in &mut r.cells {
        let cell = &mut c.cell;
        for f in [
            &mut cell.model,
            &mut cell.prompt,
            &mut cell.quant,
            &mut cell.simd,
            &mut cell.oracle,
            &mut cell.engine,
        ] {
            e(f);
        }
        e(&mut c.golden_path);
        c.error.iter_mut().for_each(e);
        if let Some(x) = &mut c.expected_failure {
            e(&mut x.cell);
            e(&mut x.reason);
            e(&mut x.expires);
        }
        for f in &mut c.verdict.failures {
            f.detail = crate::format::md_text_keep_code(&f.detail);
        }
        for nc in &mut c.comparison.not_compared {
            e(&mut nc.stage);
            e(&mut nc.reason);
        }
        for s in &mut c.comparison.stages {
            e(&mut s.stage);
        }
    }
    r
}

/// The layer sets of a grouped stage pattern, compacted: `0..29`, `0..3,5,7..9`.
pub(crate) fn compact_ranges(layers: &BTreeSet<usize>) -> String {
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

/// `blk.N.kind` → (`blk.{N}.kind`, Some(N)) through the typed id ([`lockstep_engine::Stage::parse`]);
/// other ids unchanged.
pub(crate) fn stage_pattern(stage: &str) -> (String, Option<usize>) {
    match lockstep_engine::Stage::parse(stage) {
        Some(
            st @ lockstep_engine::Stage {
                layer: Some(n),
                kind,
                ..
            },
        ) => (
            format!(
                "{}blk.{{N}}.{}",
                if st.enc { "enc." } else { "" },
                kind.suffix()
            ),
            Some(n),
        ),
        _ => (stage.to_string(), None),
    }
}

pub(crate) fn phase_list(phases: &BTreeSet<Phase>) -> String {
    phases
        .iter()
        .map(Phase::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) fn seq_position(cmp: &CellComparison, s: &StageComparison, row: usize) -> usize {
    crate::gate::seq_position(cmp, s, row)
}

/// Top-1 counts of a cell with the margin tolerance its verdict used (its thresholds'
/// `margin_tolerance`): (exact agreements, near ties, positions).
pub(crate) fn top1_counts(cmp: &CellComparison, margin_tolerance: f64) -> (usize, usize, usize) {
    cmp.logits.iter().fold((0, 0, 0), |(a, t, n), lc| {
        let ties = lc
            .disagreements
            .iter()
            .filter(|p| p.margin < margin_tolerance)
            .count();
        (a + lc.top1_agree, t + ties, n + lc.n_positions)
    })
}

/// The `## Across oracles` section: for every model (and quant) this run held to more than one oracle, the
/// largest NMSE of each stage kind — over its layers, positions (prefill and decode), prompts and SIMD
/// settings — and the largest mean KL of the logits, one column per numerics mode × oracle. Where a
/// model's ggml cells pass against llama.cpp (bit equality), its ggml column against another oracle is
/// llama.cpp's own distance from that oracle: the cross-oracle floor per stage that a reference-mode gap
/// is read against (DESIGN.md §9). A NaN anywhere in a column's values shows as NaN. Empty when no model
/// has two oracles.
fn across_oracles(r: &Report) -> String {
    let mut oracles: BTreeMap<(&str, &str), BTreeSet<&str>> = BTreeMap::new();
    for c in &r.cells {
        oracles
            .entry((&c.cell.model, &c.cell.quant))
            .or_default()
            .insert(&c.cell.oracle);
    }
    let held_twice: Vec<(&str, &str)> = oracles
        .iter()
        .filter(|(_, o)| o.len() > 1)
        .map(|(k, _)| *k)
        .collect();
    let mut md = String::new();
    if held_twice.is_empty() {
        return md;
    }
    let _ = writeln!(md, "## Across oracles\n");
    let _ = writeln!(
        md,
        "Per model, the largest NMSE of each stage kind (over layers, positions, prompts and SIMD settings) and \
         the largest mean KL of the logits, per numerics mode and oracle. `ggml` mode is bit-exact with \
         llama.cpp where its llama.cpp cells pass, so its column against another oracle is llama.cpp's own \
         distance from that oracle: the cross-oracle floor a `reference`-mode gap is read against.\n"
    );
    // NaN wins: a non-finite error is never hidden behind a finite one
    let worse = |a: f64, b: f64| {
        if a.is_nan() || b.is_nan() {
            f64::NAN
        } else {
            a.max(b)
        }
    };
    for (model, quant) in held_twice {
        let cells: Vec<&CellReport> = r
            .cells
            .iter()
            .filter(|c| c.cell.model == model && c.cell.quant == quant)
            .collect();
        let columns: Vec<(String, &str)> = cells
            .iter()
            .map(|c| (c.cell.mode.to_string(), c.cell.oracle.as_str()))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut kinds: Vec<&str> = Vec::new();
        let mut nmse: BTreeMap<(&str, usize), f64> = BTreeMap::new();
        let mut kl: BTreeMap<usize, f64> = BTreeMap::new();
        for c in &cells {
            let key = (c.cell.mode.to_string(), c.cell.oracle.as_str());
            let col = columns.iter().position(|k| *k == key).unwrap_or(0);
            for s in &c.comparison.stages {
                let kind = crate::floors::kind_of(&s.stage);
                if !kinds.contains(&kind) {
                    kinds.push(kind);
                }
                let v = nmse.entry((kind, col)).or_insert(f64::NEG_INFINITY);
                *v = worse(*v, s.nmse.max);
            }
            if let Some(m) = cell_metrics(&c.comparison, c.verdict.margin_tolerance).mean_kl {
                let v = kl.entry(col).or_insert(f64::NEG_INFINITY);
                *v = worse(*v, m);
            }
        }
        let _ = writeln!(md, "**{model}** ({quant}), {} cells\n", cells.len());
        let header: Vec<String> = columns
            .iter()
            .map(|(mode, oracle)| format!("{mode} vs {oracle}"))
            .collect();
        let _ = writeln!(md, "| stage kind | {} |", header.join(" | "));
        let _ = writeln!(md, "|---|{}", "--:|".repeat(columns.len()));
        let cell_text = |v: Option<&f64>| v.map_or("-".to_string(), |v| fmt_e3(*v));
        for kind in &kinds {
            let row: Vec<String> = (0..columns.len())
                .map(|col| cell_text(nmse.get(&(*kind, col))))
                .collect();
            let _ = writeln!(md, "| {kind} (NMSE) | {} |", row.join(" | "));
        }
        let row: Vec<String> = (0..columns.len())
            .map(|col| cell_text(kl.get(&col)))
            .collect();
        let _ = writeln!(md, "| logits (mean KL) | {} |", row.join(" | "));
        md.push('\n');
    }
    md
}

/// Passing cells report.md writes in full per model × numerics mode × oracle group (the failing cells are
/// always all written): the per-cell sections of a run over the whole matrix stay readable, and a run of at
/// most this many cells per group shows every cell. Which ones: [`shown_cells`].
pub const PASSING_SAMPLE_PER_GROUP: usize = 2;

/// A group of cells report.md rolls up and samples: model family ([`Families`]), numerics mode, oracle.
type GroupKey = (String, String, String);

/// The label rolling up every seeded model (`synth-*`, `lockstep synth`) and its variants: tiny fixtures, one
/// prompt each, 77 files in the default matrix; their cells are named one by one wherever one fails.
pub const SEEDED_FAMILY: &str = "seeded models (synth-*)";

/// The model families of a report, for its rollup: a model whose id is another model's of the run followed by
/// `-<suffix>` (a quantization variant: `smollm2-135m-q4_1-q4_k` of `smollm2-135m-q4_1`) belongs to that
/// model's family; every seeded model to [`SEEDED_FAMILY`]. So the rollup of a run over the whole matrix is a
/// screen long (3 downloaded families and the seeded one × modes × oracles), not one row per file.
struct Families {
    /// Model id → family label.
    of: BTreeMap<String, String>,
}

impl Families {
    fn new(r: &Report) -> Families {
        let models: BTreeSet<&str> = r.cells.iter().map(|c| c.cell.model.as_str()).collect();
        let mut of = BTreeMap::new();
        for m in &models {
            let family = if m.starts_with("synth-") {
                SEEDED_FAMILY.to_string()
            } else {
                // the shortest model of the run this one extends (itself when none)
                models
                    .iter()
                    .filter(|b| {
                        m.len() > b.len() && m.starts_with(*b) && m[b.len()..].starts_with('-')
                    })
                    .min_by_key(|b| b.len())
                    .map_or_else(|| m.to_string(), |b| b.to_string())
            };
            of.insert(m.to_string(), family);
        }
        // a family of several files says how many
        let mut files: BTreeMap<String, usize> = BTreeMap::new();
        for f in of.values() {
            *files.entry(f.clone()).or_default() += 1;
        }
        for f in of.values_mut() {
            let n = files[f.as_str()];
            if f.as_str() != SEEDED_FAMILY && n > 1 {
                *f = format!("{f} (+{} variants)", n - 1);
            } else if n > 1 {
                *f = format!("{f}, {n} files");
            }
        }
        Families { of }
    }

    /// The group a cell is rolled up and sampled in: its model's family, numerics mode and oracle.
    fn key(&self, c: &CellReport) -> GroupKey {
        (
            self.of
                .get(&c.cell.model)
                .cloned()
                .unwrap_or_else(|| c.cell.model.clone()),
            c.cell.mode.to_string(),
            c.cell.oracle.clone(),
        )
    }
}

/// The Markdown anchor of cell `index`'s detail (its `###` heading under "Error vs depth"): `cell-<index>`,
/// the index in the report's cell order (the plots' `NN` too), as on the HTML run page.
pub fn cell_anchor(index: usize) -> String {
    format!("cell-{index}")
}

/// Which cells report.md writes in its per-cell sections, by index in `r.cells`: every failing cell, and of
/// each model × mode × oracle group's passing cells the first [`PASSING_SAMPLE_PER_GROUP`] — those that
/// compared per-layer stages (a plot, [`super::has_depth`]) before those that did not, then by cell id. The
/// others are in report.json, results.csv and the HTML run page.
pub fn shown_cells(r: &Report) -> Vec<bool> {
    let mut shown: Vec<bool> = r.cells.iter().map(|c| !c.verdict.pass).collect();
    let mut passing: BTreeMap<GroupKey, Vec<(bool, String, usize)>> = BTreeMap::new();
    let families = Families::new(r);
    for (i, c) in r.cells.iter().enumerate().filter(|(_, c)| c.verdict.pass) {
        passing
            .entry(families.key(c))
            .or_default()
            .push((!super::has_depth(c), c.cell.id(), i));
    }
    for mut group in passing.into_values() {
        group.sort();
        for (_, _, i) in group.into_iter().take(PASSING_SAMPLE_PER_GROUP) {
            shown[i] = true;
        }
    }
    shown
}

/// Fold `v` into the worst value so far `acc` (the larger when `larger_is_worse`, else the smaller); a
/// NaN wins, never hidden behind a finite value. `None` (a cell that has no such metric) changes nothing.
pub(crate) fn fold_worst(acc: &mut Option<f64>, v: Option<f64>, larger_is_worse: bool) {
    let Some(v) = v else { return };
    *acc = Some(match *acc {
        None => v,
        Some(a) if a.is_nan() || v.is_nan() => f64::NAN,
        Some(a) if larger_is_worse => a.max(v),
        Some(a) => a.min(v),
    });
}

/// The rollup table of report.md's head: one row per model × numerics mode × oracle — the groups with a
/// failing cell first (a run over a wide matrix has hundreds of groups), each part in the order the groups
/// first appear among the cells (matrix order) — with its cells, how many pass and fail, and the worst
/// value over its cells of each gated metric — the smallest top-1 agreement (near ties counted as
/// agreeing), the largest mean KL, the smallest top-5 mean and the smallest cosine of `blk.N.out` /
/// `output_norm`. `—` where no cell of the group has the metric (an encoder has no logits). A sentence
/// instead of the table when the run has no cell (an empty shard).
fn rollup(r: &Report) -> String {
    #[derive(Default)]
    struct Row {
        cells: usize,
        failed: usize,
        yardsticks: BTreeSet<String>,
        top1: Option<f64>,
        mean_kl: Option<f64>,
        top5: Option<f64>,
        cos_out: Option<f64>,
    }
    let mut order: Vec<GroupKey> = Vec::new();
    let mut rows: BTreeMap<GroupKey, Row> = BTreeMap::new();
    let families = Families::new(r);
    for c in &r.cells {
        let key = families.key(c);
        if !rows.contains_key(&key) {
            order.push(key.clone());
        }
        let row = rows.entry(key).or_default();
        let m = cell_metrics(&c.comparison, c.verdict.margin_tolerance);
        row.cells += 1;
        row.failed += usize::from(!c.verdict.pass);
        if let Some(y) = c.thresholds.as_ref().map(|t| t.yardstick.as_str()) {
            if !y.is_empty() {
                row.yardsticks.insert(y.to_string());
            }
        }
        fold_worst(
            &mut row.top1,
            (m.positions > 0).then(|| m.top1_agreement()),
            false,
        );
        fold_worst(&mut row.mean_kl, m.mean_kl, true);
        fold_worst(&mut row.top5, m.top5_mean, false);
        fold_worst(
            &mut row.cos_out,
            m.min_cosine_out.as_ref().map(|o| o.cosine),
            false,
        );
    }
    let mut md = String::new();
    let _ = writeln!(md, "## By model, mode and oracle\n");
    if order.is_empty() {
        let _ = writeln!(md, "No cell was run.\n");
        return md;
    }
    let _ = writeln!(
        md,
        "The worst value over each group's cells of every gated metric: top-1 agreement (near ties count as \
         agreeing), mean KL, top-5 mean, and the smallest cosine of blk.N.out and output_norm; the yardstick \
         the group's thresholds hold it to (ci/thresholds.toml). A quantization variant is rolled up with its \
         model, the seeded models together. Groups with a failing cell first.\n"
    );
    let _ = writeln!(
        md,
        "| model | mode | oracle | cells | passed | failed | min top-1 | max mean KL | min top-5 mean | min cos out | yardstick |"
    );
    let _ = writeln!(md, "|---|---|---|--:|--:|--:|--:|--:|--:|--:|---|");
    let fixed4 = |v: f64| {
        if v.is_nan() {
            "nan".to_string()
        } else {
            format!("{v:.4}")
        }
    };
    let dash = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map_or("—".to_string(), f);
    // stable: matrix order within the failing and the passing groups
    order.sort_by_key(|k| rows[k].failed == 0);
    for key in &order {
        let row = &rows[key];
        let (model, mode, oracle) = key;
        let yardstick = if row.yardsticks.is_empty() {
            "—".to_string()
        } else {
            crate::format::md_text(
                &row.yardsticks
                    .iter()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; "),
            )
        };
        let _ = writeln!(
            md,
            "| {model} | {mode} | {oracle} | {} | {} | {} | {} | {} | {} | {} | {yardstick} |",
            row.cells,
            row.cells - row.failed,
            if row.failed == 0 {
                "0".to_string()
            } else {
                format!("**{}**", row.failed)
            },
            dash(row.top1, &fixed4),
            dash(row.mean_kl, &fmt_e3),
            dash(row.top5, &fixed4),
            dash(row.cos_out, &fmt_cos),
        );
    }
    md.push('\n');
    md
}

/// `s` made safe as a Markdown link's text: `[` and `]` backslash-escaped (the rest is escaped already).
fn link_text(s: &str) -> String {
    s.replace('[', "\\[").replace(']', "\\]")
}

/// Render the report as Markdown, summary first: the title and verdict, the rollup per model × mode ×
/// oracle, every failing cell with its reason and a link to its detail ([`cell_anchor`]);
/// then the environment and inputs, the metric definitions, and the per-cell sections — one summary row
/// per cell, SIMD vs scalar, first divergent stages, error vs depth, near ties, inputs — for the cells
/// [`shown_cells`] picks (every failing cell, a sample of the passing ones, one sentence counting the rest),
/// with the sections that are bounded already over every cell: the stage errors across oracles, the
/// rounding probe of failing reference cells, the 10 worst stages and the stages not compared.
pub fn render_markdown(r: &Report) -> String {
    // picked on the names as given (escaping could reorder ids), so it is what `shown_cells` says
    let shown = shown_cells(r);
    let r = &escaped(r);
    let mut md = String::new();
    let env = &r.environment;
    let n_fail = r.cells.iter().filter(|c| !c.verdict.pass).count();
    let n_left_out = shown.iter().filter(|s| !**s).count();
    let _ = writeln!(md, "# lockstep report `{}`\n", r.run_id);
    let verdict = if r.incomplete.is_some() {
        "INCOMPLETE"
    } else if n_fail == 0 {
        "PASS"
    } else {
        "FAIL"
    };
    let fails = match n_fail {
        0 => String::new(),
        1 => ", [1 fails](#failing-cells)".to_string(),
        n => format!(", [{n} fail](#failing-cells)"),
    };
    let n_xfail = r
        .cells
        .iter()
        .filter(|c| !c.verdict.pass && c.expected_failure.is_some())
        .count();
    let n_xpass = r
        .cells
        .iter()
        .filter(|c| c.verdict.pass && c.expected_failure.is_some())
        .count();
    let expected = if n_xfail + n_xpass > 0 {
        format!(
            " Expected failures (`--expected-failures`): {n_xfail} XFAIL (failing as listed, not failing the run), \
             {n_xpass} XPASS (listed but passing, failing the run)."
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        md,
        "**{verdict}**: {} of {} cells pass{fails}.{expected}\n",
        r.cells.len() - n_fail,
        r.cells.len()
    );
    if let Some(inc) = &r.incomplete {
        let _ = writeln!(
            md,
            "The run stopped at cell `{}` ({} cells not run): {}\n",
            inc.failed_cell, inc.cells_not_run, inc.error
        );
    }
    if let Some(note) = r.inputs.as_ref().and_then(|i| i.kv_cache_note.as_ref()) {
        let _ = writeln!(md, "**KV cache**: {note}.\n");
    }
    md.push_str(&rollup(r));

    // Failures, each linked to its cell's detail.
    if n_fail > 0 {
        let _ = writeln!(md, "## <a id=\"failing-cells\"></a>Failures\n");
        for (i, c) in r.cells.iter().enumerate() {
            let id = c.cell.id();
            if let Some(line) = super::cell_failure_line(c) {
                // the line starts with the cell id: keep the reason only
                let why = line.strip_prefix(&format!("FAIL {id}: ")).unwrap_or(&line);
                let xfail = c.expected_failure.as_ref().map_or(String::new(), |e| {
                    format!("**XFAIL** (expected until {}: {}) — ", e.expires, e.reason)
                });
                let _ = writeln!(
                    md,
                    "- [{}](#{}): {xfail}{why}",
                    link_text(&id),
                    cell_anchor(i)
                );
            }
        }
        md.push('\n');
    }

    // The environment and inputs.
    let _ = writeln!(md, "## Environment\n");
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
        let engine = match (&i.engine_cmd, &i.engine_tokenize_cmd, &i.engine_serve) {
            (_, _, Some(s)) => format!(
                "session (`{s}`{}; each cell's engine field is the name it reported)",
                i.stage_map
                    .as_ref()
                    .map_or(String::new(), |m| format!(", stage map `{}`", m.path))
            ),
            (Some(f), Some(t), _) => format!("external one-shot: `{f}` / tokenize `{t}`"),
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

    // Summary: one row per cell shown.
    let _ = writeln!(md, "## Cells\n");
    if n_left_out > 0 {
        let _ = writeln!(
            md,
            "Every failing cell and at most {PASSING_SAMPLE_PER_GROUP} passing cells per rollup group (model family × mode × oracle) \
             (those with per-layer stages first, then by cell id) are shown here and in the per-cell sections \
             below; the other {n_left_out} passing cells are left out of report.md: they are in report.json, \
             results.csv and the HTML run page (`lockstep publish`).\n"
        );
    }
    let _ = writeln!(
        md,
        "| model | prompt | quant | mode | simd | oracle | engine | tokens | top-1 | mean KL | max KL | top-5 mean | min cos out | prefill tok/s | decode tok/s | verdict |"
    );
    let _ = writeln!(
        md,
        "|---|---|---|---|---|---|---|---|--:|--:|--:|--:|--:|--:|--:|---|"
    );
    let shown_only = |i: &(usize, &CellReport)| shown[i.0];
    for (_, c) in r.cells.iter().enumerate().filter(shown_only) {
        let m = cell_metrics(&c.comparison, c.verdict.margin_tolerance);
        let (agree, n_ties, positions) = top1_counts(&c.comparison, c.verdict.margin_tolerance);
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
            if c.error.is_some() {
                "-"
            } else if m.tokens_match {
                "match"
            } else {
                "**differ**"
            },
            agree,
            positions,
            opt_or_dash(m.mean_kl, fmt_e3),
            opt_or_dash(m.max_kl.map(|x| x.0), fmt_e3),
            opt_or_dash(m.top5_mean, |v| format!("{v:.4}")),
            opt_or_dash(m.min_cosine_out.as_ref().map(|o| o.cosine), fmt_cos),
            opt_or_dash(Some(c.speed.prefill_tok_s()), |v| format!("{v:.1}")),
            opt_or_dash(Some(c.speed.decode_tok_s()), |v| format!("{v:.1}")),
            match (c.verdict.pass, c.expected_failure.is_some()) {
                (true, false) => "PASS",
                (false, false) => "**FAIL**",
                (false, true) => "XFAIL",
                (true, true) => "**XPASS**",
            },
        );
    }
    md.push('\n');
    // what the other per-cell sections say when they leave cells out
    let left_out = if n_left_out > 0 {
        format!(" Only the cells shown under Cells: {n_left_out} passing cells are left out.")
    } else {
        String::new()
    };

    // SIMD vs scalar: the output digests of twin cells.
    let pairs = crate::report::simd_pairs(&r.cells);
    if !pairs.is_empty() {
        let _ = writeln!(md, "## SIMD vs scalar\n");
        let _ = writeln!(
            md,
            "Each SIMD cell beside its `simd = off` twin: the sha256 of every stage and the logits the engine \
             computed. In `ggml` mode they must be identical (both kernel sets mirror llama.cpp's; a \
             difference fails the cell as `simd_bits`); in `reference` mode SIMD may reorder sums.{}\n",
            if pairs.iter().any(|p| !shown[p.simd_cell]) {
                format!(
                    " Of all {} pairs, {} are bit-identical; the rows of cells not shown are left out.",
                    pairs.len(),
                    pairs.iter().filter(|p| p.identical).count()
                )
            } else {
                String::new()
            }
        );
        let _ = writeln!(
            md,
            "| model | prompt | quant | mode | simd | output sha256 | scalar sha256 | bit-identical | decode tok/s (simd / scalar) |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
        for p in pairs.iter().filter(|p| shown[p.simd_cell]) {
            let (a, b) = (&r.cells[p.simd_cell], &r.cells[p.scalar_cell]);
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | `{}` | `{}` | {} | {:.1} / {:.1} |",
                a.cell.model,
                a.cell.prompt,
                a.cell.quant,
                a.cell.mode,
                a.cell.simd,
                crate::report::short_sha(a.output_sha256.as_deref()),
                crate::report::short_sha(b.output_sha256.as_deref()),
                if p.identical { "yes" } else { "**no**" },
                a.speed.decode_tok_s(),
                b.speed.decode_tok_s(),
            );
        }
        md.push('\n');
    }

    md.push_str(&across_oracles(r));

    // First divergent stage per cell: bisect's verdict (harness/src/bisect.rs).
    let _ = writeln!(md, "## First divergent stage\n");
    let _ = writeln!(
        md,
        "What `lockstep bisect` concludes for each cell: **structural** (a stage differs from the golden with \
         the golden's own input injected, beyond its floor: a bug, and the cell fails), **oracle-side \
         rounding** (rows beyond the measured floor only where ggml mode, which rounds matmul inputs to 8 bits \
         as llama.cpp does, equals the golden bit for bit and reference mode rerun with that rounding falls within \
         the floor), **drift** (every local error within the floor; \
         the accumulated pass first leaves the stage cutoffs here, or for a failing cell the gate: a layer output \
         below `min_cosine_out`, or `logits` at a failing position), **cannot localize** (no local pass: the \
         engine takes no injected stages — no `inject` — or the golden stores no layer output; the stage is \
         where the accumulated pass is first seen to differ, which may only carry an error that entered \
         earlier), **tokens** (the engine tokenized the prompt otherwise: the first differing token, with ids \
         and pieces), or none. A failing cell's failure line names the same verdict and stage. \"÷ floor\" is the local NMSE \
         over the measured floor (ci/floors.json).{left_out}\n"
    );
    let _ = writeln!(
        md,
        "| cell | verdict | stage | phase | position | cosine | NMSE | ÷ floor |"
    );
    let _ = writeln!(md, "|---|---|---|---|--:|--:|--:|--:|");
    for (_, c) in r.cells.iter().enumerate().filter(shown_only) {
        let row = |verdict: &str, d: &crate::gate::Divergence, ratio: Option<f64>| {
            format!(
                "| {} | {verdict} | {} | {} | {} | {} | {} | {} |",
                c.cell.id(),
                d.stage,
                d.phase,
                d.position,
                if d.cosine.is_nan() {
                    String::new()
                } else {
                    fmt_cos(d.cosine)
                },
                if d.nmse.is_nan() {
                    String::new()
                } else {
                    fmt_e3(d.nmse)
                },
                ratio.map_or("".to_string(), |r| format!("{r:.1}"))
            )
        };
        // the verdict's name and place as every view gives them (Finding::name, site, ratio)
        let line = match (&c.finding, &c.verdict.first_divergent) {
            (Some(f @ Finding::Tokens { position, .. }), _) => format!(
                "| {} | tokens: {} | tokens | prefill | {position} | | | |",
                c.cell.id(),
                crate::format::md_text(&f.tokens_text().unwrap_or_default())
            ),
            (Some(f), _) => {
                let name = f.table_name();
                match f.site() {
                    Some(d) => row(&name, d, f.ratio()),
                    None => format!("| {} | {name} | | | | | | |", c.cell.id()),
                }
            }
            // reports of older versions: the accumulated marker
            (None, Some(d)) => row("marker", d, None),
            (None, None) => format!("| {} | none | | | | | | |", c.cell.id()),
        };
        let _ = writeln!(md, "{line}");
    }
    md.push('\n');
    // the evidence behind each oracle-side-rounding verdict
    for (_, c) in r.cells.iter().enumerate().filter(shown_only) {
        if let Some(Finding::OracleRounding { sites }) = &c.finding {
            let _ = writeln!(
                md,
                "Oracle-side rounding in `{}`: the matmul input llama.cpp rounded to 8 bits, its crest factor \
                 (max|x|/rms) and the NMSE that rounding causes, against the median row of its kind:\n\n```text\n{}\n```\n",
                c.cell.id(),
                crate::judge::render_rounding(sites)
            );
        }
    }

    // The rounding probe of failing reference cells.
    let probed: Vec<(&CellReport, &crate::probe::RoundingProbe)> = r
        .cells
        .iter()
        .filter_map(|c| c.rounding_probe.as_ref().map(|p| (c, p)))
        .collect();
    if !probed.is_empty() {
        let _ = writeln!(
            md,
            "## Rounding probe (failing reference cells)
"
        );
        let _ = writeln!(
            md,
            "Each failing `reference` cell rerun with every matmul input rounded as llama.cpp rounds it (to the \
             weight type's `vec_dot_type`: Q8_0, Q8_1, Q8_K, F16 or BF16) and nothing else of ggml's \
             arithmetic, gated with the cell's own thresholds. A bug does not shrink when llama.cpp's \
             rounding is added; a gap that does was that rounding's sensitivity. Informative: the cell's \
             verdict stays as it is.\n"
        );
        let _ = writeln!(
            md,
            "| cell | top-1 | mean KL | max KL | top-5 mean | with llama.cpp's rounding: top-1 | mean KL | max KL | top-5 mean | gate |"
        );
        let _ = writeln!(md, "|---|--:|--:|--:|--:|--:|--:|--:|--:|---|");
        for (c, p) in probed {
            let m = cell_metrics(&c.comparison, c.verdict.margin_tolerance);
            let gate = if p.verdict.pass {
                "PASS".to_string()
            } else {
                let metrics: Vec<&str> = p
                    .verdict
                    .failures
                    .iter()
                    .map(|f| f.metric.as_str())
                    .collect();
                format!("FAIL ({})", metrics.join(", "))
            };
            let _ = writeln!(
                md,
                "| {} | {}/{} | {} | {} | {} | {}/{} | {} | {} | {} | {gate} |",
                c.cell.id(),
                m.top1_agree,
                m.positions,
                opt_or_dash(m.mean_kl, fmt_e3),
                opt_or_dash(m.max_kl.map(|x| x.0), fmt_e3),
                opt_or_dash(m.top5_mean, |v| format!("{v:.4}")),
                p.top1_agree,
                p.positions,
                opt_or_dash(p.mean_kl, fmt_e3),
                opt_or_dash(p.max_kl, fmt_e3),
                opt_or_dash(p.top5_mean, |v| format!("{v:.4}")),
            );
        }
        md.push('\n');
    }

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
    if n_left_out > 0 {
        let _ = writeln!(md, "{}\n", left_out.trim_start());
    }
    for (i, c) in r.cells.iter().enumerate().filter(shown_only) {
        let _ = writeln!(md, "### <a id=\"{}\"></a>{}\n", cell_anchor(i), c.cell.id());
        match super::no_plot_sentence(&r.cells, i) {
            None => {
                let _ = writeln!(
                    md,
                    "![error vs depth, every stage kind]({})\n",
                    super::plot_file_name(i, c)
                );
            }
            Some(sentence) => {
                let _ = writeln!(md, "{sentence}\n");
            }
        }
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
    let (mut ties_left_out, mut cells_left_out) = (0, 0);
    for (i, c) in r.cells.iter().enumerate() {
        let tol = c.verdict.margin_tolerance;
        if !shown[i] {
            let n = top1_counts(&c.comparison, tol).1;
            ties_left_out += n;
            cells_left_out += usize::from(n > 0);
            continue;
        }
        let ties = c.comparison.logits.iter().flat_map(|lc| {
            lc.disagreements
                .iter()
                .filter(move |p| p.margin < tol)
                .map(move |p| (lc.phase, p))
        });
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
        let _ = writeln!(
            md,
            "{}",
            if n_left_out > 0 {
                "None in the cells shown."
            } else {
                "None."
            }
        );
    }
    if ties_left_out > 0 {
        let _ = writeln!(
            md,
            "\n{ties_left_out} near ties in {cells_left_out} passing cells not shown are left out."
        );
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
            reason,
            cells.len(),
            r.cells.len(),
            items.join(", ")
        );
    }
    md.push('\n');

    // Inputs.
    let _ = writeln!(md, "## Inputs\n");
    if n_left_out > 0 {
        let _ = writeln!(md, "{}\n", left_out.trim_start());
    }
    let _ = writeln!(md, "| cell | model sha256 | golden | golden sha256 |");
    let _ = writeln!(md, "|---|---|---|---|");
    for (_, c) in r.cells.iter().enumerate().filter(shown_only) {
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
