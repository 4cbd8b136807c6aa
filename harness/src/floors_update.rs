//! `lockstep floors` as one update of the floors file: measure ([`crate::floors::measure`]), keep the
//! sets of the models not measured this time (with `--model`), write atomically.

use std::path::Path;

use anyhow::Result;

use crate::floors::{FloorSet, Floors, MeasureOptions};

/// The sets of `out` that a measurement of only `models` keeps: those of every other model. None when
/// `models` is empty (everything is measured again) or `out` does not exist yet.
///
/// Errors: an existing `out` that does not load ([`Floors::load`]) — read before measuring, so that a
/// broken file fails at once.
pub fn kept_sets(out: &Path, models: &[String]) -> Result<Vec<FloorSet>> {
    if models.is_empty() || !out.exists() {
        return Ok(Vec::new());
    }
    let old = Floors::load(out)?;
    Ok(old
        .sets
        .into_iter()
        .filter(|s| !models.contains(&s.model))
        .collect())
}

/// `measured` with the `kept` sets added, when only `models` were measured: every set sorted by
/// (model, oracle, mode). With no `models`, `measured` is the whole file and stays as it is.
pub fn merge(measured: &mut Floors, kept: Vec<FloorSet>, models: &[String]) {
    if models.is_empty() {
        return;
    }
    let mut sets = kept;
    sets.append(&mut measured.sets);
    sets.sort_by(|x, y| (&x.model, &x.oracle, &x.mode).cmp(&(&y.model, &y.oracle, &y.mode)));
    measured.sets = sets;
}

/// Measure the floors `opts` selects, merge them with the sets kept from `out` ([`kept_sets`],
/// [`merge`]; the models are `opts.filters.model`) and write `out` ([`crate::floors::write`]).
///
/// Errors: a broken existing `out` (before measuring); [`crate::floors::measure`]'s; the write's.
pub fn update(opts: &MeasureOptions, out: &Path, progress: &mut dyn FnMut(&str)) -> Result<()> {
    let models = &opts.filters.model;
    let kept = kept_sets(out, models)?;
    let mut floors = crate::floors::measure(opts, progress)?;
    merge(&mut floors, kept, models);
    crate::floors::write(out, &floors)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        merge(
            &mut f,
            vec![set("c", "ggml"), set("a", "reference")],
            &["b".into()],
        );
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
        merge(&mut f, vec![set("a", "ggml")], &[]);
        assert_eq!(
            keys(&f),
            [("z".into(), "ggml".into()), ("b".into(), "ggml".into())]
        );
    }

    #[test]
    fn nothing_is_kept_without_models_or_file_and_a_broken_file_fails() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("floors.json");
        assert!(kept_sets(&out, &["m".into()]).unwrap().is_empty());
        std::fs::write(&out, "{ not json").unwrap();
        assert!(kept_sets(&out, &[]).unwrap().is_empty());
        assert!(kept_sets(&out, &["m".into()]).is_err());
    }
}
