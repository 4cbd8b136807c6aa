"""Granite in numpy, as a porter writes it from the transformers class (`GraniteForCausalLM`,
transformers/models/granite/modeling_granite.py), behind lockstep's session protocol (version 2, HF
checkpoints):

    lockstep run --model porter-granite --oracle transformers-f32 --mode reference --simd off \\
        --engine-serve "python3 oracles/lockstep_session/numpy_granite.py"

What Granite has that a Llama block lacks: four multipliers from config.json — the embeddings ×
`embedding_multiplier`, each residual branch (attention projection, FFN output) × `residual_multiplier`
before its add, the attention scores × `attention_multiplier` (in place of 1/sqrt(head_dim)), and the
logits ÷ `logits_scaling`. Stages under canonical ids: embed (scaled), blk.N.{attn_norm,q,k,v,q_rope,k_rope,
attn_out,attn_proj,ffn_inp,ffn_norm,ffn_gate,ffn_up,ffn_act,ffn_out,out}, output_norm.

Planted bugs (`--bug NAME`), what bisect should name:
- `attention-scale`: scores × 1/sqrt(head_dim) (Llama's) instead of `attention_multiplier` →
  blk.0.attn_out, prefill.
- `residual-multiplier-decode`: layer 1's FFN residual without `residual_multiplier` in decode steps only
  (a porter's separate single-token path) → blk.1.out, decode.
"""
import sys

import numpy as np

from lockstep_session import serve
from numpy_decoder import HfDecoder

BUGS = ("attention-scale", "residual-multiplier-decode")


class NumpyGranite(HfDecoder):
    name = "numpy-granite"
    model_type = "granite"

    def embed(self, tokens):
        return (super().embed(tokens) * np.float32(self.cfg["embedding_multiplier"])).astype(np.float32)

    def layer(self, l, x, pos, start):
        n, p = x.shape[0], f"model.layers.{l}"
        a = f"{p}.self_attn"
        r = np.float32(self.cfg["residual_multiplier"])
        h = self.at(f"blk.{l}.attn_norm", self.rms_norm(x, f"{p}.input_layernorm.weight"))
        q = self.at(f"blk.{l}.q", self.linear(h, f"{a}.q_proj.weight"))
        k = self.at(f"blk.{l}.k", self.linear(h, f"{a}.k_proj.weight"))
        v = self.at(f"blk.{l}.v", self.linear(h, f"{a}.v_proj.weight"))
        q = self.at(f"blk.{l}.q_rope", self.rope(q.reshape(n, self.n_head, self.hd), pos))
        k = self.at(f"blk.{l}.k_rope", self.rope(k.reshape(n, self.n_kv, self.hd), pos))
        scale = self.hd ** -0.5 if self.bug == "attention-scale" else self.cfg["attention_multiplier"]
        o = self.attend(l, q.reshape(n, self.n_head, self.hd), k.reshape(n, self.n_kv, self.hd),
                        v.reshape(n, self.n_kv, self.hd), start, scale)
        o = self.at(f"blk.{l}.attn_out", o)
        o = self.at(f"blk.{l}.attn_proj", self.linear(o, f"{a}.o_proj.weight"))
        x = self.at(f"blk.{l}.ffn_inp", x + o * r)
        h = self.at(f"blk.{l}.ffn_norm", self.rms_norm(x, f"{p}.post_attention_layernorm.weight"))
        f = self.at(f"blk.{l}.ffn_out", self.mlp(l, h))
        if self.bug == "residual-multiplier-decode" and l == 1 and self.decoding:
            return x + f
        return x + f * r

    def logits(self, y):
        return (super().logits(y) / np.float32(self.cfg["logits_scaling"])).astype(np.float32)


if __name__ == "__main__":
    bug = sys.argv[2] if sys.argv[1:2] == ["--bug"] else None
    if bug is not None and bug not in BUGS:
        sys.exit(f"numpy_granite.py: unknown --bug {bug!r}; planted bugs: {', '.join(BUGS)}")
    serve(NumpyGranite(bug=bug))
