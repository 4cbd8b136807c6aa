//! Error vs depth as a picture: one SVG per cell, written with the report (`plots/`) and linked from
//! `report.md`. Drawn with the `plotters` crate (SVG backend; text is SVG `<text>`, no font files).
//!
//! x: layer. y: NMSE (log scale) — for each stage kind (`blk.N.<kind>`), the largest NMSE over the
//! prefill positions at layer N, one line per kind; the residual stream (`blk.N.out`) is also drawn for
//! the decode steps (dashed). The thick blue line is each layer's *local* error (bisect's pass with the
//! golden's own input injected; the largest NMSE of any of its stages): flat for rounding, a spike at the
//! layer where a bug enters. A stage equal to the golden at its storage precision has no error to draw
//! on a log scale: it sits on the bottom line, labelled *exact*. The cell's own stage NMSE cutoff
//! (`stage_max_nmse` of its thresholds), when it has one, is drawn as a horizontal line: a bug jumps
//! above it at one layer, accumulated rounding climbs smoothly below it.
//!
//! Readable at a glance: the stage kinds are coloured by *family* — attention (Q/K/V, RoPE, attention
//! output and projection), FFN (gate, up, activation, output), norms (every RMSNorm/LayerNorm output),
//! residual (`ffn_inp`, `out`) — so twenty kinds read as four colours (the legend lists each family's
//! kinds), and the worst kind (the largest
//! NMSE at any layer) is drawn thick and named in the legend. Layer ticks are integers. A cell whose
//! golden stores no per-layer stage (logits only, as the `chinese` goldens) gets no plot at all
//! ([`has_depth`]): report.md says in a sentence what its golden stores and which prompt of the model has
//! the full stages ([`no_plot_sentence`]).

use std::collections::BTreeMap;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

use super::CellReport;
use crate::compare::Phase;

/// Where exact stages are drawn (the bottom of the y axis).
const EXACT_Y: f64 = 1e-12;

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

/// The family a stage kind (`q_rope`, `ffn_up`, ...) is drawn in, and the family's colour.
fn family(kind: &str) -> (&'static str, RGBColor) {
    if kind.ends_with("norm") {
        ("norms", RGBColor(140, 140, 140))
    } else if kind == "out" || kind == "ffn_inp" {
        ("residual", RGBColor(0, 0, 0))
    } else if kind.starts_with("ffn") {
        ("FFN", RGBColor(230, 120, 0))
    } else {
        ("attention", RGBColor(0, 150, 110))
    }
}

/// An integer layer tick's label; nothing between layers.
fn layer_label(v: &f64) -> String {
    if (v - v.round()).abs() < 1e-6 {
        format!("{}", v.round() as i64)
    } else {
        String::new()
    }
}

/// Per stage kind (and phase): NMSE (max over positions) by layer.
type Series = BTreeMap<(Phase, String), BTreeMap<usize, f64>>;

fn series(c: &CellReport) -> Series {
    let mut out: Series = BTreeMap::new();
    for s in &c.comparison.stages {
        let Some(layer) = s.layer else { continue };
        let kind = s.stage.splitn(3, '.').nth(2).unwrap_or("").to_string();
        if s.phase == Phase::Decode && kind != "out" {
            continue;
        }
        let nmse = if s.exact_at_storage() {
            0.0
        } else {
            s.max_nmse()
        };
        out.entry((s.phase, kind)).or_default().insert(layer, nmse);
    }
    out
}

fn y_of(v: f64) -> f64 {
    if v.is_finite() {
        v.max(EXACT_Y)
    } else {
        1e6
    }
}

/// Render cell `c`'s error-vs-depth plot as an SVG document.
///
/// Errors: only from the drawing backend (never expected for in-memory SVG).
pub fn error_vs_depth_svg(c: &CellReport) -> Result<String> {
    let data = series(c);
    let n_layer = data
        .values()
        .flat_map(|m| m.keys())
        .max()
        .map_or(1, |l| l + 1);
    let cutoff = c.thresholds.as_ref().and_then(|t| t.stage_max_nmse);
    let exact_floor = c.thresholds.as_ref().is_some_and(|t| t.stage_exact);
    let y_max = data
        .values()
        .flat_map(|m| m.values())
        .copied()
        .chain(c.local_nmse_by_layer.iter().copied())
        .map(y_of)
        .chain(cutoff)
        .fold(1e-6_f64, f64::max)
        .min(1e30)
        * 10.0;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 540)).into_drawing_area();
        let err = |e| anyhow!("drawing {}: {e:?}", c.cell.id());
        root.fill(&WHITE).map_err(err)?;
        let (left, legend_area) = root.split_horizontally(790);
        let title = format!(
            "{} — error vs depth{}",
            c.cell.id(),
            if exact_floor {
                " (floor: bit equality at storage precision)"
            } else {
                ""
            }
        );
        let mut chart = ChartBuilder::on(&left)
            .caption(title, ("sans-serif", 13))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(
                -0.5f64..(n_layer as f64 - 0.5),
                (EXACT_Y / 3.0..y_max).log_scale(),
            )
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("layer")
            .x_labels((n_layer + 1).min(32))
            .x_label_formatter(&layer_label)
            .y_desc("NMSE (max over positions)")
            .y_label_formatter(&|v| {
                if *v <= EXACT_Y * 1.0001 {
                    "exact".to_string()
                } else {
                    format!("{v:.0e}")
                }
            })
            .draw()
            .map_err(err)?;
        // the legend is drawn by hand to the right of the plot, so it never hides a line
        let mut legend: Vec<(String, RGBAColor, u32, bool)> = Vec::new();
        // the worst kind of the prefill: the largest NMSE at any layer, drawn thick
        let worst = data
            .iter()
            .filter(|((phase, _), _)| *phase == Phase::Prefill)
            .map(|(k, pts)| (k, pts.values().copied().map(y_of).fold(0.0, f64::max)))
            .filter(|(_, v)| *v > EXACT_Y)
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(k, _)| k.clone());
        // family → its prefill kinds, in order
        let mut families: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
        for ((phase, kind), points) in &data {
            let (fam, rgb) = family(kind);
            let is_worst = worst.as_ref() == Some(&(*phase, kind.clone()));
            let color = if is_worst {
                RGBColor(200, 0, 160).to_rgba()
            } else {
                rgb.mix(if kind == "out" { 1.0 } else { 0.75 })
            };
            let width = if is_worst {
                3
            } else if kind == "out" {
                2
            } else {
                1
            };
            let pts: Vec<(f64, f64)> = points.iter().map(|(&l, &v)| (l as f64, y_of(v))).collect();
            let style = ShapeStyle::from(&color).stroke_width(width);
            match phase {
                Phase::Prefill => chart.draw_series(LineSeries::new(pts.clone(), style)),
                Phase::Decode => chart.draw_series(DashedLineSeries::new(pts.clone(), 6, 4, style)),
            }
            .map_err(err)?;
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 2, color.filled())))
                .map_err(err)?;
            if is_worst {
                legend.push((format!("worst: blk.N.{kind}"), color, width, false));
            }
            if *phase == Phase::Decode {
                legend.push((format!("blk.N.{kind} (decode)"), color, width, true));
            } else {
                families.entry(fam).or_default().push(kind.clone());
            }
        }
        for fam in ["attention", "FFN", "norms", "residual"] {
            if let Some(kinds) = families.get(fam) {
                let kind = match fam {
                    "attention" => "q",
                    "FFN" => "ffn_up",
                    "norms" => "attn_norm",
                    _ => "out",
                };
                legend.push((format!("{fam}:"), family(kind).1.to_rgba(), 2, false));
                // the family's kinds, a few per line, without a swatch
                for chunk in kinds.chunks(3) {
                    legend.push((format!("  {}", chunk.join(", ")), WHITE.to_rgba(), 0, false));
                }
            }
        }
        if !c.local_nmse_by_layer.is_empty() {
            // each layer's own error, computed from the golden's input: flat for rounding, a spike for a bug
            let blue = RGBColor(20, 90, 220).to_rgba();
            let pts: Vec<(f64, f64)> = c
                .local_nmse_by_layer
                .iter()
                .enumerate()
                .map(|(l, &v)| (l as f64, y_of(v)))
                .collect();
            let style = ShapeStyle::from(&blue).stroke_width(4);
            chart
                .draw_series(LineSeries::new(pts.clone(), style))
                .map_err(err)?;
            chart
                .draw_series(pts.iter().map(|&p| Cross::new(p, 4, blue.filled())))
                .map_err(err)?;
            legend.push(("local: worst stage, golden input".into(), blue, 4, false));
        }
        if let Some(cut) = cutoff {
            let red = RGBColor(200, 30, 30).to_rgba();
            chart
                .draw_series(DashedLineSeries::new(
                    [(-0.5, cut), (n_layer as f64 - 0.5, cut)],
                    3,
                    3,
                    ShapeStyle::from(&red).stroke_width(1),
                ))
                .map_err(err)?;
            legend.push((format!("stage_max_nmse {cut:e}"), red, 1, true));
        }
        let font = ("sans-serif", 11).into_font();
        for (i, (label, color, width, dashed)) in legend.iter().enumerate() {
            let y = 40 + 17 * i as i32;
            let style = ShapeStyle::from(color).stroke_width(*width);
            if *width == 0 {
                legend_area
                    .draw(&Text::new(label.clone(), (30, y - 6), font.clone()))
                    .map_err(err)?;
                continue;
            }
            let line = if *dashed {
                vec![(8, y), (14, y), (18, y), (24, y)]
            } else {
                vec![(8, y), (24, y)]
            };
            if *dashed {
                legend_area
                    .draw(&PathElement::new(line[..2].to_vec(), style))
                    .map_err(err)?;
                legend_area
                    .draw(&PathElement::new(line[2..].to_vec(), style))
                    .map_err(err)?;
            } else {
                legend_area
                    .draw(&PathElement::new(line, style))
                    .map_err(err)?;
            }
            legend_area
                .draw(&Text::new(label.clone(), (30, y - 6), font.clone()))
                .map_err(err)?;
        }
        root.present().map_err(err)?;
    }
    // a NUL or ESC in a cell id (a model or prompt name) would make the SVG invalid XML
    Ok(crate::format::xml_safe(&svg))
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
mod tests {
    use super::*;

    #[test]
    fn layer_ticks_are_integers() {
        assert_eq!(layer_label(&2.0), "2");
        assert_eq!(layer_label(&2.5), "");
        assert_eq!(layer_label(&-0.0), "0");
    }

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
            ("ffn_inp", "residual"),
            ("out", "residual"),
        ] {
            assert_eq!(family(kind).0, fam, "{kind}");
        }
    }
}
