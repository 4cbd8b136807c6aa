"""A Llama engine in numpy (float32, F32/F16 GGUF weights) behind lockstep's session protocol: an example of
~50 lines for `lockstep run --engine-serve "python3 oracles/lockstep_session/example_engine.py"
--stage-map oracles/lockstep_session/llama_names.toml`. It dumps under llama.cpp's node names, decodes
through its own KV cache, and does not tokenize (lockstep's tokenizer stands in, and the report says so).
`--bug kv-position` writes each decode step's keys and values at position 0: the porting bug only a
session can catch."""
import sys

import numpy as np

from lockstep_session import gguf_architecture, read_gguf, serve


# the tensors this Llama reads (`blk.N.<kind>.weight` and three globals): a model with any other (biases,
# Q/K norms, RoPE factors, ...) or another architecture is one it cannot run, and it refuses it
KINDS = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"}
GLOBALS = {"token_embd.weight", "output_norm.weight", "output.weight"}


class NumpyLlama:
    def __init__(self, bug=None):
        self.bug = bug
        self.engine_name = "numpy-llama@1" + ("-" + self.bug if self.bug else "")  # named in a refusal too

    def load(self, model, mode, target):
        # NotImplementedError = "cannot run this model": lockstep fails its cells as unsupported, goes on
        if gguf_architecture(model) not in ("llama", None):
            raise NotImplementedError(f"{model}: a {gguf_architecture(model)} model; this example runs plain Llama GGUF files")
        self.meta, self.w = read_gguf(model)  # F32/F16 only: a quantized file is refused there
        m = lambda k, d=None: self.meta.get(f"llama.{k}", d)
        other = [n for n in self.w if n not in GLOBALS and not (
            n.startswith("blk.") and n.endswith(".weight") and n.split(".")[2] in KINDS)]
        arch = self.meta.get("general.architecture")
        if arch != "llama" or other or m("rope.scaling.type", "none") != "none" or None in (
                m("block_count"), m("attention.head_count"), m("embedding_length")):
            what = f"a {arch} model" + (f" with tensor {other[0]}" if other else "")
            raise NotImplementedError(f"{model}: {what}; this example runs plain Llama GGUF files")
        self.n_layer, self.n_head = m("block_count"), m("attention.head_count")
        self.n_kv = m("attention.head_count_kv", self.n_head)
        self.eps, self.base = m("attention.layer_norm_rms_epsilon", 1e-5), m("rope.freq_base", 10000.0)
        self.hd = m("embedding_length") // self.n_head
        return {"engine": self.engine_name, "capabilities": []}

    def reset(self, mode, target, n_ctx):
        shape = (self.n_layer, n_ctx, self.n_kv, self.hd)
        self.k, self.v = np.zeros(shape, np.float32), np.zeros(shape, np.float32)

    def norm(self, x, name):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * self.w[name]

    def rope(self, x, pos):  # llama.cpp's NORM RoPE: adjacent pairs (x[2i], x[2i+1])
        ang = pos[:, None] * self.base ** (-np.arange(0, self.hd, 2) / self.hd)
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = x[..., 0::2], x[..., 1::2]
        return np.stack([a * c - b * s, a * s + b * c], axis=-1).reshape(x.shape).astype(np.float32)

    def step(self, tokens, start):
        n, w, st = len(tokens), self.w, {}
        pos = np.arange(start, start + n, dtype=np.float64)
        x = st["inp_embd"] = w["token_embd.weight"][tokens].astype(np.float32)
        for l in range(self.n_layer):
            p = lambda t: w[f"blk.{l}.{t}.weight"]
            h = st[f"attn_norm-{l}"] = self.norm(x, f"blk.{l}.attn_norm.weight")
            q = self.rope((h @ p("attn_q").T).reshape(n, self.n_head, self.hd), pos)
            k = self.rope((h @ p("attn_k").T).reshape(n, self.n_kv, self.hd), pos)
            at = 0 if (self.bug == "kv-position" and n == 1) else start
            self.k[l, at:at + n], self.v[l, at:at + n] = k, (h @ p("attn_v").T).reshape(n, self.n_kv, self.hd)
            K, V = self.k[l, : start + n], self.v[l, : start + n]
            g = self.n_head // self.n_kv
            s = np.einsum("qhd,khd->hqk", q, np.repeat(K, g, axis=1)) / np.sqrt(self.hd)
            s = np.where(np.arange(start + n)[None, None, :] <= pos[None, :, None], s, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            o = np.einsum("hqk,khd->qhd", s / s.sum(-1, keepdims=True), np.repeat(V, g, axis=1)).reshape(n, -1)
            st[f"kqv_out-{l}"] = o.astype(np.float32)
            x = st[f"ffn_inp-{l}"] = x + o @ p("attn_output").T
            h = st[f"ffn_norm-{l}"] = self.norm(x, f"blk.{l}.ffn_norm.weight")
            gt = h @ p("ffn_gate").T
            st[f"ffn_out-{l}"] = (gt / (1 + np.exp(-gt)) * (h @ p("ffn_up").T)) @ p("ffn_down").T
            x = st[f"l_out-{l}"] = x + st[f"ffn_out-{l}"]
        y = st["result_norm"] = self.norm(x, "output_norm.weight")
        return y @ w.get("output.weight", w["token_embd.weight"]).T, st


if __name__ == "__main__":
    serve(NumpyLlama(bug=sys.argv[2] if sys.argv[1:2] == ["--bug"] else None))
