//! Report formats pinned by insta snapshots (`tests/snapshots/`), on a small hand-built, deterministic
//! report: two cells, one passing (ggml mode) and one failing (reference mode: a top-1 mismatch, a near
//! tie, a layer output below the cosine gate, an NMSE of +∞, no decode timing). Also: report.json
//! round-trips through `read_report` (infinities included), and `write_report` leaves nothing behind
//! when it fails. A large report (144 cells, 3 failing) pins report.md's head — verdict, rollup, failures
//! linked to their detail — and the sample of passing cells its per-cell sections hold.
//!
//! Update the snapshots with `INSTA_UPDATE=always cargo test -p lockstep --test report_snapshots`, then
//! read the `.snap` diffs before committing them.

use std::path::Path;

use lockstep::compare::{summarize_logits, CellComparison, NotCompared, Phase, StageComparison};
use lockstep::gate::{evaluate, Thresholds};
use lockstep::matrix::{golden_path_for, Cell};
use lockstep::metrics::{LogitPosition, Summary};
use lockstep::report::failure_lines;
use lockstep::report::{
    metric_definitions, read_report, render_csv, render_markdown, write_report, CellReport,
    Environment, Report, Speed, REPORT_SCHEMA_VERSION,
};

const THRESHOLDS: &str = r#"
[[rule]]
tokens_must_match = true
min_top1_agreement = 1.0
min_top5_mean = 0.9
margin_tolerance = 0.01
max_mean_kl = 1e-3
min_cosine_out = 0.9999
stage_min_cosine = 0.999

[[rule]]
mode = "reference"
max_mean_kl = 5e-3
min_cosine_out = 0.999
stage_min_cosine = 0.99
"#;

fn cell(prompt: &str, mode: &str) -> Cell {
    Cell {
        model: "smollm2-135m-q4_1".into(),
        prompt: prompt.into(),
        quant: "Q4_1".into(),
        mode: mode.parse().unwrap(),
        simd: "off".into(),
        oracle: "llama.cpp-f32kv".into(),
        engine: "lockstep".into(),
    }
}

fn stage(id: &str, phase: Phase, cos: &[f64], nmse: &[f64]) -> StageComparison {
    let s = |v: &[f64]| Summary::of(v.iter().copied()).unwrap();
    let worst = (0..cos.len())
        .min_by(|&a, &b| cos[a].total_cmp(&cos[b]))
        .unwrap();
    let rmse: Vec<f64> = nmse
        .iter()
        .map(|n| if n.is_finite() { n.sqrt() * 0.1 } else { 0.25 })
        .collect();
    StageComparison {
        stage: id.into(),
        phase,
        layer: lockstep::compare::layer_of(id),
        width: 576,
        cosine: s(cos),
        nmse: s(nmse),
        rmse: s(&rmse),
        mean_abs: s(&rmse),
        max_abs: rmse.iter().fold(0.0, |a: f64, &b| a.max(b)) * 4.0,
        bit_exact: nmse.iter().all(|&n| n == 0.0),
        worst_position: worst,
        cosine_by_position: cos.to_vec(),
        nmse_by_position: nmse.to_vec(),
        storage: Some(lockstep::npz::Dtype::F32),
        exact_at_storage_by_position: nmse.iter().map(|&n| n == 0.0).collect(),
        positions: Vec::new(),
    }
}

fn pos(
    position: usize,
    ref_top: u32,
    eng_top: u32,
    margin: f64,
    kl: Option<f64>,
    top5: f64,
) -> LogitPosition {
    LogitPosition {
        position,
        ref_top,
        eng_top,
        margin,
        ref_gap: if ref_top == eng_top { 1.25 } else { margin },
        top5,
        top10: 1.0,
        kl,
        entropy_ref: kl.map(|k| 2.5 + k),
        entropy_eng: 2.5,
        dp_top: kl.map(|k| k / 2.0),
    }
}

/// Prompt of 3 tokens, 2 decode steps; `bad` = the failing variant.
fn comparison(bad: bool) -> CellComparison {
    let (c0, c1, n1) = if bad {
        (
            [0.999_95, 0.999_91, 0.999_93],
            [0.9992, 0.99871, 0.99902],
            [1.6e-3, 2.58e-3, 1.96e-3],
        )
    } else {
        (
            [0.999_999_8, 0.999_999_5, 0.999_999_7],
            [0.999_999_1, 0.999_998_4, 0.999_999],
            [1.8e-6, 3.2e-6, 2.0e-6],
        )
    };
    let n0: Vec<f64> = c0.iter().map(|c| 2.0 * (1.0 - c)).collect();
    let mut stages = vec![
        stage("embed", Phase::Prefill, &[1.0, 1.0, 1.0], &[0.0, 0.0, 0.0]),
        stage("blk.0.attn_norm", Phase::Prefill, &c0, &n0),
        // A reference row of zeros (BOS position): NMSE is +inf there.
        stage(
            "blk.0.ffn_act",
            Phase::Prefill,
            &[if bad { 0.0 } else { 1.0 }, c0[1], c0[2]],
            &[if bad { f64::INFINITY } else { 0.0 }, n0[1], n0[2]],
        ),
        stage("blk.0.out", Phase::Prefill, &c0, &n0),
        stage("blk.1.out", Phase::Prefill, &c1, &n1),
        stage("output_norm", Phase::Prefill, &c1, &n1),
        stage("embed", Phase::Decode, &[1.0, 1.0], &[0.0, 0.0]),
        stage("blk.0.out", Phase::Decode, &c0[..2], &n0[..2]),
        stage("blk.1.out", Phase::Decode, &c1[..2], &n1[..2]),
        stage("output_norm", Phase::Decode, &c1[1..], &n1[1..]),
    ];
    if !bad {
        stages.retain(|s| s.stage != "embed" || s.phase == Phase::Prefill);
    }
    let mut not_compared = Vec::new();
    for phase in [Phase::Prefill, Phase::Decode] {
        for layer in 0..2 {
            not_compared.push(NotCompared {
                stage: format!("blk.{layer}.attn_proj"),
                phase,
                reason: "the oracle exposes no such node".into(),
            });
            not_compared.push(NotCompared {
                stage: format!("blk.{layer}.q"),
                phase,
                reason: "not stored in this golden".into(),
            });
        }
    }
    if !bad {
        not_compared.push(NotCompared {
            stage: "embed".into(),
            phase: Phase::Decode,
            reason: "the engine did not emit it".into(),
        });
    }
    let prefill = if bad {
        vec![
            pos(0, 504, 504, 0.0, None, 1.0),
            pos(1, 909, 198, 0.53, None, 0.8),
            pos(2, 30, 30, 0.0, Some(4.2e-3), 1.0),
        ]
    } else {
        vec![
            pos(0, 504, 504, 0.0, None, 1.0),
            pos(1, 909, 909, 0.0, None, 1.0),
            pos(2, 30, 30, 0.0, Some(3.1e-6), 1.0),
        ]
    };
    let decode = if bad {
        vec![
            pos(3, 12, 17, 0.0046875, Some(8.5e-3), 0.8),
            pos(4, 2, 2, 0.0, Some(2.25e-3), 1.0),
        ]
    } else {
        vec![
            pos(3, 12, 12, 0.0, Some(4.4e-6), 1.0),
            pos(4, 2, 2, 0.0, Some(1.9e-6), 1.0),
        ]
    };
    CellComparison {
        golden_tokens: vec![1, 504, 909],
        engine_tokens: vec![1, 504, 909],
        stages,
        not_compared,
        logits: vec![
            summarize_logits(Phase::Prefill, prefill),
            summarize_logits(Phase::Decode, decode),
        ],
    }
}

/// One cell of the fixture, gated with `th`: `bad` = the failing variant of [`comparison`], with bisect's
/// structural finding.
fn cell_report(th: &Thresholds, c: Cell, bad: bool, speed: Speed) -> CellReport {
    let comparison = comparison(bad);
    let cell_th = th.for_cell(&c).unwrap();
    let mut verdict = evaluate(&c, &comparison, &cell_th);
    // bisect's verdict: the broken cell's bug is named with the golden's input injected
    let finding = if bad {
        lockstep::judge::Finding::Structural {
            at: lockstep::gate::Divergence {
                stage: "blk.0.ffn_act".into(),
                phase: lockstep::compare::Phase::Prefill,
                position: 0,
                cosine: 0.0,
                nmse: 1.0,
            },
            floor: "measured floor NMSE 4.880e-3 (4 × p99 1.220e-3 of `ffn_act` over 690 rows)"
                .into(),
            ratio: Some(204.9),
        }
    } else {
        lockstep::judge::Finding::None
    };
    lockstep::judge::gate_finding(&mut verdict, &finding);
    let ggml_target = (c.mode == lockstep_engine::NumericsMode::Ggml).then(|| "avx512".to_string());
    CellReport {
        golden_path: golden_path_for(&c),
        cell: c,
        model_sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53".into(),
        golden_sha256: if bad {
            "9f0e".repeat(16)
        } else {
            "1a2b".repeat(16)
        },
        ggml_target,
        comparison,
        speed,
        verdict,
        thresholds: Some(cell_th),
        finding: Some(finding),
        local_nmse_by_layer: if bad { vec![1e-4, 1.0] } else { Vec::new() },
        output_sha256: Some(if bad {
            "e3b0".repeat(16)
        } else {
            "5d41".repeat(16)
        }),
        error: None,
        rounding_probe: None,
        seconds: None,
        expected_failure: None,
    }
}

/// The fixture's report around `cells`: a fixed run id, time and machine.
fn report_of(cells: Vec<CellReport>) -> Report {
    Report {
        schema_version: REPORT_SCHEMA_VERSION,
        run_id: "20261122-221501-53b3529".into(),
        created_unix: 1_795_385_701,
        environment: Environment {
            cpu_model: "Test CPU @ 2.00GHz".into(),
            cpu_flags: vec!["avx".into(), "avx2".into(), "fma".into(), "f16c".into()],
            threads: 2,
            git_commit: "53b3529aa11c0b4b0a0d2f4e3c1a7b9d8e6f5a40".into(),
            git_dirty: true,
            rustc: "rustc 1.95.0 (59807616e 2026-04-14)".into(),
            os: "linux x86_64 6.8.0".into(),
            lockstep_version: "0.1.0".into(),
            golden_manifest_sha256: "c0ffee".repeat(10) + "abcd",
        },
        metric_definitions: metric_definitions(),
        thresholds_file: Some("ci/thresholds.toml".into()),
        inputs: None,
        incomplete: None,
        shard: None,
        merged_from: Vec::new(),
        cells,
    }
}

fn report() -> Report {
    let th = Thresholds::parse(THRESHOLDS, "ci/thresholds.toml").unwrap();
    let mk = |c: Cell, bad: bool, speed: Speed| cell_report(&th, c, bad, speed);
    report_of(vec![
        mk(
            cell("prose", "ggml"),
            false,
            Speed {
                prefill_tokens: 3,
                prefill_seconds: 0.012,
                decode_tokens: 2,
                decode_seconds: 0.025,
            },
        ),
        mk(
            Cell {
                simd: "avx2".into(),
                ..cell("prose", "ggml")
            },
            false,
            Speed {
                prefill_tokens: 3,
                prefill_seconds: 0.003,
                decode_tokens: 2,
                decode_seconds: 0.005,
            },
        ),
        mk(
            cell("prose", "reference"),
            true,
            Speed {
                prefill_tokens: 3,
                prefill_seconds: 0.02,
                decode_tokens: 0,
                decode_seconds: 0.0,
            },
        ),
    ])
}

#[test]
fn the_verdicts_are_what_the_fixture_says() {
    let r = report();
    assert!(r.cells[0].verdict.pass, "{:#?}", r.cells[0].verdict);
    assert!(r.cells[1].verdict.pass, "{:#?}", r.cells[1].verdict);
    assert!(!r.cells[2].verdict.pass);
    let lines = failure_lines(&r);
    assert_eq!(lines.len(), 1);
    let l = &lines[0];
    assert!(
        l.starts_with(
            "FAIL smollm2-135m-q4_1/prose/Q4_1/reference/simd-off/llama.cpp-f32kv/lockstep: "
        ),
        "{l}"
    );
    assert!(l.contains("top1_agreement = 0.8 (threshold 1)"), "{l}");
    assert!(
        l.contains("prefill position 1, ref top 909 vs engine 198 (margin 0.53)"),
        "{l}"
    );
    assert!(!l.contains("mean_kl"), "mean KL 4.98e-3 is below 5e-3: {l}");
    assert!(
        l.contains("min_cosine_out = 0.99871 (threshold 0.999)"),
        "{l}"
    );
    assert!(
        // the cell's verdict and stage, as its first-divergent row and bisect give them
        l.contains(
            "first divergent stage: structural at blk.0.ffn_act (prefill position 0, cosine 0.00000000)"
        ),
        "{l}"
    );
}

#[test]
fn a_ggml_simd_cell_whose_output_differs_from_its_scalar_twin_fails_as_simd_bits() {
    let mut r = report();
    lockstep::report::gate_simd_identity(&mut r.cells);
    assert!(r.cells[1].verdict.pass, "identical digests pass");
    r.cells[1].output_sha256 = Some("0bad".repeat(16));
    lockstep::report::gate_simd_identity(&mut r.cells);
    assert!(!r.cells[1].verdict.pass);
    let f = r.cells[1].verdict.failures.last().unwrap();
    assert_eq!(f.metric, "simd_bits");
    assert!(
        f.detail.contains("0bad0bad0bad vs 5d415d415d41"),
        "{}",
        f.detail
    );
    let md = lockstep::report::render_markdown(&r);
    assert!(md.contains("## SIMD vs scalar"), "{md}");
    assert!(md.contains("| **no** |"), "{md}");
    // a reference-mode pair is reported, not failed (SIMD may reorder sums there)
    let mut r = report();
    r.cells[0].cell.mode = lockstep_engine::NumericsMode::Reference;
    r.cells[1].cell.mode = lockstep_engine::NumericsMode::Reference;
    r.cells[1].output_sha256 = Some("0bad".repeat(16));
    lockstep::report::gate_simd_identity(&mut r.cells);
    assert!(r.cells[1].verdict.pass);
}

#[test]
fn report_md_snapshot() {
    insta::assert_snapshot!("report_md", render_markdown(&report()));
}

#[test]
fn results_csv_snapshot() {
    insta::assert_snapshot!("results_csv", render_csv(&report()).unwrap());
}

#[test]
fn junit_xml_snapshot() {
    insta::assert_snapshot!(
        "junit_xml",
        lockstep::report::render_junit(&report(), "lockstep run").unwrap()
    );
}

#[test]
fn step_summary_snapshot() {
    insta::assert_snapshot!(
        "step_summary",
        lockstep::report::render_step_summary(&report(), "lockstep run", "reports/x/report.json")
    );
}

/// The site's index and run page for the fixture run (the report's own files are not copied: its
/// directory is empty, so the page links none).
#[test]
fn published_html_snapshot() {
    use lockstep::publish::{render_site, run_dir_name, Inputs, RunInput};
    let dir = tempfile::tempdir().unwrap();
    let r = report();
    let run = format!("runs/{}/index.html", run_dir_name(&r.run_id));
    let files = render_site(&Inputs {
        runs: vec![RunInput {
            report: r,
            dir: dir.path().to_path_buf(),
        }],
        ..Inputs::default()
    })
    .unwrap();
    let page = |name: &str| {
        let (_, bytes) = files
            .iter()
            .find(|(p, _)| p == name)
            .unwrap_or_else(|| panic!("{name} not in the site"));
        String::from_utf8(bytes.clone()).unwrap()
    };
    insta::assert_snapshot!("site_index_html", page("index.html"));
    insta::assert_snapshot!("site_run_html", page(&run));
    insta::assert_snapshot!("site_bench_html", page("bench.html"));
    // every plot the run page shows is in the site
    let html = page(&run);
    for src in html.split("<img src=\"").skip(1) {
        let src = &src[..src.find('"').unwrap()];
        let want = format!("{}/{src}", run.trim_end_matches("/index.html"));
        assert!(files.iter().any(|(p, _)| *p == want), "{want}");
    }
}

#[test]
fn report_json_round_trips_with_infinities() {
    let dir = tempfile::tempdir().unwrap();
    let r = report();
    let out = write_report(dir.path(), &r).unwrap();
    assert_eq!(out, dir.path().join(&r.run_id));
    let names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let mut names = names;
    names.sort();
    assert_eq!(names, ["plots", "report.json", "report.md", "results.csv"]);
    let json = std::fs::read_to_string(out.join("report.json")).unwrap();
    assert!(
        json.contains("\"inf\""),
        "NMSE +inf is written as the string \"inf\""
    );
    let back = read_report(&out).unwrap();
    let again = lockstep::report::to_json_pretty(&back).unwrap();
    let diff: Vec<String> = json
        .lines()
        .zip(again.lines())
        .enumerate()
        .filter(|(_, (a, b))| a != b)
        .map(|(i, (a, b))| format!("line {}: {a} | {b}", i + 1))
        .collect();
    assert!(
        diff.is_empty(),
        "report.json does not read back as written:\n{}",
        diff.join("\n")
    );
    assert_eq!(back, r);
    assert_eq!(read_report(&out.join("report.json")).unwrap(), r);
    assert_eq!(
        std::fs::read_to_string(out.join("report.md")).unwrap(),
        render_markdown(&r)
    );
    // Nothing else was left in the reports root (no .partial directory).
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, [std::ffi::OsString::from(&r.run_id)]);
}

#[test]
fn read_report_refuses_another_schema_version() {
    let dir = tempfile::tempdir().unwrap();
    let out = write_report(dir.path(), &report()).unwrap();
    let p = out.join("report.json");
    let text = std::fs::read_to_string(&p).unwrap().replacen(
        "\"schema_version\": 1",
        "\"schema_version\": 2",
        1,
    );
    std::fs::write(&p, text).unwrap();
    let err = format!("{:#}", read_report(&p).unwrap_err());
    assert!(
        err.contains("schema_version is 2") && err.contains("reads schema_version 1"),
        "{err}"
    );
    std::fs::write(&p, "{\"run_id\": \"x\"}").unwrap();
    assert!(format!("{:#}", read_report(&p).unwrap_err()).contains("no integer schema_version"));
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

#[test]
fn write_report_leaves_nothing_behind_when_it_fails() {
    let dir = tempfile::tempdir().unwrap();
    let r = report();

    // The reports root is a file.
    let file = dir.path().join("reports");
    std::fs::write(&file, "not a directory").unwrap();
    let err = format!("{:#}", write_report(&file, &r).unwrap_err());
    assert!(err.contains("reports"), "{err}");
    assert_eq!(entries(dir.path()), ["reports"]);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "not a directory");

    // The report directory exists already: not overwritten, no partial directory left.
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join(&r.run_id)).unwrap();
    std::fs::write(root.join(&r.run_id).join("keep"), "x").unwrap();
    let err = format!("{:#}", write_report(&root, &r).unwrap_err());
    assert!(err.contains("already exists"), "{err}");
    assert_eq!(entries(&root), vec![r.run_id.as_str()]);
    assert_eq!(entries(&root.join(&r.run_id)), ["keep"]);

    // A run id that is not a plain directory name.
    let bad = Report {
        run_id: "../escape".into(),
        ..r.clone()
    };
    assert!(write_report(&root, &bad)
        .unwrap_err()
        .to_string()
        .contains("cannot be a directory name"));
    assert_eq!(entries(&root), vec![r.run_id.as_str()]);

    // A reports root that cannot be written into (read-only): fails before creating the report dir.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let ro = dir.path().join("ro");
        std::fs::create_dir(&ro).unwrap();
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
        let probe = ro.join("probe");
        let writable = std::fs::write(&probe, "").is_ok(); // root ignores permissions
        let _ = std::fs::remove_file(&probe);
        if !writable {
            assert!(write_report(&ro, &r).is_err());
            assert!(entries(&ro).is_empty());
        }
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

#[test]
fn every_cell_gets_an_error_vs_depth_svg_linked_from_report_md() {
    let dir = tempfile::tempdir().unwrap();
    let r = report();
    let out = write_report(dir.path(), &r).unwrap();
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    for (i, c) in r.cells.iter().enumerate() {
        let name = lockstep::report::plot_file_name(i, c);
        assert!(
            md.contains(&format!("]({name})")),
            "report.md does not link {name}"
        );
        let svg = std::fs::read_to_string(out.join(&name)).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
            "{name}"
        );
        // the stage kinds by family, the residual stream's decode steps, the axis and its floor label
        for needle in [
            "residual:",
            "norms:",
            "attn_norm",
            "blk.N.out (decode)",
            "layer",
            "NMSE",
        ] {
            assert!(svg.contains(needle), "{name}: no {needle:?}");
        }
        let th = c.thresholds.as_ref().unwrap();
        // a cutoff is drawn only where it is the gate's own test (bit equality here), never the first
        // divergent stage's marker
        assert_eq!(svg.contains("gate: stage_exact"), th.stage_exact, "{name}");
        assert!(!svg.contains("stage_max_nmse 1e-4"), "{name}");
    }
}

/// Names from a hostile matrix (a `|`, a newline, markup, 300 characters) neither break report.md's tables
/// nor lose the report: every table row keeps its column count, no raw `<script>` reaches report.md or a
/// plot, and the plot file names stay one bounded component (issue 29, items 5 and 9).
#[test]
fn hostile_names_neither_break_the_tables_nor_lose_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = report();
    r.cells[0].cell.model = "evil|model\nnext <script>alert(1)</script>".into();
    r.cells[1].cell.quant = format!("Q4_{}|`x`", "K".repeat(300));
    // brackets in the failing cell's id cannot end its link to the detail early
    r.cells[2].cell.prompt = "p](#elsewhere) [x".into();
    let out = write_report(dir.path(), &r).unwrap();
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(!md.contains("<script>"), "raw markup in report.md");
    assert!(
        md.contains(
            "/p\\](#elsewhere) \\[x/Q4_1/reference/simd-off/llama.cpp-f32kv/lockstep](#cell-2): "
        ),
        "{md}"
    );
    // every row of a table has the separator row's column count (escaped pipes do not count)
    let cols = |line: &str| line.replace("\\|", "").matches('|').count();
    let mut expected = None;
    for line in md.lines() {
        if !line.starts_with('|') {
            expected = None;
            continue;
        }
        match expected {
            None => expected = Some(cols(line)),
            Some(n) => assert_eq!(cols(line), n, "a broken table row: {line}"),
        }
    }
    for (i, c) in r.cells.iter().enumerate() {
        let name = lockstep::report::plot_file_name(i, c);
        let file = Path::new(&name).file_name().unwrap().to_str().unwrap();
        assert!(file.len() <= 140, "{file}");
        assert!(
            file.chars()
                .all(|ch| ch.is_ascii_alphanumeric() || "._-".contains(ch)),
            "{file}"
        );
        let svg = std::fs::read_to_string(out.join(&name)).unwrap();
        assert!(!svg.contains("<script>"), "raw markup in {name}");
    }
}

/// report.md's `## Across oracles` table: absent while every model has one oracle; with a second oracle,
/// one column per numerics mode × oracle and one row per stage kind holding that column's largest NMSE
/// over layers, phases and cells — a NaN is shown, never hidden behind a finite value.
#[test]
fn the_cross_oracle_table_shows_each_stage_kinds_largest_nmse_per_mode_and_oracle() {
    let mut r = report();
    assert!(
        !render_markdown(&r).contains("## Across oracles"),
        "one oracle: no table"
    );
    // the ggml cell against a second oracle, a thousand times farther at every stage
    let mut t = r.cells[0].clone();
    t.cell.oracle = "transformers-f32".into();
    for s in &mut t.comparison.stages {
        s.nmse = Summary::of(s.nmse_by_position.iter().map(|n| n * 1000.0)).unwrap();
        if s.stage == "blk.0.attn_norm" {
            s.nmse.max = f64::NAN;
        }
    }
    r.cells.push(t);
    let md = render_markdown(&r);
    let section = md
        .split("## Across oracles")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("the section");
    assert!(
        section.contains(
            "| stage kind | ggml vs llama.cpp-f32kv | ggml vs transformers-f32 | reference vs llama.cpp-f32kv |"
        ),
        "{section}"
    );
    // blk.0.out and blk.1.out, prefill and decode: the largest is blk.1.out's 3.2e-6 (the failing
    // reference cell's 2.58e-3)
    assert!(
        section.contains("| out (NMSE) | 3.200e-6 | 3.200e-3 | 2.580e-3 |"),
        "{section}"
    );
    assert!(section.contains("| attn_norm (NMSE) | "), "{section}");
    let attn_norm = section
        .lines()
        .find(|l| l.starts_with("| attn_norm (NMSE) |"))
        .unwrap();
    assert_eq!(attn_norm.split(" | ").nth(2), Some("nan"), "{attn_norm}");
    let ffn_act = section
        .lines()
        .find(|l| l.starts_with("| ffn_act (NMSE) |"))
        .unwrap();
    assert!(ffn_act.ends_with("| inf |"), "{ffn_act}");
    assert!(section.contains("| logits (mean KL) |"), "{section}");
    assert!(
        section.contains("**smollm2-135m-q4_1** (Q4_1), 4 cells"),
        "{section}"
    );
}

/// The cells of the large fixture that fail: (model, prompt, mode, simd, oracle).
const LARGE_FAILING: [(&str, &str, &str, &str, &str); 3] = [
    (
        "gemma3-270m-q4_k_m",
        "passage",
        "reference",
        "auto",
        "llama.cpp-f32kv",
    ),
    (
        "qwen2.5-coder-0.5b-q4_k_m",
        "code",
        "ggml",
        "avx2",
        "transformers-f32",
    ),
    (
        "smollm2-135m-q4_1",
        "story",
        "reference",
        "off",
        "transformers-f32",
    ),
];

/// A run over a matrix as wide as the default one is per model: 3 models × 4 prompts × 2 modes × 3 SIMD
/// settings × 2 oracles = 144 cells in matrix order, the 3 of [`LARGE_FAILING`] failing (the failing
/// variant of [`comparison`]), the others passing.
fn large_report() -> Report {
    let th = Thresholds::parse(THRESHOLDS, "ci/thresholds.toml").unwrap();
    let mut cells = Vec::new();
    for (model, quant) in [
        ("smollm2-135m-q4_1", "Q4_1"),
        ("gemma3-270m-q4_k_m", "Q4_K_M"),
        ("qwen2.5-coder-0.5b-q4_k_m", "Q4_K_M"),
    ] {
        for prompt in ["code", "passage", "prose", "story"] {
            for mode in ["reference", "ggml"] {
                for simd in ["off", "avx2", "auto"] {
                    for oracle in ["llama.cpp-f32kv", "transformers-f32"] {
                        let c = Cell {
                            model: model.into(),
                            prompt: prompt.into(),
                            quant: quant.into(),
                            mode: mode.parse().unwrap(),
                            simd: simd.into(),
                            oracle: oracle.into(),
                            engine: "lockstep".into(),
                        };
                        let bad = LARGE_FAILING.contains(&(model, prompt, mode, simd, oracle));
                        let n = cells.len() as f64;
                        let speed = Speed {
                            prefill_tokens: 3,
                            prefill_seconds: 0.01 + n * 1e-4,
                            decode_tokens: 2,
                            decode_seconds: 0.02 + n * 1e-4,
                        };
                        cells.push(cell_report(&th, c, bad, speed));
                    }
                }
            }
        }
    }
    report_of(cells)
}

/// The lines of report.md a reader sees first (issue 41: summary first).
const HEAD_LINES: usize = 60;

fn head(md: &str) -> String {
    md.lines().take(HEAD_LINES).collect::<Vec<_>>().join("\n")
}

/// The head of a large report: the verdict, one rollup row per model × mode × oracle with its worst gated
/// metrics, then every failure linked to its cell's detail; the environment and metric definitions after.
#[test]
fn large_report_md_head_snapshot() {
    insta::assert_snapshot!(
        "large_report_md_head",
        head(&render_markdown(&large_report()))
    );
}

/// In a large report the failures are on the first screen, each linked to an anchor that exists (its cell's
/// detail under "Error vs depth"); the per-cell sections hold the failing cells and at most
/// PASSING_SAMPLE_PER_GROUP passing cells per model × mode × oracle, and say how many are left out.
#[test]
fn a_large_report_leads_with_its_failures_and_samples_its_passing_cells() {
    use lockstep::report::{cell_anchor, shown_cells, PASSING_SAMPLE_PER_GROUP};
    let r = large_report();
    assert_eq!(r.cells.len(), 144);
    let failing: Vec<usize> = (0..r.cells.len())
        .filter(|&i| !r.cells[i].verdict.pass)
        .collect();
    assert_eq!(failing.len(), LARGE_FAILING.len());
    let md = render_markdown(&r);
    let head = head(&md);

    // the verdict and every failure with its link, on the first screen
    assert!(
        head.contains("**FAIL**: 141 of 144 cells pass, [3 fail](#failing-cells)."),
        "{head}"
    );
    for &i in &failing {
        let id = r.cells[i].cell.id();
        let link = format!("- [{id}](#{}): ", cell_anchor(i));
        assert!(
            head.contains(&link),
            "{link} not in the first {HEAD_LINES} lines:\n{head}"
        );
        let detail = format!("### <a id=\"{}\"></a>{id}\n", cell_anchor(i));
        assert!(md.contains(&detail), "no detail heading {detail}");
    }
    // the environment and the metric definitions come after the failures
    let at = |needle: &str| md.find(needle).unwrap_or_else(|| panic!("no {needle}"));
    assert!(at("</a>Failures\n") < at("## Environment"));
    assert!(at("## Environment") < at("## Metrics"));
    assert!(at("## Metrics") < at("## Cells"));

    // every in-document link resolves to an anchor of report.md
    let mut links = 0;
    for part in md.split("](#").skip(1) {
        let target = &part[..part.find(')').unwrap()];
        assert!(
            md.contains(&format!("<a id=\"{target}\"></a>")),
            "the link #{target} has no anchor"
        );
        links += 1;
    }
    assert_eq!(
        links,
        1 + failing.len(),
        "the verdict's link and one per failure"
    );

    // 12 groups (model × mode × oracle) of 12 cells: the failing cells and PASSING_SAMPLE_PER_GROUP passing
    // cells of each are shown, the other passing cells left out and counted
    let shown = shown_cells(&r);
    let n_shown = shown.iter().filter(|s| **s).count();
    assert_eq!(n_shown, failing.len() + 12 * PASSING_SAMPLE_PER_GROUP);
    let left_out = r.cells.len() - n_shown;
    assert!(
        md.contains(&format!(
            "the other {left_out} passing cells are left out of report.md: they are in report.json, \
             results.csv and the HTML run page (`lockstep publish`)."
        )),
        "no sentence counting the {left_out} cells left out"
    );
    // the sample is the first cells of each group by id: `code` with SIMD auto and avx2
    let sampled = "smollm2-135m-q4_1/code/Q4_1/ggml/simd-auto/llama.cpp-f32kv/lockstep";
    let beyond = "smollm2-135m-q4_1/story/Q4_1/ggml/simd-off/llama.cpp-f32kv/lockstep";
    let index = |id: &str| r.cells.iter().position(|c| c.cell.id() == id).unwrap();
    assert!(shown[index(sampled)] && !shown[index(beyond)]);
    assert!(md.contains(&format!(
        "### <a id=\"{}\"></a>{sampled}\n",
        cell_anchor(index(sampled))
    )));
    assert!(
        !md.contains(beyond),
        "a passing cell beyond the sample is in report.md"
    );
    assert!(
        !md.contains(&format!("<a id=\"{}\"></a>", cell_anchor(index(beyond)))),
        "a passing cell beyond the sample has a detail"
    );
    // one row per shown cell in Cells, SIMD vs scalar and Inputs
    let section = |name: &str| {
        md.split(&format!("\n## {name}"))
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .unwrap_or_else(|| panic!("no section {name}"))
            .to_string()
    };
    let rows = |s: &str| s.lines().filter(|l| l.starts_with("| ")).count() - 1;
    assert_eq!(rows(&section("Cells")), n_shown);
    assert_eq!(rows(&section("Inputs")), n_shown);
    assert_eq!(rows(&section("First divergent stage")), n_shown);
    let simd = section("SIMD vs scalar");
    assert!(
        simd.contains("Of all 96 pairs, 92 are bit-identical"),
        "{simd}"
    );
    // a sample that does not depend on the cells' order
    let ids = |r: &Report| -> std::collections::BTreeSet<String> {
        let shown = shown_cells(r);
        r.cells
            .iter()
            .zip(shown)
            .filter(|(_, s)| *s)
            .map(|(c, _)| c.cell.id())
            .collect()
    };
    let mut reversed = r.clone();
    reversed.cells.reverse();
    assert_eq!(ids(&reversed), ids(&r));
}

/// A run with no more passing cells per group than the sample shows every cell and says nothing is left out.
#[test]
fn a_small_report_shows_every_cell() {
    let r = report();
    assert!(lockstep::report::shown_cells(&r).iter().all(|s| *s));
    let md = render_markdown(&r);
    assert!(!md.contains("left out"), "{md}");
    for (i, c) in r.cells.iter().enumerate() {
        assert!(
            md.contains(&format!("### <a id=\"cell-{i}\"></a>{}\n", c.cell.id())),
            "{}",
            c.cell.id()
        );
    }
}

/// An incomplete run leads with INCOMPLETE, never PASS, even when every cell it ran passes, and says where
/// it stopped.
#[test]
fn an_incomplete_run_leads_with_incomplete() {
    let mut r = report();
    r.cells.truncate(2);
    r.incomplete = Some(lockstep::report::Incomplete {
        failed_cell: "smollm2-135m-q4_1/prose/Q4_1/reference/simd-off/llama.cpp-f32kv/lockstep"
            .into(),
        error: "boom".into(),
        cells_not_run: 1,
    });
    let md = render_markdown(&r);
    assert!(
        md.starts_with(
            "# lockstep report `20261122-221501-53b3529`\n\n**INCOMPLETE**: 2 of 2 cells pass.\n\n\
             The run stopped at cell `smollm2-135m-q4_1/prose/Q4_1/reference/simd-off/llama.cpp-f32kv/lockstep` \
             (1 cells not run): boom\n\n## By model, mode and oracle\n"
        ),
        "{md}"
    );
}

/// Issue 47, cause 13: a NUL or ESC in a report field (a model or prompt name, an engine's error
/// message) must not reach the SVG plots or the site's HTML, where XML 1.0 cannot carry it even escaped
/// (a browser then shows an XML error instead of the chart).
#[test]
fn control_characters_in_report_fields_keep_every_svg_and_page_valid() {
    use lockstep::publish::{render_site, Inputs, RunInput};
    let mut r = report();
    for c in &mut r.cells {
        c.cell.model = format!("evil\u{0}\u{1b}[2J{}", c.cell.model);
        c.cell.prompt = format!("p\u{1b}]0;title\u{7}{}", c.cell.prompt);
    }
    r.run_id = "run\u{0}\u{1b}".into();
    r.environment.cpu_model = "cpu\u{1b}[31m".into();
    let dir = tempfile::tempdir().unwrap();
    let files = render_site(&Inputs {
        runs: vec![RunInput {
            report: r.clone(),
            dir: dir.path().to_path_buf(),
        }],
        ..Inputs::default()
    })
    .unwrap();
    let forbidden = |c: char| (c < ' ' && !matches!(c, '\t' | '\n' | '\r')) || c == '\u{FFFE}';
    let mut svgs = 0;
    for (name, bytes) in &files {
        if name.ends_with(".svg") || name.ends_with(".html") {
            svgs += usize::from(name.ends_with(".svg"));
            let text = String::from_utf8(bytes.clone()).unwrap();
            assert!(
                !text.chars().any(forbidden),
                "{name} holds a control character XML forbids"
            );
        }
    }
    assert!(svgs > 0, "the run page has plots");
    // the plots report.json's directory holds, drawn by `lockstep run` itself
    for c in &r.cells {
        let svg = lockstep::report::error_vs_depth_svg(c).unwrap();
        assert!(!svg.chars().any(forbidden), "{}", c.cell.id());
    }
}
