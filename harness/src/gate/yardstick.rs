//! The cross-oracle yardstick: `reference` mode against llama.cpp goldens is held to llama.cpp's own measured
//! distance from transformers-f32 on the same weights and tokens (issue 41; DESIGN.md §10, "Yardsticks are
//! measured, never guessed").
//!
//! Reference mode equals transformers-f32 at the f32 floor (KL ~1e-11), so its distance from llama.cpp is
//! llama.cpp's own rounding (8-bit matmul inputs, f16 tables), not ours. That distance is measured per model ×
//! prompt by `oracles/yardstick/measure.sh` (scratch goldens of both oracles on the prompts of
//! `oracles/yardstick/prompts-derive.json`, never committed) and recorded in `golden/manifest.json` under
//! `cross_oracle` ([`crate::golden::CrossOracleRecord`]). The per-model rules of `ci/thresholds.toml` marked
//! `yardstick = "cross-oracle distance"` are [`derive`]d from those records; the test
//! `cross_oracle_rules_are_derived_from_the_manifest` (harness/tests/gate.rs) checks every number. It is a
//! change of yardstick, not a loosening: the number comes from a measurement of the oracle, not from what our
//! engine gives.
//!
//! # Derivation, per gated metric (per-prompt values over the record's prompts)
//!
//! `q(x)` is the nearest-rank [`QUANTILE`] of a per-prompt distance over the record's prompts of one llama.cpp
//! CPU build — a high quantile, so that one prompt does not set the rule alone when there are many, and the
//! largest value when there are fewer than 20 — and the larger over the builds measured (AVX2 and AVX-512
//! llama.cpp differ from transformers by different amounts; a golden may come from either). The cross-oracle distance gets [`HEADROOM`] (×1.5) on distance-type figures; the F16-KV floor
//! (llama.cpp against itself with an f16 KV cache, measured on the same prompts) is a lower bound that is
//! never undercut:
//!
//! - `max_mean_kl` = max(1.5 · q(KL), q(KL_f16kv)), KL per prompt = max(KL at the last prompt position, mean KL
//!   over every full row): the gate's `mean_kl` whichever rows a golden stores;
//! - `margin_tolerance` = max(1.5 · q(largest flip margin), q(largest flip margin_f16kv), [`MIN_MARGIN`]): every
//!   top-1 flip of llama.cpp against transformers is at a margin below it;
//! - `min_top5_mean` = 1 − max(2 · q(1 − top5), q(1 − top5_f16kv)): twice the measured top-5 misses (the same
//!   count of extra disagreements);
//! - `min_cosine_out` = 1 − max(1.5 · q(1 − min cos), q(1 − min cos_f16kv)), min cos per prompt over
//!   `blk.N.out` and `output_norm`, prompt and decode positions.
//!
//! Each value is rounded outward to two significant digits ([`round_out`]) so that the file stays readable and
//! the rule is never tighter than the derivation.

use anyhow::{bail, Result};

use crate::golden::{CrossOracleRecord, PromptDistance};

/// The quantile of per-prompt distances a rule is derived from (nearest rank): with fewer than 20 prompts it is
/// the largest.
pub const QUANTILE: f64 = 0.95;

/// The headroom on distance-type figures (KL, 1 − cosine, margins): the decided 1.5×.
pub const HEADROOM: f64 = 1.5;

/// The factor on top-5 misses: the measured count of disagreements plus the same count again.
pub const TOP5_FACTOR: f64 = 2.0;

/// The smallest `margin_tolerance` a derived rule gets, logit units: the default rule's near-tie tolerance (a
/// top-1 disagreement at a smaller reference margin is a coin flip any change of f32 summation order turns,
/// ci/thresholds.toml). A record without a single flip measures no margin at all; this is its resolution.
pub const MIN_MARGIN: f64 = 0.01;

/// The `yardstick` label of the rules derived here (ci/thresholds.toml; report.md names it per cell).
pub const LABEL: &str = "cross-oracle distance";

/// The four gated thresholds of a reference cell against llama.cpp, derived from one model's record.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Derived {
    /// `max_mean_kl`, nats.
    pub max_mean_kl: f64,
    /// `margin_tolerance`, logit units.
    pub margin_tolerance: f64,
    /// `min_top5_mean`, fraction.
    pub min_top5_mean: f64,
    /// `min_cosine_out`.
    pub min_cosine_out: f64,
}

/// The nearest-rank `p` quantile of `values` (1-based rank ⌈p·n⌉), NaN kept (a NaN distance is never below a
/// threshold). Errors on no values.
pub fn quantile(values: &[f64], p: f64) -> Result<f64> {
    if values.is_empty() {
        bail!("no values to take a quantile of");
    }
    if values.iter().any(|v| v.is_nan()) {
        return Ok(f64::NAN);
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Ok(v[rank - 1])
}

/// `x` rounded outward to two significant digits: up (`up = true`) or down, never toward a tighter rule.
pub fn round_out(x: f64, up: bool) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let e = x.abs().log10().floor() as i32 - 1;
    let scale = 10f64.powi(e);
    let m = x / scale;
    // the quotient of a decimal by a power of ten is not exact: absorb its last ulps before rounding
    let m = if (m - m.round()).abs() < 1e-9 {
        m.round()
    } else {
        m
    };
    let r = if up { m.ceil() } else { m.floor() } * scale;
    // print as the shortest decimal of two significant digits
    format!("{r:.1e}").parse().unwrap_or(r)
}

/// 1 − `x` as the decimal it is (`x` has two significant digits): 1 − 0.0045 prints 0.9955, not 0.9954999….
fn complement(x: f64) -> f64 {
    let y = 1.0 - x;
    format!("{y:.12}").parse().unwrap_or(y)
}

/// Derive the four thresholds from one model's record ([module docs](self)). Errors: a record with no prompt,
/// or a distance that is not finite (named with its prompt).
pub fn derive(record: &CrossOracleRecord) -> Result<Derived> {
    if record.prompts.is_empty() {
        bail!("the record has no prompt");
    }
    for p in &record.prompts {
        for (side, d) in [("cross_oracle", &p.cross_oracle), ("f16kv", &p.f16kv)] {
            for (name, v) in [
                ("kl", d.kl),
                ("max_flip_margin", d.max_flip_margin),
                ("top5_mean", d.top5_mean),
                ("min_cos_out", d.min_cos_out),
            ] {
                if !v.is_finite() {
                    bail!("prompt {}: {side}.{name} = {v} is not finite", p.prompt_id);
                }
            }
        }
    }
    let q = |f: fn(&PromptDistance) -> f64, f16: bool| -> Result<f64> {
        let side = if f16 { Side::F16kv } else { Side::CrossOracle };
        Ok(quantile_at(record, f, side)?.0)
    };
    let kl = (HEADROOM * q(|d| d.kl, false)?).max(q(|d| d.kl, true)?);
    let margin = (HEADROOM * q(|d| d.max_flip_margin, false)?)
        .max(q(|d| d.max_flip_margin, true)?)
        .max(MIN_MARGIN);
    let top5_miss =
        (TOP5_FACTOR * q(|d| 1.0 - d.top5_mean, false)?).max(q(|d| 1.0 - d.top5_mean, true)?);
    let cos_miss =
        (HEADROOM * q(|d| 1.0 - d.min_cos_out, false)?).max(q(|d| 1.0 - d.min_cos_out, true)?);
    Ok(Derived {
        max_mean_kl: round_out(kl, true),
        margin_tolerance: round_out(margin, true),
        min_top5_mean: complement(round_out(top5_miss, true)),
        min_cosine_out: complement(round_out(cos_miss, true)),
    }
    .within_ranges())
}

/// The value a derived threshold takes where llama.cpp's own distance from transformers leaves its metric no
/// yardstick (1 − cosine or the top-5 misses ×1.5/×2 reach 1, a margin or KL passes 10): the loosest value
/// the thresholds file accepts ([`super::THRESHOLD_RANGES`]). Measured on SmolLM2's Q2_K variant: at one
/// position of `json` llama.cpp's `output_norm` has cosine 0.158 against transformers, and the top-1 margin is
/// 6.6 logits — a 2-bit 135M model is chaotic under llama.cpp's 8-bit input rounding.
pub const VACUOUS: Derived = Derived {
    max_mean_kl: 10.0,
    margin_tolerance: 10.0,
    min_top5_mean: 1e-6,
    min_cosine_out: 1e-6,
};

impl Derived {
    /// Each field clamped into its thresholds-file range, at the [`VACUOUS`] end.
    fn within_ranges(self) -> Derived {
        Derived {
            max_mean_kl: self.max_mean_kl.min(VACUOUS.max_mean_kl),
            margin_tolerance: self.margin_tolerance.min(VACUOUS.margin_tolerance),
            min_top5_mean: self.min_top5_mean.max(VACUOUS.min_top5_mean),
            min_cosine_out: self.min_cosine_out.max(VACUOUS.min_cosine_out),
        }
    }

    /// The names of the fields at their [`VACUOUS`] value: metrics this model's measured distance leaves no
    /// yardstick for.
    pub fn vacuous(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        for (name, v, vac) in [
            ("max_mean_kl", self.max_mean_kl, VACUOUS.max_mean_kl),
            (
                "margin_tolerance",
                self.margin_tolerance,
                VACUOUS.margin_tolerance,
            ),
            ("min_top5_mean", self.min_top5_mean, VACUOUS.min_top5_mean),
            (
                "min_cosine_out",
                self.min_cosine_out,
                VACUOUS.min_cosine_out,
            ),
        ] {
            if v == vac {
                out.push(name);
            }
        }
        out
    }
}

/// The `yardstick` label of the rules that hold ggml mode against transformers-f32, derived by [`derive_ggml`].
pub const LABEL_GGML: &str = "cross-oracle distance (llama.cpp's arithmetic against f32)";

/// The four gated thresholds of a **ggml** cell against transformers-f32, derived from one model's record: ggml
/// mode is llama.cpp bit for bit, so against transformers it shows exactly the measured distance with
/// transformers as the reference (`cross_oracle_tf_ref`). Per figure: the [`QUANTILE`] (the larger build) ×
/// [`HEADROOM`] (top-5 misses × [`TOP5_FACTOR`]), margins never below [`MIN_MARGIN`]; no F16-KV floor (the KV
/// precision of llama.cpp is not what this cell varies). Errors: a record without that distance.
pub fn derive_ggml(record: &CrossOracleRecord) -> Result<Derived> {
    let q = |f: fn(&PromptDistance) -> f64| -> Result<f64> {
        Ok(quantile_at(record, f, Side::TfRef)?.0)
    };
    Ok(Derived {
        max_mean_kl: round_out(HEADROOM * q(|d| d.kl)?, true),
        margin_tolerance: round_out((HEADROOM * q(|d| d.max_flip_margin)?).max(MIN_MARGIN), true),
        min_top5_mean: complement(round_out(TOP5_FACTOR * q(|d| 1.0 - d.top5_mean)?, true)),
        min_cosine_out: complement(round_out(HEADROOM * q(|d| 1.0 - d.min_cos_out)?, true)),
    }
    .within_ranges())
}

/// The `[[rule]]` for `model`'s ggml cells against transformers-f32 ([`derive_ggml`]), a comment per number.
pub fn render_ggml_rule(model: &str, record: &CrossOracleRecord) -> Result<String> {
    let d = derive_ggml(record)?;
    let mut out = format!(
        "[[rule]]\nmodel = \"{model}\"\nmode = \"ggml\"\noracle = \"transformers-f32\"\nyardstick = \"{LABEL_GGML}\"\n\
         note = \"{model}: ggml mode (llama.cpp bit for bit) against transformers-f32, at their measured distance\"\n\
         # the same record, transformers-f32 as the reference; q = p{} of each build, the larger:\n",
        (QUANTILE * 100.0).round()
    );
    for (field, value, f, factor) in [
        (
            "max_mean_kl",
            d.max_mean_kl,
            (|x: &PromptDistance| x.kl) as fn(&PromptDistance) -> f64,
            HEADROOM,
        ),
        (
            "margin_tolerance",
            d.margin_tolerance,
            |x| x.max_flip_margin,
            HEADROOM,
        ),
        (
            "min_top5_mean",
            d.min_top5_mean,
            |x| 1.0 - x.top5_mean,
            TOP5_FACTOR,
        ),
        (
            "min_cosine_out",
            d.min_cosine_out,
            |x| 1.0 - x.min_cos_out,
            HEADROOM,
        ),
    ] {
        let (q, at) = quantile_at(record, f, Side::TfRef)?;
        out.push_str(&format!(
            "# {field}: q {q:.3e} ({at}) x {factor}, rounded out\n{field} = {value}\n"
        ));
    }
    Ok(out)
}

/// One derived threshold with where it came from: the measured quantile of each side, the prompt that holds
/// it, and which side bounds the value.
#[derive(Clone, Debug, PartialEq)]
pub struct Provenance {
    /// The field of the rule.
    pub field: &'static str,
    /// The value derived ([`derive`]).
    pub value: f64,
    /// The [`QUANTILE`] of the cross-oracle distance, and the prompt it is measured on.
    pub cross_oracle: (f64, String),
    /// The same of the F16-KV floor.
    pub f16kv: (f64, String),
    /// The factor on the cross-oracle distance.
    pub factor: f64,
}

/// Which distance of a [`crate::golden::PromptRecord`] a quantile reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    /// llama.cpp-f32kv (reference) against transformers-f32.
    CrossOracle,
    /// llama.cpp-f32kv against llama.cpp-f16kv.
    F16kv,
    /// transformers-f32 (reference) against llama.cpp-f32kv.
    TfRef,
}

impl Side {
    fn of(self, p: &crate::golden::PromptRecord) -> Option<&PromptDistance> {
        match self {
            Side::CrossOracle => Some(&p.cross_oracle),
            Side::F16kv => Some(&p.f16kv),
            Side::TfRef => p.cross_oracle_tf_ref.as_ref(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Side::CrossOracle => "cross_oracle",
            Side::F16kv => "f16kv",
            Side::TfRef => "cross_oracle_tf_ref",
        }
    }
}

/// The quantile of one per-prompt figure, and the prompt (`id@build`) that holds it: the [`QUANTILE`] of each
/// llama.cpp build's rows, the largest over the builds (a golden may come from either build: their distances
/// from transformers differ, AVX2 vs AVX-512 reductions).
fn quantile_at(
    record: &CrossOracleRecord,
    f: fn(&PromptDistance) -> f64,
    which: Side,
) -> Result<(f64, String)> {
    if let Some(p) = record.prompts.iter().find(|p| which.of(p).is_none()) {
        bail!(
            "prompt {}@{}: no {} distance recorded",
            p.prompt_id,
            p.build,
            which.name()
        );
    }
    let side = |p: &crate::golden::PromptRecord| which.of(p).map_or(f64::NAN, f);
    let builds: std::collections::BTreeSet<&str> =
        record.prompts.iter().map(|p| p.build.as_str()).collect();
    let mut best: Option<(f64, String)> = None;
    for b in builds {
        let rows: Vec<&crate::golden::PromptRecord> =
            record.prompts.iter().filter(|p| p.build == b).collect();
        let v: Vec<f64> = rows.iter().map(|p| side(p)).collect();
        let q = quantile(&v, QUANTILE)?;
        let at = rows
            .iter()
            .find(|p| side(p) == q)
            .map_or_else(String::new, |p| format!("{}@{b}", p.prompt_id));
        if best.as_ref().is_none_or(|(x, _)| q > *x || q.is_nan()) {
            best = Some((q, at));
        }
    }
    best.ok_or_else(|| anyhow::anyhow!("the record has no prompt"))
}

/// [`derive`]'s four thresholds with their [`Provenance`], in rule order (`max_mean_kl`, `margin_tolerance`,
/// `min_top5_mean`, `min_cosine_out`). Distances are as the rule reads them: KL, margin, top-5 misses
/// (1 − top5), 1 − cosine.
pub fn provenance(record: &CrossOracleRecord) -> Result<Vec<Provenance>> {
    let d = derive(record)?;
    let row = |field, value, f: fn(&PromptDistance) -> f64, factor| -> Result<Provenance> {
        Ok(Provenance {
            field,
            value,
            cross_oracle: quantile_at(record, f, Side::CrossOracle)?,
            f16kv: quantile_at(record, f, Side::F16kv)?,
            factor,
        })
    };
    Ok(vec![
        row("max_mean_kl", d.max_mean_kl, |x| x.kl, HEADROOM)?,
        row(
            "margin_tolerance",
            d.margin_tolerance,
            |x| x.max_flip_margin,
            HEADROOM,
        )?,
        row(
            "min_top5_mean",
            d.min_top5_mean,
            |x| 1.0 - x.top5_mean,
            TOP5_FACTOR,
        )?,
        row(
            "min_cosine_out",
            d.min_cosine_out,
            |x| 1.0 - x.min_cos_out,
            HEADROOM,
        )?,
    ])
}

/// The `[[rule]]` of `ci/thresholds.toml` for `model`'s reference cells against llama.cpp-f32kv, derived from its
/// record, with a comment per number (`lockstep yardstick` prints these; the test
/// `cross_oracle_rules_are_derived_from_the_manifest` checks the file against [`derive`]).
pub fn render_rule(model: &str, record: &CrossOracleRecord) -> Result<String> {
    let mut out = format!(
        "[[rule]]\nmodel = \"{model}\"\nmode = \"reference\"\noracle = \"llama.cpp-f32kv\"\nyardstick = \"{LABEL}\"\n\
         note = \"{model}: reference mode held to llama.cpp's own measured distance from transformers-f32\"\n\
         # {} rows of {} (golden/manifest.json cross_oracle.{model}), per llama.cpp build:\n",
        record.prompts.len(),
        record.prompts_file,
    );
    for (b, r) in &record.builds {
        let n = record.prompts.iter().filter(|p| &p.build == b).count();
        out.push_str(&format!(
            "#   {b}: {n} prompts, measured {} by `{}`\n",
            r.measured, r.command
        ));
    }
    out.push_str(&format!(
        "# q = nearest-rank p{} over each build's prompts, the larger build (prompt@build that holds it); f16kv =\n\
         # llama.cpp against itself with an f16 KV cache, the floor never undercut.\n",
        (QUANTILE * 100.0).round()
    ));
    let vacuous = derive(record)?.vacuous();
    if !vacuous.is_empty() {
        out.push_str(&format!(
            "# VACUOUS here: {} — llama.cpp's own distance from transformers on this model leaves these metrics no\n\
             # yardstick (the loosest value the file accepts); the other metrics and the transformers-f32 cells hold it.\n",
            vacuous.join(", ")
        ));
    }
    for p in provenance(record)? {
        let (what, dist) = match p.field {
            "max_mean_kl" => ("KL", "KL"),
            "margin_tolerance" => ("largest top-1 flip margin", "margin"),
            "min_top5_mean" => ("top-5 misses (1 - top5)", "misses"),
            _ => ("1 - min cosine of blk.N.out/output_norm", "1 - cos"),
        };
        let bound = if p.factor * p.cross_oracle.0 >= p.f16kv.0 {
            "cross-oracle"
        } else {
            "f16kv floor"
        };
        out.push_str(&format!(
            "# {}: {what}: q cross-oracle {:.3e} ({}) x {} vs q f16kv {:.3e} ({}) -> {bound}, {dist} rounded out\n{} = {}\n",
            p.field, p.cross_oracle.0, p.cross_oracle.1, p.factor, p.f16kv.0, p.f16kv.1, p.field, p.value
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::golden::{CrossOracleRecord, PromptDistance, PromptRecord};

    fn d(kl: f64, margin: f64, top5: f64, cos: f64) -> PromptDistance {
        PromptDistance {
            kl,
            max_flip_margin: margin,
            top5_mean: top5,
            min_cos_out: cos,
            ..PromptDistance::default()
        }
    }

    fn record(rows: &[(PromptDistance, PromptDistance)]) -> CrossOracleRecord {
        CrossOracleRecord {
            prompts: rows
                .iter()
                .enumerate()
                .map(|(i, (c, f))| PromptRecord {
                    prompt_id: format!("p{i}"),
                    cross_oracle: c.clone(),
                    f16kv: f.clone(),
                    ..PromptRecord::default()
                })
                .collect(),
            ..CrossOracleRecord::default()
        }
    }

    #[test]
    fn quantile_is_nearest_rank_and_keeps_nan() {
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.95).unwrap(), 19.0);
        assert_eq!(quantile(&v[..19], 0.95).unwrap(), 19.0);
        assert_eq!(quantile(&[3.0, 1.0, 2.0], 0.95).unwrap(), 3.0);
        assert!(quantile(&[1.0, f64::NAN], 0.5).unwrap().is_nan());
        assert!(quantile(&[], 0.5).is_err());
    }

    #[test]
    fn rounding_is_outward_at_two_digits() {
        assert_eq!(round_out(0.01234, true), 0.013);
        assert_eq!(round_out(0.01234, false), 0.012);
        assert_eq!(round_out(0.013, true), 0.013);
        assert_eq!(round_out(3.01e-3, true), 3.1e-3);
        assert_eq!(round_out(0.45, true), 0.45);
        assert_eq!(round_out(0.0, true), 0.0);
    }

    #[test]
    fn headroom_applies_to_the_cross_oracle_distance_and_the_f16kv_floor_bounds_it() {
        // three prompts: the quantile is the largest
        let r = record(&[
            (d(1e-3, 0.1, 0.96, 0.998), d(4e-4, 0.0, 1.0, 0.9995)),
            (d(4e-3, 0.2, 0.98, 0.999), d(1e-3, 0.05, 0.99, 0.9999)),
            (d(2e-3, 0.0, 0.94, 0.997), d(5e-4, 0.5, 0.95, 0.9990)),
        ]);
        let got = derive(&r).unwrap();
        assert_eq!(got.max_mean_kl, 6e-3); // 1.5 x 4e-3 > 1e-3
        assert_eq!(got.margin_tolerance, 0.5); // the f16kv floor 0.5 > 1.5 x 0.2
        assert!((got.min_top5_mean - 0.88).abs() < 1e-12, "{got:?}"); // 1 - 2 x 0.06
        assert!((got.min_cosine_out - 0.9955).abs() < 1e-12, "{got:?}"); // 1 - 1.5 x 0.003
                                                                         // no flip measured anywhere: the default near-tie tolerance
        let mut none = r.clone();
        for p in &mut none.prompts {
            p.cross_oracle.max_flip_margin = 0.0;
            p.f16kv.max_flip_margin = 0.0;
        }
        assert_eq!(derive(&none).unwrap().margin_tolerance, MIN_MARGIN);
        // a distance past the metric's range: the loosest value the file accepts, named as vacuous
        let mut chaos = r.clone();
        chaos.prompts[0].cross_oracle.min_cos_out = 0.158;
        let got = derive(&chaos).unwrap();
        assert_eq!(got.min_cosine_out, VACUOUS.min_cosine_out);
        assert_eq!(got.vacuous(), ["min_cosine_out"]);
        assert!(derive(&r).unwrap().vacuous().is_empty());
        let mut bad = r.clone();
        bad.prompts[1].f16kv.kl = f64::NAN;
        let e = format!("{:#}", derive(&bad).unwrap_err());
        assert!(e.contains("p1") && e.contains("f16kv.kl"), "{e}");
        assert!(derive(&CrossOracleRecord::default()).is_err());
    }

    /// Each llama.cpp build's rows give their own quantile; the larger holds (twenty rows per build: the p95 is
    /// the second largest of each, so one build's outlier alone does not set the rule).
    #[test]
    fn the_larger_builds_quantile_holds() {
        let floor = d(0.0, 0.0, 1.0, 1.0);
        let mut rows = Vec::new();
        for (build, base) in [("avx512", 1e-3), ("avx2", 2e-3)] {
            for i in 0..20 {
                let kl = if i == 19 {
                    1.0
                } else {
                    base * (1.0 + i as f64 / 100.0)
                };
                rows.push((build, d(kl, 0.0, 1.0, 1.0)));
            }
        }
        let mut r = record(
            &rows
                .iter()
                .map(|(_, x)| (x.clone(), floor.clone()))
                .collect::<Vec<_>>(),
        );
        for (p, (b, _)) in r.prompts.iter_mut().zip(&rows) {
            p.build = b.to_string();
        }
        // avx2's p95 = its 19th value 2e-3 x 1.18; x 1.5 = 3.54e-3 -> 3.6e-3 (the outliers at 1.0 are 20th)
        assert_eq!(derive(&r).unwrap().max_mean_kl, 3.6e-3);
        let p = &provenance(&r).unwrap()[0];
        assert_eq!(p.cross_oracle.1, "p38@avx2", "{p:?}");
    }
}
