//! The registered quantization variants (`[[variants]]` in models.toml) made by lockstep itself, on a
//! machine without cmake or a C++ compiler: every one must come out with its registered sha256.
//!
//! Ignored (it reads the real SmolLM2 model, ~100 MB, and writes ~1.5 GB of variants into a temporary
//! cache): `cargo test --release -p lockstep --test variants -- --ignored --nocapture`. The source model
//! is hard-linked (or copied) from the user's lockstep cache when it is there, else fetched once into
//! the temporary cache. Each variant is then made by a `lockstep fetch ID` child process whose `PATH`
//! holds only directories with none of `cmake`, `c++`, `g++`, `gcc`, `cc`, `clang` in them (so
//! llama-quantize could not be built, and `$LOCKSTEP_VARIANT_RECIPE` is unset), into an empty
//! `$LOCKSTEP_CACHE`, and its bytes are hashed here again. The test lists every variant that failed
//! (a type whose quantizer is not ported yet fails with an error naming it).

#![cfg(unix)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use lockstep::fetch::{cache_dir, fetch_into, model_path, variant_path, FetchOptions};
use lockstep::registry::Registry;

const TOOLS: [&str; 6] = ["cmake", "c++", "g++", "gcc", "cc", "clang"];

/// `$PATH` without the directories that hold a compiler or cmake.
fn path_without_compilers() -> String {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .filter(|d| !TOOLS.iter().any(|t| d.join(t).exists()))
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}

/// Puts the source model into `cache` (hard link or copy from the user's cache, else a fetch).
fn seed_source(reg: &Registry, source: &str, cache: &Path) -> PathBuf {
    let dst = model_path(cache, source);
    fs::create_dir_all(dst.parent().unwrap()).unwrap();
    let user = cache_dir().ok().map(|c| model_path(&c, source));
    if let Some(u) = user.filter(|u| u.is_file()) {
        if fs::hard_link(&u, &dst).is_err() {
            fs::copy(&u, &dst).unwrap();
        }
        return dst;
    }
    let opts = FetchOptions {
        recipe: None,
        ..FetchOptions::from_env()
    };
    fetch_into(reg.lookup(source).unwrap(), cache, &opts).unwrap()
}

#[test]
#[ignore = "real model: cargo test --release -p lockstep --test variants -- --ignored --nocapture"]
fn every_registered_variant_is_made_without_a_compiler_and_matches_its_sha256() {
    let reg = Registry::active().unwrap();
    assert!(!reg.variants.is_empty());
    let cache = tempfile::tempdir().unwrap();
    let path = path_without_compilers();
    for d in std::env::split_paths(&path) {
        for t in TOOLS {
            assert!(!d.join(t).exists(), "{t} in {}", d.display());
        }
    }
    let mut sources: Vec<&str> = reg.variants.iter().map(|v| v.source.as_str()).collect();
    sources.dedup();
    for s in sources {
        seed_source(&reg, s, cache.path());
    }
    let bin = env!("CARGO_BIN_EXE_lockstep");
    let mut failures = Vec::new();
    let t_all = Instant::now();
    for v in &reg.variants {
        let t0 = Instant::now();
        let out = Command::new(bin)
            .args(["fetch", &v.id])
            .env_clear()
            .env("PATH", &path)
            .env("HOME", cache.path())
            .env("LOCKSTEP_CACHE", cache.path())
            .output()
            .unwrap();
        let file = variant_path(cache.path(), v);
        let got = lockstep::hash::sha256_model(&file).ok();
        let secs = t0.elapsed().as_secs_f64();
        if out.status.success() && got.as_deref() == Some(v.sha256.as_str()) {
            eprintln!("{:<26} ok       {secs:6.1} s  {}", v.id, v.sha256);
        } else {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let last = stderr
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            eprintln!("{:<26} FAILED   {secs:6.1} s  {last}", v.id);
            failures.push(format!(
                "{} ({}): status {}, sha256 {:?}, want {}; {last}",
                v.id, v.qtype, out.status, got, v.sha256
            ));
        }
        let _ = fs::remove_file(&file); // keep the temporary cache small
    }
    eprintln!(
        "{} variants in {:.1} s",
        reg.variants.len(),
        t_all.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} of {} variants failed:\n{}",
        failures.len(),
        reg.variants.len(),
        failures.join("\n")
    );
}
