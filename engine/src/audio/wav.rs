//! WAV input (the `hound` crate): 16 kHz mono, 16-bit integer or 32-bit float samples.
//!
//! Anything else is refused with the file's name and what it holds: the log-mel front end
//! ([`super::mel`]) assumes Whisper's 16 kHz, and resampling or down-mixing would be a hidden
//! preprocessing step that the reference (transformers' `WhisperFeatureExtractor`, which takes samples
//! already at its `sampling_rate`) does not make.

use std::path::Path;

use crate::error::{Error, Result};

/// The only sample rate accepted, in Hz (Whisper's `WhisperFeatureExtractor.sampling_rate`).
pub const SAMPLE_RATE: u32 = 16_000;

/// Reads a 16 kHz mono WAV file into samples in [-1, 1].
///
/// 16-bit PCM is scaled by 1/32768 (as `soundfile`/`librosa` read it); 32-bit float is taken as is. Returns
/// one `f32` per sample.
///
/// # Errors
/// [`Error::Audio`] naming the file when it cannot be opened or parsed, is not 16 kHz, is not mono, uses
/// another sample format, is empty, or holds a non-finite sample.
pub fn read_wav_16k_mono(path: &Path) -> Result<Vec<f32>> {
    let bad = |what: String| Error::Audio {
        path: path.to_path_buf(),
        what,
    };
    let mut reader =
        hound::WavReader::open(path).map_err(|e| bad(format!("not a readable WAV file: {e}")))?;
    let spec = reader.spec();
    if spec.sample_rate != SAMPLE_RATE {
        return Err(bad(format!(
            "sample rate is {} Hz; Whisper's front end takes {SAMPLE_RATE} Hz (resample it first, e.g. \
             `sox in.wav -r 16000 -c 1 out.wav`)",
            spec.sample_rate
        )));
    }
    if spec.channels != 1 {
        return Err(bad(format!(
            "{} channels; Whisper's front end takes mono (mix it down first, e.g. `sox in.wav -c 1 out.wav`)",
            spec.channels
        )));
    }
    let samples: Vec<f32> = match (spec.sample_format, spec.bits_per_sample) {
        (hound::SampleFormat::Int, 16) => reader
            .samples::<i16>()
            .map(|s| s.map(|v| f32::from(v) / 32768.0))
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| bad(format!("truncated or corrupt sample data: {e}")))?,
        (hound::SampleFormat::Float, 32) => reader
            .samples::<f32>()
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| bad(format!("truncated or corrupt sample data: {e}")))?,
        (format, bits) => {
            return Err(bad(format!(
                "{bits}-bit {format:?} samples; accepted are 16-bit integer and 32-bit float"
            )))
        }
    };
    if samples.is_empty() {
        return Err(bad("holds no samples".into()));
    }
    if let Some(i) = samples.iter().position(|s| !s.is_finite()) {
        return Err(bad(format!("sample {i} is not finite ({})", samples[i])));
    }
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, rate: u32, channels: u16, samples: &[i16]) {
        let spec = hound::WavSpec {
            channels,
            sample_rate: rate,
            bits_per_sample: 16,
            sample_format: hound::SampleFormat::Int,
        };
        let mut w = hound::WavWriter::create(path, spec).unwrap();
        for &s in samples {
            w.write_sample(s).unwrap();
        }
        w.finalize().unwrap();
    }

    #[test]
    fn reads_16_bit_mono_scaled_to_unit_range() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.wav");
        write(&p, 16_000, 1, &[0, 16384, -32768, 32767]);
        let s = read_wav_16k_mono(&p).unwrap();
        assert_eq!(s, vec![0.0, 0.5, -1.0, 32767.0 / 32768.0]);
    }

    #[test]
    fn refuses_other_rates_channels_and_garbage_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.wav");
        write(&p, 44_100, 1, &[1, 2]);
        let e = read_wav_16k_mono(&p).unwrap_err().to_string();
        assert!(e.contains("r.wav") && e.contains("44100 Hz"), "{e}");
        let p = dir.path().join("c.wav");
        write(&p, 16_000, 2, &[1, 2]);
        let e = read_wav_16k_mono(&p).unwrap_err().to_string();
        assert!(e.contains("c.wav") && e.contains("2 channels"), "{e}");
        let p = dir.path().join("g.wav");
        std::fs::write(&p, b"RIFF\x10\x00\x00\x00WAVEjunk").unwrap();
        let e = read_wav_16k_mono(&p).unwrap_err().to_string();
        assert!(
            e.contains("g.wav") && e.contains("not a readable WAV"),
            "{e}"
        );
        let p = dir.path().join("e.wav");
        write(&p, 16_000, 1, &[]);
        let e = read_wav_16k_mono(&p).unwrap_err().to_string();
        assert!(e.contains("no samples"), "{e}");
    }
}
