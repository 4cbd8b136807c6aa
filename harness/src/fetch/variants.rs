//! Quantization variants (models.toml `[[variants]]`): made from their source model in process by
//! lockstep's quantizer, or by the shell recipe `$LOCKSTEP_VARIANT_RECIPE` names; checked against the
//! registry's size and sha256 and cached beside the models.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use super::cache::{read_sidecar, remove_if_exists, FileStamp};
use super::{bytes_bar, fetch_into, fetch_synth_into, FetchOptions, CACHE_ENV, RECIPE_ENV};
use crate::registry::{Registry, VariantEntry};

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
/// model (a `[[models]]` entry fetched or a `[[synth]]` entry written first, if needed):
/// [`crate::quantize`], byte-identical to `oracles/llamacpp/make_variants.sh` (llama-quantize's F32
/// dequantization, then `--pure TYPE`), no llama.cpp needed. With `opts.recipe` set
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
    fetch_variants_in(variants, &Registry::active()?, cache_root, opts)
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
        if v.is_hf() {
            fetch_hf_copy(v, registry, cache_root, opts)?;
        } else if !variant_cached_ok(v, cache_root, opts)? {
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

/// The source model of variant `v` in the cache: a `[[synth]]` entry written or a `[[models]]` entry fetched.
fn source_path(
    source: &str,
    needed_by: &str,
    registry: &Registry,
    cache_root: &Path,
    opts: &FetchOptions,
) -> Result<PathBuf> {
    match registry.synth(source) {
        Some(s) => fetch_synth_into(s, cache_root, opts),
        None => {
            let entry = registry.lookup(source).with_context(|| {
                format!("cannot make the variant(s) {needed_by} without their source model")
            })?;
            fetch_into(entry, cache_root, opts)
        }
    }
}

/// Bytes of the files [`crate::hash::sha256_hf_dir`] covers in `dir`.
fn hf_dir_size(dir: &Path) -> Result<u64> {
    let mut n = 0;
    for f in crate::hash::hf_dir_files(dir)? {
        let p = dir.join(&f);
        n += fs::metadata(&p)
            .with_context(|| format!("cannot read {}", p.display()))?
            .len();
    }
    Ok(n)
}

/// Makes sure the Hugging Face copy `v` (type [`crate::registry::HF_TYPE`]) is in the cache
/// (`<cache>/variants/<source>/<source>-hf/`) and is the registered one: its digest
/// ([`crate::hash::sha256_hf_dir`]: a few MiB for the seeded models, rehashed every time) and the bytes of
/// the files it covers. A missing copy, or one that fails the check (deleted, with a message), is made in
/// process by `lockstep export-hf` of the source ([`crate::hf::export_hf`]) into a temporary directory
/// beside it, checked, then renamed into place.
///
/// Errors: the source cannot be fetched or exported; the copy made is not the registered one (both digests
/// named; it is deleted); the cache is not writable.
pub(crate) fn fetch_hf_copy(
    v: &VariantEntry,
    registry: &Registry,
    cache_root: &Path,
    _opts: &FetchOptions,
) -> Result<PathBuf> {
    let path = variant_path(cache_root, v);
    let matches = |dir: &Path| -> Result<(bool, String, u64)> {
        let sha = crate::hash::sha256_hf_dir(dir)?;
        let size = hf_dir_size(dir)?;
        Ok((sha == v.sha256 && size == v.size, sha, size))
    };
    if path.is_dir() {
        match matches(&path) {
            Ok((true, _, _)) => return Ok(path),
            Ok((false, sha, size)) => eprintln!(
                "lockstep: cached {} has digest {sha} ({size} bytes), models.toml says {} ({} bytes) for `{}`; \
                 deleting it",
                path.display(),
                v.sha256,
                v.size,
                v.id
            ),
            Err(e) => eprintln!(
                "lockstep: cached {} is not a complete copy ({e:#}); deleting it",
                path.display()
            ),
        }
        fs::remove_dir_all(&path).with_context(|| format!("cannot remove {}", path.display()))?;
    } else if path.exists() {
        bail!(
            "{} is in the way of the cached Hugging Face copy and is not a directory; remove it",
            path.display()
        );
    }
    let src = source_path(&v.source, &v.id, registry, cache_root, _opts)?;
    let parent = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.partial-", v.id))
        .tempdir_in(parent)
        .with_context(|| format!("cannot write in {}", parent.display()))?;
    eprintln!(
        "lockstep: making {} (the Hugging Face copy of `{}`: lockstep export-hf, in process)",
        path.display(),
        v.source
    );
    crate::hf::export_hf(&src, tmp.path())
        .with_context(|| format!("cannot make the Hugging Face copy `{}`", v.id))?;
    let (ok, sha, size) = matches(tmp.path())?;
    if !ok {
        bail!(
            "the Hugging Face copy of `{}` made by lockstep export-hf is not the registered `{}`: digest {sha} \
             ({size} bytes), models.toml says {} ({} bytes); it was deleted",
            v.source,
            v.id,
            v.sha256,
            v.size
        );
    }
    let made = tmp.keep();
    fs::rename(&made, &path)
        .with_context(|| format!("cannot move {} to {}", made.display(), path.display()))?;
    Ok(path)
}

/// Makes `variants` (all of `source`) with lockstep's quantizer and verifies each.
pub(crate) fn make_in_process(
    source: &str,
    variants: &[&VariantEntry],
    registry: &Registry,
    cache_root: &Path,
    opts: &FetchOptions,
) -> Result<()> {
    let src_path = match registry.synth(source) {
        Some(s) => fetch_synth_into(s, cache_root, opts)?,
        None => {
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
            fetch_into(entry, cache_root, opts)?
        }
    };
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
pub(crate) fn check_made(
    v: &VariantEntry,
    cache_root: &Path,
    opts: &FetchOptions,
    maker: &str,
) -> Result<()> {
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
pub(crate) fn run_recipe(
    source: &str,
    types: &[&str],
    cache_root: &Path,
    opts: &FetchOptions,
) -> Result<()> {
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
pub(crate) fn variant_cached_ok(
    v: &VariantEntry,
    cache_root: &Path,
    opts: &FetchOptions,
) -> Result<bool> {
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
