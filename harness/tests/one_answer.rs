//! One answer per cell (issue 46, item 3): for every failing cell of a run, its failure line in report.md
//! (the "why"), report.md's first-divergent table, the HTML run page (its reason column and its bisect
//! table) and `lockstep bisect` on the same cell name the same verdict and the same stage — over the
//! mutation suite's faults (`lockstep_engine::faults`, the suite of `tests/mutants.rs`), on seeded models
//! of several architectures, both numerics modes, both oracles.
//!
//! The fault switch is process-wide: nextest runs each test in a process of its own; under `cargo test`
//! the tests of this file take turns ([`SWITCH`]).

mod common;

use std::path::Path;

use common::root;
use lockstep::bisect::{bisect_with, render, BisectOptions};
use lockstep::engine::LockstepEngine;
use lockstep::matrix::Filters;
use lockstep::report::{CellReport, Report};
use lockstep::run::{run, RunOptions};
use lockstep_engine::faults::{self, Fault};

static SWITCH: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The verdict names every view uses (`Finding::name`), longest first where one is a prefix of another.
const NAMES: [&str; 7] = [
    "cannot localize (no layer outputs in the golden)",
    "cannot localize (no inject)",
    "oracle-side rounding",
    "structural",
    "drift",
    "tokens",
    "none",
];

/// (verdict name, stage) read from a verdict headline (`Finding::headline`): `structural at blk.0.k
/// (prefill position 1, ...)`, `cannot localize (no inject): first seen at blk.0.out (...)`, `tokens at
/// token 0 (...)`, `none`.
fn parse_headline(text: &str) -> (String, String) {
    let name = NAMES
        .iter()
        .find(|n| text.starts_with(**n))
        .unwrap_or_else(|| panic!("no verdict name at the start of {text:?}"));
    let rest = &text[name.len()..];
    let stage = if *name == "tokens" {
        "tokens".to_string()
    } else {
        match rest.split_once(" at ") {
            Some((_, after)) if !rest.starts_with(" (") || name.starts_with("cannot") => {
                after.split(' ').next().unwrap_or_default().to_string()
            }
            _ => String::new(),
        }
    };
    (name.to_string(), stage)
}

/// (verdict name, stage) of a first-divergent table row's verdict and stage cells: `oracle-side rounding (3
/// rows)` reads as `oracle-side rounding`; `tokens: position 0 ...` as `tokens`, at `tokens`.
fn from_table(verdict: &str, stage: &str) -> (String, String) {
    let name = NAMES
        .iter()
        .find(|n| verdict.starts_with(**n))
        .unwrap_or_else(|| panic!("no verdict name in the table cell {verdict:?}"));
    let stage = if *name == "tokens" { "tokens" } else { stage };
    (name.to_string(), stage.to_string())
}

/// The failure line ("why") of `id` in report.md, parsed.
fn md_why(md: &str, id: &str) -> (String, String) {
    let line = md
        .lines()
        .find(|l| l.starts_with(&format!("- [{id}](")))
        .unwrap_or_else(|| panic!("report.md lists no failure line for {id}"));
    let (_, tail) = line
        .rsplit_once("; first divergent stage: ")
        .unwrap_or_else(|| panic!("no first divergent stage in {line}"));
    parse_headline(tail)
}

/// The row of `id` in report.md's first-divergent table, parsed.
fn md_table(md: &str, id: &str) -> (String, String) {
    let section = md
        .split("## First divergent stage")
        .nth(1)
        .expect("report.md has a first-divergent section");
    let row = section
        .lines()
        .find(|l| l.starts_with(&format!("| {id} |")))
        .unwrap_or_else(|| panic!("no first-divergent row for {id}"));
    let cells: Vec<&str> = row.split(" | ").collect();
    from_table(cells[1], cells[2])
}

/// Text of an HTML fragment without its tags, entities of `esc` undone.
fn untag(s: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    for ch in s.chars() {
        match ch {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// The cells (untagged) of the rows of the HTML table after `heading` whose first cell is `id`.
fn html_rows(html: &str, heading: &str, id: &str) -> Vec<Vec<String>> {
    let section = html
        .split(heading)
        .nth(1)
        .unwrap_or_else(|| panic!("no {heading:?} on the run page"));
    let table = section.split("</table>").next().unwrap_or_default();
    table
        .split("<tr>")
        .skip(1)
        .map(|row| {
            row.split("<td")
                .skip(1)
                .map(|c| untag(&format!("<td{c}")).trim().to_string())
                .collect::<Vec<_>>()
        })
        .filter(|cells| cells.first().is_some_and(|c| c == id))
        .collect()
}

/// The HTML page's answers for `id`: its reason column in the cells table, and its bisect-table row.
fn html_answers(html: &str, id: &str) -> ((String, String), (String, String)) {
    let cells = html_rows(html, "<h2>Cells</h2>", id);
    let why = cells
        .first()
        .and_then(|c| c.last())
        .unwrap_or_else(|| panic!("no cells-table row for {id}"));
    let (_, tail) = why
        .rsplit_once("; first divergent stage: ")
        .unwrap_or_else(|| panic!("no first divergent stage in the page's reason {why}"));
    let bisect = html_rows(html, "<h2>First divergent stage", id);
    let row = bisect
        .first()
        .unwrap_or_else(|| panic!("no bisect-table row for {id} on the run page"));
    (parse_headline(tail), from_table(&row[1], &row[2]))
}

fn options(reports: &Path, model: &str) -> RunOptions {
    RunOptions {
        golden_dir: root().join("golden"),
        matrix: root().join("ci/matrix.toml"),
        thresholds: root().join("ci/thresholds.toml"),
        reports_root: reports.to_path_buf(),
        filters: Filters {
            model: vec![model.into()],
            ..Filters::default()
        },
        external: None,
        force_external: false,
        serve: None,
        progress: false,
        threads: rayon::current_num_threads(),
        ggml_target: None,
        floors: root().join("ci/floors.json"),
        shard: None,
        select: Default::default(),
    }
}

/// `lockstep bisect` of the cell `c` with our engine (the fault already switched on).
fn bisect_cell(c: &CellReport) -> lockstep::bisect::BisectReport {
    let simd = lockstep_engine::Simd::parse(&c.cell.simd).unwrap();
    let opts = BisectOptions {
        golden_dir: root().join("golden"),
        thresholds: root().join("ci/thresholds.toml"),
        model: c.cell.model.clone(),
        prompt: c.cell.prompt.clone(),
        mode: c.cell.mode,
        oracle: c.cell.oracle.clone(),
        ggml_target: None,
        floors: root().join("ci/floors.json"),
        simd,
    };
    let path = lockstep::fetch::resolve_model(&c.cell.model).unwrap();
    let mut engine = LockstepEngine::load(&path).unwrap().with_simd(simd);
    bisect_with(&opts, &path, &mut engine).unwrap()
}

/// The run page of `report` (as `lockstep publish` renders it).
fn run_page(report: &Report, dir: &Path) -> String {
    let inputs = lockstep::publish::Inputs {
        runs: vec![lockstep::publish::RunInput {
            report: report.clone(),
            dir: dir.to_path_buf(),
        }],
        ..Default::default()
    };
    let files = lockstep::publish::render_site(&inputs).unwrap();
    let (_, bytes) = files
        .iter()
        .find(|(p, _)| p.starts_with("runs/") && p.ends_with("/index.html"))
        .expect("a run page");
    String::from_utf8(bytes.clone()).unwrap()
}

/// The mutation suite's faults (`tests/mutants.rs`, `mutants`), the layer-specific ones at layer 1; the
/// portable-dequantizer fault is left out (it shows only where the portable dequantizer runs).
fn mutants() -> Vec<Fault> {
    Fault::every(1)
        .into_iter()
        .filter(|f| *f != Fault::PortableDequantHalvesSwapped)
        .collect()
}

/// Every fault of the mutation suite on `model`'s cells: each failing cell's four answers agree. Returns
/// the number of failing cells compared.
fn agree_over_faults(model: &str) -> usize {
    let _turn = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let mut compared = 0;
    let mut disagreements = Vec::new();
    let mut all: Vec<Option<Fault>> = vec![None];
    all.extend(mutants().into_iter().map(Some));
    for fault in all {
        faults::set(fault);
        let reports = tempfile::tempdir().unwrap();
        let (dir, report) = run(&options(reports.path(), model))
            .unwrap_or_else(|e| panic!("{model} {fault:?}: {e:#}"));
        let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
        let html = run_page(&report, &dir);
        for c in report.cells.iter().filter(|c| !c.verdict.pass) {
            let id = c.cell.id();
            let b = bisect_cell(c);
            let text = render(&b);
            let first = text.lines().next().unwrap_or_default();
            let bisect = parse_headline(
                first
                    .strip_prefix("verdict: ")
                    .unwrap_or_else(|| panic!("bisect's first line {first:?}")),
            );
            let why = md_why(&md, &id);
            let table = md_table(&md, &id);
            let (page_why, page_table) = html_answers(&html, &id);
            compared += 1;
            let answers = [
                ("report.md why", &why),
                ("report.md table", &table),
                ("page why", &page_why),
                ("page table", &page_table),
            ];
            if answers.iter().any(|(_, a)| **a != bisect) {
                disagreements.push(format!("{fault:?} {id}: bisect {bisect:?}, {answers:?}"));
            }
            // bisect never passes a cell the run fails, and a failing cell is placed
            if b.is_clean() {
                disagreements.push(format!("{fault:?} {id}: bisect exits 0 on a failing cell"));
            }
            if c.finding.as_ref().is_some_and(|f| f.site().is_none())
                && !matches!(c.finding, Some(lockstep::judge::Finding::Tokens { .. }))
                && c.error.is_none()
            {
                disagreements.push(format!(
                    "{fault:?} {id}: a failing cell without a stage: {}",
                    why.0
                ));
            }
        }
    }
    faults::set(None);
    assert!(
        disagreements.is_empty(),
        "{} of {compared} failing cells:\n{}",
        disagreements.len(),
        disagreements.join("\n")
    );
    compared
}

#[test]
fn synth_llama_report_page_and_bisect_give_one_answer_per_failing_cell() {
    assert!(agree_over_faults("synth-llama") > 20);
}

#[test]
fn synth_gemma3_report_page_and_bisect_give_one_answer_per_failing_cell() {
    assert!(agree_over_faults("synth-gemma3") > 20);
}

#[test]
fn synth_qwen2_q4_k_report_page_and_bisect_give_one_answer_per_failing_cell() {
    assert!(agree_over_faults("synth-qwen2-q4_k") > 20);
}
