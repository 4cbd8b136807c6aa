//! `results.csv`: one row per cell × stage × phase × metric, for spreadsheets and plots.

use anyhow::Result;

use crate::format::{non_finite, CsvDoc};
use crate::gate::cell_metrics;

use super::markdown::{seq_position, top1_counts};

use super::Report;

/// How a CSV value is written: shortest representation that reads back exactly.
#[derive(Clone, Copy)]
pub(crate) enum Num {
    /// Plain decimal (cosines, fractions, seconds, rates).
    Fixed(f64),
    /// Scientific (NMSE, KL, RMSE, abs errors, entropies).
    Sci(f64),
    /// An integer (counts, flags, positions).
    Int(u64),
}

impl Num {
    pub(crate) fn csv(self) -> String {
        match self {
            Num::Fixed(v) => non_finite(v).map_or_else(|| format!("{v}"), str::to_string),
            Num::Sci(0.0) => "0".to_string(),
            Num::Sci(v) => non_finite(v).map_or_else(|| format!("{v:e}"), str::to_string),
            Num::Int(v) => v.to_string(),
        }
    }
}

/// The header of `results.csv`.
pub const CSV_HEADER: &str =
    "cell_id,model,prompt,quant,mode,simd,oracle,engine,phase,stage,layer,metric,value";

/// Render `results.csv`: one row per cell × stage × phase × metric, plus logits rows (`stage` =
/// `logits`), cell-level gate aggregates (`stage` = `cell`), tokens (`stage` = `tokens`), speed
/// (`stage` = `speed`) and the verdict (`stage` = `verdict`). Values are the shortest text that reads
/// back to the same f64 (scientific for NMSE, KL, RMSE, absolute errors, entropies); non-finite values
/// are `inf`, `-inf`, `nan`. `layer` is empty for stages without a block index; positions are sequence
/// positions (decode step i = prompt length + i). Written with the `csv` crate ([`CsvDoc`]).
///
/// Errors: only a record of the wrong width (a bug).
pub fn render_csv(r: &Report) -> Result<String> {
    let mut out = CsvDoc::with_header(CSV_HEADER.split(','))?;
    let mut err: Option<anyhow::Error> = None;
    for c in &r.cells {
        let cell = &c.cell;
        let prefix: [String; 8] = [
            cell.id(),
            cell.model.clone(),
            cell.prompt.clone(),
            cell.quant.clone(),
            cell.mode.name().to_string(),
            cell.simd.clone(),
            cell.oracle.clone(),
            cell.engine.clone(),
        ];
        let mut row = |phase: &str, stage: &str, layer: Option<usize>, metric: &str, v: Num| {
            let rest = [
                phase.to_string(),
                stage.to_string(),
                layer.map_or(String::new(), |l| l.to_string()),
                metric.to_string(),
                v.csv(),
            ];
            if let Err(e) = out.row(prefix.iter().chain(rest.iter())) {
                err.get_or_insert(e);
            }
        };
        let cmp = &c.comparison;
        let tol = c.verdict.margin_tolerance;
        let ties_of = |lc: &crate::compare::LogitsComparison| {
            lc.disagreements.iter().filter(|p| p.margin < tol).count()
        };
        row(
            "prefill",
            "tokens",
            None,
            "match",
            Num::Int(u64::from(cmp.tokens_match())),
        );
        row(
            "prefill",
            "tokens",
            None,
            "golden_count",
            Num::Int(cmp.golden_tokens.len() as u64),
        );
        row(
            "prefill",
            "tokens",
            None,
            "engine_count",
            Num::Int(cmp.engine_tokens.len() as u64),
        );
        for s in &cmp.stages {
            let ph = s.phase.to_string();
            let row_for = |m: &str, v: Num| (m.to_string(), v);
            let worst =
                crate::gate::lowest_index(&s.cosine_by_position).unwrap_or(s.worst_position);
            for (m, v) in [
                row_for("cosine_min", Num::Fixed(s.cosine.min)),
                row_for("cosine_mean", Num::Fixed(s.cosine.mean)),
                row_for("cosine_p50", Num::Fixed(s.cosine.p50)),
                row_for("nmse_mean", Num::Sci(s.nmse.mean)),
                row_for("nmse_p50", Num::Sci(s.nmse.p50)),
                row_for("nmse_max", Num::Sci(s.nmse.max)),
                row_for("rmse_mean", Num::Sci(s.rmse.mean)),
                row_for("mean_abs_mean", Num::Sci(s.mean_abs.mean)),
                row_for("max_abs", Num::Sci(s.max_abs)),
                row_for("bit_exact", Num::Int(u64::from(s.bit_exact))),
                row_for("positions", Num::Int(s.cosine.count as u64)),
                row_for(
                    "worst_position",
                    Num::Int(seq_position(cmp, s, worst) as u64),
                ),
            ] {
                row(&ph, &s.stage, s.layer, &m, v);
            }
        }
        for lc in &cmp.logits {
            let ph = lc.phase.to_string();
            let mut rows = vec![
                ("positions", Num::Int(lc.n_positions as u64)),
                ("top1_agree", Num::Int(lc.top1_agree as u64)),
                ("near_ties", Num::Int(ties_of(lc) as u64)),
                (
                    "mismatches",
                    Num::Int((lc.disagreements.len() - ties_of(lc)) as u64),
                ),
            ];
            if let Some(kl) = &lc.kl {
                rows.extend([
                    ("kl_mean", Num::Sci(kl.mean)),
                    ("kl_p50", Num::Sci(kl.p50)),
                    ("kl_p90", Num::Sci(kl.p90)),
                    ("kl_max", Num::Sci(kl.max)),
                    ("kl_positions", Num::Int(kl.count as u64)),
                ]);
            }
            rows.extend([
                ("top5_mean", Num::Fixed(lc.top5.mean)),
                ("top5_min", Num::Fixed(lc.top5.min)),
                ("top10_mean", Num::Fixed(lc.top10.mean)),
            ]);
            if let Some(e) = &lc.entropy_ref {
                rows.push(("entropy_ref_mean", Num::Sci(e.mean)));
            }
            rows.push(("entropy_eng_mean", Num::Sci(lc.entropy_eng.mean)));
            if let Some(d) = &lc.dp_top {
                rows.extend([
                    ("dp_top_mean", Num::Sci(d.mean)),
                    ("dp_top_max", Num::Sci(d.max)),
                ]);
            }
            for (m, v) in rows {
                row(&ph, "logits", None, m, v);
            }
        }
        let m = cell_metrics(cmp, tol);
        let (agree, ties, positions) = top1_counts(cmp, tol);
        let agreement = if positions == 0 {
            f64::NAN
        } else {
            (agree + ties) as f64 / positions as f64
        };
        row("", "cell", None, "top1_agreement", Num::Fixed(agreement));
        if let Some(kl) = m.mean_kl {
            row("", "cell", None, "mean_kl", Num::Sci(kl));
        }
        if let Some((kl, _, _)) = m.max_kl {
            row("", "cell", None, "max_kl", Num::Sci(kl));
        }
        if let Some(t5) = m.top5_mean {
            row("", "cell", None, "top5_mean", Num::Fixed(t5));
        }
        if let Some(o) = &m.min_cosine_out {
            row("", "cell", None, "min_cosine_out", Num::Fixed(o.cosine));
        }
        let sp = &c.speed;
        row(
            "prefill",
            "speed",
            None,
            "tokens",
            Num::Int(sp.prefill_tokens as u64),
        );
        row(
            "prefill",
            "speed",
            None,
            "seconds",
            Num::Fixed(sp.prefill_seconds),
        );
        row(
            "prefill",
            "speed",
            None,
            "tok_s",
            Num::Fixed(sp.prefill_tok_s()),
        );
        row(
            "decode",
            "speed",
            None,
            "tokens",
            Num::Int(sp.decode_tokens as u64),
        );
        row(
            "decode",
            "speed",
            None,
            "seconds",
            Num::Fixed(sp.decode_seconds),
        );
        row(
            "decode",
            "speed",
            None,
            "tok_s",
            Num::Fixed(sp.decode_tok_s()),
        );
        row(
            "",
            "verdict",
            None,
            "pass",
            Num::Int(u64::from(c.verdict.pass)),
        );
        row(
            "",
            "verdict",
            None,
            "failures",
            Num::Int(c.verdict.failures.len() as u64),
        );
    }
    match err {
        Some(e) => Err(e),
        None => out.finish(),
    }
}
