//! Models: loading a GGUF file into an architecture, sessions (KV cache + scratch), and the forward pass.
//!
//! One forward function per architecture lives in its own module ([`llama`]); they share the numeric blocks
//! of [`crate::ops`] and the weight handles here. The public surface the harness uses is [`Model`] and
//! [`Session`].

pub mod llama;

use std::path::Path;

use crate::backend::{Backend, MatmulScratch, QMatrix, ScalarBackend};
use crate::gguf::{GgufFile, TensorInfo};
use crate::hooks::{Stage, StageSink};
use crate::kv_cache::KvCache;
use crate::quant::{self, NumericsMode};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// A 2-D weight as it lies in the model file: `[rows, cols]` (ggml `ne = [cols, rows]`).
#[derive(Clone, Debug)]
pub struct Weight {
    /// The GGUF tensor record (name, type, absolute offset, size).
    pub info: TensorInfo,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
}

impl Weight {
    /// Look up a 2-D tensor and check its shape is `[rows, cols]` (either may be `None` = any) and that the
    /// engine has kernels for its type.
    pub fn load(
        gguf: &GgufFile,
        name: &str,
        rows: Option<usize>,
        cols: Option<usize>,
    ) -> Result<Weight> {
        let info = gguf.tensor(name)?.clone();
        let bad = |what: String| Error::Model {
            path: gguf.path().to_path_buf(),
            what,
        };
        if info.dims.len() != 2 {
            return Err(bad(format!(
                "tensor {name} has {} dims, expected 2",
                info.dims.len()
            )));
        }
        let (c, r) = (info.dims[0] as usize, info.dims[1] as usize);
        if rows.is_some_and(|x| x != r) || cols.is_some_and(|x| x != c) {
            return Err(bad(format!(
                "tensor {name} has shape [{r}, {c}] (rows, cols), expected [{}, {}]",
                rows.map_or("any".into(), |x| x.to_string()),
                cols.map_or("any".into(), |x| x.to_string()),
            )));
        }
        if !quant::supports(info.ggml_type) {
            return Err(Error::Unsupported(format!(
                "{}: tensor {name} has type {}, which this engine has no kernels for yet",
                gguf.path().display(),
                info.ggml_type
            )));
        }
        Ok(Weight {
            info,
            rows: r,
            cols: c,
        })
    }

    /// A matrix view over the mapped bytes.
    pub fn matrix<'a>(&self, gguf: &'a GgufFile) -> QMatrix<'a> {
        QMatrix {
            ty: self.info.ggml_type,
            rows: self.rows,
            cols: self.cols,
            data: gguf.tensor_data(&self.info),
        }
    }
}

/// Read a 1-D tensor (norm weights, biases) as f32. These are small (one row) and copied at load; the
/// matrices stay in the map.
pub fn load_vector(gguf: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>> {
    let info = gguf.tensor(name)?;
    if info.n_elements != len as u64 {
        return Err(Error::Model {
            path: gguf.path().to_path_buf(),
            what: format!(
                "tensor {name} has {} elements, expected {len}",
                info.n_elements
            ),
        });
    }
    let mut out = vec![0.0; len];
    quant::dequantize_row(info.ggml_type, gguf.tensor_data(info), &mut out)?;
    Ok(out)
}

/// The architectures the engine runs.
#[derive(Debug)]
pub enum Arch {
    /// `general.architecture = "llama"` (Llama 1/2/3, SmolLM, Mistral-style without sliding window).
    Llama(llama::Llama),
}

/// Hyperparameters common to decoder-only transformers, read from `<arch>.*` GGUF metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// `general.architecture`.
    pub arch: String,
    /// Transformer blocks (`block_count`).
    pub n_layer: usize,
    /// Residual width (`embedding_length`).
    pub d_model: usize,
    /// Query heads (`attention.head_count`).
    pub n_head: usize,
    /// Key/value heads (`attention.head_count_kv`).
    pub n_kv_head: usize,
    /// Per-head width (`attention.key_length`, default d_model / n_head).
    pub head_dim: usize,
    /// FFN hidden width (`feed_forward_length`).
    pub d_ff: usize,
    /// Vocabulary size (rows of `token_embd`).
    pub n_vocab: usize,
    /// Training context (`context_length`).
    pub n_ctx_train: usize,
    /// RoPE base (`rope.freq_base`, default 10000).
    pub rope_base: f32,
    /// Dimensions rotated per head (`rope.dimension_count`, default head_dim).
    pub rope_dim: usize,
    /// RMSNorm epsilon (`attention.layer_norm_rms_epsilon`).
    pub norm_eps: f32,
}

impl Config {
    /// Read the hyperparameters of `arch` from the file's metadata; errors name the missing key.
    pub fn from_gguf(gguf: &GgufFile, arch: &str) -> Result<Config> {
        let key = |k: &str| format!("{arch}.{k}");
        let opt_u32 = |k: &str| -> Result<Option<usize>> {
            let k = key(k);
            match gguf.get(&k) {
                Some(_) => Ok(Some(gguf.get_u32(&k)? as usize)),
                None => Ok(None),
            }
        };
        let d_model = gguf.get_u32(&key("embedding_length"))? as usize;
        let n_head = gguf.get_u32(&key("attention.head_count"))? as usize;
        let n_kv_head = opt_u32("attention.head_count_kv")?.unwrap_or(n_head);
        if n_head == 0 || n_kv_head == 0 || n_head % n_kv_head != 0 {
            return Err(Error::Model {
                path: gguf.path().to_path_buf(),
                what: format!(
                    "head_count {n_head} is not a positive multiple of head_count_kv {n_kv_head}"
                ),
            });
        }
        let head_dim = opt_u32("attention.key_length")?.unwrap_or(d_model / n_head);
        let rope_base = match gguf.get(&key("rope.freq_base")) {
            Some(_) => gguf.get_f32(&key("rope.freq_base"))?,
            None => 10000.0,
        };
        let embd = gguf.tensor("token_embd.weight")?;
        let n_vocab = embd.dims.get(1).copied().unwrap_or(0) as usize;
        let cfg = Config {
            arch: arch.to_string(),
            n_layer: gguf.get_u32(&key("block_count"))? as usize,
            d_model,
            n_head,
            n_kv_head,
            head_dim,
            d_ff: gguf.get_u32(&key("feed_forward_length"))? as usize,
            n_vocab,
            n_ctx_train: opt_u32("context_length")?.unwrap_or(2048),
            rope_base,
            rope_dim: opt_u32("rope.dimension_count")?.unwrap_or(head_dim),
            norm_eps: gguf.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
        };
        if cfg.rope_dim > cfg.head_dim || cfg.rope_dim % 2 != 0 {
            return Err(Error::Model {
                path: gguf.path().to_path_buf(),
                what: format!(
                    "rope.dimension_count {} must be even and ≤ head_dim {}",
                    cfg.rope_dim, cfg.head_dim
                ),
            });
        }
        Ok(cfg)
    }
}

/// A loaded model: the mapped file, its tokenizer and its architecture's weights.
pub struct Model {
    gguf: GgufFile,
    tokenizer: Tokenizer,
    config: Config,
    arch: Arch,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("path", &self.gguf.path())
            .field("config", &self.config)
            .finish()
    }
}

impl Model {
    /// Open a GGUF file and prepare its architecture. Weights stay in the memory map.
    ///
    /// Errors: unreadable or invalid GGUF, unsupported architecture or tensor type, missing metadata or
    /// tensors — each naming the file.
    pub fn load(path: &Path) -> Result<Model> {
        Self::from_gguf(GgufFile::open(path)?)
    }

    /// Prepare a model from an already parsed file (tests build synthetic files in memory).
    pub fn from_gguf(gguf: GgufFile) -> Result<Model> {
        let arch_name = gguf.get_str("general.architecture")?.to_string();
        let config = Config::from_gguf(&gguf, &arch_name)?;
        let arch = match arch_name.as_str() {
            "llama" => Arch::Llama(llama::Llama::load(&gguf, &config)?),
            other => {
                return Err(Error::Unsupported(format!(
                    "{}: architecture {other:?} is not supported yet (supported: llama)",
                    gguf.path().display()
                )))
            }
        };
        let tokenizer = Tokenizer::from_gguf(&gguf)?;
        Ok(Model {
            gguf,
            tokenizer,
            config,
            arch,
        })
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Hyperparameters.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The parsed file (metadata, tensor table).
    pub fn gguf(&self) -> &GgufFile {
        &self.gguf
    }

    /// Every stage the forward pass emits, in forward order, with its row width.
    pub fn stages(&self) -> Vec<(Stage, usize)> {
        match &self.arch {
            Arch::Llama(_) => llama::stages(&self.config),
        }
    }

    /// A fresh session (empty KV cache) for up to `n_ctx` positions.
    pub fn session(&self, n_ctx: usize, mode: NumericsMode) -> Session {
        let c = &self.config;
        Session {
            kv: KvCache::new(c.n_layer, c.n_kv_head, c.head_dim, n_ctx),
            n_past: 0,
            mode,
            backend: Box::new(ScalarBackend),
            scratch: Scratch::default(),
        }
    }

    /// Run `tokens` through the model at positions `session.n_past() ..`, appending to the KV cache, and
    /// return the logits `[tokens.len(), n_vocab]` (row-major). Every stage is handed to `sink`, which may
    /// replace it.
    ///
    /// Errors: an empty batch, a token id outside the vocabulary, the context overflowing the session.
    pub fn forward<'s>(
        &self,
        session: &'s mut Session,
        tokens: &[u32],
        sink: Option<&mut dyn StageSink>,
    ) -> Result<&'s [f32]> {
        if tokens.is_empty() {
            return Err(Error::Invalid("forward called with no tokens".into()));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.config.n_vocab) {
            return Err(Error::Invalid(format!(
                "token id {bad} is outside the vocabulary (size {})",
                self.config.n_vocab
            )));
        }
        if session.n_past + tokens.len() > session.kv.capacity() {
            return Err(Error::Invalid(format!(
                "context overflow: {} cached + {} new positions > session size {}",
                session.n_past,
                tokens.len(),
                session.kv.capacity()
            )));
        }
        match &self.arch {
            Arch::Llama(m) => m.forward(&self.gguf, &self.config, session, tokens, sink)?,
        }
        session.n_past += tokens.len();
        Ok(&session.scratch.logits[..tokens.len() * self.config.n_vocab])
    }
}

/// Per-sequence state: KV cache, position, numerics mode, backend and reusable activation buffers.
pub struct Session {
    /// Keys and values of every processed position.
    pub kv: KvCache,
    n_past: usize,
    mode: NumericsMode,
    backend: Box<dyn Backend>,
    scratch: Scratch,
}

impl Session {
    /// Positions already in the KV cache (the position of the next token).
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Numerics mode of every matrix product in this session.
    pub fn mode(&self) -> NumericsMode {
        self.mode
    }

    /// Name of the compute backend.
    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// Forget every cached position (the next forward starts at position 0).
    pub fn reset(&mut self) {
        self.n_past = 0;
    }
}

/// Activation buffers reused across forward calls (resized, never shrunk: no allocation once warm).
#[derive(Default)]
pub(crate) struct Scratch {
    pub x: Vec<f32>,
    pub h: Vec<f32>,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub att: Vec<f32>,
    pub proj: Vec<f32>,
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub logits: Vec<f32>,
    pub rope: Vec<f32>,
    pub scores: Vec<f32>,
    pub mm: MatmulScratch,
}

/// Resize a scratch buffer to `n` (contents unspecified) — allocation only when it grows past capacity.
#[inline]
pub(crate) fn sized(buf: &mut Vec<f32>, n: usize) -> &mut [f32] {
    buf.resize(n, 0.0);
    &mut buf[..n]
}
