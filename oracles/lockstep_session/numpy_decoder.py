"""What the two porter's example engines (numpy_olmo2.py, numpy_granite.py) share: an HF decoder read from
its checkpoint directory (config.json + safetensors, `read_safetensors`), float32 throughout, with its own
KV cache, transformers' RoPE (rotate_half: the two halves of each head, `apply_rotary_pos_emb`), eager
attention (`eager_attention_forward`: scores × scale, causal mask, softmax, × V, grouped-query heads
repeated) and RMSNorm (`Olmo2RMSNorm` / `GraniteRMSNorm`: x / sqrt(mean(x²) + eps) × weight, in float32).

A subclass writes `layer(l, x, pos, start)`, the wiring of one block, and `logits(y)`. Every value it names
with `self.at(stage, value)` is recorded in the step's dump under that canonical stage id (README, "Plugging
in another engine") and, with the capability `inject`, replaced by the harness's value when one was
injected for this step.
"""
import json
import os

import numpy as np

from lockstep_session import read_safetensors


class HfDecoder:
    """A decoder-only HF checkpoint behind lockstep's session protocol (version 2, format "hf")."""

    name = "numpy-decoder"
    # config.json's model_type this engine implements (a subclass sets it)
    model_type = None

    def __init__(self, bug=None):
        self.bug = bug
        self.pending, self.injected = {}, {}
        # "name@version": `load`'s answer, and a refused `load`'s (lockstep_session.serve)
        self.engine_name = f"{self.name}@1" + (f"-{bug}" if bug else "")

    def load(self, model, mode, target, format="gguf"):
        if format != "hf":
            raise NotImplementedError(f"{self.name} reads HF checkpoint directories; {model} is {format}")
        with open(os.path.join(model, "config.json")) as f:
            self.cfg = c = json.load(f)
        if c.get("model_type") != self.model_type:
            raise NotImplementedError(
                f"{self.name} implements model_type {self.model_type!r}; {model}/config.json says {c.get('model_type')!r}")
        self.w = read_safetensors(model)
        self.n_layer, self.n_head = c["num_hidden_layers"], c["num_attention_heads"]
        self.n_kv = c.get("num_key_value_heads", self.n_head)
        self.hd = c.get("head_dim") or c["hidden_size"] // self.n_head
        self.eps = c["rms_norm_eps"]
        rope = c.get("rope_parameters") or {}
        self.theta = rope.get("rope_theta", c.get("rope_theta", 10000.0))
        if rope.get("rope_type", "default") != "default":
            raise NotImplementedError(f"{model}: rope_type {rope['rope_type']}; this engine has the default RoPE only")
        self.n_vocab = c["vocab_size"]
        return {
            "engine": self.engine_name,
            "capabilities": ["inject"],
            "n_vocab": self.n_vocab,
        }

    def reset(self, mode, target, n_ctx):
        shape = (self.n_layer, n_ctx, self.n_kv, self.hd)
        self.k, self.v = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        self.pending = {}

    def inject(self, stage, value):
        self.pending[stage] = value

    def at(self, stage, value):
        """Record `value` [n, D] as `stage` in this step's dump; go on with the injected rows if any."""
        value = np.ascontiguousarray(value, dtype=np.float32).reshape(value.shape[0], -1)
        self.st[stage] = value
        return self.injected.get(stage, value)

    def weight(self, name):
        return self.w[name]

    def linear(self, x, name):  # torch.nn.Linear without bias: x @ Wᵀ
        return (x @ self.w[name].T).astype(np.float32)

    def rms_norm(self, x, name, n_groups=1):
        """RMSNorm over the last axis (over `n_groups` equal parts of it when > 1), × the weight `name`."""
        n = x.shape[0]
        g = x.reshape(n, n_groups, -1)
        var = np.mean(g * g, axis=-1, keepdims=True, dtype=np.float32)
        return (self.w[name] * (g / np.sqrt(var + np.float32(self.eps))).reshape(n, -1)).astype(np.float32)

    def rope(self, x, pos):
        """transformers' RoPE on x [n, heads, hd] at float32 positions `pos` [n]: halves (rotate_half)."""
        inv = (1.0 / (np.float32(self.theta) ** (np.arange(0, self.hd, 2, dtype=np.float32) / np.float32(self.hd)))).astype(np.float32)
        ang = np.concatenate([pos[:, None] * inv[None, :]] * 2, axis=-1).astype(np.float32)
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        h = self.hd // 2
        rot = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
        return (x * c + rot * s).astype(np.float32)

    def attend(self, l, q, k, v, start, scale):
        """Write k, v [n, n_kv, hd] at positions start.. of layer l's cache; attend q [n, n_head, hd] over
        the cache up to each query's position; heads concatenated, [n, n_head·hd]."""
        n = q.shape[0]
        self.k[l, start:start + n], self.v[l, start:start + n] = k, v
        K, V = self.k[l, : start + n], self.v[l, : start + n]
        g = self.n_head // self.n_kv
        s = np.einsum("qhd,khd->hqk", q, np.repeat(K, g, axis=1)).astype(np.float32) * np.float32(scale)
        pos = np.arange(start, start + n)
        s = np.where(np.arange(start + n)[None, None, :] <= pos[None, :, None], s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        p = (s / s.sum(-1, keepdims=True)).astype(np.float32)
        return np.einsum("hqk,khd->qhd", p, np.repeat(V, g, axis=1)).reshape(n, -1).astype(np.float32)

    def mlp(self, l, h):
        """SwiGLU: down(silu(gate(h)) ⊙ up(h)), recording ffn_gate, ffn_up, ffn_act."""
        p = f"model.layers.{l}.mlp"
        gt = self.at(f"blk.{l}.ffn_gate", self.linear(h, f"{p}.gate_proj.weight"))
        up = self.at(f"blk.{l}.ffn_up", self.linear(h, f"{p}.up_proj.weight"))
        act = self.at(f"blk.{l}.ffn_act", gt / (1 + np.exp(-gt)) * up)
        return self.linear(act, f"{p}.down_proj.weight")

    def layer(self, l, x, pos, start):
        raise NotImplementedError

    def logits(self, y):
        return self.linear(y, "lm_head.weight")

    def embed(self, tokens):
        return self.w["model.embed_tokens.weight"][tokens].astype(np.float32)

    def step(self, tokens, start):
        self.injected, self.pending, self.st = self.pending, {}, {}
        self.decoding = start > 0 and len(tokens) == 1
        pos = np.arange(start, start + len(tokens)).astype(np.float32)
        x = self.at("embed", self.embed(tokens))
        for l in range(self.n_layer):
            x = self.at(f"blk.{l}.out", self.layer(l, x, pos, start))
        y = self.at("output_norm", self.rms_norm(x, "model.norm.weight"))
        return self.logits(y), self.st
