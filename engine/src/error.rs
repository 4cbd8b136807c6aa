//! The engine's error type. Every variant names the file (where there is one) and what is wrong.

use std::path::PathBuf;

/// Errors raised by the engine. Messages are meant for a user: they name the file, the byte offset or
/// tensor, and what was expected.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// I/O failure opening or mapping a file.
    #[error("{path}: {source}")]
    Io {
        /// The file being read.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A malformed or hostile GGUF file.
    #[error("{path}: invalid GGUF at byte offset {offset}: {what}")]
    Gguf {
        /// The file being parsed (or `<memory>` for an in-memory buffer).
        path: PathBuf,
        /// Byte offset in the file where the problem was found.
        offset: u64,
        /// What is wrong.
        what: String,
    },
    /// The model uses something this engine does not implement (an architecture, a tensor type, a key).
    #[error("{0}")]
    Unsupported(String),
    /// A required metadata key or tensor is missing or has the wrong type / shape.
    #[error("{path}: {what}")]
    Model {
        /// The model file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// An audio file that cannot be used (not WAV, not 16 kHz mono, truncated, non-finite samples).
    #[error("{path}: {what}")]
    Audio {
        /// The audio file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// Tokenizer construction or encoding failure.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// Bad arguments to an engine call (token id out of range, context overflow, wrong buffer size).
    #[error("{0}")]
    Invalid(String),
}

/// Result alias for engine operations.
pub type Result<T> = std::result::Result<T, Error>;
