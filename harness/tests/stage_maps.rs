//! The transformers oracle's stage maps are data (`oracles/transformers/stage_maps/<model_type>.toml`, read by
//! `tf_capture.read_stage_map`): every file is well formed, and every architecture's map in
//! `golden/manifest.json` (`stage_map.transformers.<arch>`, what the harness reads) is exactly the rows of its
//! file, in order — so a map edited without regenerating the goldens, or a manifest map no file backs, fails here.
//!
//! `cargo test -p lockstep --test stage_maps`. No torch needed: TOML and JSON only.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// Hook kind -> the manifest's `op` (tf_capture.HOOKS).
const HOOK_OPS: [(&str, &str); 7] = [
    ("output", "forward_hook"),
    ("input", "forward_pre_hook"),
    ("attn_query", "attention_function"),
    ("attn_key", "attention_function"),
    ("columns", "forward_hook_columns"),
    ("logits_result", "model_output"),
    ("pooled", "computed_from_output"),
];
const MAP_KEYS: [&str; 7] = [
    "model_type",
    "arch",
    "class",
    "qk_layout",
    "about",
    "from_pretrained",
    "stage",
];
const STAGE_KEYS: [&str; 7] = [
    "id",
    "module",
    "hook",
    "columns",
    "heads_first",
    "fallback",
    "describe",
];
/// `columns = ...` names (tf_capture.COLUMNS).
const COLUMNS: [&str; 5] = ["q", "k", "v", "ffn_gate", "ffn_up"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn str_of<'a>(t: &'a toml::Table, key: &str, what: &str) -> &'a str {
    t.get(key)
        .and_then(|v| v.as_str())
        .unwrap_or_else(|| panic!("{what}: `{key}` missing or not a string"))
}

/// Every stage map file: (model_type, arch, parsed table).
fn maps() -> Vec<(String, String, toml::Table)> {
    let dir = root().join("oracles/transformers/stage_maps");
    let mut out = Vec::new();
    let mut paths: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "{}: no stage map", dir.display());
    for p in paths {
        let what = p.display().to_string();
        let t: toml::Table = toml::from_str(&fs::read_to_string(&p).unwrap())
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let mt = str_of(&t, "model_type", &what).to_string();
        assert_eq!(
            p.file_stem().unwrap().to_str().unwrap(),
            mt,
            "{what}: the file must be named <model_type>.toml"
        );
        let arch = t
            .get("arch")
            .and_then(|v| v.as_str())
            .unwrap_or(&mt)
            .to_string();
        out.push((mt, arch, t));
    }
    out
}

#[test]
fn every_stage_map_file_is_well_formed() {
    for (mt, _, t) in maps() {
        for k in t.keys() {
            assert!(MAP_KEYS.contains(&k.as_str()), "{mt}.toml: unknown key {k}");
        }
        str_of(&t, "class", &mt);
        let qk = t.get("qk_layout").and_then(|v| v.as_str()).unwrap_or("hf");
        assert!(
            ["hf", "llama_gguf"].contains(&qk),
            "{mt}.toml: qk_layout {qk}"
        );
        let stages = t
            .get("stage")
            .and_then(|v| v.as_array())
            .unwrap_or_else(|| panic!("{mt}.toml: no [[stage]]"));
        assert!(!stages.is_empty(), "{mt}.toml: no [[stage]]");
        let mut seen = BTreeMap::new();
        for (i, s) in stages.iter().enumerate() {
            let s = s
                .as_table()
                .unwrap_or_else(|| panic!("{mt}.toml: stage {i} not a table"));
            let what = format!("{mt}.toml [[stage]] #{}", i + 1);
            for k in s.keys() {
                assert!(STAGE_KEYS.contains(&k.as_str()), "{what}: unknown key {k}");
            }
            let id = str_of(s, "id", &what);
            let hook = str_of(s, "hook", &what);
            str_of(s, "module", &what);
            assert!(
                HOOK_OPS.iter().any(|(h, _)| *h == hook),
                "{what}: hook {hook}"
            );
            assert!(
                seen.insert(id.to_string(), i).is_none(),
                "{what}: {id} twice"
            );
            if hook == "columns" {
                let c = str_of(s, "columns", &what);
                assert!(COLUMNS.contains(&c), "{what}: columns {c}");
            }
            if hook.starts_with("attn_") {
                assert!(id.contains("{N}"), "{what}: an attention hook is per layer");
            }
        }
    }
}

#[test]
fn the_manifests_transformers_maps_are_the_stage_map_files() {
    let manifest: serde_json::Value = serde_json::from_str(
        &fs::read_to_string(root().join("golden/manifest.json")).expect("golden/manifest.json"),
    )
    .expect("manifest.json parses");
    let in_manifest = manifest["stage_map"]["transformers"]
        .as_object()
        .expect("stage_map.transformers in golden/manifest.json");
    let files = maps();
    for (arch, m) in in_manifest {
        let (mt, _, t) = files.iter().find(|(_, a, _)| a == arch).unwrap_or_else(|| {
            panic!("manifest stage_map.transformers.{arch}: no stage map file has arch {arch}")
        });
        let rows = m["stages"].as_array().expect("stages");
        let stages = t["stage"].as_array().unwrap();
        assert_eq!(
            rows.len(),
            stages.len(),
            "{arch}: {} manifest rows, {} in {mt}.toml",
            rows.len(),
            stages.len()
        );
        for (row, s) in rows.iter().zip(stages) {
            let s = s.as_table().unwrap();
            let id = s["id"].as_str().unwrap();
            let hook = s["hook"].as_str().unwrap();
            let name = s
                .get("describe")
                .and_then(|v| v.as_str())
                .unwrap_or_else(|| s["module"].as_str().unwrap());
            let op = HOOK_OPS
                .iter()
                .find(|(h, _)| *h == hook)
                .unwrap_or_else(|| panic!("{mt}.toml {id}: hook {hook}"))
                .1;
            assert_eq!(
                row["canonical"], id,
                "{arch}: row order differs from {mt}.toml"
            );
            assert_eq!(row["op"], op, "{arch} {id}: op");
            let on = row["oracle_name"].as_str().unwrap();
            if hook == "columns" {
                assert!(
                    on.starts_with(&format!("{name} output, ")),
                    "{arch} {id}: oracle_name {on}"
                );
            } else {
                assert_eq!(on, name, "{arch} {id}: oracle_name");
            }
        }
    }
}
