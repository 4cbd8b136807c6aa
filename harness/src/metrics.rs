//! Error metrics between an engine's tensor and the reference's, with their definitions.
//!
//! Conventions: `a` is the engine's row, `b` the reference's (the golden). All sums are accumulated in
//! f64. Definitions (also written into every report):
//!
//! - **cosine** = a·b / (‖a‖‖b‖); 1 when both rows are all zeros, 0 when exactly one is.
//! - **max_abs** = maxᵢ |aᵢ − bᵢ|; **mean_abs** = meanᵢ |aᵢ − bᵢ|; **rmse** = √(meanᵢ (aᵢ − bᵢ)²).
//! - **nmse** = Σ(aᵢ − bᵢ)² / Σbᵢ² — llama.cpp `tests/test-backend-ops.cpp` `nmse`, b = reference;
//!   0 when both are zero, +∞ when only the reference is.
//! - **bit_exact**: every aᵢ == bᵢ.
//!
//! On logits, per position, with P = softmax(reference), Q = softmax(engine) (log-softmax in f64):
//! - **kl** = KL(P ‖ Q) = Σ P (log P − log Q), nats. Needs full rows on both sides.
//! - **top1**: argmax agreement; when they differ, **margin** = reference top-1 logit − reference logit
//!   of the engine's choice (≥ 0). A disagreement with margin below the tolerance is a near tie and is
//!   counted apart, not as a failure.
//! - **top-k overlap** = |topk(ref) ∩ topk(eng)| / k, k = 5 and 10.
//! - **entropy** H = −Σ p log p of each side, nats (a flattened distribution is a bug signal that cosine
//!   hides).
//! - **dp_top** = P(t*) − Q(t*) for the reference's top token t*.
//!
//! Aggregates ([`Summary`]) give count, mean, min, max and the 50th/90th/99th percentiles (nearest-rank).

use serde::{Deserialize, Serialize};

/// Errors between one engine row and one reference row.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RowError {
    /// a·b / (‖a‖‖b‖).
    pub cosine: f64,
    /// Σ(a−b)² / Σb².
    pub nmse: f64,
    /// √mean (a−b)².
    pub rmse: f64,
    /// max |a−b|.
    pub max_abs: f64,
    /// mean |a−b|.
    pub mean_abs: f64,
    /// a == b everywhere.
    pub bit_exact: bool,
}

/// Where a row holds a value that is not finite.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NonFinite {
    /// Index in the row.
    pub index: usize,
    /// The value (NaN or ±∞).
    pub value: f32,
}

/// The first non-finite value of a row, if any.
pub fn first_non_finite(row: &[f32]) -> Option<NonFinite> {
    row.iter()
        .position(|v| !v.is_finite())
        .map(|index| NonFinite {
            index,
            value: row[index],
        })
}

/// Compare one engine row `a` with one reference row `b` (same length; the caller checks shapes and
/// finiteness).
pub fn row_error(a: &[f32], b: &[f32]) -> RowError {
    debug_assert_eq!(a.len(), b.len());
    let (mut ab, mut aa, mut bb, mut se, mut sa) = (0f64, 0f64, 0f64, 0f64, 0f64);
    let mut max_abs = 0f64;
    let mut exact = true;
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x as f64, y as f64);
        ab += x * y;
        aa += x * x;
        bb += y * y;
        let d = x - y;
        se += d * d;
        sa += d.abs();
        max_abs = max_abs.max(d.abs());
        exact &= x == y;
    }
    let n = a.len().max(1) as f64;
    let cosine = match (aa == 0.0, bb == 0.0) {
        (true, true) => 1.0,
        (true, false) | (false, true) => 0.0,
        _ => ab / (aa.sqrt() * bb.sqrt()),
    };
    let nmse = if bb == 0.0 {
        if se == 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    } else {
        se / bb
    };
    RowError {
        cosine,
        nmse,
        rmse: (se / n).sqrt(),
        max_abs,
        mean_abs: sa / n,
        bit_exact: exact,
    }
}

/// log-softmax of a logits row in f64.
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
    let sum: f64 = logits.iter().map(|&x| (x as f64 - max).exp()).sum();
    let lse = max + sum.ln();
    logits.iter().map(|&x| x as f64 - lse).collect()
}

/// Indices of the `k` largest values, descending (ties: lower index first).
pub fn top_k(row: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    let k = k.min(row.len());
    let cmp = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    if k < idx.len() {
        idx.select_nth_unstable_by(k, cmp);
        idx.truncate(k);
    }
    idx.sort_by(cmp);
    idx
}

/// |a ∩ b| / k over the first `k` entries of two descending top lists (k shrinks to the shorter list
/// when a vocabulary is smaller than k).
pub fn overlap(a: &[u32], b: &[u32], k: usize) -> f64 {
    let k = k.min(a.len()).min(b.len());
    if k == 0 {
        return 1.0;
    }
    let (a, b) = (&a[..k], &b[..k]);
    a.iter().filter(|x| b.contains(x)).count() as f64 / k as f64
}

/// Logit metrics at one position.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogitPosition {
    /// Sequence position (decode step i is position T + i).
    pub position: usize,
    /// Reference's top-1 token.
    pub ref_top: u32,
    /// Engine's top-1 token.
    pub eng_top: u32,
    /// Reference logit of its top-1 minus its logit of the engine's top-1 (0 when they agree).
    pub margin: f64,
    /// Reference's top-1 − top-2 logit gap (how close the reference itself was to a tie).
    pub ref_gap: f64,
    /// Top-5 overlap.
    pub top5: f64,
    /// Top-10 overlap.
    pub top10: f64,
    /// KL(P_ref ‖ P_eng) in nats; `None` where the reference has only a top-k row.
    pub kl: Option<f64>,
    /// Entropy of the reference distribution (nats); full rows only.
    pub entropy_ref: Option<f64>,
    /// Entropy of the engine distribution (nats).
    pub entropy_eng: f64,
    /// P_ref(t*) − P_eng(t*) for the reference's top token t*; full rows only.
    pub dp_top: Option<f64>,
}

/// What the reference provides at one position: a full logits row, or its top-k ids and values.
pub enum RefLogits<'a> {
    /// Full `[V]` row.
    Full(&'a [f32]),
    /// Top-k ids (descending) and their logits.
    TopK(&'a [u32], &'a [f32]),
}

/// Compare the engine's logits row with the reference's at `position`.
pub fn logit_position(position: usize, eng: &[f32], reference: RefLogits<'_>) -> LogitPosition {
    let eng_top10 = top_k(eng, 10);
    let eng_top = eng_top10[0];
    let lq = log_softmax(eng);
    let entropy_eng = -lq.iter().map(|&l| l.exp() * l).sum::<f64>();
    match reference {
        RefLogits::Full(r) => {
            let ref_top10 = top_k(r, 10);
            let ref_top = ref_top10[0];
            let lp = log_softmax(r);
            let kl: f64 = lp.iter().zip(&lq).map(|(&p, &q)| p.exp() * (p - q)).sum();
            let entropy_ref = -lp.iter().map(|&l| l.exp() * l).sum::<f64>();
            LogitPosition {
                position,
                ref_top,
                eng_top,
                margin: r[ref_top as usize] as f64 - r[eng_top as usize] as f64,
                ref_gap: r[ref_top as usize] as f64
                    - ref_top10
                        .get(1)
                        .map_or(r[ref_top as usize] as f64, |&t| r[t as usize] as f64),
                top5: overlap(&ref_top10, &eng_top10, 5),
                top10: overlap(&ref_top10, &eng_top10, 10),
                // clamp rounding below zero, but let a NaN through (never `max`, which eats it)
                kl: Some(if kl < 0.0 { 0.0 } else { kl }),
                entropy_ref: Some(entropy_ref),
                entropy_eng,
                dp_top: Some(lp[ref_top as usize].exp() - lq[ref_top as usize].exp()),
            }
        }
        RefLogits::TopK(ids, vals) => {
            let ref_top = ids[0];
            // The engine's choice may be outside the reference's top-k: its margin is then at least
            // the gap to the k-th value.
            let margin = match ids.iter().position(|&i| i == eng_top) {
                Some(j) => vals[0] as f64 - vals[j] as f64,
                None => vals[0] as f64 - vals[vals.len() - 1] as f64,
            };
            LogitPosition {
                position,
                ref_top,
                eng_top,
                margin,
                ref_gap: vals[0] as f64 - vals.get(1).copied().unwrap_or(vals[0]) as f64,
                top5: overlap(ids, &eng_top10, 5),
                top10: overlap(ids, &eng_top10, 10),
                kl: None,
                entropy_ref: None,
                entropy_eng,
                dp_top: None,
            }
        }
    }
}

/// count / mean / min / max / percentiles of a set of values.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Number of values.
    pub count: usize,
    /// Arithmetic mean.
    pub mean: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
    /// Median (nearest rank).
    pub p50: f64,
    /// 90th percentile (nearest rank).
    pub p90: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
}

impl Summary {
    /// The summary of no values: count 0, every statistic 0.
    pub const EMPTY: Summary = Summary {
        count: 0,
        mean: 0.0,
        min: 0.0,
        max: 0.0,
        p50: 0.0,
        p90: 0.0,
        p99: 0.0,
    };

    /// Summarise `values`; `None` when empty. NaN sorts last (it should never occur: inputs are
    /// checked for finiteness first).
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Summary> {
        let mut v: Vec<f64> = values.into_iter().collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let rank = |p: f64| v[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
        Some(Summary {
            count: n,
            mean: v.iter().sum::<f64>() / n as f64,
            min: v[0],
            max: v[n - 1],
            p50: rank(0.5),
            p90: rank(0.9),
            p99: rank(0.99),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_error_definitions() {
        let e = row_error(&[1.0, 2.0, 3.0], &[1.0, 2.0, 3.0]);
        assert!(e.bit_exact && e.nmse == 0.0 && (e.cosine - 1.0).abs() < 1e-15);
        let e = row_error(&[2.0, 0.0], &[1.0, 1.0]);
        assert!((e.cosine - 1.0 / 2f64.sqrt()).abs() < 1e-12);
        assert!((e.nmse - 2.0 / 2.0).abs() < 1e-12);
        assert_eq!(e.max_abs, 1.0);
        assert_eq!(e.mean_abs, 1.0);
        assert!((e.rmse - 1.0).abs() < 1e-12);
        assert_eq!(row_error(&[0.0], &[0.0]).cosine, 1.0);
        assert_eq!(row_error(&[1.0], &[0.0]).nmse, f64::INFINITY);
        assert_eq!(row_error(&[0.0, 0.0], &[1.0, 0.0]).cosine, 0.0);
    }

    #[test]
    fn flat_logits_score_high_cosine_but_kl_and_entropy_expose_them() {
        // The lesson lockstep is built on: a flattened distribution keeps a high cosine.
        let reference: Vec<f32> = (0..100)
            .map(|i| 10.0 + if i == 0 { 5.0 } else { (i % 3) as f32 * 0.1 })
            .collect();
        let flat: Vec<f32> = reference.iter().map(|x| x * 0.5).collect();
        assert!(row_error(&flat, &reference).cosine > 0.9);
        let p = logit_position(0, &flat, RefLogits::Full(&reference));
        assert_eq!(p.eng_top, p.ref_top);
        assert!(p.kl.unwrap() > 0.5, "kl {}", p.kl.unwrap());
        assert!(p.entropy_eng > p.entropy_ref.unwrap() + 1.0);
        assert!(p.dp_top.unwrap() > 0.3);
    }

    #[test]
    fn kl_of_identical_rows_is_zero_and_margin_counts_the_tie() {
        let r = [1.0f32, 3.0, 2.999, -1.0];
        let p = logit_position(4, &r, RefLogits::Full(&r));
        assert!(p.kl.unwrap().abs() < 1e-15);
        assert_eq!((p.top5, p.top10), (1.0, 1.0));
        let e = [1.0f32, 2.998, 3.0, -1.0];
        let p = logit_position(4, &e, RefLogits::Full(&r));
        assert_eq!((p.ref_top, p.eng_top), (1, 2));
        assert!((p.margin - 0.001).abs() < 1e-6);
        let p = logit_position(4, &e, RefLogits::TopK(&[1, 2, 0], &[3.0, 2.999, 1.0]));
        assert!((p.margin - 0.001).abs() < 1e-6 && p.kl.is_none());
    }

    #[test]
    fn top_k_and_summary() {
        assert_eq!(top_k(&[0.5, 2.0, 2.0, -1.0, 7.0], 3), vec![4, 1, 2]);
        assert_eq!(overlap(&[1, 2, 3, 4, 5], &[5, 6, 7, 1, 9], 5), 0.4);
        let s = Summary::of((1..=100).map(f64::from)).unwrap();
        assert_eq!(
            (s.count, s.min, s.max, s.p50, s.p90, s.p99),
            (100, 1.0, 100.0, 50.0, 90.0, 99.0)
        );
        assert!((s.mean - 50.5).abs() < 1e-12);
        assert!(Summary::of(std::iter::empty()).is_none());
        assert_eq!(first_non_finite(&[1.0, f32::NAN]).unwrap().index, 1);
    }
}
