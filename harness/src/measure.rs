//! `lockstep floors`: measuring the stage floors ([`crate::floors`]) of every (model, oracle, mode) whose
//! thresholds ask for them — bisect's local pass ([`crate::judge::Case::local`]) of the unbroken engine on
//! every golden of the matrix for it.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};

use crate::floors::{FloorBuilder, Floors, FLOORS_SCHEMA_VERSION};

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

/// Measure the floors of every (model, oracle, mode) of the matrix whose thresholds set
/// `stage_floor_headroom`: bisect's local pass of our engine on every golden of it.
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
        for gpath in goldens_of(&cells) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_golden_is_measured_once_whatever_the_simd_settings() {
        let cell = |prompt: &str, simd: &str| crate::matrix::Cell {
            model: "m".into(),
            prompt: prompt.into(),
            quant: "Q4_1".into(),
            mode: "reference".into(),
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
}
