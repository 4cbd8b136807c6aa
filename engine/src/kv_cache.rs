//! A flat f32 KV cache with explicit write positions.
//!
//! Layout: one allocation per tensor, `[layer][kv_head][pos][head_dim]`, so that the keys of one head are a
//! contiguous `[n_pos, head_dim]` block for the attention dot products. Every write names its position:
//! the classic prefill bug (every token of a batch written at one cursor) cannot be expressed.

use crate::{Error, Result};

/// Keys and values of every layer for up to `capacity` positions. f32 (llama.cpp `type_k = type_v = F32`).
/// Each layer has its own KV head count and head width (Gemma 4's full-attention layers have wider heads
/// than its sliding-window ones); most models have one shape for all.
#[derive(Clone, Debug)]
pub struct KvCache {
    /// Per layer: `(n_kv_head, head_dim, offset of the layer's block in k and v)`.
    layers: Vec<(usize, usize, usize)>,
    capacity: usize,
    /// Per layer `[n_kv_head, capacity, head_dim]`, layers one after the other.
    k: Vec<f32>,
    /// Per layer `[n_kv_head, capacity, head_dim]`, layers one after the other.
    v: Vec<f32>,
    /// Per block, the cross-attention keys and values of the encoded input (`[n_enc, width]` each) and
    /// `n_enc`: computed once per input (an encoder–decoder model), empty otherwise.
    cross: Vec<(Vec<f32>, Vec<f32>, usize)>,
}

impl KvCache {
    /// A zeroed cache for `capacity` positions, its memory written (committed) here, as llama.cpp clears
    /// its KV buffer when it makes a context (`llama_kv_cache` → `ggml_backend_buffer_clear`): the first
    /// forward passes then take no page faults (`vec![0.0; n]` would map lazily zeroed pages).
    pub fn new(n_layer: usize, n_kv_head: usize, head_dim: usize, capacity: usize) -> KvCache {
        KvCache::with_layers(&vec![(n_kv_head, head_dim); n_layer], capacity)
    }

    /// [`KvCache::new`] with a shape per layer: `shapes[l] = (n_kv_head, head_dim)`.
    pub fn with_layers(shapes: &[(usize, usize)], capacity: usize) -> KvCache {
        let mut layers = Vec::with_capacity(shapes.len());
        let mut n = 0;
        for &(h, d) in shapes {
            layers.push((h, d, n));
            n += h * capacity * d;
        }
        let written = || {
            let mut v = Vec::with_capacity(n);
            // black_box: an allocator may not fold this write back into a lazily zeroed allocation
            v.resize(n, std::hint::black_box(0.0f32));
            v
        };
        KvCache {
            layers,
            capacity,
            k: written(),
            v: written(),
            cross: Vec::new(),
        }
    }

    /// Maximum number of positions.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Start of `head`'s `[capacity, head_dim]` block in `layer`, and the layer's head_dim.
    #[inline]
    fn base(&self, layer: usize, head: usize) -> (usize, usize) {
        let (_, hd, off) = self.layers[layer];
        (off + head * self.capacity * hd, hd)
    }

    /// Store the key and value rows of one token at `pos`. `k_row`, `v_row`: `[n_kv_head · head_dim]` of
    /// the layer, heads concatenated. Errors when `pos` is past the capacity.
    pub fn write(&mut self, layer: usize, pos: usize, k_row: &[f32], v_row: &[f32]) -> Result<()> {
        if pos >= self.capacity {
            return Err(Error::Invalid(format!(
                "KV cache full: position {pos} is past the context size {}",
                self.capacity
            )));
        }
        let (n_kv_head, hd, _) = self.layers[layer];
        for h in 0..n_kv_head {
            let at = self.base(layer, h).0 + pos * hd;
            self.k[at..at + hd].copy_from_slice(&k_row[h * hd..(h + 1) * hd]);
            self.v[at..at + hd].copy_from_slice(&v_row[h * hd..(h + 1) * hd]);
        }
        Ok(())
    }

    /// Keys of `head` in `layer` for positions `0..n_pos`: `[n_pos, head_dim]`.
    /// Keep block `layer`'s cross-attention keys and values (`[n_enc, width]` each), replacing those of
    /// an earlier input.
    pub fn set_cross(&mut self, layer: usize, k: &[f32], v: &[f32], n_enc: usize) {
        if self.cross.len() <= layer {
            self.cross.resize(layer + 1, (Vec::new(), Vec::new(), 0));
        }
        let n = n_enc;
        let slot = &mut self.cross[layer];
        slot.0.clear();
        slot.0.extend_from_slice(k);
        slot.1.clear();
        slot.1.extend_from_slice(v);
        slot.2 = n;
    }

    /// Block `layer`'s cross-attention keys, values and their row count, once set
    /// ([`KvCache::set_cross`]); `None` before.
    pub fn cross(&self, layer: usize) -> Option<(&[f32], &[f32], usize)> {
        self.cross
            .get(layer)
            .filter(|c| c.2 > 0)
            .map(|c| (&c.0[..], &c.1[..], c.2))
    }

    #[inline]
    pub fn keys(&self, layer: usize, head: usize, n_pos: usize) -> &[f32] {
        let (b, hd) = self.base(layer, head);
        &self.k[b..b + n_pos * hd]
    }

    /// Values of `head` in `layer` for positions `0..n_pos`: `[n_pos, head_dim]`.
    #[inline]
    pub fn values(&self, layer: usize, head: usize, n_pos: usize) -> &[f32] {
        let (b, hd) = self.base(layer, head);
        &self.v[b..b + n_pos * hd]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_land_at_their_position() {
        let mut c = KvCache::new(2, 2, 3, 4);
        c.write(
            1,
            2,
            &[1., 2., 3., 4., 5., 6.],
            &[7., 8., 9., 10., 11., 12.],
        )
        .unwrap();
        assert_eq!(&c.keys(1, 0, 3)[6..9], &[1., 2., 3.]);
        assert_eq!(&c.keys(1, 1, 3)[6..9], &[4., 5., 6.]);
        assert_eq!(&c.values(1, 1, 3)[6..9], &[10., 11., 12.]);
        assert!(c.keys(0, 0, 4).iter().all(|&x| x == 0.0));
        assert!(c.write(0, 4, &[0.; 6], &[0.; 6]).is_err());
    }

    #[test]
    fn layers_of_different_widths_do_not_overlap() {
        // layer 0: 1 head of 2; layer 1: 2 heads of 3
        let mut c = KvCache::with_layers(&[(1, 2), (2, 3)], 2);
        c.write(0, 1, &[1., 2.], &[3., 4.]).unwrap();
        c.write(1, 0, &[5., 6., 7., 8., 9., 10.], &[0.; 6]).unwrap();
        assert_eq!(c.keys(0, 0, 2), &[0., 0., 1., 2.]);
        assert_eq!(c.values(0, 0, 2), &[0., 0., 3., 4.]);
        assert_eq!(c.keys(1, 1, 1), &[8., 9., 10.]);
    }
}
