//! llama.cpp's `llama-bench` as an engine of the bench: the binary cached for this CPU, the flags the
//! bench sets itself, one `-r 1` run's JSON record parsed, and a model described as llama-bench names it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use lockstep_engine::Model;

use super::child::{run_child, ChildSetup, SampleOut, Sampler};
use super::{EngineSettings, Test};

/// The llama-bench `oracles/llamacpp/build_tools.sh` (in the checkout at `root`) cached for this CPU, if
/// it ran here: the script is asked with `LOCKSTEP_TOOLS_CACHED_ONLY=1` (it builds nothing) and prints the
/// tools directory last. None when it fails or the directory holds no `llama-bench`.
pub fn cached_llama_bench(root: &Path) -> Option<PathBuf> {
    let out = std::process::Command::new("bash")
        .arg(root.join("oracles/llamacpp/build_tools.sh"))
        .env("LOCKSTEP_TOOLS_CACHED_ONLY", "1")
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let dir = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()?
        .trim()
        .to_string();
    let p = PathBuf::from(dir).join("llama-bench");
    (out.status.success() && p.is_file()).then_some(p)
}

/// Flags of llama-bench that `lockstep bench` sets itself (model, test sizes, repetitions, threads,
/// output format); `--llama-bench-args` may not give them.
pub const LLAMA_BENCH_OWN_FLAGS: &[&str] = &[
    "-m",
    "--model",
    "-p",
    "--n-prompt",
    "-n",
    "--n-gen",
    "-pg",
    "-d",
    "--n-depth",
    "-r",
    "--repetitions",
    "-t",
    "--threads",
    "-o",
    "--output",
    "-oe",
    "--output-err",
];

/// Parse llama-bench's `-o json` output of one `-r 1` run of `test`: exactly one record, for that
/// test (`n_prompt`, `n_gen` and, when present, `n_depth` equal to the test's; an absent `n_depth` —
/// llama-bench before depths — only for depth 0), with exactly one positive sample in `samples_ns`.
/// Returns the nanoseconds and the record. `bin` names the program in errors.
///
/// Errors name the program, the record and the field: not JSON, no or several records (a list given in
/// `--llama-bench-args`), a record of another test (pp4096 where pp16 was asked), a sample of 0 ns.
pub fn parse_llama_bench_output(
    stdout: &[u8],
    test: Test,
    bin: &str,
) -> Result<(u64, serde_json::Value)> {
    let v: serde_json::Value =
        serde_json::from_slice(stdout).with_context(|| format!("{bin} printed no JSON"))?;
    let records = v
        .as_array()
        .with_context(|| format!("{bin} printed JSON that is not an array of test records"))?;
    if records.len() != 1 {
        bail!(
            "{bin} printed {} test records; one ({}) was asked for (no lists in --llama-bench-args)",
            records.len(),
            test.name()
        );
    }
    let rec = &records[0];
    let field = |k: &str| rec.get(k).and_then(serde_json::Value::as_u64);
    let (Some(p), Some(g)) = (field("n_prompt"), field("n_gen")) else {
        bail!(
            "{bin}'s record has no n_prompt or n_gen count (asked for {})",
            test.name()
        );
    };
    let d = match rec.get("n_depth") {
        None => 0,
        Some(x) => x
            .as_u64()
            .with_context(|| format!("{bin}'s record: n_depth {x} is not a count"))?,
    };
    let got = (p, g, d);
    let want = (test.n_prompt as u64, test.n_gen as u64, test.n_depth as u64);
    if got != want {
        let name = match (usize::try_from(p), usize::try_from(g), usize::try_from(d)) {
            (Ok(n_prompt), Ok(n_gen), Ok(n_depth)) => Test {
                n_prompt,
                n_gen,
                n_depth,
            }
            .name(),
            _ => format!("n_prompt {p}, n_gen {g}, n_depth {d}"),
        };
        bail!(
            "{bin}'s record is of test {name} (n_prompt {p}, n_gen {g}, n_depth {d}), but {} was asked for",
            test.name()
        );
    }
    let samples = rec
        .get("samples_ns")
        .and_then(serde_json::Value::as_array)
        .with_context(|| format!("{bin}'s record ({}) has no samples_ns", test.name()))?;
    if samples.len() != 1 {
        bail!(
            "{bin}'s record ({}) has {} samples_ns; it was run with -r 1",
            test.name(),
            samples.len()
        );
    }
    let ns = samples[0].as_u64().with_context(|| {
        format!(
            "{bin}'s record ({}): samples_ns[0] {} is not a count of nanoseconds",
            test.name(),
            samples[0]
        )
    })?;
    if ns == 0 {
        bail!(
            "{bin}'s record ({}): samples_ns[0] is 0 ns (no time cannot be turned into tokens/s)",
            test.name()
        );
    }
    Ok((ns, rec.clone()))
}

pub(crate) fn llama_sampler(
    bin: &Path,
    threads: usize,
    extra: &[String],
    setup: &ChildSetup,
) -> Sampler {
    let b = bin.to_path_buf();
    let extra = extra.to_vec();
    let setup = setup.clone();
    Sampler {
        settings: EngineSettings {
            engine: "llama.cpp".into(),
            mode: None,
            simd: None,
            binary: format!("{} {}", bin.display(), extra.join(" "))
                .trim()
                .to_string(),
        },
        run: Box::new(move |model: &Path, t: Test| {
            let mut cmd = Command::new(&b);
            cmd.arg("-m")
                .arg(model)
                .args(["-p", &t.n_prompt.to_string(), "-n", &t.n_gen.to_string()])
                .args([
                    "-d",
                    &t.n_depth.to_string(),
                    "-r",
                    "1",
                    "-t",
                    &threads.to_string(),
                ])
                .args(["-o", "json"])
                .args(&extra);
            let (stdout, peak_rss_bytes) = run_child(cmd, &setup, "llama-bench", &b)?;
            let (ns, rec) = parse_llama_bench_output(&stdout, t, &b.display().to_string())?;
            Ok(SampleOut {
                ns,
                record: Some(rec),
                peak_rss_bytes,
            })
        }),
    }
}

/// A model's llama-bench-style description: `<arch> <params> <file type>` (e.g. `llama 135M Q4_1`).
pub(crate) fn model_type(model: &Model, n_params: u64) -> String {
    let size = if n_params >= 1_000_000_000 {
        format!("{:.1}B", n_params as f64 / 1e9)
    } else {
        format!("{}M", (n_params as f64 / 1e6).round())
    };
    let ftype = model
        .gguf()
        .get_u32("general.file_type")
        .ok()
        .map_or_else(|| "?".to_string(), file_type_name);
    format!("{} {size} {ftype}", model.info().arch)
}

/// `llama_ftype` names (llama.h) for `general.file_type`.
pub(crate) fn file_type_name(ft: u32) -> String {
    let n = match ft {
        0 => "all F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K - Medium",
        11 => "Q3_K - Small",
        12 => "Q3_K - Medium",
        13 => "Q3_K - Large",
        14 => "Q4_K - Small",
        15 => "Q4_K - Medium",
        16 => "Q5_K - Small",
        17 => "Q5_K - Medium",
        18 => "Q6_K",
        25 => "IQ4_NL",
        30 => "IQ4_XS",
        32 => "BF16",
        _ => return format!("ftype {ft}"),
    };
    n.to_string()
}
