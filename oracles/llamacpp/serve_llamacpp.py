"""llama.cpp itself as the engine under test, behind lockstep's session protocol.

    lockstep run --engine-serve "$VENV/bin/python oracles/llamacpp/serve_llamacpp.py" --oracle transformers-f32

runs llama.cpp (llama-cpp-python's low-level API, the oracle's venv: oracles/llamacpp/setup.sh) one cell at a
time: `prefill` is one `llama_decode` of the prompt, each `decode` one `llama_decode` of one token through
llama.cpp's own KV cache (f32, as the llama.cpp-f32kv goldens; `--kv f16` for llama.cpp's default), and every
stage is captured through the scheduler's eval callback exactly as the oracle captures it
(ggml_capture.Capture, its per-architecture node maps), so the report shows llama.cpp's own distance from
transformers per stage. It reports itself as `llama.cpp@<commit of the vendored llama.cpp>`. The numerics
mode and ggml target of a cell do not apply (llama.cpp computes what its build computes); the cells of
both modes run the same engine and are held to their mode's thresholds.
"""

import argparse
import ctypes
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lockstep_session"))

import llama_cpp as L  # noqa: E402

from ggml_capture import (  # noqa: E402
    ARCH_STAGES, KV_TYPES, LLAMA_CPP_COMMIT, Capture, Oracle, Settings, canonical_ids, wanted_nodes,
)
from lockstep_session import serve  # noqa: E402


class LlamaCppEngine:
    def __init__(self, kv: str, threads: int) -> None:
        self.kv, self.threads = kv, threads
        self.oracle = self.ctx = self.batch = None

    def load(self, model, mode, target):
        self.oracle = Oracle(model, Settings(n_threads=self.threads))
        buf = ctypes.create_string_buffer(128)
        if L.llama_model_meta_val_str(self.oracle.model, b"general.architecture", buf, len(buf)) < 0:
            raise ValueError(f"{model}: no general.architecture")
        arch = buf.value.decode()
        if arch not in ARCH_STAGES:
            raise ValueError(f"{model}: architecture {arch} has no node map in ggml_capture.ARCH_STAGES")
        self.stages = ARCH_STAGES[arch][0]
        order = [s for s in canonical_ids(self.stages, self.oracle.n_layer) if s != "logits"]
        name = f"llama.cpp@{LLAMA_CPP_COMMIT[:7]}" + ("" if self.kv == "f32" else f"-{self.kv}kv")
        return {"engine": name, "capabilities": ["tokenize"], "n_vocab": self.oracle.n_vocab, "stages": order}

    def tokenize(self, text, add_special, parse_special):
        return self.oracle.tokenize(text, add_special, parse_special)

    def _free(self):
        if self.batch is not None:
            L.llama_batch_free(self.batch)
            self.batch = None
        if self.ctx:
            L.llama_free(self.ctx)
            self.ctx = None

    def reset(self, mode, target, n_ctx):
        self._free()
        n = self.oracle.n_layer
        self.cap = Capture(wanted_nodes(self.stages, n), by_input=wanted_nodes(self.stages, n, by_input=True))
        s = Settings(n_threads=self.threads)  # the goldens' context: n_ctx = n_batch = n_ubatch = 512
        size = max(s.n_ctx, -(-n_ctx // 256) * 256)
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = size, size, size, 1
        cp.n_threads = cp.n_threads_batch = self.threads
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.type_k = cp.type_v = KV_TYPES[self.kv]
        cp.embeddings, cp.no_perf = False, True
        cp.cb_eval, cp.cb_eval_user_data = self.cap.cfunc, None
        self.ctx = L.llama_init_from_model(self.oracle.model, cp)
        if not self.ctx:
            raise RuntimeError("llama_init_from_model failed")
        self.batch = L.llama_batch_init(size, 0, 1)

    def step(self, tokens, start):
        b = self.batch
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, start + i, 1, 1
            b.seq_id[i][0] = 0
        b.n_tokens = len(tokens)
        self.cap.begin(len(tokens))
        rc = L.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        got = dict(self.cap.finish())
        got.pop("logits", None)  # the dump keeps the logits apart, from llama_get_logits_ith
        rows = np.empty((len(tokens), self.oracle.n_vocab), np.float32)
        for i in range(len(tokens)):
            rows[i] = np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, i), shape=(self.oracle.n_vocab,))
        return rows, got


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kv", choices=sorted(KV_TYPES), default="f32", help="KV-cache type (default f32)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    serve(LlamaCppEngine(a.kv, a.threads))
