//! lockstep-engine: a CPU inference engine for GGUF models, built to be looked inside.
//!
//! Weights stay quantized inside the memory map ([`gguf`]); kernels read ggml blocks where they lie
//! ([`quant`]); the forward pass of each architecture ([`models`]) emits every named stage to an optional
//! [`hooks::StageSink`] that may observe or replace it. The harness (`lockstep` crate) knows this crate only
//! through that public API.
//!
//! Module map:
//! - [`audio`] — 16 kHz mono WAV input and Whisper's log-mel front end.
//! - [`gguf`] — GGUF v2/v3 reader over `memmap2`, bounds-checked.
//! - [`hf`] — Hugging Face checkpoint directories (config.json, safetensors, tokenizer.json) presented as a
//!   [`gguf::GgufFile`], and the per-architecture layout tables both directions use.
//! - [`quant`] — ggml tensor types, block layouts, dequantization and dot products in both numerics modes.
//! - [`quantize`] — model quantization byte-identical to `llama-quantize --pure` (type choice, GGUF layout,
//!   streaming writer).
//! - [`tokenizer`] — tokenizers built from GGUF metadata (gpt2-style BPE on the `tokenizers` crate,
//!   SentencePiece-style as llama.cpp's `llm_tokenizer_spm`).
//! - [`backend`] — the matrix-multiply seam: kernel choice per [`Simd`] and thread splitting.
//! - [`workers`] — the persistent worker threads the hot parallel loops run on (ggml's threadpool with
//!   its spin barrier), sized by the engine's thread count.
//! - [`numerics`] — the leaf every numeric module depends on: [`NumericsMode`], [`GgmlTarget`], [`Simd`]
//!   (detected at run time) and [`Numerics`], the three carried as one value.
//! - [`ops`] — the numerics of the shared blocks: RMSNorm, RoPE, softmax, SiLU/GELU gates, attention, and
//!   the ggml-mode replicas per x86 target.
//! - [`kv_cache`] — flat KV cache with explicit write positions.
//! - [`hooks`] — canonical stage ids and the observe/replace sink.
//! - [`models`] — shared blocks and one wiring module per architecture (llama, qwen2, gemma3);
//!   [`models::Model`] and [`models::Session`] are the entry points.
//! - [`synth`] — tiny seeded GGUF models: test fixtures and `lockstep synth`.
//! - [`sample`] — greedy / temperature / top-k / top-p token selection.

pub mod audio;
pub mod backend;
pub mod error;
pub mod faults;
pub mod gguf;
pub mod hf;
pub mod hooks;
pub mod kv_cache;
pub mod models;
pub mod numerics;
pub mod ops;
pub mod quant;
pub mod quantize;
pub mod sample;
pub mod synth;
pub mod tokenizer;
pub mod workers;

pub use error::{Error, Result};
pub use hooks::{Stage, StageKind, StageSink};
pub use models::{Model, Session};
pub use numerics::{GgmlTarget, Numerics, NumericsMode, Simd};
