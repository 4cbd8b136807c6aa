//! Audio input for speech models: 16 kHz mono WAV files ([`wav`]) and Whisper's log-mel front end ([`mel`]).
//!
//! The front end has no learned weights and is fully deterministic, so it is the first stage a Whisper port
//! is held to: frame 0 matching the reference says the windowing and the FFT are right.

pub mod mel;
pub mod wav;

pub use mel::{log_mel, mel_filter_bank, MelConfig};
pub use wav::read_wav_16k_mono;
