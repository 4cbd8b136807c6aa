//! Error vs depth as a picture: one SVG per cell, written with the report (`plots/`) and linked from
//! `report.md`. Drawn with the `plotters` crate (SVG backend; text is SVG `<text>`, no font files).
//!
//! x: layer, with `embed` one column before layer 0 and the stages after the last layer (`output_norm`,
//! an encoder's `pooled`) one column after it. y: NMSE (log scale), the largest over the positions, one
//! series per stage kind and phase: prefill solid, decode dashed (every stage the golden stores for the
//! decode steps). The thick blue line is each layer's *local* error (bisect's pass with the golden's own
//! input injected; the largest NMSE of any of its stages): flat for rounding, a spike at the layer where a
//! bug enters. A stage equal to the golden at its storage precision has no error to draw on a log scale: it
//! sits on a row labelled *exact*, a decade under the smallest error drawn; the axis fits the data (it does
//! not run down to a fixed 1e-12).
//!
//! What the plot names agrees with the verdict: the series named *worst* is the drawn series with the
//! largest value, decode included; the stage the verdict names (the first divergent stage, bisect's
//! structural finding, a failing metric's stage such as `min_cosine_out` at `output_norm`) is ringed in red;
//! and a cutoff line is drawn only where it is the gate's own test on a drawn quantity, so a passing cell
//! never crosses it: bit equality (`stage_exact`, a line just above the *exact* row), the local line's
//! `stage_max_nmse` (a cell without measured floors), an encoder's pooled NMSE. Measured floors (one per
//! stage kind) and a `stage_max_nmse` that only marks the first divergent stage are named in the legend,
//! not drawn.
//!
//! Readable at a glance: the stage kinds are coloured by *family* — attention (Q/K/V, RoPE, attention
//! output and projection), FFN (gate, up, activation, output), norms (every RMSNorm/LayerNorm output),
//! residual (`embed`, `ffn_inp`, `out`, `pooled`) — each kind a distinct shade of its family's hue, listed
//! under its family in the legend. Layer ticks are integers. A cell whose golden stores no per-layer stage
//! (logits only, as the `chinese` goldens) gets no plot at all ([`has_depth`]): report.md says in a sentence
//! what its golden stores and which prompt of the model has the full stages ([`no_plot_sentence`]).

use std::collections::BTreeMap;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

use super::CellReport;
use crate::compare::Phase;

/// The file name of cell `index`'s plot inside the report directory: `plots/<index>-<cell id>.svg`, the
/// id made one safe, bounded file-name component ([`crate::output::file_stem`]: characters other than
/// ASCII letters, digits, `.`, `-`, `_` become `_`; an id over 120 bytes is cut and a hash appended), e.g.
/// `plots/03-smollm2-135m-q4_1_prose_Q4_1_ggml_simd-off_llama.cpp-f32kv_lockstep.svg`.
pub fn plot_file_name(index: usize, cell: &CellReport) -> String {
    format!(
        "plots/{index:02}-{}.svg",
        crate::output::file_stem(&cell.cell.id())
    )
}

/// Whether cell `c` compared any per-layer stage (`blk.N.*`): the only cells with a plot.
pub fn has_depth(c: &CellReport) -> bool {
    c.comparison.stages.iter().any(|s| s.layer.is_some())
}

/// The sentence report.md (and the site) show instead of the plot of a cell without per-layer stages
/// ([`has_depth`]): what its golden stores, and the prompts of the same model in `cells` whose goldens
/// store the full stages. `None` for a cell that has a plot.
pub fn no_plot_sentence(cells: &[CellReport], i: usize) -> Option<String> {
    let c = &cells[i];
    if has_depth(c) {
        return None;
    }
    let mut stored: Vec<&str> = c
        .comparison
        .stages
        .iter()
        .map(|s| s.stage.as_str())
        .collect();
    if !c.comparison.logits.is_empty() {
        stored.push("logits");
    }
    stored.sort_unstable();
    stored.dedup();
    let stores = if stored.is_empty() {
        "nothing that was compared".to_string()
    } else {
        format!("only {}", stored.join(", "))
    };
    let mut full: Vec<&str> = cells
        .iter()
        .filter(|o| o.cell.model == c.cell.model && has_depth(o))
        .map(|o| o.cell.prompt.as_str())
        .collect();
    full.sort_unstable();
    full.dedup();
    let elsewhere = if full.is_empty() {
        format!(
            "no other prompt of {} in this run stores them",
            c.cell.model
        )
    } else {
        format!(
            "the full stages of {} are in the goldens of prompt {}",
            c.cell.model,
            full.join(", ")
        )
    };
    Some(format!(
        "No error-vs-depth plot: the golden {} stores no per-layer stage ({stores}); {elsewhere}.",
        c.golden_path
    ))
}

/// The family a stage kind (`q_rope`, `ffn_up`, `output_norm`, ...) is drawn in, and the family's palette:
/// each kind of a family present in a cell gets the next colour of its family's palette, so the kinds of a
/// family are told apart while the family still reads as one hue.
fn family(kind: &str) -> (&'static str, &'static [RGBColor]) {
    const ATTENTION: &[RGBColor] = &[
        RGBColor(0, 150, 110),
        RGBColor(0, 100, 170),
        RGBColor(70, 170, 40),
        RGBColor(0, 80, 60),
        RGBColor(80, 170, 220),
        RGBColor(20, 200, 170),
        RGBColor(40, 110, 30),
        RGBColor(0, 50, 120),
        RGBColor(120, 200, 120),
    ];
    const FFN: &[RGBColor] = &[
        RGBColor(230, 120, 0),
        RGBColor(190, 40, 30),
        RGBColor(150, 90, 20),
        RGBColor(240, 180, 40),
        RGBColor(120, 50, 0),
        RGBColor(250, 110, 90),
    ];
    const NORMS: &[RGBColor] = &[
        RGBColor(140, 140, 140),
        RGBColor(110, 70, 170),
        RGBColor(70, 70, 70),
        RGBColor(180, 130, 210),
        RGBColor(170, 170, 120),
        RGBColor(90, 60, 120),
    ];
    const RESIDUAL: &[RGBColor] = &[
        RGBColor(0, 0, 0),
        RGBColor(110, 80, 50),
        RGBColor(60, 60, 140),
        RGBColor(120, 120, 0),
    ];
    if kind.ends_with("norm") {
        ("norms", NORMS)
    } else if matches!(kind, "out" | "ffn_inp" | "embed" | "pooled") {
        ("residual", RESIDUAL)
    } else if kind.starts_with("ffn") {
        ("FFN", FFN)
    } else {
        ("attention", ATTENTION)
    }
}

/// Where a stage is drawn on the x axis: its layer; `embed` one column before layer 0; any other stage
/// without a layer (`output_norm`, an encoder's `pooled`) one column after the last layer.
fn x_of(stage: &str, layer: Option<usize>, n_layer: usize) -> i64 {
    match layer {
        Some(l) => l as i64,
        None if stage == "embed" => -1,
        None => n_layer as i64,
    }
}

/// The kind a stage is drawn as: `blk.N.<kind>`'s kind, or the whole id of a stage without a layer.
fn kind_of(stage: &str, layer: Option<usize>) -> String {
    match layer {
        Some(_) => stage.splitn(3, '.').nth(2).unwrap_or("").to_string(),
        None => stage.to_string(),
    }
}

/// A series' name in the legend: `blk.N.<kind>` or the stage id, `(decode)` for the decode steps.
fn series_label(phase: Phase, kind: &str, per_layer: bool) -> String {
    let name = if per_layer {
        format!("blk.N.{kind}")
    } else {
        kind.to_string()
    };
    match phase {
        Phase::Prefill => name,
        Phase::Decode => format!("{name} (decode)"),
    }
}

/// One drawn series: a stage kind in one phase, NMSE (max over positions; 0 = exact at storage precision,
/// NaN/∞ kept) by x column ([`x_of`]).
#[derive(Clone, Debug)]
struct Line {
    phase: Phase,
    kind: String,
    per_layer: bool,
    points: BTreeMap<i64, f64>,
}

/// Every compared stage of `c` as lines, prefill first, in first-seen (forward) order, and the number of
/// layers.
fn lines(c: &CellReport) -> (Vec<Line>, usize) {
    let n_layer = c
        .comparison
        .stages
        .iter()
        .filter_map(|s| s.layer)
        .max()
        .map_or(0, |l| l + 1);
    let mut out: Vec<Line> = Vec::new();
    for phase in [Phase::Prefill, Phase::Decode] {
        for s in c.comparison.stages.iter().filter(|s| s.phase == phase) {
            let kind = kind_of(&s.stage, s.layer);
            let v = if s.exact_at_storage() {
                0.0
            } else {
                s.max_nmse()
            };
            let x = x_of(&s.stage, s.layer, n_layer);
            match out.iter_mut().find(|l| l.phase == phase && l.kind == kind) {
                Some(l) => {
                    l.points.insert(x, v);
                }
                None => out.push(Line {
                    phase,
                    kind,
                    per_layer: s.layer.is_some(),
                    points: BTreeMap::from([(x, v)]),
                }),
            }
        }
    }
    (out, n_layer)
}

/// The y scale: where exact stages and non-finite values are drawn, and the axis range. It fits the data:
/// the axis starts a little under the smallest error drawn, and the *exact* row (only when some stage is
/// exact) sits one decade under that, not at a fixed 1e-12.
#[derive(Clone, Copy, Debug)]
struct Scale {
    exact_y: f64,
    has_exact: bool,
    nonfinite_y: f64,
    bottom: f64,
    top: f64,
}

impl Scale {
    fn of(values: &[f64], extra: &[f64]) -> Self {
        let finite: Vec<f64> = values
            .iter()
            .chain(extra)
            .copied()
            .filter(|v| v.is_finite() && *v > 0.0)
            .collect();
        let has_exact = values.contains(&0.0);
        let has_nonfinite = values.iter().any(|v| !v.is_finite());
        let lo = finite.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = finite.iter().copied().fold(0.0, f64::max);
        let (lo, hi) = if finite.is_empty() {
            (1e-10, 1e-10)
        } else {
            (lo.max(1e-300), hi.min(1e290))
        };
        // a power of ten a decade (or more) under the smallest error: a log tick, labelled `exact`
        let exact_y = 10f64.powf(lo.log10().floor() - 1.0);
        let nonfinite_y = hi * 100.0;
        Self {
            exact_y,
            has_exact,
            nonfinite_y,
            bottom: if has_exact { exact_y / 3.0 } else { lo / 3.0 },
            top: if has_nonfinite {
                nonfinite_y * 3.0
            } else {
                hi * 10.0
            },
        }
    }

    fn y(&self, v: f64) -> f64 {
        if v == 0.0 {
            self.exact_y
        } else if v.is_finite() {
            v
        } else {
            self.nonfinite_y
        }
    }
}

/// The cutoff a plot draws: only one that is the gate's own test on a drawn quantity, so that a passing
/// cell never crosses it.
#[derive(Clone, Debug, PartialEq)]
enum Cutoff {
    /// `stage_exact`: every accumulated stage must be exact at storage precision; the line is drawn just
    /// above the *exact* row.
    Exact,
    /// No measured floors and not bit-exact: the local pass (the blue line) is held to `stage_max_nmse`
    /// (bisect's structural finding, [`crate::judge`]).
    Local(f64),
    /// An encoder: its pooled embedding is held to `stage_max_nmse` (drawn over the post-layer column).
    Pooled(f64),
    /// No drawable per-stage NMSE test: why, as legend text.
    None(String),
}

fn cutoff_of(c: &CellReport) -> Cutoff {
    let Some(th) = c.thresholds.as_ref() else {
        return Cutoff::None("no thresholds recorded: no cutoff".into());
    };
    let pooled = c.comparison.stages.iter().any(|s| s.stage == "pooled");
    if th.stage_exact {
        Cutoff::Exact
    } else if let (true, Some(m)) = (pooled, th.stage_max_nmse) {
        Cutoff::Pooled(m)
    } else if let Some(h) = th.stage_floor_headroom {
        Cutoff::None(format!(
            "gate: local NMSE ≤ {h} × each kind's measured floor (one per kind, not drawn)"
        ))
    } else if let (Some(m), false) = (th.stage_max_nmse, c.local_nmse_by_layer.is_empty()) {
        Cutoff::Local(m)
    } else {
        Cutoff::None(match th.stage_max_nmse {
            Some(m) => format!(
                "no NMSE gate drawn: stage_max_nmse {m:e} only marks the first divergent stage"
            ),
            None => "no per-stage NMSE gate".into(),
        })
    }
}

/// A legend row: text, swatch colour, swatch width (0: text only), dashed, a ring swatch.
type LegendRow = (String, RGBAColor, u32, bool, bool);

/// Render cell `c`'s error-vs-depth plot as an SVG document.
///
/// Every compared stage is drawn: `blk.N.<kind>` by layer, `embed` before layer 0, `output_norm` (and an
/// encoder's `pooled`) after the last layer, prefill solid and decode dashed. The stage named worst is the
/// drawn series with the largest value, decode included. The stage the verdict names (first divergent,
/// structural finding, or the stage a failing metric names) is ringed in red. A cutoff line is drawn only
/// where it is the gate's own test ([`Cutoff`]).
///
/// Errors: only from the drawing backend (never expected for in-memory SVG).
pub fn error_vs_depth_svg(c: &CellReport) -> Result<String> {
    let (data, n_layer) = lines(c);
    let cutoff = cutoff_of(c);
    let has_embed = data.iter().any(|l| l.points.contains_key(&-1));
    let post: Vec<String> = {
        let mut v: Vec<String> = data
            .iter()
            .filter(|l| l.points.contains_key(&(n_layer as i64)))
            .map(|l| l.kind.clone())
            .collect();
        v.sort();
        v.dedup();
        v
    };
    let all_values: Vec<f64> = data
        .iter()
        .flat_map(|l| l.points.values().copied())
        .chain(c.local_nmse_by_layer.iter().copied())
        .collect();
    let extra: Vec<f64> = match cutoff {
        Cutoff::Local(m) | Cutoff::Pooled(m) => vec![m],
        _ => Vec::new(),
    };
    let sc = Scale::of(&all_values, &extra);
    let x_lo = if has_embed { -1.5 } else { -0.5 };
    let x_hi = n_layer as f64 - 0.5 + if post.is_empty() { 0.0 } else { 1.0 };
    let post_label = post.join("/");
    let x_label = |v: &f64| -> String {
        if (v - v.round()).abs() > 1e-6 {
            return String::new();
        }
        let i = v.round() as i64;
        if i == -1 && has_embed {
            "embed".into()
        } else if i == n_layer as i64 && !post.is_empty() {
            post_label.clone()
        } else if i >= 0 && i < n_layer as i64 {
            format!("{i}")
        } else {
            String::new()
        }
    };
    // the worst drawn series: the largest value of any series, either phase
    let worst: Option<usize> = data
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let m = l
                .points
                .values()
                .map(|&v| if v.is_nan() { f64::INFINITY } else { v })
                .fold(0.0, f64::max);
            (i, m)
        })
        .filter(|(_, m)| *m > 0.0)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(i, _)| i);
    // colours: each kind the next colour of its family's palette; decode shares its kind's colour
    let mut colors: BTreeMap<String, RGBColor> = BTreeMap::new();
    let mut used: BTreeMap<&'static str, usize> = BTreeMap::new();
    for l in &data {
        if !colors.contains_key(&l.kind) {
            let (fam, palette) = family(&l.kind);
            let n = used.entry(fam).or_default();
            colors.insert(l.kind.clone(), palette[*n % palette.len()]);
            *n += 1;
        }
    }

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1060, 660)).into_drawing_area();
        let err = |e| anyhow!("drawing {}: {e:?}", c.cell.id());
        root.fill(&WHITE).map_err(err)?;
        let (left, legend_area) = root.split_horizontally(760);
        let title = format!(
            "{} — error vs depth{}",
            c.cell.id(),
            if cutoff == Cutoff::Exact {
                " (floor: bit equality at storage precision)"
            } else {
                ""
            }
        );
        let mut chart = ChartBuilder::on(&left)
            .caption(title, ("sans-serif", 12))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(x_lo..x_hi, (sc.bottom..sc.top).log_scale())
            .map_err(err)?;
        let has_exact = sc.has_exact;
        let exact_y = sc.exact_y;
        chart
            .configure_mesh()
            .x_desc("layer")
            .x_labels(((x_hi - x_lo).round() as usize + 1).min(40))
            .x_label_formatter(&x_label)
            .y_desc("NMSE (max over positions)")
            .y_label_formatter(&|v| {
                if has_exact && (v / exact_y - 1.0).abs() < 1e-3 {
                    "exact".to_string()
                } else if has_exact && *v < exact_y {
                    String::new()
                } else {
                    format!("{v:.0e}")
                }
            })
            .draw()
            .map_err(err)?;
        // the legend is drawn by hand to the right of the plot, so it never hides a line
        let mut legend: Vec<LegendRow> = Vec::new();
        let mut order: Vec<usize> = (0..data.len()).filter(|&i| Some(i) != worst).collect();
        order.extend(worst);
        for &i in &order {
            let l = &data[i];
            let is_worst = Some(i) == worst;
            let color = if is_worst {
                RGBColor(200, 0, 160).to_rgba()
            } else {
                colors[&l.kind].to_rgba()
            };
            let width = if is_worst {
                3
            } else if l.kind == "out" {
                2
            } else {
                1
            };
            let pts: Vec<(f64, f64)> = l
                .points
                .iter()
                .map(|(&x, &v)| (x as f64, sc.y(v)))
                .collect();
            let style = ShapeStyle::from(&color).stroke_width(width);
            match l.phase {
                Phase::Prefill => chart.draw_series(LineSeries::new(pts.clone(), style)),
                Phase::Decode => chart.draw_series(DashedLineSeries::new(pts.clone(), 6, 4, style)),
            }
            .map_err(err)?;
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 2, color.filled())))
                .map_err(err)?;
        }
        if let Some(w) = worst {
            let l = &data[w];
            legend.push((
                format!("worst: {}", series_label(l.phase, &l.kind, l.per_layer)),
                RGBColor(200, 0, 160).to_rgba(),
                3,
                l.phase == Phase::Decode,
                false,
            ));
        }
        // by family: a header, then each kind with its own colour (decode series dashed)
        for fam in ["attention", "FFN", "norms", "residual"] {
            let members: Vec<&Line> = data.iter().filter(|l| family(&l.kind).0 == fam).collect();
            if members.is_empty() {
                continue;
            }
            legend.push((format!("{fam}:"), WHITE.to_rgba(), 0, false, false));
            for l in members {
                legend.push((
                    format!("  {}", series_label(l.phase, &l.kind, l.per_layer)),
                    colors[&l.kind].to_rgba(),
                    if l.kind == "out" { 2 } else { 1 },
                    l.phase == Phase::Decode,
                    false,
                ));
            }
        }
        let blue = RGBColor(20, 90, 220).to_rgba();
        if !c.local_nmse_by_layer.is_empty() {
            // each layer's own error, computed from the golden's input: flat for rounding, a spike for a bug
            let pts: Vec<(f64, f64)> = c
                .local_nmse_by_layer
                .iter()
                .enumerate()
                .map(|(l, &v)| (l as f64, sc.y(v)))
                .collect();
            let style = ShapeStyle::from(&blue).stroke_width(4);
            chart
                .draw_series(LineSeries::new(pts.clone(), style))
                .map_err(err)?;
            chart
                .draw_series(pts.iter().map(|&p| Cross::new(p, 4, blue.filled())))
                .map_err(err)?;
            legend.push((
                "local: worst stage, golden input".into(),
                blue,
                4,
                false,
                false,
            ));
        }
        let red = RGBColor(200, 30, 30).to_rgba();
        let gate_line = |y: f64, x0: f64, x1: f64, color: RGBAColor| {
            DashedLineSeries::new(
                [(x0, y), (x1, y)],
                3,
                3,
                ShapeStyle::from(&color).stroke_width(1),
            )
        };
        match &cutoff {
            Cutoff::Exact => {
                // every nonzero point is a decade or more above the exact row
                chart
                    .draw_series(gate_line(sc.exact_y * 3.0, x_lo, x_hi, red))
                    .map_err(err)?;
                legend.push((
                    "gate: stage_exact (above 'exact' fails)".into(),
                    red,
                    1,
                    true,
                    false,
                ));
            }
            Cutoff::Local(m) => {
                chart
                    .draw_series(gate_line(*m, x_lo, x_hi, blue))
                    .map_err(err)?;
                legend.push((
                    format!("gate on the local line: NMSE ≤ {m:e}"),
                    blue,
                    1,
                    true,
                    false,
                ));
            }
            Cutoff::Pooled(m) => {
                let x = n_layer as f64;
                chart
                    .draw_series(gate_line(*m, x - 0.4, x + 0.4, red))
                    .map_err(err)?;
                legend.push((format!("gate: pooled NMSE ≤ {m:e}"), red, 1, true, false));
            }
            Cutoff::None(why) => legend.push((why.clone(), WHITE.to_rgba(), 0, false, false)),
        }
        // the stages the verdict names, ringed where they are drawn
        for (label, stage, phase, local_value) in named_stages(c) {
            let layer = crate::compare::layer_of(&stage);
            let kind = kind_of(&stage, layer);
            let x = x_of(&stage, layer, n_layer);
            let y = match local_value {
                Some(v) => Some(sc.y(v)),
                None => data
                    .iter()
                    .find(|l| l.phase == phase && l.kind == kind)
                    .and_then(|l| l.points.get(&x))
                    .map(|&v| sc.y(v)),
            };
            match y {
                Some(y) => {
                    chart
                        .draw_series(std::iter::once(Circle::new(
                            (x as f64, y),
                            7,
                            ShapeStyle::from(&red).stroke_width(2),
                        )))
                        .map_err(err)?;
                    legend.push((label, red, 2, false, true));
                }
                None => legend.push((
                    format!("{label} (not a drawn stage)"),
                    WHITE.to_rgba(),
                    0,
                    false,
                    false,
                )),
            }
        }
        let font = ("sans-serif", 10).into_font();
        for (i, (label, color, width, dashed, ring)) in legend.iter().enumerate() {
            let y = 30 + 15 * i as i32;
            let style = ShapeStyle::from(color).stroke_width(*width);
            if *width > 0 && *ring {
                legend_area
                    .draw(&Circle::new((16, y), 5, style))
                    .map_err(err)?;
            } else if *width > 0 && *dashed {
                for seg in [[(8, y), (14, y)], [(18, y), (24, y)]] {
                    legend_area
                        .draw(&PathElement::new(seg.to_vec(), style))
                        .map_err(err)?;
                }
            } else if *width > 0 {
                legend_area
                    .draw(&PathElement::new(vec![(8, y), (24, y)], style))
                    .map_err(err)?;
            }
            legend_area
                .draw(&Text::new(label.clone(), (30, y - 5), font.clone()))
                .map_err(err)?;
        }
        root.present().map_err(err)?;
    }
    // a NUL or ESC in a cell id (a model or prompt name) would make the SVG invalid XML
    Ok(crate::format::xml_safe(&svg))
}

/// The stages the verdict names, to ring on the plot: (legend text, stage id, phase, the local value when
/// the stage is named for its local error). The first divergent stage (bisect's structural finding when
/// there is one), and each failing metric whose detail starts with a stage and phase (`min_cosine_out`:
/// `output_norm prefill position 3 ...`).
fn named_stages(c: &CellReport) -> Vec<(String, String, Phase, Option<f64>)> {
    let mut out: Vec<(String, String, Phase, Option<f64>)> = Vec::new();
    let structural = matches!(c.finding, Some(crate::judge::Finding::Structural { .. }));
    if let Some(d) = &c.verdict.first_divergent {
        if d.stage != crate::gate::verdict::TOKENS_MARKER {
            let local = structural && d.nmse.is_finite();
            out.push((
                format!(
                    "{}: {} ({}, position {}){}",
                    if structural {
                        "failing"
                    } else {
                        "first divergent"
                    },
                    d.stage,
                    d.phase,
                    d.position,
                    if local { ", local NMSE" } else { "" }
                ),
                d.stage.clone(),
                d.phase,
                local.then_some(d.nmse),
            ));
        }
    }
    for f in &c.verdict.failures {
        let mut words = f.detail.split_whitespace();
        let (Some(stage), Some(phase)) = (words.next(), words.next()) else {
            continue;
        };
        let phase = match phase {
            "prefill" => Phase::Prefill,
            "decode" => Phase::Decode,
            _ => continue,
        };
        let drawn = c
            .comparison
            .stages
            .iter()
            .any(|s| s.stage == stage && s.phase == phase);
        if drawn
            && !out
                .iter()
                .any(|o| o.1 == stage && o.2 == phase && o.3.is_none())
        {
            out.push((
                format!("failing {}: {stage} ({phase})", f.metric),
                stage.to_string(),
                phase,
                None,
            ));
        }
    }
    out
}

/// The page written in place of a plot that could not be drawn: the reason, as SVG text.
pub fn plot_error_svg(reason: &str) -> String {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (960, 80)).into_drawing_area();
        let _ = root.fill(&WHITE);
        let _ = root.draw(&Text::new(
            format!("error vs depth could not be drawn: {reason}"),
            (10, 30),
            ("sans-serif", 13).into_font(),
        ));
        let _ = root.present();
    }
    crate::format::xml_safe(&svg)
}

#[cfg(test)]
mod tests;
