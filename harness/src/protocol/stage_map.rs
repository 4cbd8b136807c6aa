//! Stage names from the engine's world: a map file from an engine's own stage names (llama.cpp node names
//! such as `l_out-3`, transformers module paths such as `model.layers.3.mlp.down_proj`) to lockstep's
//! canonical ids, so an engine can dump under the names it has.
//!
//! The file is TOML, one table `[stages]` of `"engine name" = "canonical id"`; `{N}` stands for a block
//! index, on both sides or on neither:
//!
//! ```toml
//! [stages]
//! "inp_embd" = "embed"
//! "attn_norm-{N}" = "blk.{N}.attn_norm"
//! "model.layers.{N}.mlp.down_proj" = "blk.{N}.ffn_out"
//! "l_out-{N}" = "blk.{N}.out"
//! "result_norm" = "output_norm"
//! ```
//!
//! A name the map does not cover is not dropped in silence: the run lists it under "not compared"
//! ([`crate::compare::NOT_IN_STAGE_MAP`]). Without a map, names must be canonical ids, and any other name
//! is listed the same way.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use lockstep_engine::Stage;
use serde::Deserialize;

/// Largest map file read (a map of every node of a 100-layer model is a few KB).
const MAX_MAP_BYTES: u64 = 1 << 20;

/// One entry: the engine's name split at `{N}` (or whole), and the canonical id's pattern.
#[derive(Clone, Debug, PartialEq)]
struct Entry {
    engine: (String, Option<String>),
    canonical: (String, Option<String>),
}

/// The map from an engine's stage names to canonical ids (see the module docs).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NameMap {
    entries: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    stages: BTreeMap<String, String>,
}

fn split(s: &str) -> std::result::Result<(String, Option<String>), String> {
    match s.split_once("{N}") {
        None => Ok((s.to_string(), None)),
        Some((a, b)) if !b.contains("{N}") => Ok((a.to_string(), Some(b.to_string()))),
        Some(_) => Err(format!("`{s}` holds {{N}} more than once")),
    }
}

impl NameMap {
    /// Read a map file.
    ///
    /// Errors, naming the file and the entry: unreadable, not a regular file (a FIFO, a device:
    /// [`crate::input`]) or larger than 1 MiB; not TOML with one table
    /// `[stages]` of strings; `{N}` more than once on a side, or on one side only; a canonical side that is
    /// no canonical id (tried with `{N}` = 0); two engine names for the same canonical id.
    pub fn load(path: &Path) -> Result<NameMap> {
        let text = crate::input::read_string(path, "the stage map", MAX_MAP_BYTES)?;
        NameMap::parse(&text).with_context(|| format!("stage map {}", path.display()))
    }

    /// [`NameMap::load`] on the file's text.
    pub fn parse(text: &str) -> Result<NameMap> {
        let f: File = toml::from_str(text)
            .context("expected one table [stages] of \"engine name\" = \"canonical id\"")?;
        let mut entries = Vec::new();
        let mut seen = BTreeMap::new();
        for (name, id) in &f.stages {
            let engine = split(name).map_err(anyhow::Error::msg)?;
            let canonical = split(id).map_err(anyhow::Error::msg)?;
            if engine.1.is_some() != canonical.1.is_some() {
                bail!("`{name}` = `{id}`: {{N}} must appear on both sides or on neither");
            }
            if engine.0.is_empty() && engine.1.as_deref() == Some("") {
                bail!("`{name}`: a name that is only {{N}} matches every number");
            }
            let probe = id.replace("{N}", "0");
            if Stage::parse(&probe).is_none() {
                bail!("`{name}` = `{id}`: `{id}` is not a canonical stage id (see the README's table)");
            }
            if let Some(prev) = seen.insert(id.clone(), name.clone()) {
                bail!("`{prev}` and `{name}` both map to `{id}`");
            }
            entries.push(Entry { engine, canonical });
        }
        Ok(NameMap { entries })
    }

    /// The canonical stage of the engine's `name`, or `None` when the map does not cover it.
    pub fn to_canonical(&self, name: &str) -> Option<Stage> {
        for e in &self.entries {
            match (&e.engine, &e.canonical) {
                ((n, None), (c, None)) if n == name => return Stage::parse(c),
                ((pre, Some(post)), (cpre, Some(cpost))) => {
                    let Some(mid) = name
                        .strip_prefix(pre.as_str())
                        .and_then(|r| r.strip_suffix(post.as_str()))
                    else {
                        continue;
                    };
                    if mid.is_empty() || !mid.bytes().all(|b| b.is_ascii_digit()) {
                        continue;
                    }
                    let Ok(n) = mid.parse::<usize>() else {
                        continue;
                    };
                    if let Some(s) = Stage::parse(&format!("{cpre}{n}{cpost}")) {
                        return Some(s);
                    }
                }
                _ => {}
            }
        }
        None
    }

    /// The engine's name of canonical `stage` (for `inject`), or `None` when the map does not cover it.
    pub fn to_engine(&self, stage: Stage) -> Option<String> {
        let id = stage.to_string();
        for e in &self.entries {
            match (&e.engine, &e.canonical) {
                ((n, None), (c, None)) if *c == id => return Some(n.clone()),
                ((pre, Some(post)), (cpre, Some(cpost))) => {
                    let Some(l) = stage.layer else { continue };
                    if format!("{cpre}{l}{cpost}") == id {
                        return Some(format!("{pre}{l}{post}"));
                    }
                }
                _ => {}
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA: &str = r#"
[stages]
"inp_embd" = "embed"
"attn_norm-{N}" = "blk.{N}.attn_norm"
"model.layers.{N}.mlp.down_proj" = "blk.{N}.ffn_out"
"l_out-{N}" = "blk.{N}.out"
"result_norm" = "output_norm"
"#;

    #[test]
    fn names_map_both_ways() {
        let m = NameMap::parse(LLAMA).unwrap();
        let s = |id| Stage::parse(id).unwrap();
        assert_eq!(m.to_canonical("inp_embd"), Some(s("embed")));
        assert_eq!(m.to_canonical("l_out-12"), Some(s("blk.12.out")));
        assert_eq!(
            m.to_canonical("model.layers.3.mlp.down_proj"),
            Some(s("blk.3.ffn_out"))
        );
        for unknown in ["l_out-", "l_out-x", "l_out-1a", "ffn_out-3", "blk.3.out"] {
            assert_eq!(m.to_canonical(unknown), None, "{unknown}");
        }
        assert_eq!(m.to_engine(s("blk.7.out")).as_deref(), Some("l_out-7"));
        assert_eq!(
            m.to_engine(s("output_norm")).as_deref(),
            Some("result_norm")
        );
        assert_eq!(m.to_engine(s("blk.7.q")), None);
    }

    #[test]
    fn bad_maps_are_refused_naming_the_entry() {
        for (text, needle) in [
            ("[stages]\n\"a-{N}\" = \"embed\"\n", "both sides"),
            ("[stages]\n\"a\" = \"blk.{N}.out\"\n", "both sides"),
            (
                "[stages]\n\"a-{N}\" = \"blk.{N}.nope\"\n",
                "not a canonical stage id",
            ),
            (
                "[stages]\n\"a-{N}-{N}\" = \"blk.{N}.out\"\n",
                "more than once",
            ),
            (
                "[stages]\n\"a\" = \"embed\"\n\"b\" = \"embed\"\n",
                "both map to",
            ),
            ("[stagez]\n", "one table [stages]"),
            ("[stages]\n\"{N}\" = \"blk.{N}.out\"\n", "every number"),
        ] {
            let e = format!("{:#}", NameMap::parse(text).unwrap_err());
            assert!(e.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn a_missing_file_is_named() {
        let e = format!(
            "{:#}",
            NameMap::load(Path::new("/nonexistent/map.toml")).unwrap_err()
        );
        assert!(e.contains("/nonexistent/map.toml"), "{e}");
    }
}
