//! Measured stage floors of a numerics mode that does not reproduce the oracle bit for bit (`reference`):
//! how far each stage kind's *local* error (bisect's injected pass: each layer computing from the golden's
//! own input, [`crate::bisect`]) reaches on the unbroken engine, so that bisect and the gate can tell a bug
//! from the rounding the two computations differ by.
//!
//! `lockstep floors` measures them on every golden of the matrix for the mode and writes `ci/floors.json`;
//! `lockstep run` and `lockstep bisect` read it. Per (model, oracle, mode) and stage kind it records:
//!
//! - `nmse_p99`, the 99th percentile of the local NMSE over every stored row (prompt positions and decode
//!   steps, every layer, every golden of the model): the floor is `stage_floor_headroom` (thresholds) times
//!   it. The percentile rather than the maximum: the maximum is set by a few rows where llama.cpp's own 8-bit
//!   activation rounding (Q8_1, Q8_K) of an extreme input moves its result far from f32 — rows bisect
//!   classifies as oracle-side rounding by checking them against ggml mode, which reproduces that rounding.
//! - `exact_at`: the stages (e.g. `blk.0.attn_norm`, `embed`) where every row equalled the golden at the
//!   golden's storage precision whenever the injected input was the oracle's exact value — computations
//!   both sides do identically (norms, lookups). There the floor is bit equality, as in ggml mode: a wrong
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
    pub goldens: BTreeMap<String, String>,
    /// Per stage kind (`attn_norm`, `q`, ..., `embed`, `output_norm`).
    pub kinds: BTreeMap<String, KindFloor>,
}

/// The measured local error of one stage kind.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KindFloor {
    /// Rows (positions × layers × goldens) measured.
    pub rows: usize,
    /// Median local NMSE.
    pub nmse_median: f64,
    /// 99th percentile of the local NMSE (nearest rank).
    pub nmse_p99: f64,
    /// Largest local NMSE.
    pub nmse_max: f64,
    /// Stage ids of this kind where every row with an exact injected input was exact at storage precision.
    pub exact_at: Vec<String>,
}

/// The kind part of a canonical stage id (`attn_norm` of `blk.3.attn_norm`; a global id is its own kind).
pub fn kind_of(stage: &str) -> &str {
    match stage.strip_prefix("blk.") {
        Some(rest) => rest.split_once('.').map_or(rest, |(_, k)| k),
        None => stage,
    }
}

impl Floors {
    /// Read `path`.
    ///
    /// Errors: missing file, bad JSON, another schema version — naming the file.
    pub fn load(path: &Path) -> Result<Floors> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the floors file {}", path.display()))?;
        let f: Floors = serde_json::from_str(&text)
            .with_context(|| format!("parsing the floors file {}", path.display()))?;
        if f.schema_version != FLOORS_SCHEMA_VERSION {
            bail!(
                "{}: schema_version {} (this lockstep reads {FLOORS_SCHEMA_VERSION}); rerun `lockstep floors`",
                path.display(),
                f.schema_version
            );
        }
        for s in &f.sets {
            for (k, v) in &s.kinds {
                if !(v.nmse_p99.is_finite() && v.nmse_p99 >= 0.0) {
                    bail!(
                        "{}: {}/{}/{} kind `{k}` has nmse_p99 {}",
                        path.display(),
                        s.model,
                        s.oracle,
                        s.mode,
                        v.nmse_p99
                    );
                }
            }
        }
        Ok(f)
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
            kinds.insert(
                kind,
                KindFloor {
                    rows: v.len(),
                    nmse_median: rank(0.5),
                    nmse_p99: rank(0.99),
                    nmse_max: v[v.len() - 1],
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

/// Write `floors` to `path` atomically (a temporary file beside it, then a rename).
///
/// Errors: the directory is not writable.
pub fn write(path: &Path, floors: &Floors) -> Result<()> {
    let text = serde_json::to_string_pretty(floors)? + "\n";
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("cannot create a file in {}", dir.display()))?;
    std::io::Write::write_all(&mut tmp, text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )?;
    tmp.persist(path)
        .with_context(|| format!("cannot move the floors into place at {}", path.display()))?;
    Ok(())
}

/// What `lockstep floors` measures.
#[derive(Clone, Debug)]
pub struct MeasureOptions {
    /// The golden directory.
    pub golden_dir: std::path::PathBuf,
    /// The matrix whose cells are measured.
    pub matrix: std::path::PathBuf,
    /// The thresholds: a cell is measured when its thresholds ask for measured floors.
    pub thresholds: std::path::PathBuf,
    /// Narrowing of the matrix (by model, mode, oracle; prompts are always all of the model's goldens).
    pub filters: crate::matrix::Filters,
}

/// Measure the floors of every (model, oracle, mode) of the matrix whose thresholds set
/// `stage_floor_headroom`: bisect's local pass of our engine on every golden of it.
///
/// Errors: as `lockstep bisect` (missing model, stale golden, ...); no cell asking for floors.
pub fn measure(opts: &MeasureOptions, progress: &mut dyn FnMut(&str)) -> Result<Floors> {
    use crate::bisect::{input_known, Case};
    use crate::engine::LockstepEngine;

    let manifest = crate::golden::load_manifest(&opts.golden_dir)?;
    let matrix = crate::matrix::Matrix::load(&opts.matrix)?;
    let thresholds = crate::gate::Thresholds::load(&opts.thresholds)?;
    let cells = matrix.expand(&manifest, &opts.filters)?;
    let mut groups: BTreeMap<(String, String, String), Vec<crate::matrix::Cell>> = BTreeMap::new();
    for c in cells {
        let th = thresholds.for_cell(&c)?;
        if th.stage_exact || th.stage_floor_headroom.is_none() {
            continue;
        }
        groups
            .entry((c.model.clone(), c.oracle.clone(), c.mode.clone()))
            .or_default()
            .push(c);
    }
    if groups.is_empty() {
        bail!(
            "no cell of {} has thresholds asking for measured floors (stage_floor_headroom)",
            opts.matrix.display()
        );
    }
    let mut sets = Vec::new();
    for ((model, oracle, mode), cells) in groups {
        let path = crate::fetch::resolve_model(&model)?;
        let sha = crate::hash::sha256_file(&path)?;
        let mut engine = LockstepEngine::load(&path)?;
        let m: lockstep_engine::NumericsMode =
            mode.parse().map_err(|e: String| anyhow::anyhow!(e))?;
        let mut builder = FloorBuilder::default();
        let mut goldens = BTreeMap::new();
        for c in &cells {
            let gpath = crate::matrix::golden_path_for(c);
            progress(&gpath);
            let entry = manifest.entry(&opts.golden_dir, &gpath)?.clone();
            crate::golden::verify_golden(&opts.golden_dir, &entry)?;
            crate::golden::check_model(&opts.golden_dir, &entry, &sha)?;
            let mut gf = crate::golden::GoldenFile::open(&opts.golden_dir, &entry)?;
            let case = Case::new(
                &mut gf,
                &mut engine,
                manifest.stage_map(&entry.oracle.name, &entry.arch),
                None,
            )?;
            goldens.insert(entry.path.clone(), entry.sha256.clone());
            if !case.bisectable() {
                // no layer output to inject: no local pass, so nothing to measure and nothing to hold to it
                continue;
            }
            let acc = case.accumulated(&mut gf, &mut engine, m)?;
            let (local, known) = case.local(&mut gf, &mut engine, m, &acc)?;
            let cmp = local
                .cmp
                .as_ref()
                .with_context(|| format!("{gpath}: the local pass was not compared"))?;
            if acc.cmp.is_none() || !local.is_finite() {
                bail!("{gpath}: the unbroken engine produced a NaN or ±Inf in {mode} mode; no floor can be measured");
            }
            builder.add(cmp, &|s, row| input_known(&known, s.phase, &s.stage, row));
        }
        sets.push(builder.finish(&model, &oracle, &mode, goldens));
    }
    Ok(Floors {
        schema_version: FLOORS_SCHEMA_VERSION,
        made_by:
            "lockstep floors (bisect's local pass of the unbroken engine on every golden listed)"
                .into(),
        sets,
    })
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
