//! The statistics of `llama-perplexity --kl-divergence`, written out and unit-tested on their own.
//!
//! Mirrors llama.cpp `tools/perplexity/perplexity.cpp`: the running sums of `struct kl_divergence_result`
//! (filled per token by `log_softmax(n_vocab, logits, base_log_prob, tok, kld)`), the lambdas
//! `mean_and_uncertainty` and `covariance` and `percentile` of `kl_divergence()`, and the final printout's
//! derived figures (PPL = exp(mean NLL) with uncertainty PPL·σ(ln PPL); ln(PPL(Q)/PPL(base)) with the
//! covariance of the two NLL series; RMS Δp from the mean and uncertainty of Δp²; Same top p as a binomial
//! proportion). The per-token inputs (NLL, KLD, Δp, same top) are computed by the caller
//! ([`crate::quality`]).

use serde::{Deserialize, Serialize};

/// A value and its ± uncertainty (one standard error), as llama-perplexity prints `v ± u`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Unc {
    /// The estimate.
    pub value: f64,
    /// One standard error of it.
    pub unc: f64,
}

/// One percentile of a sorted series: its label as llama-perplexity prints it (`99.9%`, `Median`, ...) and
/// the value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Percentile {
    /// `Maximum`, `99.9%`, ..., `Median`, ..., `0.1%`, `Minimum`.
    pub label: String,
    /// The value (KLD in nats; Δp as a probability difference, not in %).
    pub value: f64,
}

/// Mean of a series from its sum and sum of squares, and the standard error of that mean.
///
/// llama.cpp `kl_divergence()` lambda `mean_and_uncertainty`: `f = sum/count`, `df = sum2/count − f²`,
/// uncertainty `sqrt(df/(count−1))` when `df > 0` and `count > 10`, else 0; `(0, 0)` for an empty series.
pub fn mean_and_uncertainty(sum: f64, sum2: f64, count: usize) -> (f64, f64) {
    if count < 1 {
        return (0.0, 0.0);
    }
    let n = count as f64;
    let f = sum / n;
    let df = sum2 / n - f * f;
    let df = if df > 0.0 && count > 10 {
        (df / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    (f, df)
}

/// Covariance of the means of two series from their sums and the sum of their products.
///
/// llama.cpp `kl_divergence()` lambda `covariance`: 0 for fewer than 10 values, else
/// `(sumab/count − (suma/count)(sumb/count)) / (count − 1)`.
pub fn covariance(suma: f64, sumb: f64, sumab: f64, count: usize) -> f64 {
    if count < 10 {
        return 0.0;
    }
    let n = count as f64;
    (sumab / n - (suma / n) * (sumb / n)) / (n - 1.0)
}

/// Linear-interpolated percentile of an ascending series, `fraction` in [0, 1].
///
/// llama.cpp `kl_divergence()` lambda `percentile`: `p = fraction·(n−1)`, interpolate between
/// `values[⌊p⌋]` and the next one; the first value for `fraction ≤ 0`, the last for `fraction ≥ 1`. Computed
/// in f32 as llama.cpp does. Returns NaN for an empty series.
pub fn percentile(sorted: &[f32], fraction: f32) -> f32 {
    let (Some(&first), Some(&last)) = (sorted.first(), sorted.last()) else {
        return f32::NAN;
    };
    if fraction <= 0.0 {
        return first;
    }
    if fraction >= 1.0 {
        return last;
    }
    let mut p = fraction * (sorted.len() - 1) as f32;
    let ip = p as usize;
    p -= ip as f32;
    (1.0 - p) * sorted[ip] + p * sorted[(ip + 1).min(sorted.len() - 1)]
}

/// Median of an ascending series as llama.cpp computes `kld_median` / `p_diff_median`: the mean of the two
/// middle values for an even count (in f32). NaN for an empty series.
pub fn median(sorted: &[f32]) -> f32 {
    let n = sorted.len();
    match n {
        0 => f32::NAN,
        _ if n.is_multiple_of(2) => 0.5 * (sorted[n / 2] + sorted[n / 2 - 1]),
        _ => sorted[n / 2],
    }
}

/// The running sums of llama.cpp `struct kl_divergence_result`, plus every token's KLD and Δp (llama.cpp's
/// `kld_values` / `p_diff_values`) for the percentiles.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KldAccumulator {
    /// Σ NLL(Q) (nats).
    pub sum_nll: f64,
    /// Σ NLL(Q)².
    pub sum_nll2: f64,
    /// Σ NLL(base).
    pub sum_nll_base: f64,
    /// Σ NLL(base)².
    pub sum_nll_base2: f64,
    /// Σ NLL(Q)·NLL(base).
    pub sum_nll_nll_base: f64,
    /// Σ KLD.
    pub sum_kld: f64,
    /// Σ KLD².
    pub sum_kld2: f64,
    /// Σ Δp.
    pub sum_p_diff: f64,
    /// Σ Δp².
    pub sum_p_diff2: f64,
    /// Σ Δp⁴.
    pub sum_p_diff4: f64,
    /// Tokens whose argmax under Q equals the base's.
    pub n_same_top: usize,
    /// Scored tokens.
    pub count: usize,
    /// Every token's KLD, in scoring order.
    pub kld_values: Vec<f32>,
    /// Every token's Δp, in scoring order.
    pub p_diff_values: Vec<f32>,
}

/// One scored token: the inputs llama.cpp's per-token `log_softmax(.., kld)` derives from the two rows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenScore {
    /// −ln p_Q(next token) (nats).
    pub nll: f64,
    /// −ln p_base(next token) (nats).
    pub nll_base: f64,
    /// KL(base ‖ Q) at this position (nats).
    pub kld: f64,
    /// p_Q(next token) − p_base(next token).
    pub p_diff: f64,
    /// argmax Q == argmax base.
    pub same_top: bool,
}

impl KldAccumulator {
    /// Adds one token (llama.cpp `log_softmax(n_vocab, logits, base_log_prob, tok, kld)`'s updates; NLL and Δp
    /// rounded to f32 first, as llama.cpp holds them in floats).
    pub fn add(&mut self, t: TokenScore) {
        let nll = f64::from(t.nll as f32);
        let nll_base = f64::from(t.nll_base as f32);
        self.sum_nll += nll;
        self.sum_nll2 += nll * nll;
        self.sum_nll_base += nll_base;
        self.sum_nll_base2 += nll_base * nll_base;
        self.sum_nll_nll_base += nll * nll_base;
        self.sum_kld += t.kld;
        self.sum_kld2 += t.kld * t.kld;
        let p_diff = f64::from(t.p_diff as f32);
        self.sum_p_diff += p_diff;
        let p2 = p_diff * p_diff;
        self.sum_p_diff2 += p2;
        self.sum_p_diff4 += p2 * p2;
        self.n_same_top += usize::from(t.same_top);
        self.count += 1;
        self.kld_values.push(t.kld as f32);
        self.p_diff_values.push(p_diff as f32);
    }

    /// The figures llama-perplexity prints at the end of `--kl-divergence` (llama.cpp `kl_divergence()`).
    ///
    /// Errors (as `None`) for an empty accumulator. llama.cpp prints nothing below 100 tokens; we still
    /// compute (the uncertainties are then 0 below 11 tokens, as its formulas give).
    pub fn finish(&self) -> Option<QualityStats> {
        if self.count == 0 {
            return None;
        }
        let n = self.count;
        let log_ppl = mean_and_uncertainty(self.sum_nll, self.sum_nll2, n);
        let ppl = log_ppl.0.exp();
        let log_ppl_base = mean_and_uncertainty(self.sum_nll_base, self.sum_nll_base2, n);
        let ppl_base = log_ppl_base.0.exp();
        let cov = covariance(self.sum_nll, self.sum_nll_base, self.sum_nll_nll_base, n);
        let cor = cov / (log_ppl.1 * log_ppl_base.1);
        let ratio_val = log_ppl.0 - log_ppl_base.0;
        let ratio_unc = (log_ppl.1 * log_ppl.1 + log_ppl_base.1 * log_ppl_base.1 - 2.0 * cov)
            .max(0.0)
            .sqrt();
        let kld = mean_and_uncertainty(self.sum_kld, self.sum_kld2, n);
        let p_diff = mean_and_uncertainty(self.sum_p_diff, self.sum_p_diff2, n);
        let mse = mean_and_uncertainty(self.sum_p_diff2, self.sum_p_diff4, n);
        let rms = mse.0.sqrt();
        let rms_unc = if rms > 0.0 { 0.5 / rms * mse.1 } else { 0.0 };
        let same = self.n_same_top as f64 / n as f64;
        let same_unc = if n > 1 {
            (same * (1.0 - same) / (n as f64 - 1.0)).sqrt()
        } else {
            0.0
        };
        let mut k = self.kld_values.clone();
        k.sort_by(f32::total_cmp);
        let mut d = self.p_diff_values.clone();
        d.sort_by(f32::total_cmp);
        Some(QualityStats {
            count: n,
            ppl_q: Unc {
                value: ppl,
                unc: ppl * log_ppl.1,
            },
            ppl_base: Unc {
                value: ppl_base,
                unc: ppl_base * log_ppl_base.1,
            },
            cor_ln_ppl: cor,
            ln_ppl_ratio: Unc {
                value: ratio_val,
                unc: ratio_unc,
            },
            kld: Unc {
                value: kld.0,
                unc: kld.1,
            },
            kld_percentiles: percentiles(&k, KLD_FRACTIONS),
            p_diff: Unc {
                value: p_diff.0,
                unc: p_diff.1,
            },
            p_diff_percentiles: percentiles(&d, P_DIFF_FRACTIONS),
            rms_p_diff: Unc {
                value: rms,
                unc: rms_unc,
            },
            same_top_p: Unc {
                value: same,
                unc: same_unc,
            },
        })
    }
}

/// The KLD percentiles llama-perplexity prints, top down: (label, fraction); `None` = the median.
pub const KLD_FRACTIONS: &[(&str, Option<f32>)] = &[
    ("Maximum", Some(1.0)),
    ("99.9%", Some(0.999)),
    ("99.0%", Some(0.990)),
    ("95.0%", Some(0.950)),
    ("90.0%", Some(0.900)),
    ("Median", None),
    ("10.0%", Some(0.100)),
    ("5.0%", Some(0.050)),
    ("1.0%", Some(0.010)),
    ("0.1%", Some(0.001)),
    ("Minimum", Some(0.0)),
];

/// The Δp percentiles llama-perplexity prints, top down (KLD's plus 75% and 25%).
pub const P_DIFF_FRACTIONS: &[(&str, Option<f32>)] = &[
    ("Maximum", Some(1.0)),
    ("99.9%", Some(0.999)),
    ("99.0%", Some(0.990)),
    ("95.0%", Some(0.950)),
    ("90.0%", Some(0.900)),
    ("75.0%", Some(0.750)),
    ("Median", None),
    ("25.0%", Some(0.250)),
    ("10.0%", Some(0.100)),
    ("5.0%", Some(0.050)),
    ("1.0%", Some(0.010)),
    ("0.1%", Some(0.001)),
    ("Minimum", Some(0.0)),
];

fn percentiles(sorted: &[f32], fractions: &[(&str, Option<f32>)]) -> Vec<Percentile> {
    fractions
        .iter()
        .map(|&(label, f)| Percentile {
            label: label.to_string(),
            value: f64::from(f.map_or_else(|| median(sorted), |f| percentile(sorted, f))),
        })
        .collect()
}

/// The final figures of one `--kl-divergence` run, named as llama-perplexity prints them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QualityStats {
    /// Scored tokens.
    pub count: usize,
    /// `Mean PPL(Q)`.
    pub ppl_q: Unc,
    /// `Mean PPL(base)`.
    pub ppl_base: Unc,
    /// `Cor(ln(PPL(Q)), ln(PPL(base)))` as a fraction (llama.cpp prints it in %).
    pub cor_ln_ppl: f64,
    /// `Mean ln(PPL(Q)/PPL(base))`.
    pub ln_ppl_ratio: Unc,
    /// `Mean    KLD` (nats).
    pub kld: Unc,
    /// `Maximum KLD`, `99.9%   KLD`, ..., `Minimum KLD` ([`KLD_FRACTIONS`]).
    pub kld_percentiles: Vec<Percentile>,
    /// `Mean    Δp` (a probability difference; llama.cpp prints it in %).
    pub p_diff: Unc,
    /// `Maximum Δp`, ..., `Minimum Δp` ([`P_DIFF_FRACTIONS`]).
    pub p_diff_percentiles: Vec<Percentile>,
    /// `RMS Δp` (fraction).
    pub rms_p_diff: Unc,
    /// `Same top p` (fraction).
    pub same_top_p: Unc,
}

impl QualityStats {
    /// The KLD percentile with this label (`"99.9%"`, `"Median"`, ...).
    pub fn kld_at(&self, label: &str) -> Option<f64> {
        self.kld_percentiles
            .iter()
            .find(|p| p.label == label)
            .map(|p| p.value)
    }

    /// The Δp percentile with this label.
    pub fn p_diff_at(&self, label: &str) -> Option<f64> {
        self.p_diff_percentiles
            .iter()
            .find(|p| p.label == label)
            .map(|p| p.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn mean_and_uncertainty_by_hand() {
        // 1..=11: mean 6, population variance (Σx²/n − 6²) = 506/11 − 36 = 10, se = sqrt(10/10) = 1
        let xs: Vec<f64> = (1..=11).map(f64::from).collect();
        let (s, s2) = (xs.iter().sum(), xs.iter().map(|x| x * x).sum());
        let (m, u) = mean_and_uncertainty(s, s2, xs.len());
        assert!(close(m, 6.0, 1e-12) && close(u, 1.0, 1e-12), "{m} {u}");
        // 10 values or fewer: no uncertainty, as llama.cpp
        assert_eq!(mean_and_uncertainty(55.0, 385.0, 10), (5.5, 0.0));
        assert_eq!(mean_and_uncertainty(0.0, 0.0, 0), (0.0, 0.0));
    }

    #[test]
    fn covariance_by_hand() {
        // a = 1..=10, b = 2a: cov(a,b)/(n-1) = (Σab/n − ā·b̄)/(n−1) = (770/10 − 5.5·11)/9 = 16.5/9
        let a: Vec<f64> = (1..=10).map(f64::from).collect();
        let sa: f64 = a.iter().sum();
        let sab: f64 = a.iter().map(|x| x * 2.0 * x).sum();
        assert!(close(covariance(sa, 2.0 * sa, sab, 10), 16.5 / 9.0, 1e-12));
        assert_eq!(covariance(1.0, 1.0, 1.0, 9), 0.0);
    }

    #[test]
    fn percentile_and_median_like_llama_cpp() {
        let v = [0.0f32, 1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 0.0), 0.0);
        assert_eq!(percentile(&v, 1.0), 4.0);
        // p = 0.9·4 = 3.6: 0.4·3 + 0.6·4
        assert!((percentile(&v, 0.9) - 3.6).abs() < 1e-6);
        assert!((percentile(&v, 0.1) - 0.4).abs() < 1e-6);
        assert_eq!(median(&v), 2.0);
        assert_eq!(median(&[1.0, 2.0, 4.0, 8.0]), 3.0);
        assert!(percentile(&[], 0.5).is_nan() && median(&[]).is_nan());
        assert_eq!(percentile(&[7.0], 0.5), 7.0);
    }

    #[test]
    fn finish_by_hand() {
        let mut acc = KldAccumulator::default();
        // 20 tokens: NLL(Q) alternates 1 and 3, NLL(base) constant 1.5, KLD 0.01·i, Δp ±0.1, 15 same tops
        for i in 0..20 {
            acc.add(TokenScore {
                nll: if i % 2 == 0 { 1.0 } else { 3.0 },
                nll_base: 1.5,
                kld: 0.01 * f64::from(i),
                p_diff: if i % 2 == 0 { 0.1 } else { -0.1 },
                same_top: i < 15,
            });
        }
        let s = acc.finish().unwrap();
        assert_eq!(s.count, 20);
        // ln PPL(Q): mean 2, variance 1, se sqrt(1/19)
        let se = (1.0f64 / 19.0).sqrt();
        assert!(close(s.ppl_q.value, 2f64.exp(), 1e-9));
        assert!(close(s.ppl_q.unc, 2f64.exp() * se, 1e-9));
        assert!(close(s.ppl_base.value, 1.5f64.exp(), 1e-9) && s.ppl_base.unc == 0.0);
        // base is constant: covariance 0, the ratio's uncertainty is that of ln PPL(Q)
        assert!(close(s.ln_ppl_ratio.value, 0.5, 1e-9));
        assert!(close(s.ln_ppl_ratio.unc, se, 1e-9));
        // KLD 0..0.19: mean 0.095; variance (Σk²/n − mean²) = 0.0001·(2470/20) − 0.095² = 0.003325
        assert!(close(s.kld.value, 0.095, 1e-12));
        assert!(close(s.kld.unc, (0.003325f64 / 19.0).sqrt(), 1e-9));
        assert!((s.kld_at("Median").unwrap() - 0.095).abs() < 1e-6);
        assert!((s.kld_at("Maximum").unwrap() - 0.19).abs() < 1e-6);
        // p = 0.9·19 = 17.1 → 0.171
        assert!((s.kld_at("90.0%").unwrap() - 0.171).abs() < 1e-6);
        // Δp: mean 0 (f32-rounded ±0.1 cancel), RMS 0.1 with zero spread of Δp²
        assert!(s.p_diff.value.abs() < 1e-9);
        assert!(close(s.rms_p_diff.value, 0.1, 1e-7) && s.rms_p_diff.unc < 1e-9);
        assert_eq!(s.p_diff_at("Median").unwrap(), 0.0);
        // same top 15/20 = 0.75 ± sqrt(0.75·0.25/19)
        assert!(close(s.same_top_p.value, 0.75, 1e-12));
        assert!(close(
            s.same_top_p.unc,
            (0.75f64 * 0.25 / 19.0).sqrt(),
            1e-12
        ));
        assert_eq!(s.kld_percentiles.len(), KLD_FRACTIONS.len());
        assert_eq!(s.p_diff_percentiles.len(), P_DIFF_FRACTIONS.len());
        assert!(KldAccumulator::default().finish().is_none());
    }
}
