//! Next-token selection from a row of logits: greedy, or temperature → top-k → top-p sampling.
//!
//! The order (top-k, then top-p over the renormalised survivors, then temperature softmax) follows
//! llama.cpp's common sampler chain (`common/sampling.cpp`: top_k → top_p → temp → dist). With
//! `temperature <= 0` selection is greedy (argmax, lowest id on ties), which is what goldens use.

/// Sampling parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplerConfig {
    /// Softmax temperature; `<= 0` means greedy.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set whose probability mass reaches `top_p` (1.0 = all).
    pub top_p: f32,
    /// Seed of the pseudo-random generator.
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            seed: 0,
        }
    }
}

/// A seeded sampler (splitmix64 generator: deterministic for a given seed on every platform).
#[derive(Clone, Debug)]
pub struct Sampler {
    cfg: SamplerConfig,
    state: u64,
    candidates: Vec<(u32, f32)>,
}

/// Index of the largest logit (first on ties); `None` for an empty row.
pub fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if best.is_none_or(|(_, b)| l > b) {
            best = Some((i, l));
        }
    }
    best.map(|(i, _)| i as u32)
}

impl Sampler {
    /// A sampler with the given parameters.
    pub fn new(cfg: SamplerConfig) -> Sampler {
        Sampler {
            cfg,
            state: cfg.seed ^ 0x9E37_79B9_7F4A_7C15,
            candidates: Vec::new(),
        }
    }

    fn next_f32(&mut self) -> f32 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Choose the next token from `logits` (`[n_vocab]`). Panics never; an empty row returns 0.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.cfg.temperature <= 0.0 {
            return argmax(logits).unwrap_or(0);
        }
        let c = &mut self.candidates;
        c.clear();
        c.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| !l.is_nan())
                .map(|(i, &l)| (i as u32, l)),
        );
        if c.is_empty() {
            return 0;
        }
        c.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if self.cfg.top_k > 0 {
            c.truncate(self.cfg.top_k);
        }
        // softmax at temperature 1 for the top-p cut, as llama.cpp's top_p sampler sees the raw logits
        let max = c[0].1;
        let total: f32 = c.iter().map(|x| (x.1 - max).exp()).sum();
        let mut cum = 0.0;
        let mut keep = c.len();
        for (i, x) in c.iter().enumerate() {
            cum += (x.1 - max).exp() / total;
            if cum >= self.cfg.top_p {
                keep = i + 1;
                break;
            }
        }
        c.truncate(keep.max(1));
        let t = self.cfg.temperature;
        let weights: Vec<f32> = c.iter().map(|x| ((x.1 - max) / t).exp()).collect();
        let sum: f32 = weights.iter().sum();
        let mut r = self.next_f32() * sum;
        for (x, w) in self.candidates.iter().zip(&weights) {
            if r < *w {
                return x.0;
            }
            r -= w;
        }
        self.candidates.last().map_or(0, |x| x.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_is_argmax_first_on_ties() {
        let mut s = Sampler::new(SamplerConfig::default());
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[]), None);
    }

    #[test]
    fn top_k_one_is_greedy_and_seed_is_deterministic() {
        let cfg = SamplerConfig {
            temperature: 1.0,
            top_k: 1,
            top_p: 1.0,
            seed: 7,
        };
        let mut s = Sampler::new(cfg);
        assert_eq!(s.sample(&[0.0, 1.0, 5.0]), 2);
        let cfg = SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 42,
        };
        let logits = [0.0f32; 50];
        let a: Vec<u32> = {
            let mut s = Sampler::new(cfg);
            (0..20).map(|_| s.sample(&logits)).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(cfg);
            (0..20).map(|_| s.sample(&logits)).collect()
        };
        assert_eq!(a, b);
        assert!(
            a.iter().any(|&x| x != a[0]),
            "uniform logits must not always give one token"
        );
    }
}
