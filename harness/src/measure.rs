//! `lockstep floors`: measuring the stage floors ([`crate::floors`]) of every (model, oracle, mode) whose
//! thresholds ask for them — bisect's local pass ([`crate::judge::Case::local`]) of the unbroken engine on
//! every golden of the matrix for it.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};

use lockstep_engine::Simd;

use crate::floors::{FloorBuilder, FloorSet, Floors, FLOORS_SCHEMA_VERSION};

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
    /// Measure this session engine (`--engine-serve`) instead of ours: for a model our engine cannot load
    /// (an HF checkpoint of an architecture it does not implement, issue 43), whose floors are then those
    /// of the unbroken external engine. It runs the matrix's `simd = off` cells only.
    pub serve: Option<crate::protocol::client::ServeCommand>,
}

/// The golden paths of `cells` (one model, oracle and mode), each once, in cell order: cells that differ
/// only in their SIMD setting or engine share one golden, and measuring it once per cell would count its
/// rows once per cell.
pub fn goldens_of(cells: &[crate::matrix::Cell]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for c in cells {
        let g = crate::matrix::golden_path_for(c);
        if !out.contains(&g) {
            out.push(g);
        }
    }
    out
}

/// The SIMD settings whose results `cells` (one model, oracle and mode) hold the engine to, each once, in
/// cell order: each cell's `simd` as the setting that gives its results in its mode ([`Simd::for_mode`]:
/// reference mode's `avx512` gives its `avx2` bits). Reference mode's SIMD kernels sum in another order
/// than its scalar code (`engine/src/quant/reference_fma.rs`), so a floor measured with one setting only
/// would not describe the other: a stage exact with one order can be off by a rounding with the other.
///
/// Errors: a cell's `simd` that is not a setting ([`Simd::parse`]) or that this CPU cannot run.
pub fn simd_settings_of(cells: &[crate::matrix::Cell]) -> Result<Vec<Simd>> {
    let mut out: Vec<Simd> = Vec::new();
    for c in cells {
        let simd = Simd::parse(&c.simd)
            .map_err(|e| anyhow::anyhow!("cell {}/{}: {e}", c.model, c.prompt))?
            .for_mode(c.mode);
        if !out.contains(&simd) {
            out.push(simd);
        }
    }
    Ok(out)
}

/// Measure the floors of every (model, oracle, mode) of the matrix whose thresholds set
/// `stage_floor_headroom`: bisect's local pass of our engine (or of `opts.serve`'s session engine, once per
/// golden, on the `simd = off` cells) on every golden of it, once per SIMD setting
/// of its cells that gives other results ([`simd_settings_of`]). The rows of every setting make one
/// distribution per stage kind, and a stage is exact only where it was exact with every setting, so the
/// floors hold the engine however the matrix runs it.
///
/// Errors: as `lockstep bisect` (missing model, stale golden, ...); no cell asking for floors.
pub fn measure(opts: &MeasureOptions, progress: &mut dyn FnMut(&str)) -> Result<Floors> {
    use crate::capture::input_known;
    use crate::engine::LockstepEngine;
    use crate::judge::Case;

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
        if crate::registry::Registry::active_golden_model(&c.model) != c.model {
            // a Hugging Face copy is judged with its source's floors (the same stages bit for bit:
            // engine/src/hf tests); the source's cells measure them
            continue;
        }
        // an external engine has no SIMD setting of ours: it runs the `off` cells (as `lockstep run`)
        if opts.serve.is_some() && c.simd != "off" {
            continue;
        }
        groups
            .entry((c.model.clone(), c.oracle.clone(), c.mode.name().to_string()))
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
        let sha = crate::run::model_sha256(&path)?;
        let model_file = match &opts.serve {
            None => Some(LockstepEngine::load_model(&path)?),
            Some(_) => None,
        };
        let m: lockstep_engine::NumericsMode =
            mode.parse().map_err(|e: String| anyhow::anyhow!(e))?;
        let mut builder = FloorBuilder::default();
        let mut goldens = BTreeMap::new();
        let settings = simd_settings_of(&cells)?;
        for (simd, gpath) in settings
            .iter()
            .flat_map(|&simd| goldens_of(&cells).into_iter().map(move |g| (simd, g)))
        {
            progress(&format!("{gpath} (simd {})", simd.name()));
            let entry = manifest.entry(&opts.golden_dir, &gpath)?.clone();
            let mut engine: Box<dyn crate::engine::Engine> = match &opts.serve {
                Some(cmd) => Box::new(crate::protocol::client::SessionEngine::start(
                    cmd.clone(),
                    &path,
                    &entry.arch,
                    m,
                    lockstep_engine::GgmlTarget::default(),
                )?),
                None => {
                    let mf = model_file
                        .clone()
                        .context("our engine's model is loaded when no session engine is given")?;
                    Box::new(LockstepEngine::shared(mf, path.clone()).with_simd(simd))
                }
            };
            if !engine.replaces_stages() {
                bail!(
                    "{gpath}: the session engine `{}` does not announce `inject`: its floors (bisect's local pass) \
                     cannot be measured",
                    engine.info().kind
                );
            }
            let engine = engine.as_mut();
            crate::golden::verify_golden(&opts.golden_dir, &entry)?;
            crate::golden::check_model(&opts.golden_dir, &entry, &sha)?;
            let mut gf = crate::golden::GoldenFile::open(&opts.golden_dir, &entry)?;
            let case = Case::new(
                &mut gf,
                engine,
                manifest.stage_map(&entry.oracle.name, &entry.arch),
                None,
            )?;
            goldens.insert(entry.path.clone(), entry.sha256.clone());
            if !case.bisectable() {
                // no layer output to inject: no local pass, so nothing to measure and nothing to hold to it
                continue;
            }
            let acc = case.accumulated(&mut gf, engine, m)?;
            let (local, known) = case.local(&mut gf, engine, m, &acc)?;
            let cmp = local
                .cmp
                .as_ref()
                .with_context(|| format!("{gpath}: the local pass was not compared"))?;
            if acc.cmp.is_none() || !local.is_finite() {
                bail!("{gpath}: the unbroken engine produced a NaN or ±Inf in {mode} mode; no floor can be measured");
            }
            builder.add(cmp, &|s, row| {
                s.id()
                    .is_some_and(|id| input_known(&known, s.phase, id, row))
            });
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

/// The sets of `out` that a measurement of only `models` and `oracles` keeps: every set the measurement does
/// not select (another model, when models are named; another oracle, when oracles are named). None when
/// neither is named (everything is measured again) or `out` does not exist yet.
///
/// Errors: an existing `out` that does not load ([`Floors::load`]) — read before measuring, so that a
/// broken file fails at once.
pub fn kept_sets(out: &Path, models: &[String], oracles: &[String]) -> Result<Vec<FloorSet>> {
    if (models.is_empty() && oracles.is_empty()) || !out.exists() {
        return Ok(Vec::new());
    }
    let old = Floors::load(out)?;
    Ok(old
        .sets
        .into_iter()
        .filter(|s| {
            let measured = (models.is_empty() || models.contains(&s.model))
                && (oracles.is_empty() || oracles.contains(&s.oracle));
            !measured
        })
        .collect())
}

/// `measured` with the `kept` sets added, when only part of the matrix was measured (`partial`): every set
/// sorted by (model, oracle, mode). A full measurement is the whole file and stays as it is.
pub fn merge(measured: &mut Floors, kept: Vec<FloorSet>, partial: bool) {
    if !partial {
        return;
    }
    let mut sets = kept;
    sets.append(&mut measured.sets);
    sets.sort_by(|x, y| (&x.model, &x.oracle, &x.mode).cmp(&(&y.model, &y.oracle, &y.mode)));
    measured.sets = sets;
}

/// Measure the floors `opts` selects, merge them with the sets kept from `out` ([`kept_sets`],
/// [`merge`]; the selection is `opts.filters.model` and `opts.filters.oracle`) and write `out`
/// ([`crate::floors::write`]).
///
/// Errors: a broken existing `out` (before measuring); [`measure`]'s; the write's.
pub fn update(opts: &MeasureOptions, out: &Path, progress: &mut dyn FnMut(&str)) -> Result<()> {
    let (models, oracles) = (&opts.filters.model, &opts.filters.oracle);
    let kept = kept_sets(out, models, oracles)?;
    let mut floors = measure(opts, progress)?;
    merge(
        &mut floors,
        kept,
        !(models.is_empty() && oracles.is_empty()),
    );
    crate::floors::write(out, &floors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_golden_is_measured_once_whatever_the_simd_settings() {
        let cell = |prompt: &str, simd: &str| crate::matrix::Cell {
            model: "m".into(),
            prompt: prompt.into(),
            quant: "Q4_1".into(),
            mode: lockstep_engine::NumericsMode::Reference,
            simd: simd.into(),
            oracle: "o".into(),
            engine: "lockstep".into(),
        };
        let cells = [
            cell("a", "off"),
            cell("a", "avx2"),
            cell("a", "avx512"),
            cell("b", "off"),
            cell("b", "avx2"),
        ];
        assert_eq!(goldens_of(&cells), ["m/o/a.npz", "m/o/b.npz"]);
    }

    #[test]
    fn each_simd_setting_with_other_results_is_measured_once() {
        let cell = |simd: &str, mode| crate::matrix::Cell {
            model: "m".into(),
            prompt: "a".into(),
            quant: "Q4_1".into(),
            mode,
            simd: simd.into(),
            oracle: "o".into(),
            engine: "lockstep".into(),
        };
        let (r, g) = (
            lockstep_engine::NumericsMode::Reference,
            lockstep_engine::NumericsMode::Ggml,
        );
        let offs = [cell("off", r), cell("off", r)];
        assert_eq!(simd_settings_of(&offs).unwrap(), [Simd::Off]);
        if Simd::Avx512.available() {
            let all = |m| [cell("off", m), cell("avx512", m), cell("avx2", m)];
            // reference mode's avx512 gives its avx2 bits: one measurement for both
            assert_eq!(simd_settings_of(&all(r)).unwrap(), [Simd::Off, Simd::Avx2]);
            assert_eq!(
                simd_settings_of(&all(g)).unwrap(),
                [Simd::Off, Simd::Avx512, Simd::Avx2]
            );
        }
        let err = simd_settings_of(&[cell("fast", r)]).unwrap_err();
        assert!(format!("{err:#}").contains("m/a"), "{err:#}");
    }

    fn set(model: &str, mode: &str) -> FloorSet {
        FloorSet {
            model: model.into(),
            oracle: "llama.cpp-f32kv".into(),
            mode: mode.into(),
            goldens: Default::default(),
            kinds: Default::default(),
        }
    }

    fn keys(f: &Floors) -> Vec<(String, String)> {
        f.sets
            .iter()
            .map(|s| (s.model.clone(), s.mode.clone()))
            .collect()
    }

    #[test]
    fn measured_sets_join_the_kept_ones_sorted() {
        let mut f = Floors {
            sets: vec![set("b", "ggml")],
            ..Default::default()
        };
        merge(&mut f, vec![set("c", "ggml"), set("a", "reference")], true);
        let want = [("a", "reference"), ("b", "ggml"), ("c", "ggml")];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(m, o)| (m.to_string(), o.to_string()))
            .collect();
        assert_eq!(keys(&f), want);
    }

    #[test]
    fn a_full_measurement_replaces_everything() {
        let mut f = Floors {
            sets: vec![set("z", "ggml"), set("b", "ggml")],
            ..Default::default()
        };
        merge(&mut f, vec![set("a", "ggml")], false);
        assert_eq!(
            keys(&f),
            [("z".into(), "ggml".into()), ("b".into(), "ggml".into())]
        );
    }

    #[test]
    fn nothing_is_kept_without_models_or_file_and_a_broken_file_fails() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("floors.json");
        assert!(kept_sets(&out, &["m".into()], &[]).unwrap().is_empty());
        std::fs::write(&out, "{ not json").unwrap();
        assert!(kept_sets(&out, &[], &[]).unwrap().is_empty());
        assert!(kept_sets(&out, &["m".into()], &[]).is_err());
        assert!(kept_sets(&out, &[], &["o".into()]).is_err());
    }

    #[test]
    fn a_measurement_of_some_oracles_keeps_the_others_sets() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("floors.json");
        let valid = |model: &str, oracle: &str| FloorSet {
            model: model.into(),
            oracle: oracle.into(),
            mode: "reference".into(),
            goldens: [(format!("{model}/{oracle}/p.npz"), "0".repeat(64))].into(),
            kinds: Default::default(),
        };
        let (ll, tf) = ("llama.cpp-f32kv", "transformers-f32");
        let f = Floors {
            schema_version: FLOORS_SCHEMA_VERSION,
            made_by: "test".into(),
            sets: vec![
                valid("a", ll),
                valid("a", tf),
                valid("b", ll),
                valid("b", tf),
            ],
        };
        std::fs::write(&out, serde_json::to_string(&f).unwrap()).unwrap();
        let kept = |models: &[&str], oracles: &[&str]| -> Vec<(String, String)> {
            let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
            kept_sets(&out, &s(models), &s(oracles))
                .unwrap()
                .into_iter()
                .map(|s| (s.model, s.oracle))
                .collect()
        };
        let pair = |m: &str, o: &str| (m.to_string(), o.to_string());
        assert_eq!(kept(&[], &[tf]), [pair("a", ll), pair("b", ll)]);
        assert_eq!(
            kept(&["a"], &[tf]),
            [pair("a", ll), pair("b", ll), pair("b", tf)]
        );
        assert_eq!(kept(&["a"], &[]), [pair("b", ll), pair("b", tf)]);
        assert!(kept(&[], &[]).is_empty());
    }
}
