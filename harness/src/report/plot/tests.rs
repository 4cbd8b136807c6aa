//! The plot read back from its SVG: which stages are drawn, which is named worst, where the cutoff is, what
//! the y axis spans, which colours the kinds get (issue 46, item 4).

use super::*;
use crate::compare::{CellComparison, StageComparison};
use crate::gate::{CellThresholds, Divergence, Failure, Verdict};
use crate::matrix::Cell;
use crate::metrics::Summary;
use crate::report::Speed;

#[test]
fn stage_kinds_fall_into_four_families() {
    for (kind, fam) in [
        ("q", "attention"),
        ("k_rope", "attention"),
        ("attn_out", "attention"),
        ("attn_proj", "attention"),
        ("ffn_gate", "FFN"),
        ("ffn_act", "FFN"),
        ("ffn_out", "FFN"),
        ("attn_norm", "norms"),
        ("q_norm", "norms"),
        ("ffn_post_norm", "norms"),
        ("output_norm", "norms"),
        ("ffn_inp", "residual"),
        ("out", "residual"),
        ("embed", "residual"),
    ] {
        assert_eq!(family(kind).0, fam, "{kind}");
    }
}

/// A stage with the same NMSE at its 3 positions (0: exact at storage precision).
fn stage(id: &str, phase: Phase, nmse: f64) -> StageComparison {
    let v = [nmse; 3];
    let cos = if nmse == 0.0 { 1.0 } else { 1.0 - nmse / 2.0 };
    let s = |x: f64| Summary::of([x; 3]).unwrap();
    StageComparison {
        stage: id.into(),
        phase,
        layer: crate::compare::layer_of(id),
        width: 8,
        cosine: s(cos),
        nmse: s(nmse),
        rmse: s(nmse.sqrt()),
        mean_abs: s(nmse.sqrt()),
        max_abs: nmse.sqrt(),
        bit_exact: nmse == 0.0,
        storage: Some(crate::npz::Dtype::F32),
        exact_at_storage_by_position: v.iter().map(|&n| n == 0.0).collect(),
        worst_position: 0,
        cosine_by_position: vec![cos; 3],
        nmse_by_position: v.to_vec(),
        positions: Vec::new(),
    }
}

fn thresholds(exact: bool, headroom: Option<f64>) -> CellThresholds {
    CellThresholds {
        tokens_must_match: true,
        min_top1_agreement: 1.0,
        max_mean_kl: 1e-2,
        max_kl: None,
        min_top5_mean: 0.9,
        min_cosine_out: 0.995,
        stage_min_cosine: 0.99,
        stage_max_nmse: Some(5e-2),
        margin_tolerance: 0.4,
        stage_exact: exact,
        stage_floor_headroom: headroom,
        yardstick: String::new(),
    }
}

/// A 3-layer cell with these stages, gated by hand: `failures` (metric, detail) and a first divergent stage.
fn cell(
    stages: Vec<StageComparison>,
    th: CellThresholds,
    failures: &[(&str, &str)],
    first: Option<(&str, Phase)>,
) -> CellReport {
    CellReport {
        cell: Cell {
            model: "m-q2_k".into(),
            prompt: "p".into(),
            quant: "Q2_K".into(),
            mode: lockstep_engine::NumericsMode::Reference,
            simd: "off".into(),
            oracle: "llama.cpp-f32kv".into(),
            engine: "lockstep".into(),
        },
        model_sha256: String::new(),
        golden_path: "m/o/p.npz".into(),
        golden_sha256: String::new(),
        ggml_target: None,
        comparison: CellComparison {
            golden_tokens: vec![1, 2, 3],
            engine_tokens: vec![1, 2, 3],
            stages,
            not_compared: Vec::new(),
            logits: Vec::new(),
        },
        speed: Speed {
            prefill_tokens: 3,
            prefill_seconds: 0.0,
            decode_tokens: 0,
            decode_seconds: 0.0,
        },
        verdict: Verdict {
            pass: failures.is_empty(),
            failures: failures
                .iter()
                .map(|(m, d)| Failure {
                    metric: m.to_string(),
                    value: 0.9,
                    threshold: 0.995,
                    detail: d.to_string(),
                })
                .collect(),
            first_divergent: first.map(|(stage, phase)| Divergence {
                stage: stage.into(),
                phase,
                position: 2,
                cosine: 0.9,
                nmse: 0.2,
            }),
            margin_tolerance: 0.4,
        },
        thresholds: Some(th),
        local_nmse_by_layer: Vec::new(),
        finding: None,
        output_sha256: None,
        error: None,
        rounding_probe: None,
        seconds: None,
        expected_failure: None,
    }
}

/// Each layer's stages at `base × (layer + 1)`, the kinds a little apart.
fn layers(phase: Phase, base: f64) -> Vec<StageComparison> {
    let mut v = Vec::new();
    for l in 0..3 {
        for (i, k) in [
            "attn_norm",
            "q",
            "k",
            "ffn_gate",
            "ffn_up",
            "ffn_act",
            "ffn_out",
            "out",
        ]
        .iter()
        .enumerate()
        {
            v.push(stage(
                &format!("blk.{l}.{k}"),
                phase,
                base * (l + 1) as f64 * (1.0 + i as f64 / 10.0),
            ));
        }
    }
    v
}

// --- reading the SVG back ---

/// The text of every `<text>` element, unescaped enough for these labels.
fn texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            let body = t.split_once('>')?.1;
            Some(
                body.split("</text>")
                    .next()?
                    .replace("&lt;", "<")
                    .replace("&gt;", ">")
                    .replace("&amp;", "&")
                    .trim_matches('\n')
                    .to_string(),
            )
        })
        .collect()
}

fn attr(el: &str, name: &str) -> Option<String> {
    let at = el.find(&format!(" {name}=\""))? + name.len() + 3;
    Some(el[at..].split('"').next()?.to_string())
}

/// Every `<circle>` as (cx, cy, r, fill, stroke).
fn circles(svg: &str) -> Vec<(f64, f64, f64, String, String)> {
    svg.split("<circle")
        .skip(1)
        .map(|c| {
            let el = c.split('>').next().unwrap();
            let n = |k| attr(el, k).unwrap().parse::<f64>().unwrap();
            (
                n("cx"),
                n("cy"),
                n("r"),
                attr(el, "fill").unwrap_or_default(),
                attr(el, "stroke").unwrap_or_default(),
            )
        })
        .collect()
}

/// A `<polyline>`: stroke colour, stroke width, points.
type Polyline = (String, f64, Vec<(f64, f64)>);

/// Every `<polyline>`.
fn polylines(svg: &str) -> Vec<Polyline> {
    svg.split("<polyline")
        .skip(1)
        .map(|p| {
            let el = p.split('>').next().unwrap();
            let pts = attr(el, "points")
                .unwrap()
                .split_whitespace()
                .map(|xy| {
                    let (x, y) = xy.split_once(',').unwrap();
                    (x.parse().unwrap(), y.parse().unwrap())
                })
                .collect();
            (
                attr(el, "stroke").unwrap_or_default(),
                attr(el, "stroke-width")
                    .and_then(|w| w.parse().ok())
                    .unwrap_or(1.0),
                pts,
            )
        })
        .collect()
}

/// The data points: the small filled circles (r = 2) inside the plot area (x < 760).
fn points(svg: &str) -> Vec<(f64, f64, String)> {
    circles(svg)
        .into_iter()
        .filter(|c| c.2 == 2.0 && c.0 < 760.0)
        .map(|c| (c.0, c.1, c.3))
        .collect()
}

#[test]
fn a_cell_failing_at_output_norm_has_it_drawn_ringed_and_named_worst() {
    // every layer far under the cutoffs; output_norm fails min_cosine_out
    let mut stages = layers(Phase::Prefill, 1e-6);
    stages.push(stage("output_norm", Phase::Prefill, 0.2));
    let c = cell(
        stages,
        thresholds(false, None),
        &[(
            "min_cosine_out",
            "output_norm prefill position 2 (NMSE 2.000e-1)",
        )],
        Some(("output_norm", Phase::Prefill)),
    );
    let svg = error_vs_depth_svg(&c).unwrap();
    let t = texts(&svg);
    // a column after the last layer, labelled with the stage
    assert!(t.iter().any(|s| s == "output_norm"), "{t:?}");
    assert!(t.iter().any(|s| s == "worst: output_norm"), "{t:?}");
    assert!(
        t.iter()
            .any(|s| s.starts_with("first divergent: output_norm (prefill, position 2)")),
        "{t:?}"
    );
    assert!(
        t.iter()
            .any(|s| s == "failing min_cosine_out: output_norm (prefill)")
            || t.iter()
                .any(|s| s.starts_with("first divergent: output_norm")),
        "{t:?}"
    );
    // the highest point (smallest y on screen) is output_norm's, right of every layer's point, ringed
    let pts = points(&svg);
    let top = pts.iter().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
    assert!(
        pts.iter().all(|p| p.0 <= top.0),
        "output_norm is not the last column"
    );
    let ring = circles(&svg)
        .into_iter()
        .find(|c| c.2 == 7.0)
        .expect("a ring");
    assert!(
        (ring.0 - top.0).abs() < 1.0 && (ring.1 - top.1).abs() < 1.0,
        "the ring {ring:?} is not on output_norm's point {top:?}"
    );
}

#[test]
fn the_worst_named_is_the_worst_drawn_decode_included() {
    // a KV-cache bug: the prefill is tiny, the decode residual stream is at 0.3-0.7
    let mut stages = layers(Phase::Prefill, 1e-8);
    for l in 0..3 {
        stages.push(stage(
            &format!("blk.{l}.out"),
            Phase::Decode,
            0.3 + 0.2 * l as f64,
        ));
    }
    let c = cell(stages, thresholds(false, Some(4.0)), &[], None);
    let svg = error_vs_depth_svg(&c).unwrap();
    let t = texts(&svg);
    assert!(t.iter().any(|s| s == "worst: blk.N.out (decode)"), "{t:?}");
    assert!(!t.iter().any(|s| s == "worst: blk.N.ffn_out"), "{t:?}");
    // the worst series is the magenta one (3 decode points), and no point is above its highest
    let pts = points(&svg);
    let magenta: Vec<f64> = pts
        .iter()
        .filter(|p| p.2 == "#C800A0")
        .map(|p| p.1)
        .collect();
    assert_eq!(magenta.len(), 3, "{pts:?}");
    let worst = magenta.iter().copied().fold(f64::INFINITY, f64::min);
    assert!(pts.iter().all(|p| p.1 >= worst - 0.5));
    assert!(
        polylines(&svg)
            .iter()
            .any(|p| p.0 == "#C800A0" && p.1 == 3.0),
        "the worst series is drawn thick"
    );
}

/// The red dashed cutoff's y on screen, if drawn across the plot.
fn cutoff_y(svg: &str, colour: &str) -> Option<f64> {
    polylines(svg)
        .into_iter()
        .filter(|p| {
            p.0 == colour && p.1 == 1.0 && p.2.len() == 2 && (p.2[0].1 - p.2[1].1).abs() < 0.1
        })
        .map(|p| p.2[0].1)
        .next()
}

#[test]
fn a_passing_cell_never_crosses_its_drawn_cutoff() {
    // reference mode with measured floors: ffn_act's accumulated error above stage_max_nmse (which only marks
    // the first divergent stage) in a passing cell: no cutoff drawn, the legend says why
    let mut stages = layers(Phase::Prefill, 1e-3);
    stages.push(stage("blk.2.ffn_act", Phase::Prefill, 0.08));
    let c = cell(
        stages,
        thresholds(false, Some(4.0)),
        &[],
        Some(("blk.2.ffn_act", Phase::Prefill)),
    );
    let svg = error_vs_depth_svg(&c).unwrap();
    assert_eq!(
        cutoff_y(&svg, "#C81E1E"),
        None,
        "a cutoff the gate does not apply"
    );
    assert!(
        texts(&svg).iter().any(|s| s.contains("measured floor")),
        "{:?}",
        texts(&svg)
    );
    assert!(
        !svg.contains("stage_max_nmse 5e-2"),
        "the marker cutoff is not drawn as a gate"
    );

    // ggml mode (bit equality): a passing cell has every point on the exact row, under the line
    let mut stages: Vec<StageComparison> = layers(Phase::Prefill, 1.0)
        .into_iter()
        .map(|s| stage(&s.stage, Phase::Prefill, 0.0))
        .collect();
    stages.push(stage("output_norm", Phase::Prefill, 0.0));
    let c = cell(stages, thresholds(true, None), &[], None);
    let svg = error_vs_depth_svg(&c).unwrap();
    let y = cutoff_y(&svg, "#C81E1E").expect("the stage_exact line");
    let pts = points(&svg);
    assert!(!pts.is_empty());
    assert!(
        pts.iter().all(|p| p.1 > y),
        "a passing point above the cutoff"
    );
    // and a failing one: its inexact stage is above it
    let mut stages: Vec<StageComparison> = layers(Phase::Prefill, 1.0)
        .into_iter()
        .map(|s| stage(&s.stage, Phase::Prefill, 0.0))
        .collect();
    stages[9] = stage(&stages[9].stage.clone(), Phase::Prefill, 1e-9);
    let c = cell(
        stages,
        thresholds(true, None),
        &[("stage_exact", "1 stage(s) differ")],
        Some(("blk.1.q", Phase::Prefill)),
    );
    let svg = error_vs_depth_svg(&c).unwrap();
    let y = cutoff_y(&svg, "#C81E1E").unwrap();
    assert_eq!(points(&svg).iter().filter(|p| p.1 < y).count(), 1);

    // no measured floors: the gate holds the local line to stage_max_nmse; it is drawn in the local line's
    // colour, and a passing cell's local line stays under it
    let mut c = cell(
        layers(Phase::Prefill, 1e-3),
        thresholds(false, None),
        &[],
        None,
    );
    c.local_nmse_by_layer = vec![1e-3, 2e-3, 4e-3];
    let svg = error_vs_depth_svg(&c).unwrap();
    let y = cutoff_y(&svg, "#145ADC").expect("the local cutoff");
    let local: Vec<(f64, f64)> = polylines(&svg)
        .into_iter()
        .filter(|p| p.0 == "#145ADC" && p.1 == 4.0 && p.2.len() == 3)
        .flat_map(|p| p.2)
        .collect();
    assert_eq!(local.len(), 3);
    assert!(local.iter().all(|p| p.1 > y));
    assert!(texts(&svg)
        .iter()
        .any(|s| s == "gate on the local line: NMSE ≤ 5e-2"));
}

/// The y tick labels, top to bottom.
fn y_ticks(svg: &str) -> Vec<String> {
    texts(svg)
        .into_iter()
        .filter(|t| t == "exact" || t.contains("e-") || t.contains("e0") || t.contains("e1"))
        .filter(|t| !t.contains(' ') && !t.contains(':'))
        .collect()
}

#[test]
fn the_y_axis_fits_the_data() {
    // errors between 1e-3 and 1e-2, none exact: no `exact` row, nothing below 1e-4
    let c = cell(
        layers(Phase::Prefill, 2e-3),
        thresholds(false, Some(4.0)),
        &[],
        None,
    );
    let svg = error_vs_depth_svg(&c).unwrap();
    let ticks = y_ticks(&svg);
    assert!(!ticks.is_empty());
    assert!(!ticks.iter().any(|t| t == "exact"), "{ticks:?}");
    let lowest = ticks
        .iter()
        .map(|t| t.parse::<f64>().unwrap())
        .fold(f64::INFINITY, f64::min);
    assert!(lowest >= 1e-4, "{ticks:?}");
    // some exact stages: an `exact` row a decade under the smallest error (1e-5 → 1e-6), not 1e-12
    let mut stages = layers(Phase::Prefill, 2e-5);
    stages.push(stage("blk.0.k_rope", Phase::Prefill, 0.0));
    let c = cell(stages, thresholds(false, Some(4.0)), &[], None);
    let ticks = y_ticks(&error_vs_depth_svg(&c).unwrap());
    assert!(ticks.iter().any(|t| t == "exact"), "{ticks:?}");
    assert!(
        !ticks.iter().any(|t| t == "1e-12" || t == "1e-9"),
        "{ticks:?}"
    );
}

#[test]
fn kinds_of_a_family_get_distinct_colours() {
    let c = cell(
        layers(Phase::Prefill, 1e-4),
        thresholds(false, Some(4.0)),
        &[],
        None,
    );
    let svg = error_vs_depth_svg(&c).unwrap();
    // the FFN kinds (gate, up, act, out) and the attention kinds (q, k): one colour each, all different
    let mut colours: Vec<String> = polylines(&svg)
        .into_iter()
        .filter(|p| p.2.len() == 3 && p.1 <= 2.0)
        .map(|p| p.0)
        .collect();
    let n = colours.len();
    // 8 kinds, one is the worst (magenta, thick): 7 thin series
    assert_eq!(n, 7, "{colours:?}");
    colours.sort();
    colours.dedup();
    assert_eq!(colours.len(), n, "kinds share a colour");
    assert_ne!(family("ffn_up").1[0], family("ffn_up").1[1]);
}
