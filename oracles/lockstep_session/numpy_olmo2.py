"""OLMo 2 in numpy, as a porter writes it from the transformers class (`Olmo2ForCausalLM`,
transformers/models/olmo2/modeling_olmo2.py), behind lockstep's session protocol (version 2, HF checkpoints):

    lockstep run --model porter-olmo2 --oracle transformers-f32 --mode reference --simd off \\
        --engine-serve "python3 oracles/lockstep_session/numpy_olmo2.py"

What OLMo 2 has that a Llama block lacks: no RMSNorm before attention or the FFN; instead one after each
(post_attention_layernorm on the attention output, post_feedforward_layernorm on the FFN output) before its
residual add; and Q/K RMSNorm over the whole projection (all heads at once, weights n_head·head_dim wide),
before RoPE. Stages are dumped under canonical ids: embed, blk.N.{q,k,v,q_norm,k_norm,q_rope,k_rope,
attn_out,attn_proj,attn_post_norm,ffn_inp,ffn_gate,ffn_up,ffn_act,ffn_out,ffn_post_norm,out}, output_norm.

Planted bugs (`--bug NAME`), what bisect should name:
- `k-norm-per-head`: K's RMSNorm over each head instead of the whole projection (a reading of "QK-norm"
  from other architectures) → blk.0.k_norm, prefill.
- `post-norm-residual-l1`: layer 1 normalizes the sum (residual + FFN output) instead of the FFN output
  alone → blk.1.ffn_post_norm, prefill.
"""
import sys

import numpy as np

from lockstep_session import serve
from numpy_decoder import HfDecoder

BUGS = ("k-norm-per-head", "post-norm-residual-l1")


class NumpyOlmo2(HfDecoder):
    name = "numpy-olmo2"
    model_type = "olmo2"

    def layer(self, l, x, pos, start):
        n, p = x.shape[0], f"model.layers.{l}"
        a = f"{p}.self_attn"
        q = self.at(f"blk.{l}.q", self.linear(x, f"{a}.q_proj.weight"))
        k = self.at(f"blk.{l}.k", self.linear(x, f"{a}.k_proj.weight"))
        v = self.at(f"blk.{l}.v", self.linear(x, f"{a}.v_proj.weight"))
        q = self.at(f"blk.{l}.q_norm", self.rms_norm(q, f"{a}.q_norm.weight"))
        k_groups = self.n_kv if self.bug == "k-norm-per-head" else 1
        k = self.at(f"blk.{l}.k_norm", self.rms_norm(k, f"{a}.k_norm.weight", k_groups))
        q = self.at(f"blk.{l}.q_rope", self.rope(q.reshape(n, self.n_head, self.hd), pos))
        k = self.at(f"blk.{l}.k_rope", self.rope(k.reshape(n, self.n_kv, self.hd), pos))
        o = self.attend(l, q.reshape(n, self.n_head, self.hd), k.reshape(n, self.n_kv, self.hd),
                        v.reshape(n, self.n_kv, self.hd), start, self.hd ** -0.5)
        o = self.at(f"blk.{l}.attn_out", o)
        o = self.at(f"blk.{l}.attn_proj", self.linear(o, f"{a}.o_proj.weight"))
        o = self.at(f"blk.{l}.attn_post_norm", self.rms_norm(o, f"{p}.post_attention_layernorm.weight"))
        x = self.at(f"blk.{l}.ffn_inp", x + o)
        f = self.at(f"blk.{l}.ffn_out", self.mlp(l, x))
        if self.bug == "post-norm-residual-l1" and l == 1:
            f = self.rms_norm(x + f, f"{p}.post_feedforward_layernorm.weight") - x
        else:
            f = self.rms_norm(f, f"{p}.post_feedforward_layernorm.weight")
        f = self.at(f"blk.{l}.ffn_post_norm", f)
        return x + f


if __name__ == "__main__":
    bug = sys.argv[2] if sys.argv[1:2] == ["--bug"] else None
    if bug is not None and bug not in BUGS:
        sys.exit(f"numpy_olmo2.py: unknown --bug {bug!r}; planted bugs: {', '.join(BUGS)}")
    serve(NumpyOlmo2(bug=bug))
