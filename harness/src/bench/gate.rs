//! `lockstep gate --speed`: the files read (the bench, an optional baseline bench, the limits, optional
//! speed floors) and every check of both gates run on them — [`gate_speed`] against llama.cpp and the
//! baselines, [`gate_floors`] against the floors.

use std::path::Path;

use anyhow::{bail, Result};

use super::file::read_bench;
use super::floors::{gate_floors, SpeedFloors};
use super::speed::{gate_speed, SpeedCheck, SpeedLimits};

/// [`gate_speed`] on files: the bench.json at `bench` ([`read_bench`]), the optional `baseline`
/// bench.json, the limits file at `limits` ([`SpeedLimits::load`]), and with `floors` also
/// [`gate_floors`] against that speed floors file.
///
/// Errors: any file unreadable or invalid; [`gate_speed`]'s and `gate_floors`' (naming the bench file,
/// and the baseline or floors file when there is one); no check at all (a bench without llama.cpp or a
/// baseline binary, and neither `baseline` nor `floors`).
pub fn gate_speed_files(
    bench: &Path,
    baseline: Option<&Path>,
    floors: Option<&Path>,
    limits: &Path,
) -> Result<Vec<SpeedCheck>> {
    let limits = SpeedLimits::load(limits)?;
    let r = read_bench(bench)?;
    let base = baseline.map(read_bench).transpose()?;
    let floor_file = floors.map(SpeedFloors::load).transpose()?;
    let mut checks = gate_speed(&r, base.as_ref(), &limits).map_err(|e| {
        let against = baseline.map_or_else(String::new, |b| {
            format!(" against the baseline {}", b.display())
        });
        anyhow::anyhow!("{}{against}: {e:#}", bench.display())
    })?;
    if let (Some(f), Some(path)) = (&floor_file, floors) {
        checks.extend(gate_floors(&r, f, &limits).map_err(|e| {
            anyhow::anyhow!(
                "{} against the speed floors {}: {e:#}",
                bench.display(),
                path.display()
            )
        })?);
    }
    if checks.is_empty() {
        bail!(
            "{} holds no comparison to gate (bench with llama.cpp or --baseline-bin, or give --baseline or \
             --speed-floors)",
            bench.display()
        );
    }
    Ok(checks)
}
