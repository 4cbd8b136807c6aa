//! The bench page (`bench.html`): lockstep vs llama.cpp (and any baseline) per model and test **over
//! commits** — each bench report one point, the ratio of median tokens/s with its 95% bootstrap interval,
//! as a line chart the way a benchmark dashboard shows a trend (`charts/*.svg`, plotters) — with the
//! numbers in a table, and the quantization-quality tables of `lockstep quality`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

use super::html::{esc, page, table, td, td_num};
use crate::bench::BenchReport;
use crate::quality::report::QualityReport;

/// One point of a trend: the bench's run id, its commit, the ratio and its interval.
#[derive(Clone, Debug)]
struct Point {
    run_id: String,
    commit: String,
    ratio: f64,
    low: f64,
    high: f64,
}

/// (model, test, numerator, denominator) → points in bench order.
type Trends = BTreeMap<(String, String, String, String), Vec<Point>>;

fn trends(benches: &[&BenchReport]) -> Trends {
    let mut t: Trends = BTreeMap::new();
    for b in benches {
        for c in &b.comparisons {
            t.entry((
                c.model.clone(),
                c.test.clone(),
                c.numerator.clone(),
                c.denominator.clone(),
            ))
            .or_default()
            .push(Point {
                run_id: b.run_id.clone(),
                commit: b.environment.git_commit.chars().take(8).collect(),
                ratio: c.ratio,
                low: c.ci_low,
                high: c.ci_high,
            });
        }
    }
    t
}

/// A line chart of one trend: x = the benches in order (labelled by commit), y = the ratio, the interval
/// as a vertical bar, parity (1.0) dashed.
fn chart_svg(title: &str, points: &[Point]) -> Result<String> {
    let finite = |v: f64| v.is_finite() && v > 0.0;
    let ys: Vec<f64> = points
        .iter()
        .flat_map(|p| [p.ratio, p.low, p.high])
        .filter(|v| finite(*v))
        .chain([1.0])
        .collect();
    let lo = ys.iter().copied().fold(f64::INFINITY, f64::min) * 0.9;
    let hi = ys.iter().copied().fold(0.0, f64::max) * 1.1;
    let n = points.len();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (720, 320)).into_drawing_area();
        let err = |e| anyhow!("drawing the chart {title}: {e:?}");
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 13))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(56)
            .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), lo..hi)
            .map_err(err)?;
        let labels: Vec<String> = points.iter().map(|p| p.commit.clone()).collect();
        chart
            .configure_mesh()
            .x_desc("bench run (commit), oldest first")
            .y_desc("ratio of median tokens/s")
            .x_labels(n.min(20) + 1)
            .x_label_formatter(&|v| {
                let i = v.round();
                if (v - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < labels.len() {
                    labels[i as usize].clone()
                } else {
                    String::new()
                }
            })
            .draw()
            .map_err(err)?;
        let grey = RGBColor(150, 150, 150);
        chart
            .draw_series(DashedLineSeries::new(
                [(-0.5, 1.0), (n as f64 - 0.5, 1.0)],
                4,
                4,
                ShapeStyle::from(&grey).stroke_width(1),
            ))
            .map_err(err)?;
        let blue = RGBColor(20, 90, 220);
        let pts: Vec<(f64, f64)> = points
            .iter()
            .enumerate()
            .filter(|(_, p)| finite(p.ratio))
            .map(|(i, p)| (i as f64, p.ratio))
            .collect();
        chart
            .draw_series(LineSeries::new(
                pts.clone(),
                ShapeStyle::from(&blue).stroke_width(2),
            ))
            .map_err(err)?;
        chart
            .draw_series(
                points
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| finite(p.low) && finite(p.high))
                    .map(|(i, p)| {
                        PathElement::new(
                            vec![(i as f64, p.low), (i as f64, p.high)],
                            ShapeStyle::from(&blue).stroke_width(1),
                        )
                    }),
            )
            .map_err(err)?;
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 3, blue.filled())))
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    // a NUL or ESC in a model or test name would make the SVG invalid XML
    Ok(crate::format::xml_safe(&svg))
}

/// Render `bench.html` and its charts: (path relative to the site root, bytes). Benches are ordered by
/// run id (which starts with the UTC date and time).
///
/// Errors: a chart the drawing backend refuses (not expected).
pub fn render(
    benches: &[BenchReport],
    quality: &[QualityReport],
) -> Result<Vec<(String, Vec<u8>)>> {
    let mut files = Vec::new();
    let mut sorted: Vec<&BenchReport> = benches.iter().collect();
    sorted.sort_by(|a, b| a.run_id.cmp(&b.run_id));
    let mut b = String::new();
    let t = trends(&sorted);
    if t.is_empty() {
        let _ = writeln!(
            b,
            "<p>No bench report with a comparison (<code>lockstep bench</code> beside llama-bench) in the \
             reports directory.</p>"
        );
    } else {
        let _ = writeln!(
            b,
            "<p>{} bench runs. Each chart is one model and test: the ratio of median tokens/s of the \
             first engine to the second, per bench run (oldest first), with its 95% bootstrap interval as \
             a bar; the dashed line is parity.</p>",
            sorted.len()
        );
    }
    for (k, ((model, test, num, den), points)) in t.iter().enumerate() {
        let title = format!("{model} {test}: {num} / {den}");
        let name = format!(
            "charts/{k:02}-{}.svg",
            crate::output::file_stem(&format!("{model}-{test}-{num}-{den}"))
        );
        files.push((name.clone(), chart_svg(&title, points)?.into_bytes()));
        let _ = writeln!(
            b,
            "<h2>{}</h2>\n<figure><img src=\"{}\" alt=\"{}\"></figure>",
            esc(&title),
            esc(&name),
            esc(&title)
        );
        let rows: Vec<Vec<String>> = points
            .iter()
            .map(|p| {
                vec![
                    td(format!("<code>{}</code>", esc(&p.run_id))),
                    td(format!("<code>{}</code>", esc(&p.commit))),
                    td_num(format!("{:.3}", p.ratio)),
                    td_num(format!("[{:.3}, {:.3}]", p.low, p.high)),
                ]
            })
            .collect();
        b.push_str(&table(
            &["bench run", "commit", "ratio", "95% interval"],
            &rows,
        ));
    }
    // quantization quality, newest report first
    let mut q: Vec<&QualityReport> = quality.iter().collect();
    q.sort_by(|a, b| b.run_id.cmp(&a.run_id));
    if !q.is_empty() {
        let _ = writeln!(b, "<h2>Quantization quality</h2>");
    }
    for r in q {
        for m in &r.models {
            let _ = writeln!(
                b,
                "<h3>{} <span class=\"muted\">(run <code>{}</code>, corpus {})</span></h3>",
                esc(&m.model),
                esc(&r.run_id),
                esc(&r.corpus.id)
            );
            let rows: Vec<Vec<String>> = m
                .variants
                .iter()
                .map(|v| {
                    let mut row = vec![
                        td(esc(&v.label)),
                        td_num(v.bpw.map_or("-".into(), |b| format!("{b:.2}"))),
                    ];
                    match &v.stats {
                        Some(s) => row.extend([
                            td_num(format!("{:.4} ± {:.4}", s.ppl_q.value, s.ppl_q.unc)),
                            td_num(format!("{:.6} ± {:.6}", s.kld.value, s.kld.unc)),
                            td_num(format!(
                                "{:.3} ± {:.3} %",
                                100.0 * s.same_top_p.value,
                                100.0 * s.same_top_p.unc
                            )),
                            td(""),
                        ]),
                        None => row.extend([
                            td_num("-"),
                            td_num("-"),
                            td_num("-"),
                            td(esc(v.error.as_deref().unwrap_or(""))),
                        ]),
                    }
                    row
                })
                .collect();
            b.push_str(&table(
                &[
                    "variant",
                    "bpw",
                    "PPL(Q)",
                    "mean KLD",
                    "same top p",
                    "error",
                ],
                &rows,
            ));
        }
    }
    files.push((
        "bench.html".into(),
        page("lockstep benchmarks", "", &b).into_bytes(),
    ));
    Ok(files)
}
