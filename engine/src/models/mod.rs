//! Models: loading a GGUF file into an architecture, sessions (KV cache + scratch), and the forward pass.
//!
//! Layout (one concept per module):
//! - [`hparams`]: typed `<arch>.*` metadata and the dimensions of a decoder-only transformer;
//! - [`weights`]: quantized matrices left in the map, small f32 vectors;
//! - [`blocks`]: the shared blocks (embedding, RMSNorm, attention with options, gated FFN, pre/post-norm
//!   layer, output head) that compute and emit every stage;
//! - one module per architecture ([`llama`], [`qwen2`], [`qwen3`], [`gemma2`], [`gemma3`], [`gemma4`], [`phi3`],
//!   [`starcoder2`], [`stablelm`], [`gpt2`]): hyperparameters and wiring, no
//!   arithmetic. A new architecture is a new module plus a line in [`ARCHITECTURES`];
//! - encoders ([`bert`]): the blocks of [`encoder`] (bidirectional attention, post-norms, pooling), a line
//!   in [`ENCODER_ARCHITECTURES`]. An encoder's session has no KV cache: one forward pass per sequence, its
//!   output the pooled embedding ([`Output::Pooled`]).
//!
//! - encoder–decoder speech models ([`whisper`]): the blocks of [`speech`] (log-mel input, convolutions,
//!   an encoder stack, cross-attention), a line in [`SPEECH_ARCHITECTURES`]. [`Model::encode_audio`] runs
//!   the encoder once per input and caches every decoder block's cross-attention keys and values;
//!   [`Model::forward`] then runs decoder tokens as for any decoder.
//!
//! The public surface the harness uses is [`Model`] and [`Session`].

pub mod bert;
pub mod blocks;
pub mod encoder;
pub mod gemma2;
pub mod gemma3;
pub mod gemma4;
pub mod gpt2;
pub mod hparams;
pub mod llama;
pub mod phi3;
pub mod qwen2;
pub mod qwen3;
pub mod speech;
pub mod stablelm;
pub mod starcoder2;
pub mod weights;
pub mod whisper;

use std::path::Path;
use std::sync::OnceLock;

use crate::backend::{Backend, CpuBackend, MatmulScratch};
use crate::gguf::GgufFile;
use crate::hooks::{Stage, StageSink};
use crate::kv_cache::KvCache;
use crate::numerics::{GgmlTarget, Numerics, NumericsMode, Simd};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

pub use blocks::Decoder;
pub use encoder::Encoder;
pub use hparams::DecoderDims;
pub use weights::{load_vector, Weight};

/// The architectures the engine runs: `general.architecture` → the module that wires its [`Decoder`].
/// The next architecture goes here and in a module of its own beside [`llama`].
pub const ARCHITECTURES: &[(&str, ArchLoader)] = &[
    ("llama", llama::load),
    ("qwen2", qwen2::load),
    ("qwen3", qwen3::load),
    ("gemma2", gemma2::load),
    ("gemma3", gemma3::load),
    ("gemma4", gemma4::load),
    ("phi3", phi3::load),
    ("starcoder2", starcoder2::load),
    ("stablelm", stablelm::load),
    ("gpt2", gpt2::load),
];

/// Reads an architecture's hyperparameters and builds its blocks.
pub type ArchLoader = fn(&GgufFile) -> Result<(DecoderDims, Decoder)>;

/// The encoder-only architectures: `general.architecture` → the module that wires its [`Encoder`].
pub const ENCODER_ARCHITECTURES: &[(&str, EncoderLoader)] = &[("bert", bert::load)];

/// Reads an encoder architecture's hyperparameters and builds its blocks.
pub type EncoderLoader = fn(&GgufFile) -> Result<(DecoderDims, Encoder)>;

/// The encoder–decoder speech architectures: `general.architecture` → the module that wires its
/// [`speech::EncoderDecoder`].
pub const SPEECH_ARCHITECTURES: &[(&str, SpeechLoader)] = &[("whisper", whisper::load)];

/// Reads a speech architecture's hyperparameters (the decoder's as [`DecoderDims`]) and builds its blocks.
pub type SpeechLoader = fn(&GgufFile) -> Result<(DecoderDims, speech::EncoderDecoder)>;

/// What [`Model::forward`] returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// A decoder's logits, `[rows, n_vocab]`.
    Logits,
    /// An encoder's pooled embedding, `[1, d_model]` (the stage `pooled`).
    Pooled,
}

/// The blocks of a loaded model.
#[derive(Debug)]
enum Net {
    Decoder(Decoder),
    Encoder(Encoder),
    Speech(Box<speech::EncoderDecoder>),
}

/// What the harness and the CLI need to know about a loaded model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelInfo {
    /// `general.architecture`.
    pub arch: String,
    /// Vocabulary size (logit row width).
    pub n_vocab: usize,
    /// Training context length.
    pub n_ctx_train: usize,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Residual width.
    pub d_model: usize,
    /// Every dimension the architecture read from the file.
    pub dims: DecoderDims,
}

/// A loaded model: the mapped file, its tokenizer and its architecture's blocks.
pub struct Model {
    gguf: GgufFile,
    tokenizer: Tokenizer,
    info: ModelInfo,
    net: Net,
    stages: OnceLock<Vec<(Stage, usize)>>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("path", &self.gguf.path())
            .field("info", &self.info)
            .finish()
    }
}

impl Model {
    /// Open a GGUF file, or a Hugging Face checkpoint directory ([`crate::hf::open_dir`]), and prepare its
    /// architecture. Weights stay in the memory map (an HF directory: but for the derived copies its layout
    /// needs, [`crate::gguf::HfSource::derived`]).
    ///
    /// Errors: unreadable or invalid GGUF, unsupported architecture or tensor type, missing metadata or
    /// tensors — each naming the file.
    pub fn load(path: &Path) -> Result<Model> {
        Self::from_gguf(crate::hf::open(path)?)
    }

    /// Prepare a model from an already parsed file (tests build synthetic files in memory).
    pub fn from_gguf(gguf: GgufFile) -> Result<Model> {
        let arch = gguf.get_str("general.architecture")?.to_string();
        let decoder = ARCHITECTURES.iter().find(|(name, _)| *name == arch);
        let encoder = ENCODER_ARCHITECTURES.iter().find(|(name, _)| *name == arch);
        let speech = SPEECH_ARCHITECTURES.iter().find(|(name, _)| *name == arch);
        // on an HF directory, errors naming a tensor name its HF name too
        let hf_err = |e| crate::hf::with_hf_names(e, &gguf);
        let (dims, net) = match (decoder, encoder) {
            (None, None) if speech.is_some() => {
                let (_, loader) = speech.expect("checked");
                let (dims, sd) = loader(&gguf).map_err(hf_err)?;
                (dims, Net::Speech(Box::new(sd)))
            }
            (Some((_, loader)), _) => {
                let (dims, d) = loader(&gguf).map_err(hf_err)?;
                (dims, Net::Decoder(d))
            }
            (None, Some((_, loader))) => {
                let (dims, e) = loader(&gguf).map_err(hf_err)?;
                (dims, Net::Encoder(e))
            }
            (None, None) => {
                let known: Vec<&str> = ARCHITECTURES
                    .iter()
                    .map(|(n, _)| *n)
                    .chain(ENCODER_ARCHITECTURES.iter().map(|(n, _)| *n))
                    .chain(SPEECH_ARCHITECTURES.iter().map(|(n, _)| *n))
                    .collect();
                return Err(Error::Unsupported(format!(
                    "{}: architecture {arch:?} is not supported yet (supported: {})",
                    gguf.path().display(),
                    known.join(", ")
                )));
            }
        };
        let tokenizer = Tokenizer::from_gguf(&gguf)?;
        if tokenizer.vocab_size() != dims.n_vocab {
            return Err(Error::Model {
                path: gguf.path().to_path_buf(),
                what: format!(
                    "the tokenizer has {} tokens but token_embd has {} rows",
                    tokenizer.vocab_size(),
                    dims.n_vocab
                ),
            });
        }
        Ok(Model {
            gguf,
            tokenizer,
            info: ModelInfo {
                arch,
                n_vocab: dims.n_vocab,
                n_ctx_train: dims.n_ctx_train,
                n_layer: dims.n_layer,
                d_model: dims.d_model,
                dims,
            },
            net,
            stages: OnceLock::new(),
        })
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Architecture name and dimensions.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// The blocks of a decoder-only model (weights, per-layer options); `None` for an encoder.
    pub fn decoder(&self) -> Option<&Decoder> {
        match &self.net {
            Net::Decoder(d) => Some(d),
            Net::Speech(s) => Some(&s.decoder),
            Net::Encoder(_) => None,
        }
    }

    /// The blocks of an encoder–decoder speech model (Whisper); `None` for every other model.
    pub fn speech(&self) -> Option<&speech::EncoderDecoder> {
        match &self.net {
            Net::Speech(s) => Some(s),
            _ => None,
        }
    }

    /// The blocks of an encoder-only model (BERT); `None` for a decoder.
    pub fn encoder(&self) -> Option<&Encoder> {
        match &self.net {
            Net::Encoder(e) => Some(e),
            Net::Decoder(_) | Net::Speech(_) => None,
        }
    }

    /// What [`Model::forward`] returns: logits (decoders) or the pooled embedding (encoders).
    pub fn output(&self) -> Output {
        match self.net {
            Net::Decoder(_) | Net::Speech(_) => Output::Logits,
            Net::Encoder(_) => Output::Pooled,
        }
    }

    /// The width of a row [`Model::forward`] returns: `n_vocab` for logits, `d_model` for a pooled
    /// embedding.
    pub fn output_width(&self) -> usize {
        match self.output() {
            Output::Logits => self.info.n_vocab,
            Output::Pooled => self.info.d_model,
        }
    }

    /// The parsed file (metadata, tensor table).
    pub fn gguf(&self) -> &GgufFile {
        &self.gguf
    }

    /// Every stage the forward pass emits, in forward order, with its row width.
    ///
    /// Derived from the forward pass itself, not from a list kept beside it: the first call runs one token
    /// (id 0, reference mode) through a fresh session with a recording sink and keeps the order in which
    /// the blocks emitted their stages. Errors of that pass (none for a model that loaded) yield an empty
    /// list.
    pub fn stages(&self) -> Vec<(Stage, usize)> {
        self.stages
            .get_or_init(|| {
                struct Order(Vec<(Stage, usize)>);
                impl StageSink for Order {
                    fn on_stage(
                        &mut self,
                        stage: Stage,
                        _: std::ops::Range<usize>,
                        width: usize,
                        _: &mut [f32],
                    ) {
                        self.0.push((stage, width));
                    }
                }
                let mut order = Order(Vec::new());
                let mut s = self.session(1, NumericsMode::Reference);
                if let Some(sd) = self.speech() {
                    // a speech model's decoder reads an encoded input: silence (a zero mel)
                    let e = &sd.encoder;
                    let mel = vec![0.0f32; e.stem.n_mels * e.n_frames];
                    if self.encode_audio(&mut s, &mel, Some(&mut order)).is_err() {
                        return Vec::new();
                    }
                }
                match self.forward(&mut s, &[0], Some(&mut order)) {
                    Ok(_) => order.0,
                    Err(_) => Vec::new(),
                }
            })
            .clone()
    }

    /// Refuse a sequence of `n_positions` that the model was not trained for, before any work: more than
    /// `n_ctx_train` (`<arch>.context_length`), or none at all. llama.cpp clamps nothing either: its
    /// `llama_decode` fails past the context it was given.
    ///
    /// Errors: [`Error::Invalid`] naming both numbers.
    pub fn check_context(&self, n_positions: usize) -> Result<()> {
        let n_ctx = self.info.n_ctx_train;
        if n_positions == 0 {
            return Err(Error::Invalid(
                "a sequence of 0 positions has nothing to run".into(),
            ));
        }
        if n_positions > n_ctx {
            return Err(Error::Invalid(format!(
                "a sequence of {n_positions} positions is longer than the model's context of {n_ctx} \
                 (context_length); shorten the prompt or the number of tokens to generate"
            )));
        }
        Ok(())
    }

    /// A fresh session (empty KV cache) for up to `n_ctx` positions with the numerics `numerics`: a whole
    /// [`Numerics`], or a bare [`NumericsMode`] (then the default target [`GgmlTarget::Avx512`] and the
    /// scalar kernels, [`Simd::Off`]). An encoder's session has no KV cache (a zero-layer one: nothing is
    /// allocated or kept between forward passes).
    pub fn session(&self, n_ctx: usize, numerics: impl Into<Numerics>) -> Session {
        let numerics = numerics.into();
        // one (n_kv_head, head_dim) per cached layer (Gemma 4's differ); an encoder caches nothing
        let shapes: Vec<(usize, usize)> = match self.decoder() {
            Some(dec) => (dec.layers.iter())
                .map(|l| (l.attn.shape.n_kv_head, l.attn.shape.head_dim))
                .collect(),
            None => Vec::new(),
        };
        Session {
            kv: KvCache::with_layers(&shapes, n_ctx),
            n_past: 0,
            numerics,
            input_rounding: false,
            backend: Box::new(CpuBackend::new(numerics.simd)),
            mm: MatmulScratch::default(),
            act: blocks::Activations::default(),
            enc: encoder::EncoderBufs::default(),
            speech: speech::SpeechBufs::default(),
        }
    }

    /// Encode one input of an encoder–decoder speech model: `mel` is the log-mel spectrogram
    /// `[n_mels, n_frames]` row-major (HF `WhisperFeatureExtractor`'s `input_features[0]`; from a WAV file:
    /// [`crate::audio::log_mel`] with [`Model::mel_config`]). Runs the encoder and caches every decoder
    /// block's cross-attention keys and values in the session (computed once here, read by every
    /// [`Model::forward`] after); the session's decoder positions restart at 0. Emits `mel`, the encoder's
    /// stages (`enc.…`) and `blk.N.cross_k` / `cross_v` to `sink`.
    ///
    /// Errors: a model that is not a speech model; a mel of the wrong shape; as the blocks'.
    pub fn encode_audio(
        &self,
        session: &mut Session,
        mel: &[f32],
        sink: Option<&mut dyn StageSink>,
    ) -> Result<()> {
        let Some(sd) = self.speech() else {
            return Err(Error::Invalid(format!(
                "{} is not a speech model: it has no audio encoder",
                self.info.arch
            )));
        };
        let Session {
            kv,
            n_past,
            numerics,
            backend,
            mm,
            speech,
            ..
        } = session;
        let mut f = blocks::Fwd::new(&self.gguf, *numerics, backend.as_ref(), mm, sink, 0, 1);
        *n_past = 0;
        sd.encode(&mut f, kv, speech, mel)
    }

    /// The log-mel front end a speech model reads ([`crate::audio::MelConfig::whisper`] with the model's
    /// mel bins and its chunk of `2·max_source_positions` frames, 10 ms each); `None` for other models.
    pub fn mel_config(&self) -> Option<crate::audio::MelConfig> {
        let e = &self.speech()?.encoder;
        Some(crate::audio::MelConfig::whisper_frames(
            e.stem.n_mels,
            e.n_frames,
        ))
    }

    /// Run `tokens` through the model at positions `session.n_past() ..`, appending to the KV cache, and
    /// return the logits `[tokens.len(), n_vocab]` (row-major). Every stage is handed to `sink`, which may
    /// replace it.
    ///
    /// An encoder ([`Output::Pooled`]) runs the whole sequence in one call from position 0 and returns its
    /// pooled embedding `[1, d_model]`; it has no KV cache, so a second call on the same session (a decode
    /// step) is an error, never a silent re-run: [`Session::reset`] first.
    ///
    /// Errors: an empty batch, a token id outside the vocabulary, the context overflowing the session, a
    /// decode step on an encoder.
    pub fn forward<'s>(
        &self,
        session: &'s mut Session,
        tokens: &[u32],
        sink: Option<&mut dyn StageSink>,
    ) -> Result<&'s [f32]> {
        self.forward_rows(session, tokens, sink, false)
    }

    /// [`Model::forward`] that computes the output head for the batch's last position only and returns
    /// its logits `[n_vocab]`: what llama.cpp does for a batch that asks for the last token's logits
    /// alone (`llama_batch_get_one`; the graph's `inp_out_ids`), as generation and llama-bench's prompt
    /// test do. Every block still runs on every position (the KV cache is filled); `output_norm` and
    /// `logits` are emitted for the last position only. In ggml mode the output matmul is then a
    /// one-row product, with the kernel llama.cpp picks for one row (for some weight types other bits
    /// than the same row inside a full-batch [`Model::forward`]).
    ///
    /// Errors: as [`Model::forward`].
    pub fn forward_last<'s>(
        &self,
        session: &'s mut Session,
        tokens: &[u32],
        sink: Option<&mut dyn StageSink>,
    ) -> Result<&'s [f32]> {
        self.forward_rows(session, tokens, sink, true)
    }

    fn forward_rows<'s>(
        &self,
        session: &'s mut Session,
        tokens: &[u32],
        sink: Option<&mut dyn StageSink>,
        last_only: bool,
    ) -> Result<&'s [f32]> {
        // Called from outside rayon's pool (the usual caller), each of a forward's parallel loops — a few
        // hundred per decode step: every matmul, norm, RoPE and attention — would inject a job into the
        // pool and block the caller on it until a worker finished it. Run from a pool worker instead (one
        // injection per forward), they fork and join inside the pool, as ggml's threads meet at a
        // barrier. A forward with a stage sink (not `Send`) stays on the caller's thread. The split of
        // the work is the same either way, and so are the results.
        if sink.is_none() && rayon::current_thread_index().is_none() {
            return rayon::scope(|_| self.forward_rows_here(session, tokens, None, last_only));
        }
        self.forward_rows_here(session, tokens, sink, last_only)
    }

    /// [`Model::forward_rows`] on the calling thread.
    fn forward_rows_here<'s>(
        &self,
        session: &'s mut Session,
        tokens: &[u32],
        sink: Option<&mut dyn StageSink>,
        last_only: bool,
    ) -> Result<&'s [f32]> {
        if tokens.is_empty() {
            return Err(Error::Invalid("forward called with no tokens".into()));
        }
        let n_vocab = self.info.n_vocab;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(Error::Invalid(format!(
                "token id {bad} is outside the vocabulary (size {n_vocab})"
            )));
        }
        self.check_context(session.n_past + tokens.len())?;
        if session.n_past + tokens.len() > session.kv.capacity() {
            return Err(Error::Invalid(format!(
                "context overflow: {} cached + {} new positions > session size {}",
                session.n_past,
                tokens.len(),
                session.kv.capacity()
            )));
        }
        let Session {
            kv,
            n_past,
            numerics,
            backend,
            mm,
            act,
            enc,
            ..
        } = session;
        let encoder = match &self.net {
            Net::Decoder(decoder) => Err(decoder),
            Net::Speech(s) => Err(&s.decoder),
            Net::Encoder(e) => Ok(e),
        };
        let decoder = match encoder {
            Err(decoder) => decoder,
            Ok(e) => {
                if *n_past > 0 {
                    return Err(Error::Invalid(format!(
                    "{} is an encoder without a KV cache: a sequence is one forward pass from position 0, \
                     so there is no decode step after the {} positions already run (reset the session \
                     and run the whole sequence)",
                    self.info.arch, *n_past
                )));
                }
                let mut f = blocks::Fwd::new(
                    &self.gguf,
                    *numerics,
                    backend.as_ref(),
                    mm,
                    sink,
                    0,
                    tokens.len(),
                );
                e.forward(&mut f, enc, tokens)?;
                *n_past += tokens.len();
                return Ok(&enc.pooled[..self.info.d_model]);
            }
        };
        let mut f = blocks::Fwd::new(
            &self.gguf,
            *numerics,
            backend.as_ref(),
            mm,
            sink,
            *n_past,
            tokens.len(),
        );
        decoder.forward(&mut f, kv, act, tokens, last_only)?;
        *n_past += tokens.len();
        let rows = if last_only { 1 } else { tokens.len() };
        Ok(&act.logits[..rows * n_vocab])
    }
}

/// Per-sequence state: KV cache, position, numerics mode, backend and reusable activation buffers.
pub struct Session {
    /// Keys and values of every processed position.
    pub kv: KvCache,
    n_past: usize,
    /// Mode, ggml target and kernels of every forward; the backend is always `CpuBackend::new(numerics.simd)`.
    numerics: Numerics,
    input_rounding: bool,
    backend: Box<dyn Backend>,
    mm: MatmulScratch,
    act: blocks::Activations,
    enc: encoder::EncoderBufs,
    speech: speech::SpeechBufs,
}

impl Session {
    /// Positions already in the KV cache (the position of the next token).
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Numerics mode of every matrix product in this session.
    pub fn mode(&self) -> NumericsMode {
        self.numerics.mode
    }

    /// The session's numerics as one value (mode, ggml target, SIMD kernels).
    pub fn numerics(&self) -> Numerics {
        self.numerics
    }

    /// The ggml-cpu build that ggml mode mirrors (default [`GgmlTarget::Avx512`]; ignored in reference
    /// mode).
    pub fn ggml_target(&self) -> GgmlTarget {
        self.numerics.target
    }

    /// Mirror `target`'s ggml-cpu kernels in ggml mode (pick it from the golden's recorded CPU).
    pub fn set_ggml_target(&mut self, target: GgmlTarget) {
        self.numerics.target = target;
    }

    /// Name of the compute backend.
    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// The SIMD setting of the compute kernels (default [`Simd::Off`]).
    pub fn simd(&self) -> Simd {
        self.numerics.simd
    }

    /// Use `simd`'s kernels from the next forward on. In ggml mode this changes no result (the SIMD
    /// kernels give the scalar ones' bits); in reference mode sums may be reordered.
    pub fn set_simd(&mut self, simd: Simd) {
        self.numerics.simd = simd;
        self.backend = Box::new(CpuBackend::new(simd).with_input_rounding(self.input_rounding));
    }

    /// In reference mode, round every matmul input as llama.cpp does (to the weight type's `vec_dot_type`
    /// and back) before the f32 dot products: the rounding probe
    /// ([`crate::quant::PreparedRow::prepare_rounded`]). Off by default; no effect in ggml mode.
    pub fn set_input_rounding(&mut self, on: bool) {
        self.input_rounding = on;
        self.backend = Box::new(CpuBackend::new(self.numerics.simd).with_input_rounding(on));
    }

    /// Forget every cached position (the next forward starts at position 0).
    pub fn reset(&mut self) {
        self.n_past = 0;
    }
}
