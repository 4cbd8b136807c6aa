//! One run's page (`runs/<run id>/index.html`) and its plots: the summary table with the failing cells
//! first, the bisect verdicts, SIMD vs scalar, the rounding probe and the cross-oracle table when the
//! report has them, then each cell with its error-vs-depth plot (or the sentence saying why it has none).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::Result;

use super::html::{esc, page, table, td, td_num, verdict};
use crate::format::{fmt_cos, fmt_e3, fmt_utc};
use crate::gate::cell_metrics;
use crate::judge::Finding;
use crate::matrix::Cell;
use crate::report::{CellReport, Report};

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "-".to_string(), f)
}

/// A top-1 column: exact agreements over positions, and the near ties beside them — the counts of the
/// failure line's `top1_agreement` text and of report.md's column (`12/15 (+2 near ties)`).
fn top1_text(m: &crate::gate::CellMetrics) -> String {
    let ties = match m.near_ties.len() {
        0 => String::new(),
        1 => " (+1 near tie)".to_string(),
        n => format!(" (+{n} near ties)"),
    };
    format!("{}/{}{ties}", m.top1_agree, m.positions)
}

/// The anchor of cell `i` on its run page.
fn anchor(i: usize) -> String {
    format!("cell-{i}")
}

fn cell_link(i: usize, c: &CellReport) -> String {
    format!(
        "<a href=\"#{}\"><code>{}</code></a>",
        anchor(i),
        esc(&c.cell.id())
    )
}

/// The reason part of a failing cell's failure line (the line without its `FAIL <id>: ` prefix).
fn why(c: &CellReport) -> String {
    crate::report::cell_failure_line(c)
        .map(|l| {
            l.strip_prefix(&format!("FAIL {}: ", c.cell.id()))
                .unwrap_or(&l)
                .to_string()
        })
        .unwrap_or_default()
}

/// Render the page and its plots: (path relative to the run's directory, bytes). `copied` names the
/// report files copied beside the page (linked from it).
///
/// Errors: a plot the drawing backend refuses (not expected for in-memory SVG).
pub fn render(r: &Report, copied: &[&str]) -> Result<Vec<(String, Vec<u8>)>> {
    let mut files = Vec::new();
    let mut b = String::new();
    let env = &r.environment;
    let n = r.cells.len();
    let failed = r.cells.iter().filter(|c| !c.verdict.pass).count();
    let pass = failed == 0 && r.incomplete.is_none();
    let _ = writeln!(
        b,
        "<p>{} · {} of {n} cells pass · {} · commit <code>{}</code>{} · CPU {} · {} threads · lockstep {}</p>",
        verdict(pass),
        n - failed,
        esc(&fmt_utc(r.created_unix)),
        esc(&env.git_commit.chars().take(12).collect::<String>()),
        if env.git_dirty { " (dirty)" } else { "" },
        esc(&env.cpu_model),
        env.threads,
        esc(&env.lockstep_version),
    );
    if let Some(inc) = &r.incomplete {
        let _ = writeln!(
            b,
            "<p class=\"fail\">INCOMPLETE: the run stopped at cell <code>{}</code> ({} cells not run): {}</p>",
            esc(&inc.failed_cell),
            inc.cells_not_run,
            esc(&inc.error)
        );
    }
    if let Some(s) = &r.shard {
        let _ = writeln!(
            b,
            "<p>Shard {}/{} of a matrix of {} cells (balanced by {}).</p>",
            s.index,
            s.count,
            s.matrix_cells.len(),
            esc(&s.balanced_by)
        );
    }
    if !r.merged_from.is_empty() {
        let _ = writeln!(
            b,
            "<p>Merged from the shards {}.</p>",
            r.merged_from
                .iter()
                .map(|id| format!("<code>{}</code>", esc(id)))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if !copied.is_empty() {
        let links: Vec<String> = copied
            .iter()
            .map(|f| format!("<a href=\"{f}\">{f}</a>", f = esc(f)))
            .collect();
        let _ = writeln!(b, "<p>Files: {}</p>", links.join(" · "));
    }

    // failures first, then matrix order
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| (r.cells[i].verdict.pass, i));

    let _ = writeln!(b, "<h2>Cells</h2>");
    let rows: Vec<Vec<String>> = order
        .iter()
        .map(|&i| {
            let c = &r.cells[i];
            let m = cell_metrics(&c.comparison, c.verdict.margin_tolerance);
            vec![
                td(cell_link(i, c)),
                td(if c.error.is_some() {
                    "-"
                } else if m.tokens_match {
                    "match"
                } else {
                    "<span class=\"fail\">differ</span>"
                }),
                td_num(top1_text(&m)),
                td_num(opt(m.mean_kl, fmt_e3)),
                td_num(opt(m.max_kl.map(|x| x.0), fmt_e3)),
                td_num(opt(m.top5_mean, |v| format!("{v:.4}"))),
                td_num(opt(m.min_cosine_out.as_ref().map(|o| o.cosine), fmt_cos)),
                td(verdict(c.verdict.pass)),
                td(esc(&why(c))),
            ]
        })
        .collect();
    b.push_str(&table(
        &[
            "cell",
            "tokens",
            "top-1",
            "mean KL",
            "max KL",
            "top-5 mean",
            "min cos out",
            "verdict",
            "why",
        ],
        &rows,
    ));

    // bisect verdicts
    let _ = writeln!(
        b,
        "<h2>First divergent stage (bisect verdicts)</h2>\n<p>What <code>lockstep bisect</code> \
         concludes per cell: structural (a bug at that stage), oracle-side rounding, drift, cannot localize (no \
         local pass: no <code>inject</code>, or no layer output in the golden), tokens, or none; ÷ floor is the \
         local NMSE over the measured floor. A failing cell's reason names the same verdict and stage.</p>"
    );
    let rows: Vec<Vec<String>> = order
        .iter()
        .map(|&i| {
            let c = &r.cells[i];
            let at = |v: &str, d: &crate::gate::Divergence, ratio: Option<f64>| {
                vec![
                    td(cell_link(i, c)),
                    td(esc(v)),
                    td(format!("<code>{}</code>", esc(&d.stage))),
                    td(esc(&d.phase.to_string())),
                    td_num(d.position.to_string()),
                    td_num(if d.cosine.is_nan() {
                        String::new()
                    } else {
                        fmt_cos(d.cosine)
                    }),
                    td_num(if d.nmse.is_nan() {
                        String::new()
                    } else {
                        fmt_e3(d.nmse)
                    }),
                    td_num(ratio.map_or(String::new(), |r| format!("{r:.1}"))),
                ]
            };
            let blank = |v: &str| {
                let mut row = vec![td(cell_link(i, c)), td(esc(v))];
                row.extend(std::iter::repeat_n(td(""), 6));
                row
            };
            // the verdict's name and place as every view gives them (Finding::name, site, ratio)
            match (&c.finding, &c.verdict.first_divergent) {
                (Some(f @ Finding::Tokens { .. }), _) => {
                    blank(&format!("tokens: {}", f.tokens_text().unwrap_or_default()))
                }
                (Some(f), _) => {
                    let name = f.table_name();
                    match f.site() {
                        Some(d) => at(&name, d, f.ratio()),
                        None => blank(&name),
                    }
                }
                (None, None) => blank("none"),
                (None, Some(d)) => at("marker", d, None),
            }
        })
        .collect();
    b.push_str(&table(
        &[
            "cell", "verdict", "stage", "phase", "position", "cosine", "NMSE", "÷ floor",
        ],
        &rows,
    ));

    // SIMD vs scalar
    let pairs = crate::report::simd_pairs(&r.cells);
    if !pairs.is_empty() {
        let _ = writeln!(
            b,
            "<h2>SIMD vs scalar</h2>\n<p>Each SIMD cell beside its <code>simd = off</code> twin: the sha256 \
             of every stage and the logits. In ggml mode they must be identical.</p>"
        );
        let rows: Vec<Vec<String>> = pairs
            .iter()
            .map(|p| {
                let (a, s) = (&r.cells[p.simd_cell], &r.cells[p.scalar_cell]);
                vec![
                    td(cell_link(p.simd_cell, a)),
                    td(format!(
                        "<code>{}</code>",
                        esc(&crate::report::short_sha(a.output_sha256.as_deref()))
                    )),
                    td(format!(
                        "<code>{}</code>",
                        esc(&crate::report::short_sha(s.output_sha256.as_deref()))
                    )),
                    td(if p.identical {
                        "yes"
                    } else {
                        "<span class=\"fail\">no</span>"
                    }),
                    td_num(format!(
                        "{:.1} / {:.1}",
                        a.speed.decode_tok_s(),
                        s.speed.decode_tok_s()
                    )),
                ]
            })
            .collect();
        b.push_str(&table(
            &[
                "SIMD cell",
                "output sha256",
                "scalar sha256",
                "bit-identical",
                "decode tok/s (simd / scalar)",
            ],
            &rows,
        ));
    }

    // rounding probe
    let probed: Vec<(usize, &CellReport, &crate::probe::RoundingProbe)> = r
        .cells
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.rounding_probe.as_ref().map(|p| (i, c, p)))
        .collect();
    if !probed.is_empty() {
        let _ = writeln!(
            b,
            "<h2>Rounding probe (failing reference cells)</h2>\n<p>Each failing reference cell rerun with \
             every matmul input rounded as llama.cpp rounds it, gated with the cell's own thresholds \
             (informative).</p>"
        );
        let rows: Vec<Vec<String>> = probed
            .iter()
            .map(|(i, c, p)| {
                let m = cell_metrics(&c.comparison, c.verdict.margin_tolerance);
                vec![
                    td(cell_link(*i, c)),
                    td_num(top1_text(&m)),
                    td_num(opt(m.mean_kl, fmt_e3)),
                    td_num(format!("{}/{}", p.top1_agree, p.positions)),
                    td_num(opt(p.mean_kl, fmt_e3)),
                    td_num(opt(p.max_kl, fmt_e3)),
                    td(verdict(p.verdict.pass)),
                ]
            })
            .collect();
        b.push_str(&table(
            &[
                "cell",
                "top-1",
                "mean KL",
                "rounded: top-1",
                "rounded: mean KL",
                "rounded: max KL",
                "rounded: gate",
            ],
            &rows,
        ));
    }

    // cross-oracle: the same cell against each oracle
    let mut by_rest: BTreeMap<Cell, Vec<usize>> = BTreeMap::new();
    for (i, c) in r.cells.iter().enumerate() {
        let key = Cell {
            oracle: String::new(),
            ..c.cell.clone()
        };
        by_rest.entry(key).or_default().push(i);
    }
    let multi: Vec<(&Cell, &Vec<usize>)> = by_rest.iter().filter(|(_, v)| v.len() > 1).collect();
    if !multi.is_empty() {
        let _ = writeln!(
            b,
            "<h2>Across oracles</h2>\n<p>The same cell held to each oracle's golden: their distance is the \
             disagreement between the references themselves.</p>"
        );
        let mut rows = Vec::new();
        for (_, idx) in multi {
            for &i in idx {
                let c = &r.cells[i];
                let m = cell_metrics(&c.comparison, c.verdict.margin_tolerance);
                rows.push(vec![
                    td(cell_link(i, c)),
                    td(format!("<code>{}</code>", esc(&c.cell.oracle))),
                    td_num(top1_text(&m)),
                    td_num(opt(m.mean_kl, fmt_e3)),
                    td_num(opt(m.min_cosine_out.as_ref().map(|o| o.cosine), fmt_cos)),
                    td(verdict(c.verdict.pass)),
                ]);
            }
        }
        b.push_str(&table(
            &[
                "cell",
                "oracle",
                "top-1",
                "mean KL",
                "min cos out",
                "verdict",
            ],
            &rows,
        ));
    }

    // each cell with its plot
    let _ = writeln!(b, "<h2>Error vs depth</h2>");
    for &i in &order {
        let c = &r.cells[i];
        let _ = writeln!(
            b,
            "<section class=\"cell\" id=\"{}\">\n<h3><code>{}</code> {}</h3>",
            anchor(i),
            esc(&c.cell.id()),
            verdict(c.verdict.pass)
        );
        if !c.verdict.pass {
            let _ = writeln!(b, "<p>{}</p>", esc(&why(c)));
        }
        match crate::report::no_plot_sentence(&r.cells, i) {
            Some(sentence) => {
                let _ = writeln!(b, "<p>{}</p>", esc(&sentence));
            }
            None => {
                let name = crate::report::plot_file_name(i, c);
                let svg = crate::report::error_vs_depth_svg(c)?;
                let _ = writeln!(
                    b,
                    "<figure><img src=\"{}\" alt=\"error vs depth of {}\" loading=\"lazy\"></figure>",
                    esc(&name),
                    esc(&c.cell.id())
                );
                files.push((name, svg.into_bytes()));
            }
        }
        b.push_str("</section>\n");
    }
    files.push((
        "index.html".into(),
        page(&format!("run {}", r.run_id), "../../", &b).into_bytes(),
    ));
    Ok(files)
}
