//! Gates: every threshold trips with a line naming the cell, the metric, the value and the threshold;
//! near ties are excepted; an unmeasurable metric fails; `first_divergent` finds the first stage in
//! forward order; threshold rules merge field by field; and the committed `ci/matrix.toml` and
//! `ci/thresholds.toml` cover every cell of the committed goldens.
//!
//! `cargo test -p lockstep --test gate`.

use lockstep_engine::NumericsMode;
use std::path::{Path, PathBuf};

use lockstep::compare::{summarize_logits, CellComparison, NotCompared, Phase, StageComparison};
use lockstep::gate::{evaluate, failure_line, first_divergent, CellThresholds, Thresholds};
use lockstep::golden::load_manifest;
use lockstep::matrix::{Cell, Filters, Matrix};
use lockstep::metrics::{LogitPosition, Summary};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn cell(mode: &str) -> Cell {
    Cell {
        model: "smollm2-135m-q4_1".into(),
        prompt: "prose".into(),
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
    StageComparison {
        stage: id.into(),
        phase,
        layer: lockstep::compare::layer_of(id),
        width: 8,
        cosine: s(cos),
        nmse: s(nmse),
        rmse: s(nmse),
        mean_abs: s(nmse),
        max_abs: 0.5,
        bit_exact: false,
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
        ref_gap: 0.5,
        top5,
        top10: 1.0,
        kl,
        entropy_ref: kl.map(|_| 2.0),
        entropy_eng: 2.0,
        dp_top: kl.map(|_| 0.001),
    }
}

/// A 3-token prompt with 2 decode steps, everything well within the thresholds.
fn good() -> CellComparison {
    let ok = [0.999_999, 0.999_998, 0.999_999];
    let okd = [0.999_999, 0.999_997];
    let n3 = [1e-6, 2e-6, 1e-6];
    let n2 = [1e-6, 3e-6];
    CellComparison {
        golden_tokens: vec![1, 2, 3],
        engine_tokens: vec![1, 2, 3],
        stages: vec![
            stage("embed", Phase::Prefill, &[1.0, 1.0, 1.0], &[0.0, 0.0, 0.0]),
            stage("blk.0.attn_norm", Phase::Prefill, &ok, &n3),
            stage("blk.0.out", Phase::Prefill, &ok, &n3),
            stage("blk.1.attn_norm", Phase::Prefill, &ok, &n3),
            stage("blk.1.out", Phase::Prefill, &ok, &n3),
            stage("output_norm", Phase::Prefill, &ok, &n3),
            stage("blk.0.out", Phase::Decode, &okd, &n2),
            stage("blk.1.out", Phase::Decode, &okd, &n2),
            stage("output_norm", Phase::Decode, &okd, &n2),
        ],
        not_compared: vec![NotCompared {
            stage: "blk.0.attn_proj".into(),
            phase: Phase::Prefill,
            reason: "not stored in this golden".into(),
        }],
        logits: vec![
            summarize_logits(
                Phase::Prefill,
                vec![
                    pos(0, 5, 5, 0.0, None, 1.0),
                    pos(1, 6, 6, 0.0, None, 1.0),
                    pos(2, 7, 7, 0.0, Some(1e-5), 1.0),
                ],
            ),
            summarize_logits(
                Phase::Decode,
                vec![
                    pos(3, 8, 8, 0.0, Some(2e-5), 1.0),
                    pos(4, 9, 9, 0.0, Some(3e-5), 1.0),
                ],
            ),
        ],
    }
}

fn th() -> CellThresholds {
    CellThresholds {
        tokens_must_match: true,
        min_top1_agreement: 1.0,
        max_mean_kl: 1e-3,
        max_kl: Some(1e-2),
        min_top5_mean: 0.9,
        min_cosine_out: 0.9999,
        stage_min_cosine: 0.999,
        margin_tolerance: 0.01,
        stage_max_nmse: None,
        stage_exact: false,
        stage_floor_headroom: None,
        yardstick: String::new(),
    }
}

/// Evaluate, expect exactly one failure of `metric`, and check its line names everything.
fn trips(cmp: &CellComparison, metric: &str, value: &str, threshold: &str, detail: &str) {
    let c = cell("ggml");
    let v = evaluate(&c, cmp, &th());
    assert!(!v.pass);
    let metrics: Vec<&str> = v.failures.iter().map(|f| f.metric.as_str()).collect();
    assert_eq!(metrics, [metric], "{v:#?}");
    let line = failure_line(&c, &v).unwrap();
    // a value that could not be measured is said so, never printed as `nan`
    let shown = if value == "nan" {
        format!("{metric} not measured")
    } else {
        format!("{metric} = {value}")
    };
    let want = format!("FAIL {}: {shown} (threshold {threshold}) — ", c.id());
    assert!(line.starts_with(&want), "line: {line}\nwant prefix: {want}");
    assert!(line.contains(detail), "line: {line}\nwant detail: {detail}");
}

#[test]
fn a_good_cell_passes() {
    let v = evaluate(&cell("ggml"), &good(), &th());
    assert!(v.pass, "{v:#?}");
    assert!(v.failures.is_empty() && v.first_divergent.is_none());
    assert_eq!(failure_line(&cell("ggml"), &v), None);
}

#[test]
fn tokens_mismatch_trips() {
    let mut cmp = good();
    cmp.engine_tokens = vec![1, 4, 3, 9];
    trips(
        &cmp,
        "tokens_match",
        "0",
        "1",
        "golden has 3 tokens, engine 4; first difference at index 1: golden 2 vs engine 4",
    );
    let v = evaluate(
        &cell("ggml"),
        &cmp,
        &CellThresholds {
            tokens_must_match: false,
            ..th()
        },
    );
    assert!(v.pass, "tokens_must_match = false must not check tokens");
}

#[test]
fn top1_mismatch_trips_but_a_near_tie_does_not() {
    let mut cmp = good();
    cmp.logits[0].positions[1] = pos(1, 909, 198, 0.53, None, 1.0);
    trips(
        &cmp,
        "top1_agreement",
        "0.8",
        "1",
        "prefill position 1, ref top 909 vs engine 198 (margin 0.53)",
    );

    let mut cmp = good();
    cmp.logits[1].positions[0] = pos(3, 909, 198, 0.004, Some(2e-5), 1.0);
    let v = evaluate(&cell("ggml"), &cmp, &th());
    assert!(
        v.pass,
        "a near tie (margin 0.004 < 0.01) counts as agreeing: {v:#?}"
    );
    // The gate re-partitions with its own margin tolerance.
    let v = evaluate(
        &cell("ggml"),
        &cmp,
        &CellThresholds {
            margin_tolerance: 0.001,
            ..th()
        },
    );
    assert_eq!(v.failures[0].metric, "top1_agreement");
    assert!(
        v.failures[0].detail.contains("decode position 3"),
        "{}",
        v.failures[0].detail
    );
}

#[test]
fn mean_kl_trips() {
    let mut cmp = good();
    cmp.logits[1].positions[1].kl = Some(6e-3);
    trips(
        &cmp,
        "mean_kl",
        "2.01e-3",
        "1e-3",
        "over 3 of 5 positions (the golden keeps the full logits row at 3 positions only, top-k elsewhere); largest 6e-3 at decode position 4",
    );
}

#[test]
fn max_kl_trips() {
    let mut cmp = good();
    // Mean stays below 1e-3 only with many positions: use a lenient mean threshold instead.
    cmp.logits[1].positions[1].kl = Some(2.5e-2);
    let c = cell("ggml");
    let v = evaluate(
        &c,
        &cmp,
        &CellThresholds {
            max_mean_kl: 1.0,
            ..th()
        },
    );
    let line = failure_line(&c, &v).unwrap();
    assert_eq!(v.failures.len(), 1, "{v:#?}");
    assert!(
        line.contains(&format!(
            "FAIL {}: max_kl = 2.5e-2 (threshold 1e-2) — decode position 4",
            c.id()
        )),
        "{line}"
    );
    let v = evaluate(
        &c,
        &cmp,
        &CellThresholds {
            max_mean_kl: 1.0,
            max_kl: None,
            ..th()
        },
    );
    assert!(v.pass, "max_kl = None is not checked");
}

#[test]
fn top5_trips() {
    let mut cmp = good();
    for p in &mut cmp.logits[0].positions {
        p.top5 = 0.6;
    }
    trips(
        &cmp,
        "top5_mean",
        "0.76",
        "0.9",
        "lowest 0.6 at prefill position 0",
    );
}

#[test]
fn min_cosine_out_trips_on_a_layer_output_and_on_output_norm() {
    let mut cmp = good();
    cmp.stages[7] = stage(
        "blk.1.out",
        Phase::Decode,
        &[0.999_999, 0.9991],
        &[1e-6, 1.8e-3],
    );
    trips(
        &cmp,
        "min_cosine_out",
        "0.9991",
        "0.9999",
        "blk.1.out decode position 4 (NMSE 1.8e-3)",
    );

    let mut cmp = good();
    cmp.stages[5] = stage(
        "output_norm",
        Phase::Prefill,
        &[0.99, 0.999_999, 0.98],
        &[1e-2, 1e-6, f64::INFINITY],
    );
    trips(
        &cmp,
        "min_cosine_out",
        "0.98",
        "0.9999",
        "output_norm prefill position 2 (NMSE inf)",
    );

    // Other stages do not count for min_cosine_out (they are the bisect's business).
    let mut cmp = good();
    cmp.stages[1] = stage(
        "blk.0.attn_norm",
        Phase::Prefill,
        &[0.9, 0.9, 0.9],
        &[0.1, 0.1, 0.1],
    );
    let v = evaluate(&cell("ggml"), &cmp, &th());
    assert!(v.pass);
    assert_eq!(v.first_divergent.unwrap().stage, "blk.0.attn_norm");
}

#[test]
fn an_unmeasurable_metric_fails() {
    let mut cmp = good();
    for l in &mut cmp.logits {
        for p in &mut l.positions {
            p.kl = None;
        }
    }
    trips(
        &cmp,
        "mean_kl",
        "nan",
        "1e-3",
        "no position has a full reference logits row",
    );

    let mut cmp = good();
    cmp.stages
        .retain(|s| s.stage.ends_with("attn_norm") || s.stage == "embed");
    trips(
        &cmp,
        "min_cosine_out",
        "nan",
        "0.9999",
        "no blk.N.out or output_norm stage was compared",
    );

    let mut cmp = good();
    cmp.logits.clear();
    let v = evaluate(&cell("ggml"), &cmp, &th());
    let metrics: Vec<&str> = v.failures.iter().map(|f| f.metric.as_str()).collect();
    assert_eq!(metrics, ["top1_agreement", "mean_kl", "top5_mean"]);
}

#[test]
fn several_failures_share_one_line_with_the_first_divergent_stage() {
    let mut cmp = good();
    cmp.engine_tokens = vec![1, 2];
    cmp.stages[4] = stage(
        "blk.1.out",
        Phase::Prefill,
        &[0.999_999, 0.95, 0.9],
        &[1e-6, 5e-2, 0.1],
    );
    let c = cell("reference");
    let line = failure_line(&c, &evaluate(&c, &cmp, &th())).unwrap();
    assert_eq!(
        line,
        format!(
            "FAIL {}: tokens_match = 0 (threshold 1) — golden has 3 tokens, engine 2; first difference at index 2: \
             golden 3 vs engine (end); min_cosine_out = 0.9 (threshold 0.9999) — blk.1.out prefill position 2 (NMSE 1e-1); \
             first divergent stage: tokens (the prompt's token 2 differs)",
            c.id()
        )
    );
    // the same tokens: the first divergent stage is the marker (other tokens are, issue 42)
    cmp.engine_tokens = cmp.golden_tokens.clone();
    let line = failure_line(&c, &evaluate(&c, &cmp, &th())).unwrap();
    assert_eq!(
        line,
        format!(
            "FAIL {}: min_cosine_out = 0.9 (threshold 0.9999) — blk.1.out prefill position 2 (NMSE 1e-1); \
             first divergent stage: blk.1.out (prefill position 1, cosine 0.95)",
            c.id()
        )
    );
}

#[test]
fn first_divergent_walks_forward_order_then_decode() {
    let mut cmp = good();
    assert_eq!(first_divergent(&cmp, 0.999, None), None);
    // Forward order is the order of cmp.stages, not alphabetical: blk.1.attn_norm comes after blk.0.out.
    cmp.stages[3] = stage(
        "blk.1.attn_norm",
        Phase::Prefill,
        &[0.9995, 0.998, 0.5],
        &[1e-4, 2e-3, 0.5],
    );
    cmp.stages[4] = stage(
        "blk.1.out",
        Phase::Prefill,
        &[0.1, 0.1, 0.1],
        &[1.0, 1.0, 1.0],
    );
    let d = first_divergent(&cmp, 0.999, None).unwrap();
    assert_eq!(
        (d.stage.as_str(), d.phase, d.position),
        ("blk.1.attn_norm", Phase::Prefill, 1)
    );
    assert_eq!((d.cosine, d.nmse), (0.998, 2e-3));
    // A looser threshold moves the first position, not the stage.
    let d = first_divergent(&cmp, 0.9, None).unwrap();
    assert_eq!(
        (d.stage.as_str(), d.position, d.cosine),
        ("blk.1.attn_norm", 2, 0.5)
    );

    // Decode comes after every prefill stage, and its position is prompt length + step.
    let mut cmp = good();
    cmp.stages[6] = stage(
        "blk.0.out",
        Phase::Decode,
        &[0.999_999, 0.99],
        &[1e-6, f64::INFINITY],
    );
    let d = first_divergent(&cmp, 0.999, None).unwrap();
    assert_eq!(
        (d.stage.as_str(), d.phase, d.position),
        ("blk.0.out", Phase::Decode, 4)
    );
    assert_eq!(d.nmse, f64::INFINITY);
}

const RULES: &str = r#"
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

[[rule]]
model = "smollm2-135m-q4_1"
mode = "reference"
oracle = "llama.cpp-f32kv"
min_cosine_out = 0.998
max_kl = 0.1
"#;

#[test]
fn rules_merge_field_by_field_in_order() {
    let t = Thresholds::parse(RULES, "rules.toml").unwrap();
    let g = t.for_cell(&cell("ggml")).unwrap();
    assert_eq!(
        (g.max_mean_kl, g.min_cosine_out, g.max_kl),
        (1e-3, 0.9999, None)
    );
    let r = t.for_cell(&cell("reference")).unwrap();
    assert_eq!(
        (r.max_mean_kl, r.min_cosine_out, r.max_kl),
        (5e-3, 0.998, Some(0.1))
    );
    assert_eq!((r.min_top1_agreement, r.stage_min_cosine), (1.0, 0.999));
    let mut other = cell("reference");
    other.oracle = "llama.cpp-f16kv".into();
    assert_eq!(t.for_cell(&other).unwrap().min_cosine_out, 0.999);
}

#[test]
fn rules_errors_name_the_cell_and_field() {
    let t = Thresholds::parse(
        "[[rule]]\nmode = \"ggml\"\ntokens_must_match = true\n",
        "t.toml",
    )
    .unwrap();
    let err = t.for_cell(&cell("reference")).unwrap_err().to_string();
    assert!(
        err.contains("t.toml: no rule matches cell") && err.contains("mode reference"),
        "{err}"
    );
    let err = t.for_cell(&cell("ggml")).unwrap_err().to_string();
    assert!(
        err.contains("leave `min_top1_agreement` unset") && err.contains(&cell("ggml").id()),
        "{err}"
    );

    let bad = |text: &str| format!("{:#}", Thresholds::parse(text, "t.toml").unwrap_err());
    assert!(
        bad("[[rule]]\nmin_top5_mean = 1.5\n").contains("min_top5_mean = 1.5 is outside (0, 1]")
    );
    assert!(bad("[[rule]]\nmax_mean_kl = -1.0\n").contains("max_mean_kl"));
    assert!(
        bad("[[rule]]\nmin_cosin_out = 0.9\n").contains("t.toml is not a valid thresholds file")
    );
    assert!(bad("[[rule]]\nmodel = \"\"\n").contains("selector `model` is empty"));
    assert!(bad("").contains("t.toml"));
}

#[test]
fn committed_matrix_and_thresholds_cover_every_cell() {
    let root = repo();
    let manifest = load_manifest(&root.join("golden")).unwrap_or_else(|e| panic!("{e:#}"));
    let matrix = Matrix::load(&root.join("ci/matrix.toml")).unwrap_or_else(|e| panic!("{e:#}"));
    let cells = matrix
        .expand(&manifest, &Filters::default())
        .unwrap_or_else(|e| panic!("{e:#}"));
    let pairs: std::collections::BTreeSet<(&str, &str)> = cells
        .iter()
        .map(|c| (c.model.as_str(), c.prompt.as_str()))
        .collect();
    let reg = lockstep::registry::Registry::active().unwrap();
    // the Hugging Face copies (held to their source's goldens): every registered one, beside its source
    let copies: std::collections::BTreeSet<&str> = pairs
        .iter()
        .map(|p| p.0)
        .filter(|m| reg.hf_source(m).is_some())
        .collect();
    let registered_copies = reg.variants.iter().filter(|v| v.is_hf()).count();
    assert_eq!(
        copies.len(),
        registered_copies,
        "every HF copy in the matrix"
    );
    assert!(registered_copies >= 11, "one per seeded model");
    let models: std::collections::BTreeSet<&str> = pairs
        .iter()
        .map(|p| p.0)
        .filter(|m| !copies.contains(m))
        .collect();
    for c in &copies {
        assert!(models.contains(reg.golden_model(c)), "{c}: its source too");
    }
    // every model with goldens, every prompt it has a golden for: the three downloaded models with their
    // six prompts each, each quantization variant (the quant axis) and each seeded model (`lockstep synth`)
    // with its one prompt
    let reg = lockstep::registry::Registry::active().unwrap();
    // the porter's HF checkpoints (models.toml [[checkpoints]]) are covered by ci/matrix-porter.toml instead:
    // lockstep's engine cannot load them, so the default run, which runs it, must not hold them; a checkpoint
    // of an architecture the engine implements (whisper-seeded) is in the default run
    let engine_runs = |arch: &str| {
        use lockstep_engine::models::{ARCHITECTURES, ENCODER_ARCHITECTURES, SPEECH_ARCHITECTURES};
        ARCHITECTURES.iter().any(|(a, _)| *a == arch)
            || ENCODER_ARCHITECTURES.iter().any(|(a, _)| *a == arch)
            || SPEECH_ARCHITECTURES.iter().any(|(a, _)| *a == arch)
    };
    let with_goldens: std::collections::BTreeSet<&str> = manifest
        .goldens
        .iter()
        .map(|g| g.model_id.as_str())
        .filter(|m| reg.checkpoint(m).is_none_or(|c| engine_runs(&c.arch)))
        .collect();
    assert!(with_goldens.contains("whisper-seeded"));
    assert_eq!(
        models, with_goldens,
        "the default matrix should cover every model with goldens"
    );
    let porter =
        Matrix::load(&root.join("ci/matrix-porter.toml")).unwrap_or_else(|e| panic!("{e:#}"));
    let porter_cells = porter
        .expand(&manifest, &Filters::default())
        .unwrap_or_else(|e| panic!("{e:#}"));
    let porter_goldens: std::collections::BTreeSet<String> = manifest
        .goldens
        .iter()
        .filter(|g| {
            reg.checkpoint(&g.model_id)
                .is_some_and(|c| !engine_runs(&c.arch))
        })
        .map(|g| g.path.clone())
        .collect();
    assert_eq!(
        porter_cells
            .iter()
            .map(lockstep::matrix::golden_path_for)
            .collect::<std::collections::BTreeSet<_>>(),
        porter_goldens,
        "ci/matrix-porter.toml covers every golden of the porter's [[checkpoints]] models, once"
    );
    assert_eq!(porter_cells.len(), porter_goldens.len());
    assert!(reg.checkpoints.len() >= 2 && porter_goldens.len() >= 2 * 3);
    let th = Thresholds::load(&root.join("ci/thresholds.toml")).unwrap_or_else(|e| panic!("{e:#}"));
    th.validate_matrix(&porter)
        .unwrap_or_else(|e| panic!("{e:#}"));
    for c in &porter_cells {
        assert_eq!((c.engine.as_str(), c.simd.as_str()), ("external", "off"));
        th.for_cell(c)
            .unwrap_or_else(|e| panic!("{}: {e:#}", c.id()));
    }
    for m in &models {
        let n = pairs.iter().filter(|p| p.0 == *m).count();
        if reg.variant(m).is_some() || reg.synth(m).is_some() {
            assert_eq!(n, 1, "variant or seeded model {m}: its one golden prompt");
        } else if reg.checkpoint(m).is_some() {
            // a checkpoint the engine runs (whisper-seeded: its WAVs): every prompt it has goldens for
            let prompts: std::collections::BTreeSet<&str> = manifest
                .goldens
                .iter()
                .filter(|g| g.model_id == *m)
                .map(|g| g.prompt_id.as_str())
                .collect();
            assert_eq!(n, prompts.len(), "{m}: every prompt with goldens");
            assert!(n >= 4, "{m}: {n} prompts");
        } else {
            assert!(n >= 6, "{m}: every prompt ({n})");
        }
    }
    assert_eq!(
        models.iter().filter(|m| reg.variant(m).is_some()).count() + copies.len(),
        reg.variants.len(),
        "every registered variant is in the default matrix"
    );
    // the full tier (`--full`): off, avx2 and `auto` (this CPU's best: avx512 adds a third setting, avx2 none)
    let n_simd = matrix.simd_values().len();
    assert!(n_simd >= 2 && matrix.simd_values()[..2] == ["off", "avx2"]);
    // every model with goldens of both oracles is held to both (the three downloaded models, every seeded model
    // and seeded variant); SmolLM2's quantization variants have llama.cpp goldens only
    let seeded = |m: &str| {
        reg.synth(m).is_some()
            || reg
                .variant(m)
                .is_some_and(|v| reg.synth(&v.source).is_some())
    };
    let tf_goldens: std::collections::BTreeSet<&str> = manifest
        .goldens
        .iter()
        .filter(|g| g.path.contains("/transformers-f32/"))
        .map(|g| g.model_id.as_str())
        // the porter's checkpoints: ci/matrix-porter.toml, above
        .filter(|m| reg.checkpoint(m).is_none_or(|c| engine_runs(&c.arch)))
        .collect();
    let (lc, tf_default): (Vec<_>, Vec<_>) =
        cells.iter().partition(|c| c.oracle == "llama.cpp-f32kv");
    assert!(tf_default.iter().all(|c| c.oracle == "transformers-f32"));
    let tf_models: std::collections::BTreeSet<&str> = tf_default
        .iter()
        .map(|c| c.model.as_str())
        .filter(|m| !copies.contains(m))
        .collect();
    assert_eq!(
        tf_models, tf_goldens,
        "the default matrix holds every model with transformers goldens to them"
    );
    assert!(
        tf_models.iter().filter(|m| seeded(m)).count() >= 9 * 7,
        "nine seeded architectures, F32 + six variants each"
    );
    for m in [
        "smollm2-135m-q4_1",
        "gemma3-270m-q4_k_m",
        "qwen2.5-coder-0.5b-q4_k_m",
    ] {
        let prompts: std::collections::BTreeSet<&str> = tf_default
            .iter()
            .filter(|c| c.model == m)
            .map(|c| c.prompt.as_str())
            .collect();
        assert!(
            prompts.len() >= 6,
            "{m}: every prompt against transformers ({})",
            prompts.len()
        );
    }
    // default tier: reference mode at off and avx2 (its two orders; avx512 runs the avx2 kernels), ggml mode at
    // this CPU's best setting only; the full tier adds ggml mode's other settings
    let tf_pairs = tf_default
        .iter()
        .map(|c| (c.model.as_str(), c.prompt.as_str()))
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    // every model and prompt but a speech model's (llama.cpp does not run Whisper) is held to llama.cpp
    let speech_pairs = pairs
        .iter()
        .filter(|p| lockstep::bench::speech_arch(p.0).is_some())
        .count();
    assert_eq!(speech_pairs, 5, "whisper-seeded's five WAVs");
    assert_eq!(
        lc.len(),
        (pairs.len() - speech_pairs) * 3,
        "llama.cpp: reference × 2 + ggml × 1 per model and prompt"
    );
    assert_eq!(
        tf_default.len(),
        tf_pairs * 3,
        "transformers: reference × 2 + ggml × 1"
    );
    let best = lockstep_engine::Simd::detect().name();
    assert!(cells
        .iter()
        .filter(|c| c.mode == NumericsMode::Ggml)
        .all(|c| c.simd == best));
    let full = matrix
        .expand(
            &manifest,
            &Filters {
                full: true,
                ..Filters::default()
            },
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(
        full.len(),
        (pairs.len() - speech_pairs + tf_pairs) * (n_simd + 2),
        "full tier: ggml × {n_simd} SIMD settings + reference × 2 per model, prompt and oracle"
    );
    assert!(
        cells.iter().all(|c| full.contains(c)),
        "the default tier is part of the full tier"
    );
    let cells = full;
    let th = Thresholds::load(&root.join("ci/thresholds.toml")).unwrap_or_else(|e| panic!("{e:#}"));
    // thresholds of the seeded models against transformers-f32 (ci/thresholds.toml): reference mode at the
    // float32 floor -- KL below 1e-8 and min_cosine_out above 1 - 1e-6, orders below llama.cpp's noise --
    // whatever the weight type, since both sides compute in f32 on the same dequantized weights
    for c in cells.iter().filter(|c| {
        c.oracle == "transformers-f32" && c.mode == NumericsMode::Reference && seeded(&c.model)
    }) {
        let t = th.for_cell(c).unwrap_or_else(|e| panic!("{e:#}"));
        assert!(t.max_mean_kl <= 1e-8, "{}: {}", c.id(), t.max_mean_kl);
        assert!(
            t.min_cosine_out >= 1.0 - 1e-6,
            "{}: {}",
            c.id(),
            t.min_cosine_out
        );
    }
    // The values are tuned from measured data; what must hold whatever they are: every cell has
    // thresholds, tokens must match everywhere, and against llama.cpp ggml mode (which reproduces llama.cpp's
    // quantization) is held at least as tightly as reference mode; against transformers (f32 on the same
    // dequantized weights) reference mode is held at least as tightly as ggml mode, and at least as tightly
    // as against llama.cpp.
    for c in &cells {
        let t = th.for_cell(c).unwrap_or_else(|e| panic!("{e:#}"));
        assert!(t.tokens_must_match, "{}", c.id());
        if c.oracle == "transformers-f32" {
            if c.mode == NumericsMode::Reference {
                let mut g = c.clone();
                g.mode = NumericsMode::Ggml;
                let g = th.for_cell(&g).unwrap();
                let mut l = c.clone();
                l.oracle = "llama.cpp-f32kv".into();
                let l = th.for_cell(&l).unwrap();
                for o in [&g, &l] {
                    assert!(t.max_mean_kl <= o.max_mean_kl, "{}", c.id());
                    assert!(t.min_cosine_out >= o.min_cosine_out, "{}", c.id());
                    assert!(t.margin_tolerance <= o.margin_tolerance, "{}", c.id());
                }
                // held to this oracle's own measured floors (issue 42), never to bit equality
                assert!(
                    !t.stage_exact && t.stage_floor_headroom.is_some(),
                    "{}",
                    c.id()
                );
            }
            continue;
        }
        if c.mode == NumericsMode::Ggml {
            let mut r = c.clone();
            r.mode = NumericsMode::Reference;
            let r = th.for_cell(&r).unwrap();
            // bit equality (stage_exact: every compared stage equals the golden bit for bit) is tighter than any KL or
            // cosine; a ggml rule without it must hold them at least as tightly as reference mode's rule
            if !t.stage_exact {
                assert!(t.max_mean_kl <= r.max_mean_kl, "{}", c.id());
                assert!(t.min_cosine_out >= r.min_cosine_out, "{}", c.id());
            }
            assert!(t.margin_tolerance <= r.margin_tolerance, "{}", c.id());
            assert!(t.min_top1_agreement >= r.min_top1_agreement, "{}", c.id());
        }
    }
}

#[test]
fn first_divergent_sees_scale_errors_through_nmse() {
    // A rescaled row keeps cosine 1: only NMSE shows it (a wrong RMSNorm epsilon looks like this).
    let mut cmp = good();
    cmp.stages[1] = stage(
        "blk.0.attn_norm",
        Phase::Prefill,
        &[1.0, 1.0, 1.0],
        &[1e-9, 0.3, 0.3],
    );
    assert_eq!(
        first_divergent(&cmp, 0.999, None),
        None,
        "cosine alone is blind to scale"
    );
    let d = first_divergent(&cmp, 0.999, Some(1e-4)).unwrap();
    assert_eq!(
        (d.stage.as_str(), d.position, d.nmse),
        ("blk.0.attn_norm", 1, 0.3)
    );
}

#[test]
fn stage_exact_fails_on_any_difference_at_storage_precision_and_marks_it_first() {
    // a scale error too small for the cosine and NMSE cutoffs (a wrong RMSNorm epsilon: NMSE ~4e-7)
    let mut cmp = good();
    for s in &mut cmp.stages {
        s.exact_at_storage_by_position
            .iter_mut()
            .for_each(|e| *e = true);
    }
    let th_exact = CellThresholds {
        stage_exact: true,
        ..th()
    };
    let c = cell("ggml");
    let v = evaluate(&c, &cmp, &th_exact);
    assert!(v.pass && v.first_divergent.is_none(), "{v:#?}");
    let i = cmp
        .stages
        .iter()
        .position(|s| s.stage == "blk.1.out" && s.phase == Phase::Prefill)
        .unwrap();
    cmp.stages[i].nmse_by_position[1] = 4e-7;
    cmp.stages[i].exact_at_storage_by_position[1] = false;
    // the cutoffs see nothing ...
    let v = evaluate(&c, &cmp, &th());
    assert!(v.pass && v.first_divergent.is_none(), "{v:#?}");
    // ... bit equality does, and names the stage and position
    let v = evaluate(&c, &cmp, &th_exact);
    assert!(!v.pass);
    assert_eq!(v.failures.len(), 1, "{v:#?}");
    assert_eq!(v.failures[0].metric, "stage_exact");
    let d = v.first_divergent.as_ref().unwrap();
    assert_eq!(
        (d.stage.as_str(), d.phase, d.position),
        ("blk.1.out", Phase::Prefill, 1)
    );
    let line = failure_line(&c, &v).unwrap();
    assert!(
        line.contains("stage_exact = 0 (threshold 1)")
            && line.contains("blk.1.out prefill position 1"),
        "{line}"
    );
    // a golden stage the engine never emitted cannot pass a stage_exact gate either
    let mut missing = cmp.clone();
    missing.stages[i].exact_at_storage_by_position[1] = true;
    missing.not_compared.push(NotCompared {
        stage: "blk.1.ffn_act".into(),
        phase: Phase::Prefill,
        reason: lockstep::compare::ENGINE_HAS_NO_SUCH_STAGE.into(),
    });
    let v = evaluate(&c, &missing, &th_exact);
    assert!(
        !v.pass && v.failures[0].detail.contains("blk.1.ffn_act"),
        "{v:#?}"
    );
    // a comparison without the storage check cannot pass a stage_exact gate
    cmp.stages[i].exact_at_storage_by_position.clear();
    let v = evaluate(&c, &cmp, &th_exact);
    assert!(!v.pass && v.failures[0].value.is_nan(), "{v:#?}");
}

/// Issue 41: every rule of `ci/thresholds.toml` marked `yardstick = "cross-oracle distance"` holds a model's
/// reference cells against llama.cpp to numbers DERIVED from that model's measured record in
/// `golden/manifest.json` (`cross_oracle`; `lockstep::gate::yardstick::derive`): each of its four gated fields
/// equals the derivation, the record was measured on the prompt file as it is now (sha256), every record has its
/// rule, and every reference × llama.cpp cell of the default matrix whose model has a record is held to it.
#[test]
fn cross_oracle_rules_are_derived_from_the_manifest() {
    use lockstep::gate::yardstick::{derive, LABEL};
    let th = Thresholds::load(&repo().join("ci/thresholds.toml")).unwrap();
    let manifest = load_manifest(&repo().join("golden")).unwrap();
    assert!(
        !manifest.cross_oracle.is_empty(),
        "golden/manifest.json has no cross_oracle record"
    );
    let mut ruled = std::collections::BTreeSet::new();
    for r in th
        .rules
        .iter()
        .filter(|r| r.yardstick.as_deref() == Some(LABEL))
    {
        assert!(
            r.mode == "reference" && r.oracle == "llama.cpp-f32kv" && r.model != "*",
            "a cross-oracle rule holds one model's reference cells against llama.cpp-f32kv: {r:?}"
        );
        let rec = manifest.cross_oracle.get(&r.model).unwrap_or_else(|| {
            panic!(
                "{}: no cross_oracle record in golden/manifest.json (oracles/yardstick/measure.sh --record)",
                r.model
            )
        });
        let file = repo().join(&rec.prompts_file);
        let sha = lockstep::hash::sha256_file(&file).unwrap();
        assert_eq!(
            sha, rec.prompts_sha256,
            "{}: {} changed since it was measured; measure again",
            r.model, rec.prompts_file
        );
        let d = derive(rec).unwrap();
        let same =
            |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() <= 1e-12 * b.abs().max(1.0));
        for (name, have, want) in [
            ("max_mean_kl", r.max_mean_kl, d.max_mean_kl),
            ("margin_tolerance", r.margin_tolerance, d.margin_tolerance),
            ("min_top5_mean", r.min_top5_mean, d.min_top5_mean),
            ("min_cosine_out", r.min_cosine_out, d.min_cosine_out),
        ] {
            assert!(
                same(have, want),
                "{}: {name} = {have:?} in ci/thresholds.toml, derived from the manifest: {want}",
                r.model
            );
        }
        ruled.insert(r.model.clone());
    }
    for m in manifest.cross_oracle.keys() {
        assert!(
            ruled.contains(m),
            "{m}: a cross_oracle record without its rule in ci/thresholds.toml"
        );
    }
    let matrix = Matrix::load(&repo().join("ci/matrix.toml")).unwrap();
    for m in matrix
        .models
        .iter()
        .filter(|m| manifest.cross_oracle.contains_key(&m.id))
    {
        if !m.has_oracle("llama.cpp-f32kv") {
            continue;
        }
        let c = Cell {
            model: m.id.clone(),
            quant: m.quant.clone(),
            ..cell("reference")
        };
        assert_eq!(th.for_cell(&c).unwrap().yardstick, LABEL, "{}", m.id);
    }
}
