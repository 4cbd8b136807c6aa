//! The opt-in paths that compile llama.cpp (oracles/llamacpp/build_tools.sh for llama-bench,
//! llama-quantize and llama-perplexity; setup.sh for the oracle's llama-cpp-python wheel) check for cmake
//! and a C++ compiler before any other work: without them they exit 2 in a second with the command that
//! installs them, download nothing and leave nothing in the cache.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A directory of symlinks to the tools the scripts use before their toolchain check — every one but
/// cmake, c++, g++, gcc and cc — to serve as the whole PATH.
fn path_without_toolchain() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let tools = [
        "bash",
        "sed",
        "grep",
        "cut",
        "xargs",
        "sha256sum",
        "printf",
        "id",
        "dirname",
        "mkdir",
        "cat",
        "head",
        "tail",
        "tr",
        "echo",
        "nproc",
        "rm",
        "ls",
    ];
    let path = std::env::var_os("PATH").unwrap_or_default();
    for t in tools {
        if let Some(p) = std::env::split_paths(&path)
            .map(|d| d.join(t))
            .find(|p| p.is_file())
        {
            std::os::unix::fs::symlink(p, dir.path().join(t)).unwrap();
        }
    }
    // python3 itself, not a version manager's shim that needs its own tools on PATH
    let py = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 runs");
    let py = String::from_utf8(py.stdout).unwrap();
    std::os::unix::fs::symlink(py.trim(), dir.path().join("python3")).unwrap();
    for t in ["cmake", "c++", "g++"] {
        assert!(!dir.path().join(t).exists());
    }
    dir
}

fn check_refuses(script: &str, env: &[(&str, &str)]) {
    let bin = path_without_toolchain();
    let cache = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let out = std::process::Command::new(bin.path().join("bash"))
        .arg(root().join(script))
        .env("PATH", bin.path())
        .env("LOCKSTEP_CACHE", cache.path())
        .env("LOCKSTEP_NO_INSTALL", "1")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let took = t.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{script}: {stderr}");
    assert!(
        stderr.contains("cmake") && stderr.contains("apt-get install -y cmake g++"),
        "{script}: {stderr}"
    );
    // nothing downloaded: no source distribution, no wheel in the cache
    let mut stack = vec![cache.path().to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let name = p.file_name().unwrap().to_string_lossy().to_string();
                assert!(
                    !name.ends_with(".tar.gz") && !name.ends_with(".whl"),
                    "{script} downloaded {} before its toolchain check",
                    p.display()
                );
            }
        }
    }
    // a generous bound for a check that takes milliseconds: what matters is "not a build 15 minutes in"
    assert!(took < Duration::from_secs(60), "{script} took {took:?}");
}

#[test]
fn build_tools_without_cmake_stops_at_once_with_the_install_command() {
    check_refuses("oracles/llamacpp/build_tools.sh", &[]);
}

#[test]
fn oracle_setup_without_cmake_stops_before_building_the_wheel() {
    if std::process::Command::new("python3")
        .args(["-c", "import venv, ensurepip"])
        .status()
        .map_or(true, |s| !s.success())
    {
        panic!("python3 with venv and ensurepip is needed by this test (and by oracles/llamacpp/setup.sh)");
    }
    check_refuses("oracles/llamacpp/setup.sh", &[]);
}
