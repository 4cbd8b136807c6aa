//! Whisper's log-mel spectrogram, as transformers' `WhisperFeatureExtractor` computes it
//! (`transformers/models/whisper/feature_extraction_whisper.py`, over `audio_utils.spectrogram`,
//! `mel_filter_bank` and `window_function`), which reproduces OpenAI Whisper's `log_mel_spectrogram`.
//!
//! Steps, each a trap a port meets:
//! 1. pad with zeros (or truncate) to `n_samples` = `chunk_length` × 16 000 samples;
//! 2. centre the frames: reflect-pad `n_fft / 2` samples on each side (`np.pad(mode="reflect")`: the edge
//!    sample is not repeated);
//! 3. frames of `n_fft` = 400 samples every `hop_length` = 160, times a **periodic** Hann window
//!    (`np.hanning(n_fft + 1)[:-1]`);
//! 4. power spectrum |rfft|² (201 bins), the last frame dropped (`log_spec[:, :-1]`);
//! 5. mel filters: triangles on the **slaney** mel scale between 0 and 8 kHz, **slaney-normalised**
//!    (each scaled by 2 / (f[m+2] − f[m])); `mel = filtersᵀ · power`;
//! 6. `log10(max(mel, 1e-10))`, clamped below at (global max − 8), then `(x + 4) / 4`.
//!
//! Arithmetic is float64 throughout (as the numpy route of the feature extractor; its torch route, used when
//! torch is installed, is float32 and differs by ~1e-6), rounded to `f32` at the end.

use realfft::RealFftPlanner;

use crate::error::{Error, Result};

/// The front end's shape. [`MelConfig::whisper`] gives transformers' defaults for a given mel count and chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MelConfig {
    /// Samples per second (Whisper: 16 000).
    pub sample_rate: u32,
    /// FFT size and frame length in samples (Whisper: 400 = 25 ms).
    pub n_fft: usize,
    /// Samples between frame starts (Whisper: 160 = 10 ms).
    pub hop_length: usize,
    /// Mel bins (`num_mel_bins` in the model's config: 80, or 128 for large-v3).
    pub n_mels: usize,
    /// Samples the input is padded or truncated to (`chunk_length` × `sample_rate`; Whisper: 30 s).
    pub n_samples: usize,
}

impl MelConfig {
    /// transformers' `WhisperFeatureExtractor(feature_size=n_mels, chunk_length=chunk_seconds)` defaults.
    pub fn whisper(n_mels: usize, chunk_seconds: usize) -> Self {
        MelConfig {
            sample_rate: 16_000,
            n_fft: 400,
            hop_length: 160,
            n_mels,
            n_samples: chunk_seconds * 16_000,
        }
    }

    /// [`MelConfig::whisper`] for a chunk of `n_frames` frames (`n_frames · hop_length` samples): the front
    /// end of a Whisper model whose encoder reads `2·max_source_positions` frames.
    pub fn whisper_frames(n_mels: usize, n_frames: usize) -> Self {
        MelConfig {
            n_samples: n_frames * 160,
            ..Self::whisper(n_mels, 0)
        }
    }

    /// Frequency bins of the one-sided spectrum: `n_fft / 2 + 1`.
    pub fn n_freq(&self) -> usize {
        self.n_fft / 2 + 1
    }

    /// Output frames: `n_samples / hop_length` (the centred STFT gives one more, which is dropped).
    pub fn n_frames(&self) -> usize {
        self.n_samples / self.hop_length
    }

    fn check(&self) -> Result<()> {
        if self.n_fft < 2 || self.hop_length == 0 || self.n_mels == 0 || self.sample_rate == 0 {
            return Err(Error::Invalid(format!(
                "mel front end: degenerate configuration {self:?}"
            )));
        }
        if self.n_samples <= self.n_fft / 2 {
            return Err(Error::Invalid(format!(
                "mel front end: n_samples {} must exceed n_fft/2 = {} for reflect padding",
                self.n_samples,
                self.n_fft / 2
            )));
        }
        Ok(())
    }
}

/// Slaney mel scale (`audio_utils.hertz_to_mel(mel_scale="slaney")`): linear below 1 kHz (3 mel per
/// 200 Hz), logarithmic above (27 mel per factor 6.4).
pub fn hertz_to_mel(hz: f64) -> f64 {
    const MIN_LOG_HZ: f64 = 1000.0;
    const MIN_LOG_MEL: f64 = 15.0;
    if hz >= MIN_LOG_HZ {
        MIN_LOG_MEL + (hz / MIN_LOG_HZ).ln() * (27.0 / 6.4f64.ln())
    } else {
        3.0 * hz / 200.0
    }
}

/// Inverse of [`hertz_to_mel`] (`audio_utils.mel_to_hertz(mel_scale="slaney")`).
pub fn mel_to_hertz(mel: f64) -> f64 {
    const MIN_LOG_HZ: f64 = 1000.0;
    const MIN_LOG_MEL: f64 = 15.0;
    if mel >= MIN_LOG_MEL {
        MIN_LOG_HZ * ((6.4f64.ln() / 27.0) * (mel - MIN_LOG_MEL)).exp()
    } else {
        200.0 * mel / 3.0
    }
}

/// `np.linspace(a, b, n)`: `a + i·(b − a)/(n − 1)`, the last point exactly `b`.
fn linspace(a: f64, b: f64, n: usize) -> Vec<f64> {
    let step = (b - a) / (n - 1) as f64;
    (0..n)
        .map(|i| if i + 1 == n { b } else { a + i as f64 * step })
        .collect()
}

/// Slaney-normalised triangular mel filters between 0 Hz and 8 kHz, as
/// `audio_utils.mel_filter_bank(num_frequency_bins=n_fft/2+1, num_mel_filters=n_mels, min_frequency=0,
/// max_frequency=8000, sampling_rate, norm="slaney", mel_scale="slaney")`.
///
/// Returns `[n_freq][n_mels]` row-major (`n_freq = n_fft/2 + 1`), float64.
pub fn mel_filter_bank(cfg: &MelConfig) -> Vec<f64> {
    let (n_freq, n_mels) = (cfg.n_freq(), cfg.n_mels);
    let mel_freqs = linspace(hertz_to_mel(0.0), hertz_to_mel(8000.0), n_mels + 2);
    let filter_freqs: Vec<f64> = mel_freqs.iter().map(|&m| mel_to_hertz(m)).collect();
    let fft_freqs = linspace(0.0, (cfg.sample_rate / 2) as f64, n_freq);
    let diff: Vec<f64> = filter_freqs.windows(2).map(|w| w[1] - w[0]).collect();
    let mut bank = vec![0.0f64; n_freq * n_mels];
    for (f, &ff) in fft_freqs.iter().enumerate() {
        for m in 0..n_mels {
            // _create_triangular_filter_bank: slopes = filter_freqs − fft_freq
            let down = -(filter_freqs[m] - ff) / diff[m];
            let up = (filter_freqs[m + 2] - ff) / diff[m + 1];
            let tri = down.min(up).max(0.0);
            let enorm = match crate::faults::is(crate::faults::Fault::MelFilterUnnormalised) {
                true => 1.0,
                false => 2.0 / (filter_freqs[m + 2] - filter_freqs[m]),
            };
            bank[f * n_mels + m] = tri * enorm;
        }
    }
    bank
}

/// Periodic Hann window of length `n`: `np.hanning(n + 1)[:-1]`, i.e. `0.5 − 0.5·cos(2πk/n)`.
pub fn hann_periodic(n: usize) -> Vec<f64> {
    (0..n)
        .map(|k| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * k as f64 / n as f64).cos())
        .collect()
}

/// The log-mel spectrogram of `samples` (16 kHz mono in [-1, 1]).
///
/// Returns `[n_mels][n_frames]` row-major `f32` (the layout of `input_features[0]`), `n_frames =
/// cfg.n_frames()`; input longer than `cfg.n_samples` is truncated, shorter is zero-padded (the feature
/// extractor's `padding="max_length", truncation=True`).
///
/// # Errors
/// [`Error::Invalid`] for a degenerate configuration or a non-finite sample.
pub fn log_mel(samples: &[f32], cfg: &MelConfig) -> Result<Vec<f32>> {
    cfg.check()?;
    if let Some(i) = samples.iter().position(|s| !s.is_finite()) {
        return Err(Error::Invalid(format!(
            "mel front end: sample {i} is not finite ({})",
            samples[i]
        )));
    }
    let n = cfg.n_samples;
    let mut x: Vec<f64> = samples.iter().take(n).map(|&s| f64::from(s)).collect();
    x.resize(n, 0.0);

    // reflect padding: x[p], …, x[1] | x | x[n-2], …, x[n-1-p]
    let p = cfg.n_fft / 2;
    let mut padded = Vec::with_capacity(n + 2 * p);
    if crate::faults::is(crate::faults::Fault::StftZeroPadding) {
        padded.resize(p, 0.0);
        padded.extend_from_slice(&x);
        padded.resize(n + 2 * p, 0.0);
    } else {
        padded.extend((1..=p).rev().map(|i| x[i]));
        padded.extend_from_slice(&x);
        padded.extend((1..=p).map(|i| x[n - 1 - i]));
    }

    let window = hann_periodic(cfg.n_fft);
    let n_freq = cfg.n_freq();
    let n_frames = cfg.n_frames();
    let mut planner = RealFftPlanner::<f64>::new();
    let fft = planner.plan_fft_forward(cfg.n_fft);
    let mut input = fft.make_input_vec();
    let mut spectrum = fft.make_output_vec();
    let mut scratch = fft.make_scratch_vec();
    // power[t][f]
    let mut power = vec![0.0f64; n_frames * n_freq];
    for t in 0..n_frames {
        let frame = &padded[t * cfg.hop_length..t * cfg.hop_length + cfg.n_fft];
        for ((dst, &s), &w) in input.iter_mut().zip(frame).zip(&window) {
            *dst = s * w;
        }
        fft.process_with_scratch(&mut input, &mut spectrum, &mut scratch)
            .map_err(|e| Error::Invalid(format!("mel front end: FFT failed: {e}")))?;
        for (dst, c) in power[t * n_freq..(t + 1) * n_freq]
            .iter_mut()
            .zip(&spectrum)
        {
            *dst = c.norm_sqr();
        }
    }

    let bank = mel_filter_bank(cfg);
    let n_mels = cfg.n_mels;
    let mut log_spec = vec![0.0f64; n_mels * n_frames];
    for t in 0..n_frames {
        let pw = &power[t * n_freq..(t + 1) * n_freq];
        for m in 0..n_mels {
            let mut acc = 0.0f64;
            for (f, &p) in pw.iter().enumerate() {
                acc += bank[f * n_mels + m] * p;
            }
            log_spec[m * n_frames + t] = acc.max(1e-10).log10();
        }
    }
    let max = log_spec.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Ok(log_spec
        .iter()
        .map(|&v| ((v.max(max - 8.0) + 4.0) / 4.0) as f32)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test signal of `testdata/mel-80x100-tone-chirp.f32`: 0.5 s of a 440 Hz tone plus a chirp, one
    /// click at sample 100, then silence to the 1 s chunk (numpy: float64, cast to float32).
    fn tone_chirp() -> Vec<f32> {
        let mut x: Vec<f32> = (0..8000)
            .map(|n| {
                let n = n as f64;
                let pi2 = 2.0 * std::f64::consts::PI;
                (0.5 * (pi2 * 440.0 * n / 16000.0).sin()
                    + 0.1 * (pi2 * (200.0 + n * 0.3) * n / 16000.0).sin()) as f32
            })
            .collect();
        x[100] = 0.9;
        x
    }

    #[test]
    fn filter_bank_equals_transformers_slaney_bank() {
        // values of WhisperFeatureExtractor(feature_size=80).mel_filters[f, m] (transformers 5.23)
        let cfg = MelConfig::whisper(80, 1);
        let bank = mel_filter_bank(&cfg);
        for (f, m, want) in [
            (1, 0, 0.024862593984176087),
            (51, 44, 0.007608682402448744),
            (101, 62, 0.005150905140435065),
            (151, 72, 0.0014251532675159057),
            (199, 79, 0.00044875902758905584),
        ] {
            let got = bank[f * 80 + m];
            assert!(
                (got - want).abs() <= 1e-15 * want.abs().max(1.0),
                "bank[{f},{m}] = {got}, want {want}"
            );
        }
        assert_eq!(bank.iter().filter(|&&v| v > 0.0).count(), 391);
    }

    #[test]
    fn hann_is_periodic() {
        let w = hann_periodic(400);
        assert_eq!(w[0], 0.0);
        assert!((w[200] - 1.0).abs() < 1e-15);
        // symmetric about n/2, not about (n-1)/2: w[k] == w[n-k]
        assert!((w[1] - w[399]).abs() < 1e-15 && w[399] > 0.0);
    }

    #[test]
    fn log_mel_equals_the_feature_extractor() {
        // testdata: WhisperFeatureExtractor(feature_size=80, chunk_length=1)._np_extract_fbank_features of
        // tone_chirp() padded to 16 000 samples, float32 [80][100] little-endian.
        let bytes = include_bytes!("testdata/mel-80x100-tone-chirp.f32");
        let want: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let cfg = MelConfig::whisper(80, 1);
        let got = log_mel(&tone_chirp(), &cfg).unwrap();
        assert_eq!(got.len(), 80 * 100);
        let max_err = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(max_err <= 2e-6, "max abs error {max_err}");
    }

    #[test]
    fn padding_is_reflect_not_zero() {
        // a DC signal: reflect padding keeps frame 0's window full, zero padding would halve its energy
        let cfg = MelConfig::whisper(80, 1);
        let x = vec![0.25f32; 16_000];
        let s = log_mel(&x, &cfg).unwrap();
        // mel bin 0, frames 0 and 50 see the same constant signal
        assert!((s[0] - s[50]).abs() < 1e-6, "{} vs {}", s[0], s[50]);
    }

    #[test]
    fn refuses_non_finite_input() {
        let cfg = MelConfig::whisper(80, 1);
        let e = log_mel(&[0.0, f32::NAN], &cfg).unwrap_err().to_string();
        assert!(e.contains("sample 1 is not finite"), "{e}");
    }
}
