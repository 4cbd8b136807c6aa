//! The run matrix (`ci/matrix.toml`): which models, prompts, numerics modes, SIMD settings, oracles and
//! engines `lockstep run` crosses, and its expansion into [`Cell`]s.
//!
//! # Format
//!
//! ```toml
//! modes = ["reference", "ggml"]   # engine numerics modes
//! simd = ["off"]                  # SIMD backend setting ("off" = scalar)
//! oracles = ["llama.cpp-f32kv"]   # golden directory names under golden/<model>/
//! engines = ["lockstep"]          # "lockstep" (in process) or "external" (dump-format adapter)
//!
//! [default_simd]                  # optional: the default tier's SIMD settings per mode (each in `simd`);
//! ggml = ["auto"]                 # `lockstep run --full` (or any --simd) runs every setting in every mode
//!
//! [[models]]
//! id = "smollm2-135m-q4_1"        # registry id (models.toml); also the golden directory name
//! quant = "Q4_1"                  # the model file's weight type, for the report
//! prompts = ["*"]                 # "*" = every prompt with a golden for this model and oracle
//! oracles = ["llama.cpp-f32kv"]   # optional: the model is held to only these of the matrix's oracles
//! ```
//!
//! A model's `oracles` (a non-empty subset of the matrix's `oracles`) restricts its cells to those oracles:
//! models that have no golden of some oracle (SmolLM2's quantization variants have no transformers-f32
//! goldens) say so instead of failing the expansion. Filtering by `--oracle` to an oracle a model does not
//! list leaves that model out.
//!
//! Every combination model × prompt × mode × simd × oracle × engine is one cell. Each cell is held to the
//! golden `golden/<model>/<oracle>/<prompt>.npz` ([`golden_path_for`]), which must be listed in
//! `golden/manifest.json`: a missing golden is an error, never a skipped cell.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::golden::Manifest;
use lockstep_engine::{NumericsMode, Simd};

/// The numerics modes the engine has (`--mode`).
pub const MODES: &[&str] = &["reference", "ggml"];

/// The engines the harness can drive.
pub const ENGINES: &[&str] = &["lockstep", "external"];

/// The values of the `simd` axis: `off` (scalar kernels), `avx2`, `avx512` ([`lockstep_engine::Simd`]),
/// and `auto`, the best of those this CPU runs ([`lockstep_engine::Simd::detect`]), which [`Matrix::expand`]
/// resolves to its name (a value listed twice that way gives its cells once).
pub const SIMD: &[&str] = &["off", "avx2", "avx512", "auto"];

/// The prompt wildcard: every prompt that has a golden for the model and oracle.
pub const ALL_PROMPTS: &str = "*";

/// One cell of the matrix: one engine run held to one golden.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Cell {
    /// Model registry id (`models.toml`), e.g. `smollm2-135m-q4_1`.
    pub model: String,
    /// Prompt id of the golden, e.g. `prose`.
    pub prompt: String,
    /// The model file's weight type, e.g. `Q4_1`.
    pub quant: String,
    /// Numerics mode, typed from the matrix file on (`reference` or `ggml` in a report).
    #[serde(with = "mode_name")]
    pub mode: NumericsMode,
    /// SIMD setting: `off` (scalar backend); other values once a SIMD backend exists.
    pub simd: String,
    /// Golden directory under `golden/<model>/`, e.g. `llama.cpp-f32kv`.
    pub oracle: String,
    /// `lockstep` (in process) or `external`.
    pub engine: String,
}

/// A [`Cell`]'s mode as its name (`reference`, `ggml`) in report.json: serde through
/// [`NumericsMode::name`] and [`NumericsMode`]'s `FromStr`.
mod mode_name {
    use lockstep_engine::NumericsMode;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(mode: &NumericsMode, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(mode.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<NumericsMode, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

impl Cell {
    /// `model/prompt/quant/mode/simd-<simd>/oracle/engine`, e.g.
    /// `smollm2-135m-q4_1/prose/Q4_1/ggml/simd-off/llama.cpp-f32kv/lockstep`.
    pub fn id(&self) -> String {
        format!(
            "{}/{}/{}/{}/simd-{}/{}/{}",
            self.model, self.prompt, self.quant, self.mode, self.simd, self.oracle, self.engine
        )
    }
}

/// The golden a cell is held to, relative to the golden directory, as `GoldenEntry::path` spells it:
/// `<model>/<oracle>/<prompt>.npz`, e.g. `smollm2-135m-q4_1/llama.cpp-f32kv/prose.npz`; for the Hugging
/// Face copy of a registered model, its source's (`synth-llama-hf` → `synth-llama/...`,
/// [`crate::registry::Registry::golden_model`]).
pub fn golden_path_for(cell: &Cell) -> String {
    format!(
        "{}/{}/{}.npz",
        crate::registry::Registry::active_golden_model(&cell.model),
        cell.oracle,
        cell.prompt
    )
}

/// One `[[models]]` entry of the matrix.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatrixModel {
    /// Model registry id.
    pub id: String,
    /// The model file's weight type (e.g. `Q4_1`).
    pub quant: String,
    /// Prompt ids, or `["*"]` for every prompt with a golden.
    pub prompts: Vec<String>,
    /// The matrix's oracles this model is held to (all of them when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oracles: Option<Vec<String>>,
}

impl MatrixModel {
    /// Whether this model is held to `oracle` (its own `oracles`, when listed).
    pub fn has_oracle(&self, oracle: &str) -> bool {
        self.oracles
            .as_ref()
            .is_none_or(|o| o.iter().any(|x| x == oracle))
    }
}

/// `ci/matrix.toml`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Matrix {
    /// Models, each with its prompts.
    pub models: Vec<MatrixModel>,
    /// Numerics modes ([`MODES`]).
    pub modes: Vec<String>,
    /// SIMD settings (`off`).
    pub simd: Vec<String>,
    /// Oracles: golden directory names under `golden/<model>/`.
    pub oracles: Vec<String>,
    /// Engines ([`ENGINES`]).
    pub engines: Vec<String>,
    /// The default tier (`lockstep run` without `--full` or `--simd`): numerics mode → the SIMD settings its
    /// cells run, each one of `simd`. A mode not listed runs every setting of `simd`. The full tier
    /// (`--full`, and any explicit `--simd`) runs every setting in every mode.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub default_simd: std::collections::BTreeMap<String, Vec<String>>,
}

/// Restrict a run to some values of each axis. An empty list does not filter. Every value given must
/// match something in the matrix (a typo is an error, not an empty run).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Filters {
    /// Model ids.
    pub model: Vec<String>,
    /// Prompt ids.
    pub prompt: Vec<String>,
    /// Modes.
    pub mode: Vec<String>,
    /// Oracles.
    pub oracle: Vec<String>,
    /// SIMD settings.
    pub simd: Vec<String>,
    /// Run the full tier: every SIMD setting of the matrix in every mode, not the default tier's
    /// ([`Matrix::default_simd`]). An explicit `simd` filter selects from the full tier too.
    #[serde(default)]
    pub full: bool,
}

fn check_axis(origin: &str, name: &str, values: &[String], allowed: Option<&[&str]>) -> Result<()> {
    if values.is_empty() {
        bail!("{origin}: `{name}` is empty; list at least one value");
    }
    let mut seen = BTreeSet::new();
    for v in values {
        if v.trim().is_empty() {
            bail!("{origin}: `{name}` holds an empty value");
        }
        if !seen.insert(v.as_str()) {
            bail!("{origin}: `{name}` lists {v:?} twice");
        }
        if let Some(allowed) = allowed {
            if !allowed.contains(&v.as_str()) {
                bail!(
                    "{origin}: `{name}` value {v:?} is not one of {}",
                    allowed.join(", ")
                );
            }
        }
        if v.contains('/') {
            bail!("{origin}: `{name}` value {v:?} contains '/', which cell ids and golden paths use as separator");
        }
    }
    Ok(())
}

/// SIMD settings with `auto` resolved to this CPU's best setting, each value once (in order).
fn resolve_simd(values: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for v in values {
        let v = match v.as_str() {
            "auto" => lockstep_engine::Simd::detect().name().to_string(),
            other => other.to_string(),
        };
        if !out.contains(&v) {
            out.push(v);
        }
    }
    out
}

impl Matrix {
    /// Read and parse a matrix file.
    pub fn load(path: &Path) -> Result<Matrix> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("{} cannot be read", path.display()))?;
        Matrix::parse(&text, &path.display().to_string())
    }

    /// Parse matrix TOML; `origin` names the source in errors. Checks that no axis is empty, no value
    /// repeats, modes and engines are known, and `"*"` stands alone in a prompt list.
    pub fn parse(text: &str, origin: &str) -> Result<Matrix> {
        let m: Matrix =
            toml::from_str(text).with_context(|| format!("{origin} is not a valid run matrix"))?;
        if m.models.is_empty() {
            bail!("{origin}: no [[models]]");
        }
        let ids: Vec<String> = m.models.iter().map(|x| x.id.clone()).collect();
        check_axis(origin, "models.id", &ids, None)?;
        for model in &m.models {
            if model.quant.trim().is_empty() {
                bail!("{origin}: model {:?} has an empty quant", model.id);
            }
            let what = format!("models.prompts of {:?}", model.id);
            check_axis(origin, &what, &model.prompts, None)?;
            if model.prompts.len() > 1 && model.prompts.iter().any(|p| p == ALL_PROMPTS) {
                bail!("{origin}: {what}: \"*\" means every prompt and must stand alone");
            }
        }
        check_axis(origin, "modes", &m.modes, Some(MODES))?;
        check_axis(origin, "simd", &m.simd, Some(SIMD))?;
        check_axis(origin, "oracles", &m.oracles, None)?;
        for model in &m.models {
            if let Some(own) = &model.oracles {
                let what = format!("models.oracles of {:?}", model.id);
                check_axis(origin, &what, own, None)?;
                if let Some(o) = own.iter().find(|o| !m.oracles.contains(o)) {
                    bail!(
                        "{origin}: {what}: {o:?} is not one of the matrix's oracles ({})",
                        m.oracles.join(", ")
                    );
                }
            }
        }
        check_axis(origin, "engines", &m.engines, Some(ENGINES))?;
        for (mode, settings) in &m.default_simd {
            if !m.modes.contains(mode) {
                bail!(
                    "{origin}: default_simd names the mode {mode:?}, which is not one of `modes` ({})",
                    m.modes.join(", ")
                );
            }
            let what = format!("default_simd.{mode}");
            check_axis(origin, &what, settings, Some(SIMD))?;
            if let Some(v) = settings.iter().find(|v| !m.simd.contains(v)) {
                bail!(
                    "{origin}: {what}: {v:?} is not one of `simd` ({}); the default tier is part of the full one",
                    m.simd.join(", ")
                );
            }
        }
        Ok(m)
    }

    /// The SIMD settings of `mode`'s cells in the tier `full` selects, `auto` resolved, each once (in order):
    /// the default tier's list for the mode ([`Matrix::default_simd`]) unless `full`, else every setting.
    fn simd_values_of(&self, mode: &str, full: bool) -> Vec<String> {
        match self.default_simd.get(mode) {
            Some(v) if !full => resolve_simd(v),
            _ => self.simd_values(),
        }
    }

    /// The prompt ids that have a golden for `model` and `oracle` in the manifest, sorted.
    fn golden_prompts(manifest: &Manifest, model: &str, oracle: &str) -> BTreeSet<String> {
        let prefix = format!("{model}/{oracle}/");
        manifest
            .goldens
            .iter()
            .filter_map(|g| g.path.strip_prefix(&prefix)?.strip_suffix(".npz"))
            .filter(|p| !p.contains('/'))
            .map(str::to_string)
            .collect()
    }

    /// A model named by `--model` that the matrix does not list, but that has goldens in `manifest` (a
    /// user's model, its goldens in a directory of theirs): it joins a copy of the matrix with every prompt
    /// of its goldens (`"*"`), held to those of the matrix's oracles it has goldens of, under the matrix's
    /// modes and SIMD tiers; its `quant` is `-` (list it in a matrix file of your own to name its type).
    /// `None` when every `--model` is listed (or has no golden: the filter check then says what is
    /// available).
    fn with_unlisted_models(&self, manifest: &Manifest, wanted: &[String]) -> Option<Matrix> {
        let mut out = self.clone();
        for id in wanted {
            if self.models.iter().any(|m| &m.id == id) {
                continue;
            }
            let oracles: Vec<String> = self
                .oracles
                .iter()
                .filter(|o| !Self::golden_prompts(manifest, id, o).is_empty())
                .cloned()
                .collect();
            if !oracles.is_empty() {
                out.models.push(MatrixModel {
                    id: id.clone(),
                    quant: "-".into(),
                    prompts: vec![ALL_PROMPTS.into()],
                    oracles: Some(oracles),
                });
            }
        }
        (out.models.len() > self.models.len()).then_some(out)
    }

    /// The `simd` axis with `auto` resolved to this CPU's best setting, each value once (in order).
    pub fn simd_values(&self) -> Vec<String> {
        resolve_simd(&self.simd)
    }

    /// Expand to cells, resolving `"*"` prompts from the manifest's goldens for that model and oracle.
    ///
    /// Order: model (as listed), prompt (as listed, or sorted for `"*"`), mode, simd, oracle, engine.
    /// Errors: a cell whose golden is not in the manifest (all such cells are named, with the path
    /// expected), a `"*"` that finds no golden, and a filter value that matches nothing (with the
    /// values available).
    pub fn expand(&self, manifest: &Manifest, filters: &Filters) -> Result<Vec<Cell>> {
        fn keep(filter: &[String], v: &str) -> bool {
            filter.is_empty() || filter.iter().any(|f| f == v)
        }
        fn check_filter(axis: &str, filter: &[String], available: &BTreeSet<String>) -> Result<()> {
            for f in filter {
                if !available.contains(f) {
                    let list: Vec<&str> = available.iter().map(String::as_str).collect();
                    bail!(
                        "filter --{axis} {f:?} matches nothing in the run matrix; available {axis} values: {}",
                        if list.is_empty() { "(none)".to_string() } else { list.join(", ") }
                    );
                }
            }
            Ok(())
        }
        let set = |v: &[String]| v.iter().cloned().collect::<BTreeSet<String>>();
        // an HF checkpoint our engine cannot load is run from the porter's matrix, through its engine
        let registry = crate::registry::Registry::active().ok();
        let is_checkpoint = |m: &str| registry.as_ref().is_some_and(|r| r.checkpoint(m).is_some());
        let unlisted: Vec<String> = filters
            .model
            .iter()
            .filter(|m| !is_checkpoint(m))
            .cloned()
            .collect();
        let with_unlisted = self.with_unlisted_models(manifest, &unlisted);
        let this = with_unlisted.as_ref().unwrap_or(self);
        let models: BTreeSet<String> = this.models.iter().map(|m| m.id.clone()).collect();
        check_filter("model", &filters.model, &models).map_err(|e| {
            match filters
                .model
                .iter()
                .find(|m| !models.contains(*m) && is_checkpoint(m))
            {
                Some(m) => e.context(format!(
                    "`{m}` is an HF checkpoint (models.toml [[checkpoints]]) of an architecture lockstep's engine \
                     does not load: its cells are in ci/matrix-porter.toml, run through an external engine \
                     (--matrix ci/matrix-porter.toml --engine-serve CMD)"
                )),
                None => e,
            }
        })?;
        check_filter("mode", &filters.mode, &set(&self.modes))?;
        check_filter("oracle", &filters.oracle, &set(&self.oracles))?;
        let simd_values = self.simd_values();
        // `--simd auto` names the setting `auto` resolves to on this CPU, as the matrix's own `auto` does
        let simd_filter: Vec<String> = filters
            .simd
            .iter()
            .map(|v| match v.as_str() {
                "auto" => lockstep_engine::Simd::detect().name().to_string(),
                other => other.to_string(),
            })
            .collect();
        check_filter("simd", &simd_filter, &set(&simd_values))?;

        let models: Vec<&MatrixModel> = this
            .models
            .iter()
            .filter(|m| keep(&filters.model, &m.id))
            .filter(|m| {
                self.oracles
                    .iter()
                    .any(|o| keep(&filters.oracle, o) && m.has_oracle(o))
            })
            .collect();
        let oracles: Vec<&String> = self
            .oracles
            .iter()
            .filter(|o| keep(&filters.oracle, o))
            .collect();

        // Resolve prompts per (model, oracle): "*" from the manifest, otherwise as listed.
        let mut available_prompts = BTreeSet::new();
        // (model, its prompts in cell order, per oracle: the prompts that oracle has).
        type PerOracle = Vec<(String, BTreeSet<String>)>;
        let mut resolved: Vec<(&MatrixModel, Vec<String>, PerOracle)> = Vec::new();
        let mut empty_wildcards = Vec::new();
        for m in &models {
            let wildcard = m.prompts.iter().any(|p| p == ALL_PROMPTS);
            let mut per_oracle = Vec::new();
            let mut union = BTreeSet::new();
            for o in oracles.iter().filter(|o| m.has_oracle(o)) {
                let prompts = if wildcard {
                    let found = Self::golden_prompts(manifest, &m.id, o);
                    if found.is_empty() {
                        empty_wildcards.push(format!("{}/{o}/*.npz", m.id));
                    }
                    found
                } else {
                    m.prompts.iter().cloned().collect()
                };
                union.extend(prompts.iter().cloned());
                per_oracle.push(((*o).clone(), prompts));
            }
            let order: Vec<String> = if wildcard {
                union.iter().cloned().collect()
            } else {
                m.prompts.clone()
            };
            available_prompts.extend(union);
            resolved.push((m, order, per_oracle));
        }
        if !empty_wildcards.is_empty() {
            bail!(
                "prompts = [\"*\"] finds no golden in the manifest for {}; make the goldens (oracles/regenerate.sh) \
                 or list the model's oracles correctly",
                empty_wildcards.join(", ")
            );
        }
        check_filter("prompt", &filters.prompt, &available_prompts)?;

        let mut cells = Vec::new();
        let mut missing = Vec::new();
        for (m, order, per_oracle) in &resolved {
            for prompt in order.iter().filter(|p| keep(&filters.prompt, p)) {
                for mode in self.modes.iter().filter(|v| keep(&filters.mode, v)) {
                    // parsed once, here: the modes were checked against MODES when the matrix loaded
                    let mode: NumericsMode = mode
                        .parse()
                        .map_err(|e: String| anyhow::anyhow!("matrix mode {mode:?}: {e}"))?;
                    // the settings whose kernels differ in this mode, each once (reference mode's
                    // avx512 runs its avx2 kernels: `Simd::for_mode`)
                    let mut mode_simd: Vec<String> = Vec::new();
                    // an explicit --simd picks from the full tier, as --full does
                    let tier =
                        self.simd_values_of(mode.name(), filters.full || !simd_filter.is_empty());
                    for v in tier.iter().filter(|v| keep(&simd_filter, v)) {
                        let v = match Simd::parse(v) {
                            Ok(s) => s.for_mode(mode).name().to_string(),
                            _ => v.clone(), // refused with a clear error when the cell runs
                        };
                        if !mode_simd.contains(&v) {
                            mode_simd.push(v);
                        }
                    }
                    for simd in &mode_simd {
                        for (oracle, prompts) in per_oracle {
                            if !prompts.contains(prompt) {
                                continue; // "*" resolved per oracle: this oracle has no such golden.
                            }
                            for engine in &self.engines {
                                let cell = Cell {
                                    model: m.id.clone(),
                                    prompt: prompt.clone(),
                                    quant: m.quant.clone(),
                                    mode,
                                    simd: simd.clone(),
                                    oracle: oracle.clone(),
                                    engine: engine.clone(),
                                };
                                let path = golden_path_for(&cell);
                                if !manifest.goldens.iter().any(|g| g.path == path) {
                                    let line = format!(
                                        "model {} prompt {} oracle {}: golden/{path} is not in the manifest",
                                        cell.model, cell.prompt, cell.oracle
                                    );
                                    if !missing.contains(&line) {
                                        missing.push(line);
                                    }
                                }
                                cells.push(cell);
                            }
                        }
                    }
                }
            }
        }
        if !missing.is_empty() {
            bail!(
                "{} golden(s) missing (a missing golden is a failure, not a skip):\n  {}",
                missing.len(),
                missing.join("\n  ")
            );
        }
        if cells.is_empty() {
            bail!("the run matrix with these filters has no cells");
        }
        Ok(cells)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::golden::GoldenEntry;

    const MATRIX: &str = r#"
modes = ["reference", "ggml"]
simd = ["off"]
oracles = ["llama.cpp-f32kv"]
engines = ["lockstep"]

[[models]]
id = "m"
quant = "Q4_1"
prompts = ["*"]
"#;

    fn entry(path: &str) -> GoldenEntry {
        let parts: Vec<&str> = path.split('/').collect();
        let v = serde_json::json!({
            "path": path, "sha256": "00", "model_id": parts[0], "model_sha256": "11", "model_file": "m.gguf",
            "arch": "llama", "prompt_id": parts[2].trim_end_matches(".npz"), "prompt": "text",
            "add_special": true, "parse_special": false, "oracle": {"name": "llama.cpp"}, "kv_type": "f32",
            "settings": {}, "n_prompt_tokens": 3, "n_decode_steps": 0, "continuation": "",
            "capture_changes_logits": 0.0, "arrays": {}
        });
        serde_json::from_value(v).unwrap()
    }

    fn manifest(paths: &[&str]) -> Manifest {
        Manifest {
            schema_version: 1,
            about: None,
            stage_map: Default::default(),
            goldens: paths.iter().map(|p| entry(p)).collect(),
            cross_oracle: Default::default(),
        }
    }

    fn small() -> Manifest {
        manifest(&[
            "m/llama.cpp-f32kv/prose.npz",
            "m/llama.cpp-f32kv/chat.npz",
            "m/llama.cpp-f16kv/prose.npz",
            "other/llama.cpp-f32kv/code.npz",
        ])
    }

    #[test]
    fn cell_id_and_golden_path() {
        let c = Cell {
            model: "smollm2-135m-q4_1".into(),
            prompt: "prose".into(),
            quant: "Q4_1".into(),
            mode: NumericsMode::Ggml,
            simd: "off".into(),
            oracle: "llama.cpp-f32kv".into(),
            engine: "lockstep".into(),
        };
        assert_eq!(
            c.id(),
            "smollm2-135m-q4_1/prose/Q4_1/ggml/simd-off/llama.cpp-f32kv/lockstep"
        );
        assert_eq!(
            golden_path_for(&c),
            "smollm2-135m-q4_1/llama.cpp-f32kv/prose.npz"
        );
    }

    /// The default tier runs each mode's `default_simd`; `--full` and any explicit `--simd` pick from every
    /// setting; `default_simd` must name matrix modes and settings of `simd`.
    #[test]
    fn the_default_tier_runs_each_modes_own_simd_settings() {
        let text = MATRIX
            .replace("simd = [\"off\"]", "simd = [\"off\", \"avx2\"]")
            .replace(
                "engines = [\"lockstep\"]",
                "engines = [\"lockstep\"]\n[default_simd]\nggml = [\"avx2\"]",
            );
        let m = Matrix::parse(&text, "test").unwrap();
        let f = Filters {
            prompt: vec!["chat".into()],
            ..Filters::default()
        };
        let got = |f: &Filters| -> Vec<String> {
            m.expand(&small(), f)
                .unwrap()
                .iter()
                .map(|c| format!("{}/{}", c.mode, c.simd))
                .collect()
        };
        assert_eq!(got(&f), ["reference/off", "reference/avx2", "ggml/avx2"]);
        let full = Filters {
            full: true,
            ..f.clone()
        };
        assert_eq!(
            got(&full),
            ["reference/off", "reference/avx2", "ggml/off", "ggml/avx2"]
        );
        let off = Filters {
            simd: vec!["off".into()],
            ..f.clone()
        };
        assert_eq!(got(&off), ["reference/off", "ggml/off"]);
        for (extra, needle) in [
            (
                "[default_simd]\nggml = [\"avx512\"]",
                "is not one of `simd`",
            ),
            ("[default_simd]\nrefrence = [\"off\"]", "not one of `modes`"),
            ("[default_simd]\nggml = []", "default_simd.ggml"),
        ] {
            let t = MATRIX.replace(
                "engines = [\"lockstep\"]",
                &format!("engines = [\"lockstep\"]\n{extra}"),
            );
            let e = format!("{:#}", Matrix::parse(&t, "ci/matrix.toml").unwrap_err());
            assert!(
                e.contains(needle) && e.contains("ci/matrix.toml"),
                "{extra}: {e}"
            );
        }
    }

    /// A user's model (not in the matrix, goldens in the manifest) runs by naming it: every prompt of its
    /// goldens, only the oracles it has goldens of; a model with no golden at all is still an error.
    #[test]
    fn a_model_the_matrix_does_not_list_runs_from_its_goldens_when_named() {
        let m = Matrix::parse(MATRIX, "test").unwrap();
        assert!(!m.models.iter().any(|x| x.id == "other"));
        let f = Filters {
            model: vec!["other".into()],
            ..Filters::default()
        };
        let ids: Vec<String> = m
            .expand(&small(), &f)
            .unwrap()
            .iter()
            .map(Cell::id)
            .collect();
        assert_eq!(
            ids,
            [
                "other/code/-/reference/simd-off/llama.cpp-f32kv/lockstep",
                "other/code/-/ggml/simd-off/llama.cpp-f32kv/lockstep",
            ]
        );
        // not named: not run
        assert!(m
            .expand(&small(), &Filters::default())
            .unwrap()
            .iter()
            .all(|c| c.model != "other"));
        let f = Filters {
            model: vec!["nobody".into()],
            ..Filters::default()
        };
        let e = format!("{:#}", m.expand(&small(), &f).unwrap_err());
        assert!(e.contains("--model \"nobody\" matches nothing"), "{e}");
    }

    #[test]
    fn wildcard_expands_from_the_manifest() {
        let m = Matrix::parse(MATRIX, "test").unwrap();
        let cells = m.expand(&small(), &Filters::default()).unwrap();
        let ids: Vec<String> = cells.iter().map(Cell::id).collect();
        assert_eq!(
            ids,
            [
                "m/chat/Q4_1/reference/simd-off/llama.cpp-f32kv/lockstep",
                "m/chat/Q4_1/ggml/simd-off/llama.cpp-f32kv/lockstep",
                "m/prose/Q4_1/reference/simd-off/llama.cpp-f32kv/lockstep",
                "m/prose/Q4_1/ggml/simd-off/llama.cpp-f32kv/lockstep",
            ]
        );
    }

    #[test]
    fn auto_simd_resolves_to_this_cpus_best_setting_once() {
        let text = MATRIX.replace(r#"simd = ["off"]"#, r#"simd = ["off", "auto", "avx2"]"#);
        assert_ne!(text, MATRIX);
        let m = Matrix::parse(&text, "test").unwrap();
        let best = lockstep_engine::Simd::detect().name();
        let mut want = vec!["off".to_string()];
        for v in [best, "avx2"] {
            if !want.iter().any(|w| w == v) {
                want.push(v.to_string());
            }
        }
        assert_eq!(m.simd_values(), want);
        let f = Filters {
            mode: vec!["ggml".into()],
            prompt: vec!["chat".into()],
            ..Filters::default()
        };
        let cells = m.expand(&small(), &f).unwrap();
        let simd: Vec<&str> = cells.iter().map(|c| c.simd.as_str()).collect();
        assert_eq!(simd, want);
        // the kernels each mode runs under `best` (reference mode's avx512 is its avx2)
        let runs = |c: &Cell| lockstep_engine::Simd::detect().for_mode(c.mode).name() == c.simd;
        let f = Filters {
            simd: vec![best.to_string()],
            ..Filters::default()
        };
        assert!(m.expand(&small(), &f).unwrap().iter().all(runs));
        // `--simd auto` is the setting `auto` resolves to
        let f = Filters {
            simd: vec!["auto".into()],
            ..Filters::default()
        };
        let auto = m.expand(&small(), &f).unwrap();
        assert!(!auto.is_empty() && auto.iter().all(runs));
    }

    /// Reference mode has no AVX-512 kernels: on a CPU with AVX-512 its `avx512` setting runs the `avx2`
    /// kernels, so it adds no cell beside `avx2` (named `avx2` alone), while ggml mode keeps all three.
    #[test]
    fn reference_mode_gets_one_cell_per_kernel_set() {
        if !lockstep_engine::Simd::Avx512.available() {
            return; // the setting cannot be listed on this CPU (the matrix refuses it)
        }
        let text = MATRIX.replace(r#"simd = ["off"]"#, r#"simd = ["off", "avx2", "avx512"]"#);
        let m = Matrix::parse(&text, "test").unwrap();
        let f = Filters {
            prompt: vec!["chat".into()],
            ..Filters::default()
        };
        let ids: Vec<String> = m
            .expand(&small(), &f)
            .unwrap()
            .iter()
            .map(|c| format!("{}/{}", c.mode, c.simd))
            .collect();
        assert_eq!(
            ids,
            [
                "reference/off",
                "reference/avx2",
                "ggml/off",
                "ggml/avx2",
                "ggml/avx512"
            ]
        );
        // asked for by name, reference mode's avx512 gives its avx2 cell
        let f = Filters {
            simd: vec!["avx512".into()],
            mode: vec!["reference".into()],
            prompt: vec!["chat".into()],
            ..Filters::default()
        };
        let cells = m.expand(&small(), &f).unwrap();
        assert_eq!(cells.len(), 1);
        assert_eq!(cells[0].simd, "avx2");
    }

    #[test]
    fn a_model_held_to_some_oracles_only_gets_their_cells() {
        let text = MATRIX.replace(
            r#"oracles = ["llama.cpp-f32kv"]"#,
            r#"oracles = ["llama.cpp-f32kv", "transformers-f32"]"#,
        ) + "\n[[models]]\nid = \"other\"\nquant = \"Q4_1\"\nprompts = [\"*\"]\noracles = [\"llama.cpp-f32kv\"]\n";
        let m = Matrix::parse(&text, "t").unwrap();
        let man = manifest(&[
            "m/llama.cpp-f32kv/prose.npz",
            "m/transformers-f32/prose.npz",
            "other/llama.cpp-f32kv/code.npz",
        ]);
        let cells = m.expand(&man, &Filters::default()).unwrap();
        let ids: Vec<(&str, &str)> = cells
            .iter()
            .map(|c| (c.model.as_str(), c.oracle.as_str()))
            .collect();
        assert!(ids.contains(&("m", "transformers-f32")));
        assert!(ids.contains(&("other", "llama.cpp-f32kv")));
        assert!(!ids.contains(&("other", "transformers-f32")));
        // filtered to transformers: the model without it drops out instead of failing the expansion
        let f = Filters {
            oracle: vec!["transformers-f32".into()],
            ..Filters::default()
        };
        let cells = m.expand(&man, &f).unwrap();
        assert!(cells
            .iter()
            .all(|c| c.model == "m" && c.oracle == "transformers-f32"));
        // a model's oracles must be the matrix's
        let bad = text.replace(
            "oracles = [\"llama.cpp-f32kv\"]\n",
            "oracles = [\"nope\"]\n",
        );
        let err = format!("{:#}", Matrix::parse(&bad, "t").unwrap_err());
        assert!(
            err.contains("\"nope\" is not one of the matrix's oracles"),
            "{err}"
        );
    }

    #[test]
    fn wildcard_resolves_per_oracle() {
        let text = MATRIX.replace(
            r#"oracles = ["llama.cpp-f32kv"]"#,
            r#"oracles = ["llama.cpp-f32kv", "llama.cpp-f16kv"]"#,
        );
        let m = Matrix::parse(&text, "test").unwrap();
        let f = Filters {
            mode: vec!["ggml".into()],
            ..Filters::default()
        };
        let cells = m.expand(&small(), &f).unwrap();
        let got: Vec<(String, String)> = cells
            .iter()
            .map(|c| (c.prompt.clone(), c.oracle.clone()))
            .collect();
        assert_eq!(
            got,
            [
                ("chat".into(), "llama.cpp-f32kv".into()),
                ("prose".into(), "llama.cpp-f32kv".into()),
                ("prose".into(), "llama.cpp-f16kv".into()),
            ]
        );
    }

    #[test]
    fn a_missing_golden_is_an_error_naming_it() {
        let text = MATRIX.replace(r#"prompts = ["*"]"#, r#"prompts = ["prose", "poem"]"#);
        let m = Matrix::parse(&text, "test").unwrap();
        let err = format!("{:#}", m.expand(&small(), &Filters::default()).unwrap_err());
        assert!(
            err.contains("model m prompt poem oracle llama.cpp-f32kv"),
            "{err}"
        );
        assert!(err.contains("golden/m/llama.cpp-f32kv/poem.npz"), "{err}");
        assert!(!err.contains("prose"), "{err}");

        let text = MATRIX.replace(r#"id = "m""#, r#"id = "nomodel""#);
        let m = Matrix::parse(&text, "test").unwrap();
        let err = format!("{:#}", m.expand(&small(), &Filters::default()).unwrap_err());
        assert!(err.contains("nomodel/llama.cpp-f32kv/*.npz"), "{err}");
    }

    #[test]
    fn filters_narrow_and_a_filter_matching_nothing_errors() {
        let m = Matrix::parse(MATRIX, "test").unwrap();
        let f = Filters {
            prompt: vec!["prose".into()],
            mode: vec!["ggml".into()],
            ..Filters::default()
        };
        let cells = m.expand(&small(), &f).unwrap();
        assert_eq!(cells.len(), 1);
        assert_eq!(
            cells[0].id(),
            "m/prose/Q4_1/ggml/simd-off/llama.cpp-f32kv/lockstep"
        );

        let f = Filters {
            prompt: vec!["prse".into()],
            ..Filters::default()
        };
        let err = m.expand(&small(), &f).unwrap_err().to_string();
        assert!(
            err.contains("--prompt \"prse\"") && err.contains("chat, prose"),
            "{err}"
        );
        let f = Filters {
            model: vec!["x".into()],
            ..Filters::default()
        };
        let err = m.expand(&small(), &f).unwrap_err().to_string();
        assert!(
            err.contains("--model \"x\"") && err.contains("available model values: m"),
            "{err}"
        );
        let f = Filters {
            oracle: vec!["llama.cpp-f16kv".into()],
            ..Filters::default()
        };
        let err = m.expand(&small(), &f).unwrap_err().to_string();
        assert!(
            err.contains("--oracle") && err.contains("llama.cpp-f32kv"),
            "{err}"
        );
        let f = Filters {
            simd: vec!["avx2".into()],
            ..Filters::default()
        };
        assert!(m
            .expand(&small(), &f)
            .unwrap_err()
            .to_string()
            .contains("available simd values: off"));
    }

    #[test]
    fn parse_rejects_bad_matrices() {
        let bad = |from: &str, to: &str| {
            let text = MATRIX.replace(from, to);
            format!("{:#}", Matrix::parse(&text, "ci/matrix.toml").unwrap_err())
        };
        assert!(bad(r#""ggml"]"#, r#""gml"]"#).contains("\"gml\" is not one of reference, ggml"));
        assert!(bad(r#"simd = ["off"]"#, "simd = []").contains("`simd` is empty"));
        assert!(bad(r#"prompts = ["*"]"#, r#"prompts = ["*", "x"]"#).contains("must stand alone"));
        assert!(bad(
            r#"engines = ["lockstep"]"#,
            r#"engines = ["lockstep", "lockstep"]"#
        )
        .contains("twice"));
        assert!(bad("modes", "mdoes").contains("ci/matrix.toml"));
    }
}
