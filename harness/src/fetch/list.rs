//! `lockstep fetch` over the registry: the `--list` table, and several ids fetched (or, for a seeded model,
//! written) in one call (the variants made first, one recipe call per source).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::registry::Registry;

use super::FetchOptions;

/// The lines of `lockstep fetch --list`: every model, then every seeded model (with the `lockstep synth`
/// command that writes it), then every variant (with its type, source and recipe), then every corpus — id,
/// architecture (`corpus` for a corpus), size in bytes and name, in registry order. The models and seeded
/// models come in the order of [`Registry::ids`].
pub fn list_lines(reg: &Registry) -> Vec<String> {
    let mut out = Vec::new();
    for m in &reg.models {
        out.push(format!(
            "{:<28} {:<8} {:>12} B  {}",
            m.id, m.arch, m.size, m.name
        ));
    }
    for s in &reg.synth {
        out.push(format!(
            "{:<28} {:<8} {:>12} B  {} (written, not downloaded: {})",
            s.id,
            s.arch,
            s.size,
            s.name,
            s.recipe()
        ));
    }
    for v in &reg.variants {
        let arch = reg.arch(&v.id).unwrap_or("?");
        if v.is_hf() {
            out.push(format!(
                "{:<28} {:<8} {:>12} B  Hugging Face copy of {} (a directory, made by `{}`)",
                v.id,
                arch,
                v.size,
                v.source,
                v.recipe()
            ));
            continue;
        }
        // a seeded model's variants were registered from lockstep's own quantizer (models.toml)
        let registered = if reg.synth(&v.source).is_some() {
            String::new()
        } else {
            format!("; registered from {}", v.recipe())
        };
        out.push(format!(
            "{:<28} {:<8} {:>12} B  {} of {} (made by lockstep quantize{registered})",
            v.id, arch, v.size, v.qtype, v.source,
        ));
    }
    for c in &reg.corpora {
        out.push(format!(
            "{:<28} {:<8} {:>12} B  {}",
            c.id, "corpus", c.size, c.name
        ));
    }
    out
}

/// Fetch (a model), write (a seeded model) or make (a variant) every id of `ids` into `cache_root` (None:
/// [`super::cache_dir`], looked up once the ids are known to be registered), in order, passing each
/// file's path to `done` as it is ready: the variants are made first, in one call per source
/// ([`super::fetch_variants_in`] with `reg`, which fetches or writes their source models itself), then each
/// model is fetched ([`super::fetch_into`]) or written ([`super::fetch_synth_into`]).
///
/// Errors: an id that is neither a model, a seeded model nor a variant (before anything is fetched); any
/// fetch's, seeded model's or variant's error.
pub fn fetch_ids(
    reg: &Registry,
    ids: &[String],
    cache_root: Option<&Path>,
    opts: &FetchOptions,
    done: &mut dyn FnMut(&Path),
) -> Result<()> {
    let mut variants = Vec::new();
    for id in ids {
        if let Some(v) = reg.variant(id) {
            variants.push(v);
        } else if reg.get(id).is_none() && reg.synth(id).is_none() {
            bail!("unknown model id {id:?}; `lockstep fetch --list` shows the registered ones");
        }
    }
    let cache_root = match cache_root {
        Some(c) => c.to_path_buf(),
        None => super::cache_dir()?,
    };
    let made = super::fetch_variants_in(&variants, reg, &cache_root, opts)?;
    for id in ids {
        let path: PathBuf = match reg.variant(id) {
            None => super::fetch_model_in(id, reg, &cache_root, opts)?,
            Some(_) => {
                let i = variants
                    .iter()
                    .position(|v| &v.id == id)
                    .context("a variant")?;
                made[i].clone()
            }
        };
        done(&path);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_holds_every_registered_id_once() {
        let reg = Registry::active().unwrap();
        let lines = list_lines(&reg);
        assert_eq!(
            lines.len(),
            reg.models.len() + reg.synth.len() + reg.variants.len() + reg.corpora.len()
        );
        assert_eq!(reg.ids().len(), reg.models.len() + reg.synth.len());
        for (line, id) in lines.iter().zip(reg.ids()) {
            assert!(line.starts_with(&format!("{id:<28} ")), "{line}");
        }
        let v = &reg.variants[0];
        let line = lines.iter().find(|l| l.starts_with(&v.id)).unwrap();
        assert!(
            line.contains(&format!("{} of {}", v.qtype, v.source)),
            "{line}"
        );
        for c in &reg.corpora {
            let line = lines.iter().find(|l| l.starts_with(&c.id)).unwrap();
            assert!(line.contains(" corpus "), "{line}");
        }
        // a seeded model: its arch, and the command that writes it; its variants: made by lockstep quantize
        let s = reg.synth("synth-qwen3").unwrap();
        let line = lines
            .iter()
            .find(|l| l.starts_with("synth-qwen3 "))
            .unwrap();
        assert!(
            line.contains(" qwen3 ")
                && line.contains(&format!("{} B", s.size))
                && line.contains("lockstep synth --arch qwen3 --seed 1"),
            "{line}"
        );
        let line = lines
            .iter()
            .find(|l| l.starts_with("synth-qwen3-q4_k "))
            .unwrap();
        assert!(
            line.contains(" qwen3 ")
                && line.contains("Q4_K of synth-qwen3 (made by lockstep quantize)"),
            "{line}"
        );
    }

    #[test]
    fn an_unknown_id_fails_before_anything_is_fetched() {
        let reg = Registry::active().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let ids = [reg.models[0].id.clone(), "no-such-model".to_string()];
        let mut paths = Vec::new();
        let e = fetch_ids(
            &reg,
            &ids,
            Some(cache.path()),
            &FetchOptions::default(),
            &mut |p| paths.push(p.to_path_buf()),
        )
        .unwrap_err();
        assert!(e.to_string().contains("\"no-such-model\""), "{e}");
        assert!(paths.is_empty());
        assert_eq!(std::fs::read_dir(cache.path()).unwrap().count(), 0);
    }
}
