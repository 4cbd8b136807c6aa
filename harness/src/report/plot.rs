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
        for (i, ((phase, kind), points)) in data.iter().enumerate() {
            let color = if kind == "out" {
                BLACK.to_rgba()
            } else {
                Palette99::pick(i).to_rgba()
            };
            let width = if kind == "out" { 3 } else { 1 };
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
            let label = match phase {
                Phase::Prefill => format!("blk.N.{kind}"),
                Phase::Decode => format!("blk.N.{kind} (decode)"),
            };
            legend.push((label, color, width, *phase == Phase::Decode));
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
    Ok(svg)
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
    svg
}
