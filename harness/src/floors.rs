//! Measured stage floors of a numerics mode that does not reproduce the oracle bit for bit (`reference`):
//! how far each stage kind's *local* error (bisect's injected pass: each layer computing from the golden's
//! own input, [`crate::judge`]) reaches on the unbroken engine, so that bisect and the gate can tell a bug
//! from the rounding the two computations differ by.
//!
//! `lockstep floors` measures them on every golden of the matrix for the mode and writes `ci/floors.json`
//! ([`crate::measure`]); `lockstep run` and `lockstep bisect` read it ([`crate::judge::floor_set`]). Per (model, oracle, mode) and stage kind it records:
//!
//! - `nmse_p99`, the 99th percentile of the local NMSE over every stored row (prompt positions and decode
//!   steps, every layer, every golden of the model, each SIMD setting of the matrix whose results differ —
//!   reference mode's scalar order and its 16-lane SIMD order, [`crate::measure::simd_settings_of`]): the floor is `stage_floor_headroom` (thresholds) times
//!   it. The percentile rather than the maximum: the maximum is set by a few rows where llama.cpp's own 8-bit
//!   activation rounding (Q8_1, Q8_K) of an extreme input moves its result far from f32 — rows bisect
//!   classifies as oracle-side rounding by checking them against ggml mode, which reproduces that rounding.
//! - `exact_at`: the stages (e.g. `blk.0.attn_norm`, `embed`) where every row equalled the golden at the
//!   golden's storage precision whenever the injected input was the oracle's exact value, with every SIMD
//!   setting measured — computations both sides do identically (norms, lookups). There the floor is bit equality, as in ggml mode: a wrong
//!   RMSNorm epsilon moves `blk.0.attn_norm` by NMSE ~4e-7, far below any percentile, and is still caught.
//!
//! The floor is llama.cpp's disagreement with *our* f32 computation, measured, not a constant. llama.cpp's
//! disagreement with itself (f16 vs f32 KV cache, `vs_f32kv` in the manifest) cannot serve per stage: it is
//! zero at every stage before the first attention, where reference mode's Q8_1 difference already shows.
//! The floors are only as good as the engine they were measured on; that engine's shared code paths are
//! held bit-exact to llama.cpp by ggml mode, and every golden they were measured on is named with its
//! sha256, so changed goldens make the file stale, which is an error, not a silent pass.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::compare::{CellComparison, StageComparison};

/// Version of the floors file's shape.
pub const FLOORS_SCHEMA_VERSION: u32 = 1;

/// The floors file (`ci/floors.json`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Floors {
    /// [`FLOORS_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// How the file was made.
    pub made_by: String,
    /// One set per (model, oracle, mode).
    pub sets: Vec<FloorSet>,
}

/// The floors of one (model, oracle, mode).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FloorSet {
    /// Model id.
    pub model: String,
    /// Oracle directory, e.g. `llama.cpp-f32kv`.
    pub oracle: String,
    /// Numerics mode.
    pub mode: String,
    /// The goldens of the model in this mode (manifest path → sha256): measured where they store layer
    /// outputs to inject; the others have no local pass, so nothing is held to the floors there.
    #[serde(deserialize_with = "unique_keys")]
    pub goldens: BTreeMap<String, String>,
    /// Per stage kind (`attn_norm`, `q`, ..., `embed`, `output_norm`).
    #[serde(deserialize_with = "unique_keys")]
    pub kinds: BTreeMap<String, KindFloor>,
}

/// A JSON object as a map, refusing a key given twice (serde_json keeps the last one silently).
fn unique_keys<'de, D, V>(d: D) -> std::result::Result<BTreeMap<String, V>, D::Error>
where
    D: serde::Deserializer<'de>,
    V: Deserialize<'de>,
{
    struct Unique<V>(std::marker::PhantomData<V>);
    impl<'de, V: Deserialize<'de>> serde::de::Visitor<'de> for Unique<V> {
        type Value = BTreeMap<String, V>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut m: A,
        ) -> std::result::Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some((k, v)) = m.next_entry::<String, V>()? {
                if out.contains_key(&k) {
                    return Err(serde::de::Error::custom(format!("duplicate key `{k}`")));
                }
                out.insert(k, v);
            }
            Ok(out)
        }
    }
    d.deserialize_map(Unique(std::marker::PhantomData))
}

/// The measured local error of one stage kind.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KindFloor {
    /// Rows (positions × layers × goldens × SIMD settings with their own results) measured.
    pub rows: usize,
    /// Median local NMSE.
    pub nmse_median: f64,
    /// 99th percentile of the local NMSE (nearest rank).
    pub nmse_p99: f64,
    /// Largest local NMSE.
    pub nmse_max: f64,
    /// Stage ids of this kind where every row with an exact injected input was exact at storage precision.
    pub exact_at: Vec<String>,
    /// The largest local NMSE over the *clean* rows only: stored in f32 by the golden, with the oracle's
    /// exact value injected as the layer's input — so neither the golden's f16 storage nor an f16-rounded
    /// input is part of it. A clean row is held to this ([`FloorSet::floor_nmse`] with
    /// [`FloorStatistic::Max`]); `None` where no clean row was measured (and in files of older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nmse_max_clean: Option<f64>,
}

/// Which statistic of a stage kind's measured local NMSE its floor is `stage_floor_headroom` times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloorStatistic {
    /// The 99th percentile: where the rows above it can be explained otherwise — reference mode against
    /// llama.cpp, whose rows above the floor bisect reads against ggml mode (oracle-side rounding).
    P99,
    /// The largest measured row: where nothing can explain a row above the floor — every other (oracle,
    /// mode), e.g. both modes against transformers, whose float32 arithmetic ggml mode does not reproduce. A floor
    /// below the unbroken engine's own largest row would call that engine's rounding a bug.
    Max,
}

impl FloorStatistic {
    /// `p99` or `max`, as the floor's description names it.
    pub fn name(self) -> &'static str {
        match self {
            FloorStatistic::P99 => "p99",
            FloorStatistic::Max => "max",
        }
    }
}

impl KindFloor {
    /// The measured NMSE a row's floor is a multiple of: the 99th percentile ([`FloorStatistic::P99`]), or
    /// the largest row ([`FloorStatistic::Max`]) — of the clean rows ([`KindFloor::nmse_max_clean`]) when the
    /// row is `clean` and clean rows were measured: a golden's f16 storage must not set the floor of the
    /// rows of another golden that stores the stage in f32.
    pub fn statistic(&self, s: FloorStatistic, clean: bool) -> f64 {
        match (s, clean, self.nmse_max_clean) {
            (FloorStatistic::P99, ..) => self.nmse_p99,
            (FloorStatistic::Max, true, Some(m)) => m,
            (FloorStatistic::Max, ..) => self.nmse_max,
        }
    }
}

/// The kind part of a canonical stage id (`attn_norm` of `blk.3.attn_norm`; a global id is its own kind).
///
/// Read through the engine's parser ([`lockstep_engine::Stage::parse`]); a name that is not a canonical id
/// is its own kind (and so has no measured floor).
pub fn kind_of(stage: &str) -> &str {
    lockstep_engine::Stage::parse(stage).map_or(stage, |s| s.kind.suffix())
}

/// Where in a floors file that does not deserialize the fault is, when it is in a set: `set N
/// (model/oracle/mode)[, kind `k`][, field `f`]: <serde's message>`, for an error message that names the
/// set and field rather than only a line and column. `None` when the text is not JSON or the fault is
/// elsewhere.
fn locate(text: &str) -> Option<String> {
    use serde_json::Value;
    let v: Value = serde_json::from_str(text).ok()?;
    for (i, s) in v.get("sets")?.as_array()?.iter().enumerate() {
        let name = |f: &str| s.get(f).and_then(Value::as_str).unwrap_or("?").to_string();
        let at = format!(
            "set {} ({}/{}/{})",
            i + 1,
            name("model"),
            name("oracle"),
            name("mode")
        );
        for (k, kv) in s
            .get("kinds")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            for (field, fv) in kv.as_object().into_iter().flatten() {
                let r = match field.as_str() {
                    "rows" => usize::deserialize(fv).map(drop),
                    "nmse_median" | "nmse_p99" | "nmse_max" => f64::deserialize(fv).map(drop),
                    "nmse_max_clean" => Option::<f64>::deserialize(fv).map(drop),
                    "exact_at" => Vec::<String>::deserialize(fv).map(drop),
                    _ => continue,
                };
                if let Err(e) = r {
                    return Some(format!("{at}, kind `{k}`, field `{field}`: {e}"));
                }
            }
            if let Err(e) = KindFloor::deserialize(kv) {
                return Some(format!("{at}, kind `{k}`: {e}"));
            }
        }
        if let Err(e) = FloorSet::deserialize(s) {
            return Some(format!("{at}: {e}"));
        }
    }
    None
}

impl Floors {
    /// Read and check `path` ([`Floors::parse`]).
    ///
    /// Errors: missing or unreadable file, and every error of [`Floors::parse`] — naming the file.
    pub fn load(path: &Path) -> Result<Floors> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the floors file {}", path.display()))?;
        Floors::parse(&text, path)
    }

    /// Parse and check the text of a floors file; `origin` names it in errors. Pure: no I/O.
    ///
    /// Errors (each naming `origin`, and the set, kind and field where there is one): bad JSON, an
    /// unknown or duplicated key at any level, another schema version, and every fault [`Floors::check`]
    /// finds.
    pub fn parse(text: &str, origin: &Path) -> Result<Floors> {
        let f: Floors = serde_json::from_str(text).map_err(|e| match locate(text) {
            Some(at) => anyhow::anyhow!("{}: {at} ({e})", origin.display()),
            None => anyhow::Error::new(e)
                .context(format!("parsing the floors file {}", origin.display())),
        })?;
        if f.schema_version != FLOORS_SCHEMA_VERSION {
            bail!(
                "{}: schema_version {} (this lockstep reads {FLOORS_SCHEMA_VERSION}); rerun `lockstep floors`",
                origin.display(),
                f.schema_version
            );
        }
        f.check(origin)?;
        Ok(f)
    }

    /// Check every field of the floors, so that no value can switch a floor off:
    ///
    /// - at least one set; no two sets for the same (model, oracle, mode); model and oracle non-empty
    ///   and free of `/` and whitespace, mode a numerics mode (`reference`, `ggml`);
    /// - at least one golden per set, each `<model>/<oracle>/<prompt>.npz` of that set with no `..`, and
    ///   its sha256 64 lowercase hex digits;
    /// - each kind a per-stage kind of the engine ([`lockstep_engine::StageKind`], not `logits`);
    ///   `rows` ≥ 1; `nmse_median` and `nmse_p99` finite in [0, 1) (a floor of NMSE 1 would pass an
    ///   all-zero output); `nmse_max` finite; `nmse_median` ≤ `nmse_p99` ≤ `nmse_max`;
    /// - each `exact_at` entry a canonical stage id of that kind, listed once.
    ///
    /// Errors name `origin`, the set (index and model/oracle/mode), the kind and the field.
    pub fn check(&self, origin: &Path) -> Result<()> {
        let file = origin.display();
        if self.sets.is_empty() {
            bail!("{file}: `sets` is empty; rerun `lockstep floors`");
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, s) in self.sets.iter().enumerate() {
            let at = format!(
                "{file}: set {} ({}/{}/{})",
                i + 1,
                s.model,
                s.oracle,
                s.mode
            );
            for (name, v) in [("model", &s.model), ("oracle", &s.oracle)] {
                if v.is_empty()
                    || v.contains('/')
                    || v.chars().any(char::is_whitespace)
                    || v == "."
                    || v == ".."
                {
                    bail!("{at}: `{name}` {v:?} is not an id (empty, or holds `/` or whitespace)");
                }
            }
            if s.mode.parse::<lockstep_engine::NumericsMode>().is_err() {
                bail!(
                    "{at}: `mode` {:?} is not a numerics mode (reference, ggml)",
                    s.mode
                );
            }
            if !seen.insert((&s.model, &s.oracle, &s.mode)) {
                bail!(
                    "{at}: a second set for {}/{}/{}; each (model, oracle, mode) is measured once",
                    s.model,
                    s.oracle,
                    s.mode
                );
            }
            if s.goldens.is_empty() {
                bail!("{at}: `goldens` is empty: the floors were measured on nothing");
            }
            let prefix = format!("{}/{}/", s.model, s.oracle);
            for (g, sha) in &s.goldens {
                let prompt = g
                    .strip_prefix(&prefix)
                    .and_then(|r| r.strip_suffix(".npz"))
                    .unwrap_or("");
                if prompt.is_empty() || prompt.contains('/') || prompt.starts_with('.') {
                    bail!("{at}: golden {g:?} is not a golden of this set ({prefix}<prompt>.npz)");
                }
                if sha.len() != 64 || !sha.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
                    bail!("{at}: golden {g}: sha256 {sha:?} is not 64 lowercase hex digits");
                }
            }
            for (k, v) in &s.kinds {
                let kind = lockstep_engine::StageKind::ALL
                    .into_iter()
                    .find(|sk| sk.suffix() == k && *sk != lockstep_engine::StageKind::Logits);
                let Some(kind) = kind else {
                    bail!("{at}: kind `{k}` is not a stage kind of the engine");
                };
                let at = format!("{at}, kind `{k}`");
                if v.rows == 0 {
                    bail!("{at}: rows = 0: no row was measured, so there is no floor");
                }
                for (name, x) in [("nmse_median", v.nmse_median), ("nmse_p99", v.nmse_p99)] {
                    if !(x.is_finite() && (0.0..1.0).contains(&x)) {
                        let why = if x >= 1.0 {
                            " (an NMSE floor of 1 or more passes any output, even all zeros)"
                        } else {
                            ""
                        };
                        bail!("{at}: {name} = {x:?} is outside [0, 1){why}");
                    }
                }
                if !v.nmse_max.is_finite() {
                    bail!("{at}: nmse_max = {:?} is not finite", v.nmse_max);
                }
                if let Some(c) = v.nmse_max_clean {
                    if !(c.is_finite() && (0.0..1.0).contains(&c) && c <= v.nmse_max) {
                        bail!(
                            "{at}: nmse_max_clean = {c:?} is not in [0, 1) and at most nmse_max {:?}",
                            v.nmse_max
                        );
                    }
                }
                if !(v.nmse_median <= v.nmse_p99 && v.nmse_p99 <= v.nmse_max) {
                    bail!(
                        "{at}: nmse_median {:?} ≤ nmse_p99 {:?} ≤ nmse_max {:?} does not hold",
                        v.nmse_median,
                        v.nmse_p99,
                        v.nmse_max
                    );
                }
                let mut listed = std::collections::BTreeSet::new();
                for id in &v.exact_at {
                    let ok = lockstep_engine::Stage::parse(id)
                        .is_some_and(|st| st.kind == kind && st.to_string() == *id);
                    if !ok {
                        bail!("{at}: exact_at {id:?} is not a stage id of kind `{k}`");
                    }
                    if !listed.insert(id) {
                        bail!("{at}: exact_at lists {id} twice");
                    }
                }
            }
        }
        Ok(())
    }

    /// The set measured for (model, oracle, mode) on a golden with this manifest path and sha256.
    ///
    /// Errors: no set, or the golden is not among the measured ones or has changed since — the floors
    /// are stale and `lockstep floors` must be rerun.
    pub fn for_golden(
        &self,
        origin: &Path,
        model: &str,
        oracle: &str,
        mode: &str,
        golden_path: &str,
        golden_sha: &str,
    ) -> Result<&FloorSet> {
        let set = self
            .sets
            .iter()
            .find(|s| s.model == model && s.oracle == oracle && s.mode == mode)
            .with_context(|| {
                format!(
                    "{}: no measured floors for {model}/{oracle} in {mode} mode; run `lockstep floors`",
                    origin.display()
                )
            })?;
        match set.goldens.get(golden_path) {
            Some(sha) if sha == golden_sha => Ok(set),
            Some(_) => bail!(
                "{}: the floors of {model}/{oracle}/{mode} were measured on another version of {golden_path}; \
                 rerun `lockstep floors`",
                origin.display()
            ),
            None => bail!(
                "{}: the floors of {model}/{oracle}/{mode} were not measured on {golden_path}; rerun `lockstep floors`",
                origin.display()
            ),
        }
    }
}

impl FloorSet {
    /// The floor of a stage's kind.
    ///
    /// Errors: a kind never measured (a golden storing a stage no measured golden stored).
    pub fn kind(&self, stage: &str) -> Result<&KindFloor> {
        let k = kind_of(stage);
        self.kinds.get(k).with_context(|| {
            format!(
                "no measured floor for stage kind `{k}` of {}/{}/{} (stage {stage}); rerun `lockstep floors`",
                self.model, self.oracle, self.mode
            )
        })
    }

    /// True where the floor of `stage` is bit equality (given an exact input).
    pub fn exact_at(&self, stage: &str) -> bool {
        self.kinds
            .get(kind_of(stage))
            .is_some_and(|k| k.exact_at.iter().any(|s| s == stage))
    }
}

/// Accumulates local passes into a [`FloorSet`].
#[derive(Default)]
pub struct FloorBuilder {
    nmse: BTreeMap<String, Vec<f64>>,
    /// kind → the largest NMSE of a clean row (f32 storage, exact injected input)
    clean_max: BTreeMap<String, f64>,
    /// stage id → (all rows with exact input were exact, rows with exact input seen)
    exact: BTreeMap<String, (bool, usize)>,
}

impl FloorBuilder {
    /// Add one local pass; `input_exact(stage, row)` tells whether that row's injected input was the oracle's
    /// exact value.
    pub fn add(
        &mut self,
        local: &CellComparison,
        input_exact: &dyn Fn(&StageComparison, usize) -> bool,
    ) {
        for s in &local.stages {
            let kind = kind_of(&s.stage).to_string();
            self.nmse
                .entry(kind)
                .or_default()
                .extend(s.nmse_by_position.iter().copied());
            if s.storage == Some(crate::npz::Dtype::F32) {
                for (row, &nmse) in s.nmse_by_position.iter().enumerate() {
                    if input_exact(s, row) {
                        let m = self
                            .clean_max
                            .entry(kind_of(&s.stage).to_string())
                            .or_insert(0.0);
                        // a NaN row is the largest of all
                        *m = if nmse.is_nan() { f64::NAN } else { m.max(nmse) };
                    }
                }
            }
            for (row, &ex) in s.exact_at_storage_by_position.iter().enumerate() {
                if input_exact(s, row) {
                    let e = self.exact.entry(s.stage.clone()).or_insert((true, 0));
                    e.0 &= ex;
                    e.1 += 1;
                }
            }
        }
    }

    /// The floors measured.
    pub fn finish(
        self,
        model: &str,
        oracle: &str,
        mode: &str,
        goldens: BTreeMap<String, String>,
    ) -> FloorSet {
        let mut kinds = BTreeMap::new();
        for (kind, mut v) in self.nmse {
            v.sort_by(f64::total_cmp);
            let rank = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
            let exact_at = self
                .exact
                .iter()
                .filter(|(id, (all, n))| kind_of(id) == kind && *all && *n > 0)
                .map(|(id, _)| id.clone())
                .collect();
            let nmse_max_clean = self.clean_max.get(&kind).copied();
            kinds.insert(
                kind,
                KindFloor {
                    rows: v.len(),
                    nmse_median: rank(0.5),
                    nmse_p99: rank(0.99),
                    nmse_max: v[v.len() - 1],
                    nmse_max_clean,
                    exact_at,
                },
            );
        }
        FloorSet {
            model: model.into(),
            oracle: oracle.into(),
            mode: mode.into(),
            goldens,
            kinds,
        }
    }
}

/// Write `floors` to `path` atomically ([`crate::output::write_atomic`]: a temporary file beside it, then
/// a rename), after [`Floors::check`] — a file `lockstep floors` writes always loads.
///
/// Errors: the floors fail their check; `path` is a symlink, a device or a directory; the directory is
/// not writable; the disk is full. An existing file is left as it was on every error.
pub fn write(path: &Path, floors: &Floors) -> Result<()> {
    floors.check(path)?;
    let text = serde_json::to_string_pretty(floors)? + "\n";
    crate::output::write_atomic(path, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_of_strips_the_block() {
        assert_eq!(kind_of("blk.12.attn_norm"), "attn_norm");
        assert_eq!(kind_of("output_norm"), "output_norm");
        assert_eq!(kind_of("embed"), "embed");
    }

    fn stage(id: &str, nmse: Vec<f64>, exact: Vec<bool>) -> StageComparison {
        let n = nmse.len();
        let mut s = crate::compare::compare_stage(
            id,
            crate::compare::Phase::Prefill,
            &ndarray::Array2::zeros((n, 2)),
            &ndarray::Array2::zeros((n, 2)),
            "g.npz",
        )
        .unwrap();
        s.nmse_by_position = nmse;
        s.exact_at_storage_by_position = exact;
        s
    }

    #[test]
    fn the_floor_is_the_nearest_rank_p99_and_exactness_needs_an_exact_input() {
        let mut b = FloorBuilder::default();
        // 200 rows of blk.N.q: 1..=200 × 1e-6; the 99th percentile by nearest rank is row 198
        let nmse: Vec<f64> = (1..=200).map(|i| f64::from(i) * 1e-6).collect();
        let cmp = CellComparison {
            golden_tokens: vec![],
            engine_tokens: vec![],
            stages: vec![
                stage("blk.0.q", nmse[..100].to_vec(), vec![false; 100]),
                stage("blk.1.q", nmse[100..].to_vec(), vec![false; 100]),
                stage("blk.0.attn_norm", vec![1e-8; 3], vec![true; 3]),
                // exact where its input was exact (rows 0, 1); row 2's input was not
                stage("blk.1.attn_norm", vec![1e-8; 3], vec![true, true, false]),
            ],
            not_compared: vec![],
            logits: vec![],
        };
        b.add(&cmp, &|s, row| !(s.stage == "blk.1.attn_norm" && row == 2));
        let set = b.finish("m", "o", "reference", BTreeMap::new());
        let q = &set.kinds["q"];
        assert_eq!(q.rows, 200);
        assert!((q.nmse_p99 - 198e-6).abs() < 1e-12, "{}", q.nmse_p99);
        assert!((q.nmse_max - 200e-6).abs() < 1e-12);
        assert!(q.exact_at.is_empty());
        assert_eq!(
            set.kinds["attn_norm"].exact_at,
            ["blk.0.attn_norm", "blk.1.attn_norm"]
        );
        assert!(set.exact_at("blk.1.attn_norm") && !set.exact_at("blk.1.q"));

        // one inexact row with an exact input takes the stage off the list
        let mut b = FloorBuilder::default();
        let cmp = CellComparison {
            stages: vec![stage("blk.0.attn_norm", vec![1e-8; 2], vec![true, false])],
            ..cmp
        };
        b.add(&cmp, &|_, _| true);
        assert!(
            b.finish("m", "o", "reference", BTreeMap::new()).kinds["attn_norm"]
                .exact_at
                .is_empty()
        );
    }

    /// Issue 42: the clean rows (f32 storage, exact injected input) have a floor of their own, so that one
    /// golden's f16 storage does not set the floor of another's f32 rows.
    #[test]
    fn clean_rows_have_their_own_maximum() {
        let with = |id: &str, nmse: Vec<f64>, storage| {
            let mut s = stage(id, nmse, vec![false; 2]);
            s.storage = Some(storage);
            s
        };
        let cmp = CellComparison {
            golden_tokens: vec![],
            engine_tokens: vec![],
            stages: vec![
                with("blk.0.out", vec![1e-13, 3e-13], crate::npz::Dtype::F32),
                // f32, but row 1's input was f16-rounded: not clean
                with("blk.1.out", vec![2e-13, 5e-9], crate::npz::Dtype::F32),
                with("blk.2.out", vec![4e-7, 1e-7], crate::npz::Dtype::F16),
            ],
            not_compared: vec![],
            logits: vec![],
        };
        let mut b = FloorBuilder::default();
        b.add(&cmp, &|s, row| !(s.stage == "blk.1.out" && row == 1));
        let out = &b.finish("m", "o", "ggml", BTreeMap::new()).kinds["out"];
        assert_eq!(out.nmse_max, 4e-7);
        assert_eq!(out.nmse_max_clean, Some(3e-13));
        assert_eq!(out.statistic(FloorStatistic::Max, true), 3e-13);
        assert_eq!(out.statistic(FloorStatistic::Max, false), 4e-7);
        assert_eq!(out.statistic(FloorStatistic::P99, true), out.nmse_p99);
        // no clean row measured: the largest of all
        let mut b = FloorBuilder::default();
        b.add(&cmp, &|_, _| false);
        let out = &b.finish("m", "o", "ggml", BTreeMap::new()).kinds["out"];
        assert_eq!(
            (out.nmse_max_clean, out.statistic(FloorStatistic::Max, true)),
            (None, 4e-7)
        );
    }

    /// A valid floors file: one set, one golden, kinds `attn_norm` and `out`.
    fn valid() -> serde_json::Value {
        serde_json::json!({
            "schema_version": 1,
            "made_by": "test",
            "sets": [{
                "model": "m",
                "oracle": "llama.cpp-f32kv",
                "mode": "reference",
                "goldens": {"m/llama.cpp-f32kv/prose.npz": "ab".repeat(32)},
                "kinds": {
                    "attn_norm": {"rows": 20, "nmse_median": 1e-8, "nmse_p99": 2e-7, "nmse_max": 3e-7,
                                  "exact_at": ["blk.0.attn_norm"]},
                    "out": {"rows": 20, "nmse_median": 1e-5, "nmse_p99": 1e-4, "nmse_max": 2e-4,
                            "exact_at": []}
                }
            }]
        })
    }

    /// The error of parsing `v` as `floors.json`.
    fn refused(v: &serde_json::Value) -> String {
        let e = Floors::parse(&v.to_string(), Path::new("ci/floors.json"))
            .expect_err(&format!("accepted {v}"));
        format!("{e:#}")
    }

    #[test]
    fn every_number_and_key_of_a_floors_file_is_checked() {
        let f = Floors::parse(&valid().to_string(), Path::new("f.json")).unwrap();
        assert_eq!(f.sets[0].kinds["out"].rows, 20);
        let set = "ci/floors.json: set 1 (m/llama.cpp-f32kv/reference)";
        fn kind(v: &mut serde_json::Value) -> &mut serde_json::Value {
            &mut v["sets"][0]["kinds"]["out"]
        }
        // (mutation, what the error must say)
        type Mutation = Box<dyn Fn(&mut serde_json::Value)>;
        let cases: Vec<(Mutation, Vec<&str>)> = vec![
            (
                Box::new(|v| kind(v)["nmse_p99"] = 1e308.into()),
                vec![set, "kind `out`", "nmse_p99 = 1e308"],
            ),
            (
                Box::new(|v| kind(v)["nmse_p99"] = 1.0.into()),
                vec![set, "nmse_p99 = 1.0 is outside [0, 1)"],
            ),
            (
                Box::new(|v| kind(v)["nmse_median"] = (-1e-5).into()),
                vec![set, "nmse_median = -1e-5"],
            ),
            (
                Box::new(|v| kind(v)["nmse_max"] = 1e-6.into()),
                vec![set, "kind `out`", "nmse_p99 0.0001 ≤ nmse_max 1e-6"],
            ),
            (
                Box::new(|v| kind(v)["nmse_median"] = 5e-4.into()),
                vec![set, "nmse_median 0.0005 ≤ nmse_p99"],
            ),
            (
                Box::new(|v| kind(v)["rows"] = 0.into()),
                vec![set, "kind `out`", "rows = 0"],
            ),
            (
                Box::new(|v| kind(v)["rows"] = (-3).into()),
                vec![set, "kind `out`, field `rows`", "-3"],
            ),
            (
                Box::new(|v| kind(v)["rows"] = 2.5.into()),
                vec![set, "kind `out`, field `rows`", "2.5"],
            ),
            (
                Box::new(|v| kind(v)["nmse_p99"] = "nan".into()),
                vec![set, "kind `out`, field `nmse_p99`", "invalid type"],
            ),
            (
                Box::new(|v| kind(v)["extra"] = 1.into()),
                vec![set, "kind `out`", "unknown field `extra`"],
            ),
            (
                Box::new(|v| v["sets"][0]["kinds"]["qq"] = v["sets"][0]["kinds"]["out"].clone()),
                vec![set, "kind `qq` is not a stage kind"],
            ),
            (
                Box::new(|v| {
                    v["sets"][0]["kinds"]["logits"] = v["sets"][0]["kinds"]["out"].clone()
                }),
                vec![set, "kind `logits`"],
            ),
            (
                Box::new(|v| kind(v)["exact_at"] = serde_json::json!(["blk.0.attn_norm"])),
                vec![
                    set,
                    "exact_at \"blk.0.attn_norm\" is not a stage id of kind `out`",
                ],
            ),
            (
                Box::new(|v| kind(v)["exact_at"] = serde_json::json!(["blk.01.out"])),
                vec![set, "blk.01.out"],
            ),
            (
                Box::new(|v| kind(v)["exact_at"] = serde_json::json!(["blk.1.out", "blk.1.out"])),
                vec![set, "lists blk.1.out twice"],
            ),
            (
                Box::new(|v| v["sets"][0]["mode"] = "refrence".into()),
                vec![
                    "ci/floors.json: set 1",
                    "`mode` \"refrence\" is not a numerics mode",
                ],
            ),
            (
                Box::new(|v| v["sets"][0]["model"] = "".into()),
                vec!["ci/floors.json: set 1", "`model` \"\""],
            ),
            (
                Box::new(|v| v["sets"][0]["goldens"] = serde_json::json!({})),
                vec![set, "`goldens` is empty"],
            ),
            (
                Box::new(|v| {
                    v["sets"][0]["goldens"] =
                        serde_json::json!({"x/llama.cpp-f32kv/prose.npz": "ab".repeat(32)})
                }),
                vec![
                    set,
                    "golden \"x/llama.cpp-f32kv/prose.npz\" is not a golden of this set",
                ],
            ),
            (
                Box::new(|v| {
                    v["sets"][0]["goldens"] =
                        serde_json::json!({"m/llama.cpp-f32kv/../p.npz": "ab".repeat(32)})
                }),
                vec![set, "is not a golden of this set"],
            ),
            (
                Box::new(|v| {
                    v["sets"][0]["goldens"] =
                        serde_json::json!({"m/llama.cpp-f32kv/prose.npz": "AB".repeat(32)})
                }),
                vec![set, "sha256"],
            ),
            (
                Box::new(|v| {
                    let s = v["sets"][0].clone();
                    v["sets"].as_array_mut().unwrap().push(s);
                }),
                vec![
                    "ci/floors.json: set 2 (m/llama.cpp-f32kv/reference)",
                    "a second set",
                ],
            ),
            (
                Box::new(|v| v["sets"] = serde_json::json!([])),
                vec!["ci/floors.json", "`sets` is empty"],
            ),
            (
                Box::new(|v| v["schema_version"] = 2.into()),
                vec!["ci/floors.json", "schema_version 2"],
            ),
            (
                Box::new(|v| v["unknown"] = 2.into()),
                vec!["ci/floors.json", "unknown field `unknown`"],
            ),
        ];
        for (mutate, needles) in cases {
            let mut v = valid();
            mutate(&mut v);
            let e = refused(&v);
            for n in needles {
                assert!(e.contains(n), "{v}\n→ {e}\n(no {n:?})");
            }
        }
    }

    #[test]
    fn a_key_given_twice_is_refused_not_overwritten() {
        let text = valid().to_string();
        // the same kind twice: serde_json would keep the second silently
        let kinds_at = text.find("\"kinds\":{").unwrap() + "\"kinds\":{".len();
        let dup = format!(
            "{}\"out\":{{\"rows\":1,\"nmse_median\":0.9,\"nmse_p99\":0.9,\"nmse_max\":0.9,\"exact_at\":[]}},{}",
            &text[..kinds_at],
            &text[kinds_at..]
        );
        let e = format!(
            "{:#}",
            Floors::parse(&dup, Path::new("ci/floors.json")).unwrap_err()
        );
        assert!(
            e.contains("ci/floors.json") && e.contains("duplicate key `out`"),
            "{e}"
        );
        let goldens_at = text.find("\"goldens\":{").unwrap() + "\"goldens\":{".len();
        let dup = format!(
            "{}\"m/llama.cpp-f32kv/prose.npz\":\"{}\",{}",
            &text[..goldens_at],
            "cd".repeat(32),
            &text[goldens_at..]
        );
        let e = format!(
            "{:#}",
            Floors::parse(&dup, Path::new("ci/floors.json")).unwrap_err()
        );
        assert!(
            e.contains("duplicate key `m/llama.cpp-f32kv/prose.npz`"),
            "{e}"
        );
    }

    #[test]
    fn write_refuses_what_load_would_refuse_and_leaves_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("floors.json");
        std::fs::write(&p, "old").unwrap();
        let mut f = Floors::parse(&valid().to_string(), &p).unwrap();
        f.sets[0].kinds.get_mut("out").unwrap().nmse_p99 = f64::NAN;
        let e = write(&p, &f).unwrap_err();
        assert!(format!("{e:#}").contains("nmse_p99 = NaN"), "{e:#}");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "old");
        f.sets[0].kinds.get_mut("out").unwrap().nmse_p99 = 1e-4;
        write(&p, &f).unwrap();
        assert_eq!(Floors::load(&p).unwrap(), f);
    }

    #[test]
    fn the_committed_floors_file_passes_its_checks() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ci/floors.json");
        Floors::load(&p).unwrap_or_else(|e| panic!("{e:#}"));
    }

    #[test]
    fn stale_or_missing_floors_are_errors() {
        let mut goldens = BTreeMap::new();
        goldens.insert("m/o/p.npz".to_string(), "aa".to_string());
        let f = Floors {
            schema_version: FLOORS_SCHEMA_VERSION,
            made_by: String::new(),
            sets: vec![FloorSet {
                model: "m".into(),
                oracle: "o".into(),
                mode: "reference".into(),
                goldens,
                kinds: BTreeMap::new(),
            }],
        };
        let p = Path::new("floors.json");
        assert!(f
            .for_golden(p, "m", "o", "reference", "m/o/p.npz", "aa")
            .is_ok());
        let e = f
            .for_golden(p, "m", "o", "reference", "m/o/p.npz", "bb")
            .unwrap_err();
        assert!(format!("{e:#}").contains("another version"), "{e:#}");
        let e = f
            .for_golden(p, "m", "o", "reference", "m/o/q.npz", "aa")
            .unwrap_err();
        assert!(format!("{e:#}").contains("not measured on"), "{e:#}");
        let e = f
            .for_golden(p, "x", "o", "reference", "m/o/p.npz", "aa")
            .unwrap_err();
        assert!(format!("{e:#}").contains("no measured floors"), "{e:#}");
        let e = f.sets[0].kind("blk.0.q").unwrap_err();
        assert!(format!("{e:#}").contains("kind `q`"), "{e:#}");
    }
}
