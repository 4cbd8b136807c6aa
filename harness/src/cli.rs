//! Command-line interface of the `lockstep` binary. Each subcommand is a thin wrapper over a library module.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use lockstep_engine::sample::SamplerConfig;
use lockstep_engine::GgmlTarget;
use lockstep_engine::{NumericsMode, Simd};

pub use crate::checkout::{find_checkout_root, is_checkout_root, Defaults, ROOT_ENV};
pub use crate::prompt::{read_prompt_file, MAX_PROMPT_FILE_BYTES};
pub use crate::session::load_model;
use crate::{dump, fetch, registry};
use lockstep_engine::Numerics;

/// lockstep: hold an LLM inference engine to reference goldens, stage by stage.
#[derive(Debug, Parser)]
#[command(name = "lockstep", version, about)]
pub struct Cli {
    /// Worker threads for the engine: 1 up to this machine's cores; 0 or absent = all cores (reports
    /// record the number used). Results do not depend on it.
    #[arg(long, global = true)]
    pub threads: Option<usize>,
    /// The lockstep checkout whose files give the default paths (golden/, ci/*.toml, ci/floors.json,
    /// reports/). Default: $LOCKSTEP_ROOT, else the nearest directory at or above the working directory
    /// that holds models.toml and ci/. Never the directory the binary was built in.
    #[arg(long, global = true, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// A user registry file (the models.toml format: `[[synth]]` with other seeds, `[[models]]`,
    /// `[[variants]]`, ...) read after the checkout's models.toml and $LOCKSTEP_REGISTRY's files
    /// (repeatable). Read at run time: no rebuild. Ids must not repeat across files.
    #[arg(long = "registry", global = true, value_name = "FILE")]
    pub registry: Vec<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
// parsed once per process: the size of the largest variant (`run`'s flags) costs nothing
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Download (a model) or make (a quantization variant), verify and cache registered files; prints their
    /// paths, one a line, in the order given.
    Fetch {
        /// Model or variant ids from models.toml (`lockstep fetch --list` shows them). Missing variants are
        /// made in process by lockstep's quantizer (as `lockstep quantize`), or by the shell recipe named in
        /// $LOCKSTEP_VARIANT_RECIPE (e.g. oracles/llamacpp/make_variants.sh, one call per source).
        ids: Vec<String>,
        /// Rehash the cached file even when its verified-hash sidecar matches.
        #[arg(long)]
        verify: bool,
        /// List the registered models (and corpora).
        #[arg(long)]
        list: bool,
        /// Fetch this registered corpus (models.toml `[[corpora]]`) instead of a model.
        #[arg(long, conflicts_with_all = ["ids", "list"])]
        corpus: Option<String>,
    },
    /// Quantization quality over a text corpus, as `llama-perplexity --kl-divergence`: Mean PPL, KLD with
    /// percentiles, Δp, Same top p for each variant against the F32 base; writes
    /// reports/<run id>/quality.{json,md,csv}.
    Quality(QualityArgs),
    /// Generate text from a prompt, streamed to stdout.
    Generate(GenerateArgs),
    /// Run token ids through the engine and write every stage and the logits to an .npz (the dump format).
    Dump(DumpArgs),
    /// Run the matrix against the goldens, write reports/<run-id>/, and gate (exit 1 on failure).
    Run(RunArgs),
    /// Gate an existing report.json against thresholds, or a bench.json against the speed limits: one
    /// line per failing cell or check, exit 1 on failure.
    Gate {
        /// The report.json to gate.
        #[arg(required_unless_present = "speed", conflicts_with = "speed")]
        report: Option<PathBuf>,
        /// Re-evaluate with this thresholds file (default: the verdicts recorded in the report).
        #[arg(long, conflicts_with = "speed")]
        thresholds: Option<PathBuf>,
        /// Gate this bench.json (`lockstep bench`) on speed instead: every ratio's 95% interval against
        /// ci/speed.toml.
        #[arg(long)]
        speed: Option<PathBuf>,
        /// With --speed: also hold lockstep/llama.cpp to the same ratio in this earlier bench.json.
        #[arg(long, requires = "speed")]
        baseline: Option<PathBuf>,
        /// With --speed: the limits file (default ci/speed.toml).
        #[arg(long, requires = "speed")]
        speed_limits: Option<PathBuf>,
        /// With --speed: also hold each lockstep row's share of the machine (prefill: of the FMA peak;
        /// decode: of the read bandwidth) to this speed floors file (e.g. ci/speed-floors.toml).
        #[arg(long, requires = "speed")]
        speed_floors: Option<PathBuf>,
        /// Also write the verdicts as JUnit XML to this file (one testcase per cell, the failure line as
        /// its message).
        #[arg(long, conflicts_with = "speed")]
        junit: Option<PathBuf>,
    },
    /// Publish the reports of a directory as a static site (plain HTML + CSS, SVG charts, relative
    /// links): an index of runs, a page per run, a bench page with the ratios over commits.
    Publish {
        /// The reports directory (default: the checkout's reports/).
        reports_dir: Option<PathBuf>,
        /// The site directory to write (replaced when it is a site lockstep wrote earlier).
        #[arg(long)]
        out: PathBuf,
    },
    /// Merge the reports of every shard of a split run (`lockstep run --shard I/N`) into the report the
    /// whole run writes: reports/<new run id>/. Exit 0 once written (gate it with `lockstep gate`).
    Merge {
        /// The shards' report.json files (or their report directories), one per shard, any order.
        #[arg(required = true)]
        shards: Vec<PathBuf>,
        /// Where reports/<run-id>/ goes.
        #[arg(long)]
        reports: Option<PathBuf>,
        /// The thresholds file the shards were run with (default: the checkout's ci/thresholds.toml):
        /// every cell is judged again with it, and a recorded verdict its metrics do not give is refused.
        #[arg(long)]
        thresholds: Option<PathBuf>,
    },
    /// Tokens per second of our engine beside llama-bench (and a baseline lockstep binary), interleaved
    /// run by run; writes reports/bench-<run id>/bench.{json,md,csv}.
    Bench(BenchArgs),
    /// One timed sample of `lockstep bench` (internal: prints nanoseconds).
    #[command(hide = true)]
    BenchSample(BenchSampleArgs),
    /// Find the first stage where the engine computes something else than the golden, with each layer's
    /// reference input injected, and say whether it is a bug of one stage or accumulated drift.
    ///
    /// Exit status: 0 when no bug is found — no divergence, or a gap the floors explain (oracle-side
    /// rounding, accumulated drift: numerical sensitivity, not a bug); 1 for a bug — a structural finding, a
    /// tokenization that differs from the golden's, or a failing gate on a golden that stores no layer
    /// output and so cannot localize it; 2 for an error (bad input, missing file).
    Bisect(BisectArgs),
    /// Measure the stage floors of the modes that are not bit-exact (bisect's local pass of the unbroken
    /// engine on every golden of the matrix) and write them (ci/floors.json).
    Floors(FloorsArgs),
    /// Print the `[[rule]]`s of ci/thresholds.toml that hold reference mode against llama.cpp to llama.cpp's own
    /// measured distance from transformers, derived from golden/manifest.json's `cross_oracle` records
    /// (oracles/yardstick/measure.sh --record), a comment per number (harness/src/gate/yardstick.rs).
    Yardstick(YardstickArgs),
    /// Quantize a model as `llama-quantize --pure` does, byte for byte, without llama.cpp: by default
    /// lockstep's variant recipe (an exact F32 dequantization of the model, then `--pure TYPE`, the files
    /// `[[variants]]` in models.toml register); written atomically to --out.
    Quantize(QuantizeArgs),
    /// Write a tiny seeded model (2 blocks, widths that are multiples of 256, F32 weights, a real tokenizer
    /// block — byte-level BPE, WordPiece for bert — the tensor names and metadata keys llama.cpp's converter
    /// writes): the same
    /// architecture and seed give the same bytes on every machine. Prints the path, size and sha256.
    /// `--arch whisper` (no GGUF form) writes a Hugging Face checkpoint directory instead: --out is the
    /// directory (config.json, model.safetensors, tokenizer.json, preprocessor_config.json), and the
    /// printed registry entry is a `[[checkpoints]]` one.
    Synth {
        /// `general.architecture` to write (lockstep_engine::synth::SYNTH_ARCHS: llama, qwen2, qwen3, gemma2,
        /// gemma3, gemma4, starcoder2, stablelm, phi3, gpt2, bert), or `whisper` (an HF checkpoint
        /// directory, see --out).
        #[arg(long)]
        arch: String,
        /// Weight seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// The file to write (replaced atomically when it exists); with `--arch whisper`, the checkpoint
        /// directory to write (created if missing).
        #[arg(long)]
        out: PathBuf,
        /// Also write the Hugging Face copy of the model into this directory (`lockstep export-hf`:
        /// config.json, model.safetensors, tokenizer.json, tokenizer_config.json). Refused with
        /// `--arch whisper`, whose --out already is the Hugging Face checkpoint.
        #[arg(long)]
        hf_out: Option<PathBuf>,
    },
    /// Write the Hugging Face copy of a GGUF model (every architecture the engine implements): config.json
    /// (the transformers class's config), model.safetensors (F32/F16/BF16 as stored, quantized tensors
    /// dequantized to F32 as the engine reads them), tokenizer.json and tokenizer_config.json, so
    /// transformers' `from_pretrained(dir)`, safetensors-loading engines and lockstep itself run the same
    /// weights.
    ExportHf {
        #[command(flatten)]
        model: ModelArg,
        /// The directory to write config.json, model.safetensors and the tokenizer files into (created if
        /// missing).
        #[arg(long)]
        out: PathBuf,
    },
    /// Describe a GGUF file or a Hugging Face checkpoint directory: name, architecture, size, parameters,
    /// bits per weight and the tensors of each ggml type; for a directory its class, digest and the tensors
    /// held as derived copies in memory (JSON with --json).
    Inspect {
        #[command(flatten)]
        model: ModelArg,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Our engine behind the session protocol (JSON lines on stdin/stdout; see the README, "Plugging in
    /// another engine"): what `run --engine-serve "lockstep serve"` drives, one model per process.
    Serve {
        #[command(flatten)]
        simd: SimdArg,
    },
    /// Print the token ids of a prompt, as the engine (and llama.cpp) tokenizes it.
    Tokenize {
        #[command(flatten)]
        model: ModelArg,
        /// Text to tokenize.
        #[arg(
            long,
            conflicts_with = "prompt_file",
            required_unless_present = "prompt_file"
        )]
        prompt: Option<String>,
        /// Read the text to tokenize from this file (UTF-8, used byte for byte).
        #[arg(long)]
        prompt_file: Option<PathBuf>,
        /// Recognise control-token text such as `<|im_start|>` (llama_tokenize's parse_special).
        #[arg(long)]
        parse_special: bool,
    },
}

/// `--model`: a registry id or a path to a local GGUF file.
#[derive(Debug, Args)]
pub struct ModelArg {
    /// Model id from models.toml (fetched on first use), a path to a .gguf file, or a Hugging Face checkpoint
    /// directory (config.json, model.safetensors or a sharded index, tokenizer.json).
    #[arg(long)]
    pub model: String,
}

/// `--simd`: the kernels of our engine.
#[derive(Debug, Args)]
pub struct SimdArg {
    /// Kernel instruction set of our engine: `off` (portable scalar), `avx2`, `avx512`, or `auto` (the best
    /// this CPU runs). Ggml mode gives the same bits with every setting; reference mode sums in one order
    /// with `off` and another with any SIMD setting.
    #[arg(long, default_value = "auto", value_parser = parse_simd)]
    pub simd: Simd,
}

/// `--ggml-target` and `--simd` of a command that runs our engine on a prompt (`generate`, `dump`).
#[derive(Debug, Args)]
pub struct KernelArgs {
    /// The llama.cpp build ggml mode mirrors: `avx2`, `avx512` (with AVX512-BF16) or `avx512-nobf16`
    /// (default: this machine's).
    #[arg(long)]
    pub ggml_target: Option<GgmlTarget>,
    #[command(flatten)]
    pub simd: SimdArg,
}

impl KernelArgs {
    /// The session settings with numerics mode `mode` (the ggml target defaults to this machine's).
    pub fn numerics(&self, mode: NumericsMode) -> Numerics {
        Numerics {
            mode,
            target: self.ggml_target.unwrap_or_else(GgmlTarget::host),
            simd: self.simd.simd,
        }
    }
}

/// `--golden-dir` and `--matrix`: the goldens and the matrix a command runs over (default `golden/` and
/// `ci/matrix.toml` of the checkout).
#[derive(Debug, Args)]
pub struct MatrixFiles {
    /// The golden directory.
    #[arg(long)]
    pub golden_dir: Option<PathBuf>,
    /// The matrix file.
    #[arg(long)]
    pub matrix: Option<PathBuf>,
}

/// `--floors`: the measured floors a command judges with.
#[derive(Debug, Args)]
pub struct FloorsArg {
    /// The measured floors of modes that are not bit-exact (default ci/floors.json; `lockstep floors`).
    #[arg(long)]
    pub floors: Option<PathBuf>,
}

/// Arguments of `lockstep quantize`.
#[derive(Debug, Args)]
pub struct QuantizeArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// Output type, as llama-quantize names it: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K
    /// Q6_K IQ4_NL IQ4_XS.
    #[arg(long = "type", value_name = "TYPE")]
    pub qtype: String,
    /// The file to write (replaced atomically when it exists).
    #[arg(long)]
    pub out: PathBuf,
    /// Convert in one step, as `llama-quantize --pure --allow-requantize MODEL OUT TYPE`: tensors that
    /// already have their target type are copied instead of going through F32.
    #[arg(long)]
    pub direct: bool,
}

/// Arguments of `lockstep generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// Prompt text (tokenized with add_special = true). With `--audio`: the decoder prompt (default
    /// [`WHISPER_PROMPT`]).
    #[arg(long, required_unless_present = "audio")]
    pub prompt: Option<String>,
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 64)]
    pub n: usize,
    /// Sampling temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// Top-k cut (0 = off).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Top-p (nucleus) cut.
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Numerics mode: `reference` or `ggml`.
    #[arg(long, default_value = "ggml")]
    pub mode: NumericsMode,
    #[command(flatten)]
    pub kernels: KernelArgs,
    /// Recognise control-token text in the prompt.
    #[arg(long)]
    pub parse_special: bool,
    /// Transcribe this 16 kHz mono WAV file with a speech model (Whisper): the log-mel of the file, the
    /// encoder once, then greedy decoding (sampling flags are not used) from the prompt — by default
    /// Whisper's `<|startoftranscript|><|en|><|transcribe|><|notimestamps|>`, control tokens parsed —
    /// until `<|endoftext|>` or `-n` tokens. Prints the token ids, then the text.
    #[arg(long)]
    pub audio: Option<PathBuf>,
}

/// The decoder prompt of `generate --audio` when none is given: an English transcription without
/// timestamps (HF `WhisperForConditionalGeneration.generate`'s forced decoder ids).
pub const WHISPER_PROMPT: &str = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>";

/// Arguments of `lockstep dump`.
#[derive(Debug, Args)]
pub struct DumpArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// Prompt text, tokenized as llama.cpp's llama_tokenize(add_special=true, parse_special=false).
    #[arg(long, conflicts_with = "tokens", required_unless_present = "tokens")]
    pub prompt: Option<String>,
    /// Comma-separated token ids, used as given.
    #[arg(long, value_delimiter = ',')]
    pub tokens: Option<Vec<u32>>,
    /// Numerics mode: `reference` or `ggml`.
    #[arg(long, default_value = "reference")]
    pub mode: NumericsMode,
    #[command(flatten)]
    pub kernels: KernelArgs,
    /// Recognise control-token text in the prompt.
    #[arg(long)]
    pub parse_special: bool,
    /// Output .npz path.
    #[arg(long)]
    pub out: PathBuf,
}

/// Arguments of `lockstep bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Model ids or GGUF paths (repeatable).
    #[arg(long, required_unless_present = "matrix")]
    pub model: Vec<String>,
    /// Every model of a matrix file (default ci/matrix.toml), after the --model ones; an encoder runs
    /// the prompt tests only.
    #[arg(long, num_args = 0..=1, default_missing_value = "ci/matrix.toml")]
    pub matrix: Option<PathBuf>,
    /// Also write the speed floors of this bench's lockstep rows to this file (e.g.
    /// ci/speed-floors.toml, which `lockstep gate --speed BENCH --speed-floors FILE` holds later benches to),
    /// as the section of the SIMD kind they ran (`--simd`); an existing file's other kinds are kept.
    #[arg(long)]
    pub write_speed_floors: Option<PathBuf>,
    /// Prompt sizes (llama-bench's -p), comma-separated; 0 = none.
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    pub n_prompt: Vec<usize>,
    /// Generation sizes (llama-bench's -n), comma-separated; 0 = none.
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    pub n_gen: Vec<usize>,
    /// Context depths (llama-bench's -d), comma-separated.
    #[arg(
        short = 'd',
        long = "n-depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    pub n_depth: Vec<usize>,
    /// Repetitions per engine and test (llama-bench's -r).
    #[arg(short = 'r', long, default_value_t = 5)]
    pub repetitions: usize,
    /// Our engine's numerics mode.
    #[arg(long, default_value = "ggml")]
    pub mode: NumericsMode,
    #[command(flatten)]
    pub simd: SimdArg,
    /// llama-bench to interleave with (default: the one oracles/llamacpp/build_tools.sh cached for this
    /// CPU, if any).
    #[arg(long)]
    pub llama_bench: Option<PathBuf>,
    /// Run without llama.cpp.
    #[arg(long, conflicts_with = "llama_bench")]
    pub no_llama: bool,
    /// Extra arguments for llama-bench (e.g. "-fa 0"), split on spaces; not the flags the bench sets
    /// itself (-m, -p, -n, -d, -r, -t, -o).
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub llama_bench_args: String,
    /// A baseline lockstep binary to interleave with ours (e.g. the previous commit's build).
    #[arg(long)]
    pub baseline_bin: Option<PathBuf>,
    /// The baseline's SIMD setting.
    #[arg(long, default_value = "auto", value_parser = parse_simd)]
    pub baseline_simd: Simd,
    /// The baseline's numerics mode (default: `--mode`); e.g. `--mode reference --baseline-bin <this
    /// binary> --baseline-mode ggml` times reference mode against ggml mode side by side.
    #[arg(long, requires = "baseline_bin")]
    pub baseline_mode: Option<NumericsMode>,
    /// Where bench-<run id>/ goes.
    #[arg(long)]
    pub reports: Option<PathBuf>,
    /// Seconds one sample (one llama-bench or bench-sample process) may take before its process group
    /// is killed and the bench fails.
    #[arg(long, default_value_t = 1800.0, value_parser = positive_seconds)]
    pub engine_timeout: f64,
}

/// Arguments of `lockstep bench-sample`.
#[derive(Debug, Args)]
pub struct BenchSampleArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// Prompt tokens.
    #[arg(short = 'p', default_value_t = 0)]
    pub n_prompt: usize,
    /// Generated tokens.
    #[arg(short = 'n', default_value_t = 0)]
    pub n_gen: usize,
    /// Depth.
    #[arg(short = 'd', default_value_t = 0)]
    pub n_depth: usize,
    /// Numerics mode.
    #[arg(long, default_value = "ggml")]
    pub mode: NumericsMode,
    #[command(flatten)]
    pub simd: SimdArg,
}

/// Arguments of `lockstep quality`.
#[derive(Debug, Args)]
pub struct QualityArgs {
    /// The base GGUF (F32). Default with --variants-dir: its `*-F32.gguf`.
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// A variant GGUF (repeatable), labelled by the text after the last `-` of its file name.
    #[arg(long)]
    pub variant: Vec<PathBuf>,
    /// A directory of variants named `*-<TYPE>.gguf` (as oracles/llamacpp/make_variants.sh writes them).
    #[arg(long)]
    pub variants_dir: Option<PathBuf>,
    /// With --variants-dir: the types to score, comma-separated; each must have its `*-<TYPE>.gguf` in the
    /// directory (an unknown type is an error listing the ones there, before anything is scored). Default:
    /// those of F16,BF16,Q8_0,Q6_K,Q5_K,Q5_1,Q5_0,Q4_K,Q4_1,Q4_0,IQ4_NL,IQ4_XS,Q3_K,Q2_K the directory holds.
    #[arg(long, value_delimiter = ',', requires = "variants_dir")]
    pub types: Option<Vec<String>>,
    /// The text: a registered corpus id (models.toml `[[corpora]]`) or a local UTF-8 file.
    #[arg(long, default_value = "alice29")]
    pub corpus: String,
    /// Tokens per chunk (llama-perplexity -c).
    #[arg(long = "ctx", default_value_t = 512)]
    pub n_ctx: usize,
    /// Chunks to score, from the start (llama-perplexity --chunks); 0 = all.
    #[arg(long, default_value_t = 0)]
    pub chunks: usize,
    /// Numerics mode. ggml (default) reproduces llama.cpp's CPU arithmetic (activations quantized for the
    /// dot products as ggml does), so the figures measure what llama-perplexity measures.
    #[arg(long, default_value = "ggml")]
    pub mode: NumericsMode,
    #[command(flatten)]
    pub simd: SimdArg,
    /// Chunks (from the first) whose full base rows are kept to measure the gap of the cached KLD to the
    /// full-row KL (50 MB each for a 49k vocabulary).
    #[arg(long, default_value_t = 1)]
    pub full_kl_chunks: usize,
    /// Base tokens whose log-probability is within this many nats of the top one are stored per scored
    /// position (raw logits; the rest as one tail mass).
    #[arg(long, default_value_t = crate::quality::WINDOW)]
    pub window: f64,
    /// At most this many base tokens are stored per scored position (the most probable).
    #[arg(long, default_value_t = crate::quality::MAX_KEPT)]
    pub max_kept: usize,
    /// Cross-check with this llama-perplexity binary (`--kl-divergence` on the same text and chunks).
    #[arg(long)]
    pub check_llama_perplexity: Option<PathBuf>,
    /// With --check-llama-perplexity: the variant types to check, comma-separated; each must be a
    /// variant of the run (checked before anything is scored). Default: those of Q8_0,Q4_0 in the run.
    #[arg(long, value_delimiter = ',', requires = "check_llama_perplexity")]
    pub check_types: Option<Vec<String>>,
    /// Seconds one llama-perplexity run may take before its process group is killed (default 6 h).
    #[arg(long, default_value_t = 21600.0, value_parser = positive_seconds)]
    pub engine_timeout: f64,
    /// Where reports/<run-id>/ goes (default reports/ of the checkout); `--reports` as in `run`, `merge`
    /// and `bench` (`--reports-dir`, its older spelling, is accepted).
    #[arg(long, alias = "reports-dir")]
    pub reports: Option<PathBuf>,
}

/// Arguments of `lockstep floors`.
#[derive(Debug, Args)]
pub struct FloorsArgs {
    /// Only these models (repeatable); the other models' floors are kept from the existing file.
    #[arg(long)]
    pub model: Vec<String>,
    /// Only the goldens of these oracles (repeatable: `llama.cpp-f32kv`, `transformers-f32`); the other
    /// oracles' floors are kept from the existing file.
    #[arg(long)]
    pub oracle: Vec<String>,
    #[command(flatten)]
    pub files: MatrixFiles,
    /// The thresholds file (cells whose thresholds set `stage_floor_headroom` are measured).
    #[arg(long)]
    pub thresholds: Option<PathBuf>,
    /// Where to write the floors.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Measure a session engine's floors instead of ours (a model our engine cannot load: an HF checkpoint
    /// of another architecture, with the unbroken external engine that is held to it).
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// Arguments of `lockstep yardstick`.
#[derive(Debug, Args)]
pub struct YardstickArgs {
    /// Only these models (repeatable; default: every model with a record).
    #[arg(long)]
    pub model: Vec<String>,
    /// The golden directory whose manifest holds the records.
    #[arg(long)]
    pub golden_dir: Option<PathBuf>,
}

/// Arguments of `lockstep bisect`.
#[derive(Debug, Args)]
pub struct BisectArgs {
    /// Model id (its goldens are under golden/<id>/).
    #[arg(long)]
    pub model: String,
    /// Prompt id of the golden.
    #[arg(long)]
    pub prompt: String,
    /// Numerics mode: `reference` or `ggml`.
    #[arg(long, default_value = "ggml")]
    pub mode: NumericsMode,
    /// Oracle directory of the golden.
    #[arg(long, default_value = "llama.cpp-f32kv")]
    pub oracle: String,
    /// Mirror this ggml-cpu build (`avx2`, `avx512-nobf16`, `avx512`) instead of the one the golden records.
    #[arg(long)]
    pub ggml_target: Option<GgmlTarget>,
    /// The golden directory.
    #[arg(long)]
    pub golden_dir: Option<PathBuf>,
    /// The thresholds file.
    #[arg(long)]
    pub thresholds: Option<PathBuf>,
    #[command(flatten)]
    pub floors: FloorsArg,
    /// Also write the full result (both passes' comparisons) as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    #[command(flatten)]
    pub simd: SimdArg,
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// `--engine-serve`, `--stage-map`, `--engine-timeout`: an external engine behind the session protocol.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Run this session engine instead of ours: a command (split on whitespace, no shell) that speaks the
    /// session protocol on stdin/stdout (README: "Plugging in another engine"), e.g. "lockstep serve".
    #[arg(long)]
    pub engine_serve: Option<String>,
    /// With --engine-serve: a TOML map from the engine's own stage names to canonical ids.
    #[arg(long, requires = "engine_serve")]
    pub stage_map: Option<PathBuf>,
    /// Seconds one external-engine call (one answer of a session engine) may take before its process
    /// group is killed.
    #[arg(long, default_value_t = 1800.0, value_parser = positive_seconds)]
    pub engine_timeout: f64,
}

impl ServeArgs {
    /// The session engine to run, if any (the stage map read and checked now).
    ///
    /// Errors: the stage map cannot be read or is malformed (named).
    pub fn command(&self) -> Result<Option<crate::protocol::client::ServeCommand>> {
        let Some(command) = &self.engine_serve else {
            return Ok(None);
        };
        let stage_map = self
            .stage_map
            .as_deref()
            .map(crate::protocol::stage_map::NameMap::load)
            .transpose()?;
        Ok(Some(crate::protocol::client::ServeCommand {
            command: command.clone(),
            timeout: std::time::Duration::from_secs_f64(self.engine_timeout),
            stage_map,
            stage_map_file: self.stage_map.clone(),
        }))
    }
}

/// Arguments of `lockstep run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub floors: FloorsArg,
    /// Only these models (repeatable).
    #[arg(long)]
    pub model: Vec<String>,
    /// Only these prompt ids (repeatable).
    #[arg(long)]
    pub prompt: Vec<String>,
    /// Only these numerics modes (repeatable): reference, ggml.
    #[arg(long)]
    pub mode: Vec<String>,
    /// Only these oracles (repeatable), e.g. llama.cpp-f32kv.
    #[arg(long)]
    pub oracle: Vec<String>,
    /// Only these SIMD settings (repeatable): off, avx2, avx512 (`auto` in the matrix is resolved to one of
    /// them; with --engine-cmd: off, the default). Picks from the full tier.
    #[arg(long)]
    pub simd: Vec<String>,
    /// Run the full tier: every SIMD setting of the matrix in every mode (the default tier runs each mode's
    /// `default_simd`: ggml mode only at the fastest setting, whose bits every other setting gives too). CI
    /// runs it (ci/test.sh).
    #[arg(long)]
    pub full: bool,
    /// Mirror this ggml-cpu build (`avx2`, `avx512-nobf16`, `avx512`) in ggml mode instead of the one
    /// each golden records.
    #[arg(long)]
    pub ggml_target: Option<GgmlTarget>,
    #[command(flatten)]
    pub files: MatrixFiles,
    /// The thresholds file.
    #[arg(long)]
    pub thresholds: Option<PathBuf>,
    /// Where reports/<run-id>/ goes.
    #[arg(long)]
    pub reports: Option<PathBuf>,
    /// Run an external engine instead of ours: a one-shot command template that writes the dump format
    /// (placeholders {model} {tokens} {mode} {out}; see the README). It re-runs every decode step from
    /// position 0, so its KV cache is never exercised: prefer --engine-serve.
    #[arg(
        long,
        requires = "engine_tokenize_cmd",
        conflicts_with = "engine_serve"
    )]
    pub engine_cmd: Option<String>,
    /// The external engine's tokenize command template (placeholders {model} {prompt_file} {parse_special}).
    #[arg(long, requires = "engine_cmd")]
    pub engine_tokenize_cmd: Option<String>,
    /// Run only shard I of N of the expanded (filtered) matrix: a deterministic split that keeps a cell's
    /// SIMD twins together, balanced by --shard-costs (else by cell count). `lockstep merge` joins the
    /// shards' reports.
    #[arg(long, value_name = "I/N")]
    pub shard: Option<crate::shard::ShardSpec>,
    /// Balance --shard by the cells' measured seconds: an earlier run's report.json, or a JSON object
    /// mapping cell ids to seconds. Every shard must be given the same file.
    #[arg(long, requires = "shard", value_name = "FILE")]
    pub shard_costs: Option<PathBuf>,
    /// Also write the verdicts as JUnit XML to this file (one testcase per cell, the failure line as its
    /// message).
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Print the ids of the cells this run would run (after every filter and the shard), one per line,
    /// and exit without running them; a cell covered by the expected-failure list is followed by
    /// `  [expected failure until DATE: REASON]`.
    #[arg(long)]
    pub list: bool,
    /// Only the cells whose id matches PATTERN (repeatable; a cell matching any is kept): a glob when it
    /// holds `*`, `?`, `[` or `{` (`*` also crosses `/`; matched against the whole id, or the id without its
    /// engine), else a substring of the id. A pattern that matches no cell is an error.
    #[arg(long = "cell", value_name = "PATTERN")]
    pub cell: Vec<String>,
    /// Run only the cells that failed (FAIL or XPASS, and the cell an incomplete run stopped at) in the
    /// newest report under --reports; combines with the other filters.
    #[arg(long)]
    pub rerun_failed: bool,
    /// The expected-failure list: `[[expected]]` entries with `cell` (a --cell pattern), `reason` and
    /// `expires` (a date). A listed cell still runs and is gated; its failure shows as XFAIL with the
    /// reason and does not fail the run, a pass (XPASS) fails it, and an expired entry stops the run before
    /// it starts. Default: `<checkout>/ci/expected-failures.toml` when it exists.
    #[arg(long, value_name = "FILE")]
    pub expected_failures: Option<PathBuf>,
}

/// `--simd`: [`Simd::parse`] (refuses a setting this CPU cannot run).
pub fn parse_simd(s: &str) -> std::result::Result<Simd, String> {
    Simd::parse(s).map_err(|e| e.to_string())
}

fn positive_seconds(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v < 1e9 => Ok(v),
        _ => Err(format!("{s:?} is not a positive number of seconds")),
    }
}

fn run_matrix(a: RunArgs, threads: usize, defaults: &Defaults) -> Result<ExitCode> {
    // the first Ctrl-C stops the run and saves the finished cells; a second one quits at once
    crate::process::set_graceful(true);
    crate::report::check_step_summary()?;
    if let Some(j) = &a.junit {
        crate::output::check_file_target(j, "--junit")?;
    }
    let shard = match a.shard {
        None => None,
        Some(spec) => Some((
            spec,
            a.shard_costs
                .as_deref()
                .map(crate::shard::CostTable::load)
                .transpose()?,
        )),
    };
    let external = match (a.engine_cmd, a.engine_tokenize_cmd) {
        (Some(forward), Some(tokenize)) => Some(crate::engine::ExternalCommands {
            forward,
            tokenize,
            timeout: std::time::Duration::from_secs_f64(a.serve.engine_timeout),
        }),
        _ => None,
    };
    let serve = a.serve.command()?;
    let expected_file = match a.expected_failures {
        Some(p) => Some(p),
        None => defaults
            .path(None, "ci/expected-failures.toml", "--expected-failures")
            .ok()
            .filter(|p| p.is_file()),
    };
    let select = crate::select::Selection {
        patterns: a
            .cell
            .iter()
            .map(|p| crate::select::CellPattern::parse(p))
            .collect::<Result<_>>()?,
        rerun_failed: a.rerun_failed,
        expected: expected_file
            .as_deref()
            .map(|p| crate::select::ExpectedFailures::load(p, crate::select::today_utc()))
            .transpose()?
            .unwrap_or_default(),
    };
    let opts = crate::run::RunOptions {
        golden_dir: defaults.path(a.files.golden_dir, "golden", "--golden-dir")?,
        matrix: defaults.path(a.files.matrix, "ci/matrix.toml", "--matrix")?,
        thresholds: defaults.path(a.thresholds, "ci/thresholds.toml", "--thresholds")?,
        reports_root: defaults.path(a.reports, "reports", "--reports")?,
        filters: crate::matrix::Filters {
            model: a.model,
            prompt: a.prompt,
            mode: a.mode,
            oracle: a.oracle,
            // the SIMD axis is our kernels' setting: an external engine runs the `off` cells
            simd: if (external.is_some() || serve.is_some()) && a.simd.is_empty() {
                vec!["off".into()]
            } else {
                a.simd
            },
            full: a.full,
        },
        force_external: external.is_some(),
        external,
        serve,
        progress: true,
        threads,
        ggml_target: a.ggml_target,
        floors: defaults.path(a.floors.floors, "ci/floors.json", "--floors")?,
        shard,
        select,
    };
    if a.list {
        let plan = crate::run::plan(&opts)?;
        for c in &plan.cells {
            let id = c.id();
            match opts.select.expected.find(&id) {
                Some(e) => println!("{id}  [expected failure until {}: {}]", e.expires, e.reason),
                None => println!("{id}"),
            }
        }
        eprintln!("{} cells", plan.cells.len());
        return Ok(ExitCode::SUCCESS);
    }
    let (dir, report) = match crate::run::run(&opts) {
        Ok(done) => done,
        // a run that stopped early (an engine failure, Ctrl-C) still writes its CI outputs: the JUnit
        // file with the `(run)` error testcase and the step summary, beside the saved report
        Err(e) if e.downcast_ref::<crate::run::NothingToRerun>().is_some() => {
            println!("{e}");
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => {
            let Some(stopped) = e.downcast_ref::<crate::run::Stopped>() else {
                return Err(e);
            };
            let at = stopped
                .dir
                .as_deref()
                .map_or_else(|| PathBuf::from("(no report saved)"), Path::to_path_buf);
            return match ci_outputs(&stopped.report, &at, "lockstep run", a.junit.as_deref()) {
                Ok(()) => Err(e),
                Err(w) => Err(e.context(format!("writing the CI outputs failed too: {w:#}"))),
            };
        }
    };
    ci_outputs(&report, &dir, "lockstep run", a.junit.as_deref())?;
    let md = dir.join("report.md");
    let width = crate::select::terminal_width();
    for (c, l) in report
        .cells
        .iter()
        .zip(report.cells.iter().map(crate::report::cell_failure_line))
    {
        // the full failure line of a cell that fails the run, wrapped to the terminal
        if let (Some(l), true) = (l, crate::select::Outcome::of(c).fails_run()) {
            println!("{}", crate::select::fit_line(&l, width));
        }
    }
    println!("report: {}", md.display());
    for l in crate::select::summary_lines(&report, crate::select::summary_width()) {
        println!("{l}");
    }
    let n_fail = report
        .cells
        .iter()
        .filter(|c| crate::select::Outcome::of(c).fails_run())
        .count();
    Ok(exit_code(n_fail == 0))
}

fn gate_speed(
    bench: &Path,
    baseline: Option<&Path>,
    floors: Option<&Path>,
    limits: &Path,
) -> Result<ExitCode> {
    let checks = crate::bench::gate_speed_files(bench, baseline, floors, limits)?;
    let n_fail = checks.iter().filter(|c| !c.pass).count();
    for c in &checks {
        println!("{}", c.line());
    }
    println!("{} checks, {} failed", checks.len(), n_fail);
    Ok(exit_code(n_fail == 0))
}

fn gate(report: &Path, thresholds: Option<&Path>, junit: Option<&Path>) -> Result<ExitCode> {
    crate::report::check_step_summary()?;
    if let Some(j) = junit {
        crate::output::check_file_target(j, "--junit")?;
    }
    let (outcome, r) = crate::regate::gate_file_report(report, thresholds)?;
    ci_outputs(&r, report, "lockstep gate", junit)?;
    let width = crate::select::terminal_width();
    for l in &outcome.lines {
        println!("{}", crate::select::fit_line(l, width));
    }
    Ok(exit_code(outcome.n_fail == 0))
}

/// The outputs CI systems read: the JUnit XML (`--junit`, written atomically) and the Markdown summary
/// appended to `$GITHUB_STEP_SUMMARY` when it is set.
fn ci_outputs(
    r: &crate::report::Report,
    at: &Path,
    title: &str,
    junit: Option<&Path>,
) -> Result<()> {
    if let Some(j) = junit {
        let xml = crate::report::render_junit(r, title)?;
        crate::output::write_atomic(j, xml.as_bytes())
            .with_context(|| format!("--junit {}", j.display()))?;
    }
    let summary = crate::report::render_step_summary(r, title, &at.display().to_string());
    crate::report::append_step_summary(&summary)?;
    Ok(())
}

fn merge(shards: &[PathBuf], reports: &Path, thresholds: &Path) -> Result<ExitCode> {
    let (dir, r) = crate::shard::merge_files(shards, reports, thresholds)?;
    let n_fail = r.cells.iter().filter(|c| !c.verdict.pass).count();
    println!("report: {}", dir.join(crate::report::REPORT_MD).display());
    println!(
        "merged {} shards: {} cells, {} passed, {} failed{}",
        r.merged_from.len(),
        r.cells.len(),
        r.cells.len() - n_fail,
        n_fail,
        if r.incomplete.is_some() {
            " (INCOMPLETE)"
        } else {
            ""
        }
    );
    Ok(ExitCode::SUCCESS)
}

/// Exit status 0 on a pass, 1 on a failure (an error is 2, from [`main`]).
fn exit_code(pass: bool) -> ExitCode {
    if pass {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// Entry point for the binary: parse arguments, run, print errors with their causes.
pub fn main() -> ExitCode {
    // A reader that closes our stdout early (`lockstep inspect … | head`) ends the process quietly, as
    // it does a C tool, instead of a panic in `println!` (Rust ignores SIGPIPE by default).
    // SAFETY: restoring a signal's default disposition before any thread starts.
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    crate::process::install_interrupt_handler();
    // clap quotes a bad argument in its error: shown with its control characters escaped, as ours are
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let text = crate::format::terminal_safe(&e.render().to_string());
            if e.use_stderr() {
                eprint!("{text}");
            } else {
                print!("{text}");
            }
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            // paths, arguments and engine messages are quoted in errors: an ESC sequence in them is
            // shown, not run by the terminal
            let safe = |m: String| crate::format::terminal_safe(&m);
            eprintln!("error: {}", safe(e.to_string()));
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {}", safe(cause.to_string()));
            }
            ExitCode::from(2)
        }
    };
    if crate::process::interrupted() {
        ExitCode::from(130)
    } else {
        code
    }
}

/// Run a parsed command line.
pub fn run(cli: Cli) -> Result<ExitCode> {
    // `lockstep quality` defaults to 2 threads (shared machines; llama-perplexity runs with -t 2 beside it)
    let requested = match (&cli.command, cli.threads) {
        (Command::Quality(_), None) => {
            Some(2.min(std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)))
        }
        (_, t) => t,
    };
    let threads = resolve_threads(requested)?;
    // the mutation suite names a fault for the engine of a child process (`lockstep serve`, `lockstep
    // dump` as a one-shot engine); a build without the fault switch refuses the variable
    lockstep_engine::faults::set_from_env().map_err(anyhow::Error::msg)?;
    // The calling thread is worker 0 of the pool: the engine's parallel loops then run on it directly,
    // instead of parking it on a latch and waking a worker for each of the hundreds of matmuls of a
    // token (measured: ~20% of a SmolLM2 decode step went to those handoffs). Nothing here spawns
    // detached rayon jobs, which this thread would not pick up. A second call in one process (tests)
    // finds the pool built: keep it.
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .use_current_thread()
        .build_global();
    let threads = rayon::current_num_threads();
    registry::configure(cli.root.clone(), cli.registry);
    let defaults = Defaults::new(cli.root);
    match cli.command {
        Command::Fetch {
            ids,
            verify,
            list,
            corpus,
        } => {
            let reg = registry::Registry::active()?;
            if list {
                for line in fetch::list_lines(&reg) {
                    println!("{line}");
                }
                return Ok(ExitCode::SUCCESS);
            }
            let opts = fetch::FetchOptions {
                verify,
                ..fetch::FetchOptions::default()
            };
            if let Some(c) = corpus {
                println!("{}", fetch::fetch_corpus(reg.corpus(&c)?, &opts)?.display());
                return Ok(ExitCode::SUCCESS);
            }
            if ids.is_empty() {
                bail!("give a model id, or --list to see them")
            }
            fetch::fetch_ids(&reg, &ids, None, &opts, &mut |p| {
                println!("{}", p.display())
            })?;
        }
        Command::Generate(a) => generate(a)?,
        Command::Quality(a) => quality(a, threads, &defaults)?,
        Command::Run(a) => return run_matrix(a, threads, &defaults),
        Command::Gate {
            report,
            thresholds,
            speed,
            baseline,
            speed_limits,
            speed_floors,
            junit,
        } => {
            // clap's `requires = "speed"` is not enforced beside the positional report: refuse here
            if speed.is_none() {
                for (flag, given) in [
                    ("--baseline", baseline.is_some()),
                    ("--speed-limits", speed_limits.is_some()),
                    ("--speed-floors", speed_floors.is_some()),
                ] {
                    if given {
                        bail!(
                            "{flag} applies only to `lockstep gate --speed BENCH.json`; a report.json is \
                             gated with --thresholds"
                        );
                    }
                }
            }
            if let Some(b) = speed {
                let limits = defaults.path(speed_limits, "ci/speed.toml", "--speed-limits")?;
                return gate_speed(&b, baseline.as_deref(), speed_floors.as_deref(), &limits);
            }
            let report = report.context("give a report.json, or --speed BENCH.json")?;
            return gate(&report, thresholds.as_deref(), junit.as_deref());
        }
        Command::Publish { reports_dir, out } => {
            let dir = defaults.path(reports_dir, "reports", "REPORTS_DIR")?;
            let p = crate::publish::publish(&dir, &out)?;
            println!(
                "site: {} ({} runs, {} benches, {} quality reports, {} files)",
                p.site.join("index.html").display(),
                p.runs,
                p.benches,
                p.quality,
                p.files
            );
        }
        Command::Merge {
            shards,
            reports,
            thresholds,
        } => {
            let reports = defaults.path(reports, "reports", "--reports")?;
            let thresholds = defaults.path(thresholds, "ci/thresholds.toml", "--thresholds")?;
            return merge(&shards, &reports, &thresholds);
        }
        Command::Bench(a) => {
            let sample_timeout = std::time::Duration::from_secs_f64(a.engine_timeout);
            let llama_bench = if a.no_llama {
                None
            } else {
                match a.llama_bench {
                    Some(p) => Some(p),
                    None => Some(crate::bench::cached_llama_bench(defaults.root().context(
                        "no --llama-bench given (nor --no-llama): the cached one is found through the \
                         checkout's oracles/llamacpp/build_tools.sh",
                    )?).context(
                        "no llama-bench given and none cached for this CPU: run \
                         oracles/llamacpp/build_tools.sh (compiles llama.cpp once, 10-25 min; needs cmake and \
                         a C++ compiler: `apt-get install -y cmake g++`, which it runs itself as root), give \
                         --llama-bench, or --no-llama",
                    )?),
                }
            };
            let mut opts = crate::bench::BenchOptions {
                models: Vec::new(),
                tests: crate::bench::tests_for(&a.n_prompt, &a.n_gen, &a.n_depth),
                repetitions: a.repetitions,
                threads,
                mode: a.mode,
                simd: a.simd.simd,
                lockstep_bin: std::env::current_exe().context("cannot find this binary")?,
                baseline: a
                    .baseline_bin
                    .map(|b| (b, a.baseline_simd, a.baseline_mode.unwrap_or(a.mode))),
                llama_bench,
                llama_bench_args: a
                    .llama_bench_args
                    .split_whitespace()
                    .map(str::to_string)
                    .collect(),
                reports_root: defaults.path(a.reports, "reports", "--reports")?,
                progress: true,
                sample_timeout,
            };
            // every option checked before a model is fetched or a sample measured
            crate::bench::check_options(&opts)?;
            if let Some(f) = &a.write_speed_floors {
                crate::output::check_file_target(f, "--write-speed-floors")?;
            }
            let mut ids = a.model.clone();
            if let Some(m) = &a.matrix {
                // a relative path names a file of the checkout (the default ci/matrix.toml)
                let path = if m.is_relative() && !m.exists() {
                    defaults.path(None, &m.to_string_lossy(), "--matrix")?
                } else {
                    m.clone()
                };
                let matrix = crate::matrix::Matrix::load(&path)?;
                // a Hugging Face copy runs its source's weights (and llama-bench reads GGUF only): its
                // source's figures are its own
                ids.extend(
                    matrix
                        .models
                        .into_iter()
                        .map(|m| m.id)
                        .filter(|id| crate::registry::Registry::golden_model_of(id) == *id)
                        .filter(|id| {
                            let speech = crate::bench::speech_arch(id).is_some();
                            if speech {
                                eprintln!(
                                    "lockstep bench: {id} left out of --matrix: a speech model (its decoder \
                                     reads an encoded audio input; the bench measures token prefill and decode)"
                                );
                            }
                            !speech
                        }),
                );
            }
            for m in &ids {
                if let Some(arch) = crate::bench::speech_arch(m) {
                    bail!(
                        "lockstep bench cannot measure {m}: it is a speech model ({arch}), whose decoder reads \
                         an encoded audio input, and the bench's samples are token prefill and decode \
                         (lockstep generate --audio runs it)"
                    );
                }
                opts.models.push((m.clone(), fetch::resolve_model(m)?));
            }
            let (dir, r) = crate::bench::bench(&opts)?;
            print!("{}", crate::bench::render_bench_markdown(&r));
            println!("\nwrote {}", dir.display());
            if let Some(f) = &a.write_speed_floors {
                // this bench's SIMD kind replaces its own section; the other kinds' floors are kept
                let host = crate::bench::HostFloors::from_bench(&r)?;
                let existing = f
                    .exists()
                    .then(|| crate::bench::SpeedFloors::load(f))
                    .transpose()?;
                let (kind, n) = (host.simd.clone(), host.floor.len());
                let floors = crate::bench::SpeedFloors::with_host(existing, host);
                crate::output::write_atomic(f, floors.to_toml()?.as_bytes())?;
                println!("wrote {} ({n} floors of SIMD kind {kind})", f.display());
            }
        }
        Command::BenchSample(a) => {
            let model = load_model(&a.model.model)?;
            let test = crate::bench::Test {
                n_prompt: a.n_prompt,
                n_gen: a.n_gen,
                n_depth: a.n_depth,
            };
            // an encoder runs prompt tests without depth only (no decode step, no KV cache)
            crate::bench::runner::tests_for_model(&model, &[test])
                .with_context(|| format!("--model {}", a.model.model))?;
            println!(
                "{}",
                crate::bench::sample(&model, test, a.mode, a.simd.simd)?
            );
        }
        Command::Yardstick(a) => {
            let dir = defaults.path(a.golden_dir, "golden", "--golden-dir")?;
            let manifest = crate::golden::load_manifest(&dir)?;
            for m in &a.model {
                if !manifest.cross_oracle.contains_key(m) {
                    anyhow::bail!(
                        "{}: no cross_oracle record of {m} (records: {})",
                        dir.join("manifest.json").display(),
                        manifest
                            .cross_oracle
                            .keys()
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
            }
            for (m, rec) in &manifest.cross_oracle {
                if a.model.is_empty() || a.model.contains(m) {
                    let rule = crate::gate::yardstick::render_rule(m, rec)
                        .with_context(|| format!("cross_oracle record of {m}"))?;
                    println!("{rule}");
                    // ggml mode against transformers: for a model with transformers goldens
                    let has_tf = manifest
                        .goldens
                        .iter()
                        .any(|g| &g.model_id == m && g.path.contains("/transformers-f32/"));
                    if has_tf {
                        let rule = crate::gate::yardstick::render_ggml_rule(m, rec)
                            .with_context(|| format!("cross_oracle record of {m}"))?;
                        println!("{rule}");
                    }
                }
            }
        }
        Command::Floors(a) => {
            let out = defaults.path(a.out, "ci/floors.json", "--out")?;
            // before any measuring: a target that cannot be written fails now, not after minutes
            crate::output::check_file_target(&out, "--out")?;
            let opts = crate::measure::MeasureOptions {
                golden_dir: defaults.path(a.files.golden_dir, "golden", "--golden-dir")?,
                matrix: defaults.path(a.files.matrix, "ci/matrix.toml", "--matrix")?,
                thresholds: defaults.path(a.thresholds, "ci/thresholds.toml", "--thresholds")?,
                filters: crate::matrix::Filters {
                    model: a.model.clone(),
                    oracle: a.oracle.clone(),
                    ..Default::default()
                },
                serve: a.serve.command()?,
            };
            crate::measure::update(&opts, &out, &mut |g| eprintln!("measuring {g}"))?;
            println!("{}", out.display());
        }
        Command::Bisect(a) => {
            if let Some(p) = &a.json {
                crate::output::check_file_target(p, "--json")?;
            }
            let opts = crate::bisect::BisectOptions {
                golden_dir: defaults.path(a.golden_dir, "golden", "--golden-dir")?,
                thresholds: defaults.path(a.thresholds, "ci/thresholds.toml", "--thresholds")?,
                model: a.model,
                prompt: a.prompt,
                mode: a.mode,
                oracle: a.oracle,
                ggml_target: a.ggml_target,
                floors: defaults.path(a.floors.floors, "ci/floors.json", "--floors")?,
                simd: a.simd.simd,
            };
            let r = match a.serve.command()? {
                Some(cmd) => crate::bisect::bisect_serve(&opts, cmd)?,
                None => crate::bisect::bisect(&opts)?,
            };
            print!("{}", crate::bisect::render(&r));
            if let Some(p) = &a.json {
                let text = crate::report::to_json_pretty(&r)?;
                crate::output::write_atomic(p, text.as_bytes())?;
            }
            return Ok(exit_code(r.is_clean()));
        }
        Command::Dump(a) => {
            crate::output::check_file_target(&a.out, "--out")?;
            let model = load_model(&a.model.model)?;
            crate::session::require_logits(&model, "dump")?;
            let tokens = match (&a.prompt, &a.tokens) {
                (Some(p), _) if p.is_empty() => {
                    bail!("the prompt is empty: give --prompt some text")
                }
                (Some(p), _) => model.tokenizer().encode(p, true, a.parse_special)?,
                (None, Some(t)) => t.clone(),
                (None, None) => bail!("give --prompt or --tokens"),
            };
            let t0 = Instant::now();
            let n = a.kernels.numerics(a.mode);
            let d = dump::run(&model, &tokens, n.mode, n.target, n.simd)?;
            dump::write(&a.out, &d)?;
            eprintln!(
                "wrote {} ({} tokens, {} stages, mode {}) in {:.2}s",
                a.out.display(),
                tokens.len(),
                d.stages.len(),
                a.mode,
                t0.elapsed().as_secs_f64()
            );
        }
        Command::Quantize(a) => {
            crate::output::check_file_target(&a.out, "--out")?;
            let path = fetch::resolve_model(&a.model.model)?;
            let mut params = crate::quantize::variant_params(&a.qtype)?;
            if a.direct {
                params.via_f32 = false;
            }
            let made = crate::quantize::quantize_file_with(
                &path,
                &params,
                &a.out,
                crate::progress::Display::for_stderr(true),
            )?;
            eprintln!(
                "lockstep quantize: {} -> {} ({}, {} bytes; {} tensor(s) fell back; {:.1} s, {threads} thread(s))",
                path.display(),
                made.path.display(),
                made.types_line(),
                made.size,
                made.fallbacks,
                made.elapsed.as_secs_f64()
            );
            println!("{}", made.path.display());
        }
        Command::Synth {
            arch,
            seed,
            out,
            hf_out,
        } => {
            if arch == crate::synth::WHISPER_ARCH {
                if let Some(dir) = &hf_out {
                    bail!(
                        "synth --arch whisper writes a Hugging Face checkpoint directory to --out (Whisper has \
                         no GGUF form here): --hf-out {} has nothing to add; drop it",
                        dir.display()
                    );
                }
                let w = crate::synth::write_whisper_dir(seed, &out)?;
                eprintln!(
                    "lockstep synth: whisper seed {seed} -> {}/ ({} bytes, directory digest {})",
                    out.display(),
                    w.size,
                    w.sha256
                );
                eprintln!(
                    "lockstep synth: its registry entry (a --registry file of your own, or models.toml, in the \
                     directory that holds {}):\n{}",
                    out.display(),
                    crate::synth::checkpoint_entry(&out, seed, &w)
                );
                println!("{}", out.display());
                return Ok(ExitCode::SUCCESS);
            }
            // both targets are checked before the model is written: a bad --hf-out leaves no .gguf
            crate::output::check_file_target(&out, "--out")?;
            if let Some(dir) = &hf_out {
                crate::output::check_dir_target_uncreated(dir, "--hf-out")?;
            }
            let w = crate::synth::write_synth(&arch, seed, &out)?;
            eprintln!(
                "lockstep synth: {arch} seed {seed} -> {} ({} bytes, sha256 {})",
                out.display(),
                w.size,
                w.sha256
            );
            eprintln!(
                "lockstep synth: its registry entry (models.toml, or a --registry file of your own):\n{}",
                crate::synth::registry_entry(&out, &arch, seed, &w)
            );
            println!("{}", out.display());
            if let Some(dir) = hf_out {
                let e = crate::hf::export_hf(&out, &dir)?;
                println!(
                    "{}\n{}\n{}",
                    e.config.display(),
                    e.safetensors.display(),
                    e.tokenizer.display()
                );
            }
        }
        Command::ExportHf { model, out } => {
            let path = fetch::resolve_model(&model.model)?;
            let e = crate::hf::export_hf(&path, &out)?;
            eprintln!(
                "lockstep export-hf: {} -> {} ({} tensors)",
                path.display(),
                out.display(),
                e.n_tensors
            );
            println!(
                "{}\n{}\n{}",
                e.config.display(),
                e.safetensors.display(),
                e.tokenizer.display()
            );
        }
        Command::Serve { simd } => {
            let stdin = std::io::stdin().lock();
            let stdout = std::io::stdout().lock();
            crate::protocol::server::serve(stdin, stdout, simd.simd)?;
        }
        Command::Inspect { model, json } => {
            let path = fetch::resolve_model(&model.model)?;
            println!("{}", crate::inspect::inspect(&path, json)?);
        }
        Command::Tokenize {
            model,
            prompt,
            prompt_file,
            parse_special,
        } => {
            let prompt = match (prompt, prompt_file) {
                (Some(p), _) => p,
                (None, Some(f)) => read_prompt_file(&f)?,
                (None, None) => bail!("give --prompt or --prompt-file"),
            };
            let model = load_model(&model.model)?;
            let ids = model.tokenizer().encode(&prompt, true, parse_special)?;
            let s: Vec<String> = ids.iter().map(u32::to_string).collect();
            println!("{}", s.join(","));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The engine's thread count for `--threads`: `None` or `0` = every core; more than the machine's cores is
/// an error (oversubscription only slows the engine down and would be recorded as if it had been used).
pub fn resolve_threads(requested: Option<usize>) -> Result<usize> {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    match requested {
        None | Some(0) => Ok(cores),
        Some(n) if n <= cores => Ok(n),
        Some(n) => bail!(
            "--threads {n} is more than this machine's {cores} cores; give 1 to {cores}, or 0 for all"
        ),
    }
}

/// `lockstep quality`: resolve the files, run [`crate::quality::run`], print the table and the report's
/// path. Every type name and option is checked before anything is scored (an unknown `--types` or
/// `--check-types` entry is an error naming it and listing the known ones); a run in which every variant
/// failed is an error (exit 2) after its report, with each variant's error, is written.
fn quality(a: QualityArgs, threads: usize, defaults: &Defaults) -> Result<()> {
    let (base, variants) = crate::quality::select::select_files(
        a.base.as_deref(),
        &a.variant,
        a.variants_dir.as_deref(),
        a.types.as_deref(),
        &mut |m| eprintln!("quality: {m}"),
    )?;
    let check_types = crate::quality::select::check_types(
        a.check_llama_perplexity.is_some(),
        a.check_types,
        &variants,
    )?;
    let opts = crate::quality::QualityOptions {
        base,
        variants,
        corpus: a.corpus,
        params: crate::quality::Params {
            n_ctx: a.n_ctx,
            n_chunks: a.chunks,
            mode: a.mode,
            simd: a.simd.simd,
            full_kl_chunks: a.full_kl_chunks,
            window: a.window,
            max_kept: a.max_kept,
        },
        threads,
        cache_root: fetch::cache_dir()?,
        reports_root: defaults.path(a.reports, "reports", "--reports")?,
        // recorded in the report (its sha256, "unknown" where there is none): no reason to refuse a run
        golden_manifest: defaults.root().map_or_else(
            |_| PathBuf::new(),
            |r| r.join("golden").join(crate::golden::MANIFEST_FILE),
        ),
        llama_perplexity: a.check_llama_perplexity,
        check_types,
        llama_timeout: std::time::Duration::from_secs_f64(a.engine_timeout),
    };
    let (report, dir) = crate::quality::run(&opts, &mut |m| eprintln!("quality: {m}"))?;
    print!("{}", crate::quality::report::render_markdown(&report));
    println!("\nreport: {}", dir.display());
    let rows: Vec<&crate::quality::VariantResult> =
        report.models.iter().flat_map(|m| &m.variants).collect();
    if rows.iter().all(|v| v.stats.is_none()) {
        bail!(
            "every variant failed ({} of {}); their errors are in the report {}",
            rows.len(),
            rows.len(),
            dir.display()
        );
    }
    Ok(())
}

/// `lockstep generate`: the model loaded, [`crate::generate::generate`] streamed to stdout, its speeds
/// on stderr.
fn generate(a: GenerateArgs) -> Result<()> {
    let model = load_model(&a.model.model)?;
    crate::session::require_logits(&model, "generate")?;
    if let Some(wav) = &a.audio {
        let tok = model.tokenizer();
        let prompt = tok.encode(a.prompt.as_deref().unwrap_or(WHISPER_PROMPT), false, true)?;
        let mode = a.kernels.numerics(a.mode).mode;
        // greedy decoding stops at the decoder's context, as transformers' `generate` stops at
        // `max_target_positions` (a seeded model without a trained <|endoftext|> never ends on its own)
        let room = model.info().n_ctx_train.saturating_sub(prompt.len());
        let n = a.n.min(room);
        if n < a.n {
            eprintln!(
                "note: -n {} stops at {n} tokens: the decoder's context is {} positions, {} of them the prompt",
                a.n,
                model.info().n_ctx_train,
                prompt.len()
            );
        }
        let ids = lockstep_engine::models::speech::transcribe_greedy(&model, wav, &prompt, n, mode)
            .with_context(|| format!("transcribing {}", wav.display()))?;
        let end = ids.iter().position(|&t| tok.is_eog(t)).unwrap_or(ids.len());
        let list: Vec<String> = ids[..end].iter().map(u32::to_string).collect();
        println!("{}", list.join(" "));
        println!("{}", tok.decode(&ids[..end]));
        return Ok(());
    }
    let Some(prompt) = a.prompt.as_deref() else {
        bail!("generate needs --prompt (or --audio with a speech model)");
    };
    let opts = crate::generate::GenerateOptions {
        n_predict: a.n,
        sampler: SamplerConfig {
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            seed: a.seed,
        },
        numerics: a.kernels.numerics(a.mode),
        parse_special: a.parse_special,
    };
    let stats = crate::generate::generate(&model, prompt, &opts, &mut std::io::stdout().lock())?;
    eprintln!("{}", stats.summary(&opts.numerics));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn flattened_groups_parse_their_flags() {
        let cli = Cli::try_parse_from([
            "lockstep",
            "generate",
            "--model",
            "m.gguf",
            "--prompt",
            "hi",
            "--ggml-target",
            "avx2",
            "--simd",
            "off",
        ])
        .unwrap();
        let Command::Generate(a) = cli.command else {
            panic!("not generate")
        };
        let n = a.kernels.numerics(a.mode);
        assert_eq!(n.mode, NumericsMode::Ggml);
        assert_eq!(n.target, GgmlTarget::Avx2);
        assert_eq!(n.simd, Simd::Off);
        let cli = Cli::try_parse_from([
            "lockstep",
            "run",
            "--golden-dir",
            "g",
            "--matrix",
            "m.toml",
            "--floors",
            "f.json",
        ])
        .unwrap();
        let Command::Run(a) = cli.command else {
            panic!("not run")
        };
        assert_eq!(a.files.golden_dir, Some(PathBuf::from("g")));
        assert_eq!(a.files.matrix, Some(PathBuf::from("m.toml")));
        assert_eq!(a.floors.floors, Some(PathBuf::from("f.json")));
        // dump keeps its own default mode; the ggml target defaults to this machine's build
        let cli = Cli::try_parse_from([
            "lockstep", "dump", "--model", "m", "--tokens", "1,2", "--out", "o.npz",
        ])
        .unwrap();
        let Command::Dump(a) = cli.command else {
            panic!("not dump")
        };
        let n = a.kernels.numerics(a.mode);
        assert_eq!(n.mode, NumericsMode::Reference);
        assert_eq!(n.target, GgmlTarget::host());
        assert!(
            Cli::try_parse_from(["lockstep", "bench-sample", "--model", "m", "--simd", "x"])
                .is_err()
        );
    }

    #[test]
    fn threads_are_all_cores_or_at_most_them() {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        assert_eq!(resolve_threads(None).unwrap(), cores);
        assert_eq!(resolve_threads(Some(0)).unwrap(), cores);
        assert_eq!(resolve_threads(Some(1)).unwrap(), 1);
        let e = resolve_threads(Some(cores + 1)).unwrap_err();
        assert!(e.to_string().contains("more than this machine's"), "{e}");
    }
}
