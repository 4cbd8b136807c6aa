"""Run llama.cpp (through llama-cpp-python's low-level ctypes API) and capture every named stage of
its compute graph through the ggml scheduler's eval callback -- the mechanism of llama.cpp's
``examples/eval-callback`` -- without patching llama.cpp and without any C/C++ of our own.

How the capture works (see ``ggml_backend_sched_compute_splits`` in the vendored
``ggml/src/ggml-backend.cpp``): with ``llama_context_params.cb_eval`` set, the scheduler asks the
callback about every graph node in order (``ask=True``). For a node we want it returns true; the
scheduler then computes the graph up to and including that node and calls back with ``ask=False``,
at which point the node's data is final and in host memory (CPU backend), and we copy it out. Nodes
we do not want are computed together in one ``ggml_graph_view``, exactly as without a callback, so
the CPU backend's RMS_NORM+MUL fusion still happens (we never ask for the ``norm-N`` node in the
middle of it). Whether capturing changes anything is measured, not assumed: ``Oracle.run`` is
repeated without the callback and the logits compared (``capture_changes_logits`` in the manifest).

Several nodes share a name: ``Qcur-N`` is the Q projection (MUL_MAT), its RESHAPE to
[head_dim, n_head, T] (a view of the same data) and the RoPE'd tensor (ROPE). A stage is therefore
identified by (name, op), where op is ``ggml_op_desc`` of the node (the GLU/unary sub-op for
GGML_OP_GLU / GGML_OP_UNARY, e.g. ``SWIGLU``; otherwise ``ggml_op_name``, e.g. ``MUL_MAT``), both
read from the vendored libggml-base itself rather than from hard-coded enum values.

Array layout: numpy's shape of a ggml tensor is its ``ne`` reversed, so a 2-D node with
ne = [D, T] is [T, D] and the 3-D Q/K tensors with ne = [head_dim, n_head, T] are [T, n_head,
head_dim], flattened head-major to [T, n_head * head_dim]. Strides (``nb``) are honoured, so
non-contiguous views would be read correctly; F32 and F16 nodes are accepted, anything else is an
error.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import numpy as np

import llama_cpp as L

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
# vendor/llama.cpp of llama-cpp-python v0.3.36 (the sdist ships the submodule's gitdir; its HEAD and
# the superproject's gitlink agree; CHANGELOG: "update llama.cpp to ggml-org/llama.cpp@0c1e57098").
LLAMA_CPP_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"

GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1
# sizeof(struct ggml_object) in the vendored ggml.c: size_t offs, size_t size, ptr next, enum type,
# char padding[4]; ggml_tensor_overhead() == GGML_OBJECT_SIZE + sizeof(struct ggml_tensor).
GGML_OBJECT_SIZE = 32


class GgmlTensor(ctypes.Structure):
    """``struct ggml_tensor`` of the vendored ``ggml/include/ggml.h`` (GGML_MAX_DIMS 4, GGML_MAX_SRC 10,
    GGML_MAX_OP_PARAMS 64, GGML_MAX_NAME 64). The layout is checked against the library at run time
    (``ggml_tensor_overhead``, ``ggml_get_name``, ``ggml_nbytes``)."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


class _Ggml:
    """The few libggml-base functions the capture needs, with their C signatures."""

    def __init__(self) -> None:
        libdir = os.path.join(os.path.dirname(L.__file__), "lib")
        lib = ctypes.CDLL(os.path.join(libdir, "libggml-base.so"))
        sigs = {
            "ggml_commit": ([], ctypes.c_char_p),
            "ggml_version": ([], ctypes.c_char_p),
            "ggml_tensor_overhead": ([], ctypes.c_size_t),
            "ggml_op_desc": ([ctypes.c_void_p], ctypes.c_char_p),
            "ggml_nbytes": ([ctypes.c_void_p], ctypes.c_size_t),
            "ggml_get_name": ([ctypes.c_void_p], ctypes.c_void_p),
            "ggml_type_name": ([ctypes.c_int], ctypes.c_char_p),
            "ggml_backend_buffer_is_host": ([ctypes.c_void_p], ctypes.c_bool),
        }
        for name, (args, res) in sigs.items():
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = res
        self.lib = lib

    def commit(self) -> str:
        return self.lib.ggml_commit().decode()

    def version(self) -> str:
        return self.lib.ggml_version().decode()


GGML = _Ggml()


def build_problems() -> list[str]:
    """Mismatches between the loaded llama.cpp build and the pinned one (empty when it matches)."""
    problems = []
    if L.__version__ != LLAMA_CPP_PYTHON_VERSION:
        problems.append(f"llama_cpp: version {L.__version__}, want {LLAMA_CPP_PYTHON_VERSION}")
    commit = GGML.commit()
    if not commit.startswith(LLAMA_CPP_COMMIT[:7]):
        problems.append(f"llama.cpp: ggml_commit() is {commit!r}, want {LLAMA_CPP_COMMIT[:7]}...")
    overhead = GGML.lib.ggml_tensor_overhead()
    if overhead != ctypes.sizeof(GgmlTensor) + GGML_OBJECT_SIZE:
        problems.append(
            f"ggml: ggml_tensor_overhead() = {overhead}, but sizeof(GgmlTensor) + GGML_OBJECT_SIZE = "
            f"{ctypes.sizeof(GgmlTensor) + GGML_OBJECT_SIZE}: the struct layout changed"
        )
    return problems


@dataclass(frozen=True)
class Stage:
    """One row of the stage map: the node ``oracle_name`` (with ``{N}`` for the layer) computed by
    ``op`` is the canonical stage ``canonical``; ``layout`` says where ggml keeps the token axis
    (``"2d"``: ne = [width, T]; ``"3d"``: ne = [head_dim, n_head, T]).

    Some stages are nodes the model's graph never names (ggml then calls them ``node_<index>``,
    an index that depends on the graph): for those ``input`` names the node they consume (one of
    their ``src``) and the node is identified by (``op``, ``input``) instead of by its own name;
    ``oracle_name`` is then ``UNNAMED`` (documentation only). Example: the attention output
    projection of qwen2 / gemma3 is the MUL_MAT whose input is ``kqv_out-N``."""

    oracle_name: str
    op: str
    canonical: str
    layout: str
    input: Optional[str] = None

    @property
    def per_layer(self) -> bool:
        return "{N}" in self.canonical

    def as_json(self) -> dict:
        d = {"oracle_name": self.oracle_name, "op": self.op, "canonical": self.canonical}
        if self.input is not None:
            d["input"] = self.input
        return d


UNNAMED = "node_<id>"  # what ggml names a node nobody named (ggml_visit_parents: "node_%d")


# The llama graph of the vendored src/models/llama.cpp + src/llama-graph.cpp, in forward order.
# Notes (from that source and the node inventory printed by `make_goldens.py --list-nodes`):
# - the token embedding is the GET_ROWS node "embd" (llama-graph.cpp build_inp_embd); "inp_embd" is
#   the name of the input leaf of the *vector* embedding path, which a token batch never computes;
# - "attn_out-N" is the output projection (wo) result, named in models/llama.cpp after build_attn;
# - the gated activation is "ffn_swiglu-N" (GGML_OP_GLU / SWIGLU, ggml_swiglu_split(gate, up));
# - there is no separate "ffn_down-N" node (only named when the down projection has a bias): the
#   down projection itself is "ffn_out-N" (MUL_MAT), before the residual add "l_out-N";
# - in the last layer, two unnamed GET_ROWS nodes pick the output rows (all rows here, since logits
#   are requested at every position) between "attn_out-29" and "ffn_inp-29".
LLAMA_STAGES: tuple[Stage, ...] = (
    Stage("embd", "GET_ROWS", "embed", "2d"),
    Stage("attn_norm-{N}", "MUL", "blk.{N}.attn_norm", "2d"),
    Stage("Qcur-{N}", "MUL_MAT", "blk.{N}.q", "2d"),
    Stage("Kcur-{N}", "MUL_MAT", "blk.{N}.k", "2d"),
    Stage("Vcur-{N}", "MUL_MAT", "blk.{N}.v", "2d"),
    Stage("Qcur-{N}", "ROPE", "blk.{N}.q_rope", "3d"),
    Stage("Kcur-{N}", "ROPE", "blk.{N}.k_rope", "3d"),
    Stage("kqv_out-{N}", "CONT", "blk.{N}.attn_out", "2d"),
    Stage("attn_out-{N}", "MUL_MAT", "blk.{N}.attn_proj", "2d"),
    Stage("ffn_inp-{N}", "ADD", "blk.{N}.ffn_inp", "2d"),
    Stage("ffn_norm-{N}", "MUL", "blk.{N}.ffn_norm", "2d"),
    Stage("ffn_gate-{N}", "MUL_MAT", "blk.{N}.ffn_gate", "2d"),
    Stage("ffn_up-{N}", "MUL_MAT", "blk.{N}.ffn_up", "2d"),
    Stage("ffn_swiglu-{N}", "SWIGLU", "blk.{N}.ffn_act", "2d"),
    Stage("ffn_out-{N}", "MUL_MAT", "blk.{N}.ffn_out", "2d"),
    Stage("l_out-{N}", "ADD", "blk.{N}.out", "2d"),
    Stage("result_norm", "MUL", "output_norm", "2d"),
    Stage("result_output", "MUL_MAT", "logits", "2d"),
)
# Canonical stages the llama.cpp llama graph does not expose as a node of their own.
LLAMA_NOT_EXPOSED: tuple[str, ...] = ()

# The qwen2 graph of the vendored src/models/qwen2.cpp + src/llama-graph.cpp (build_qkv,
# build_attn, build_ffn), in forward order. Differences from llama:
# - Q/K/V have biases: build_qkv names the MUL_MAT "Qcur-N" and then the bias ADD "Qcur-N" too
#   (then the RESHAPE and, after RoPE, the ROPE node): the canonical projection is the ADD;
# - models/qwen2.cpp does not name the output projection (no cb "attn_out"), so it is the
#   unnamed MUL_MAT whose input is "kqv_out-N" (wo has no bias in Qwen2);
# - everything else is named as in llama.
QWEN2_STAGES: tuple[Stage, ...] = (
    Stage("embd", "GET_ROWS", "embed", "2d"),
    Stage("attn_norm-{N}", "MUL", "blk.{N}.attn_norm", "2d"),
    Stage("Qcur-{N}", "ADD", "blk.{N}.q", "2d"),
    Stage("Kcur-{N}", "ADD", "blk.{N}.k", "2d"),
    Stage("Vcur-{N}", "ADD", "blk.{N}.v", "2d"),
    Stage("Qcur-{N}", "ROPE", "blk.{N}.q_rope", "3d"),
    Stage("Kcur-{N}", "ROPE", "blk.{N}.k_rope", "3d"),
    Stage("kqv_out-{N}", "CONT", "blk.{N}.attn_out", "2d"),
    Stage(UNNAMED, "MUL_MAT", "blk.{N}.attn_proj", "2d", input="kqv_out-{N}"),
    Stage("ffn_inp-{N}", "ADD", "blk.{N}.ffn_inp", "2d"),
    Stage("ffn_norm-{N}", "MUL", "blk.{N}.ffn_norm", "2d"),
    Stage("ffn_gate-{N}", "MUL_MAT", "blk.{N}.ffn_gate", "2d"),
    Stage("ffn_up-{N}", "MUL_MAT", "blk.{N}.ffn_up", "2d"),
    Stage("ffn_swiglu-{N}", "SWIGLU", "blk.{N}.ffn_act", "2d"),
    Stage("ffn_out-{N}", "MUL_MAT", "blk.{N}.ffn_out", "2d"),
    Stage("l_out-{N}", "ADD", "blk.{N}.out", "2d"),
    Stage("result_norm", "MUL", "output_norm", "2d"),
    Stage("result_output", "MUL_MAT", "logits", "2d"),
)
QWEN2_NOT_EXPOSED: tuple[str, ...] = ()

# The gemma3 graph of the vendored src/models/gemma3.cpp (iswa variant: the GGUF has a sliding
# window) + src/llama-graph.cpp, in forward order. Differences from llama:
# - the input of block 0 is the token embedding scaled by sqrt(n_embd): the SCALE node
#   "inp_scaled" (the GET_ROWS "embd" before it is not stored);
# - per-head RMSNorm of Q and K before RoPE: RMS_NORM "norm-N" then MUL "Qcur_normed-N" /
#   "Kcur_normed-N" ([head_dim, n_head, T]); RoPE'd Q/K are again "Qcur-N"/"Kcur-N" (ROPE), and
#   the following ggml_scale of Q by f_attention_scale is an unnamed SCALE node (not stored:
#   q_rope is before the scale);
# - the output projection is not named (no cb "attn_out"): the unnamed MUL_MAT whose input is
#   "kqv_out-N"; it is followed by RMS_NORM "norm-N" and MUL "attn_post_norm-N";
# - the residual after attention is "sa_out-N" (ADD), the FFN activation "ffn_geglu-N"
#   (GGML_OP_GLU / GEGLU = gelu(gate) * up), the down projection "ffn_out-N" (MUL_MAT), then
#   RMS_NORM "norm" (no layer suffix: built with il = -1) and MUL "ffn_post_norm-N", and the
#   residual ADD "l_out-N".
GEMMA3_STAGES: tuple[Stage, ...] = (
    Stage("inp_scaled", "SCALE", "embed", "2d"),
    Stage("attn_norm-{N}", "MUL", "blk.{N}.attn_norm", "2d"),
    Stage("Qcur-{N}", "MUL_MAT", "blk.{N}.q", "2d"),
    Stage("Kcur-{N}", "MUL_MAT", "blk.{N}.k", "2d"),
    Stage("Vcur-{N}", "MUL_MAT", "blk.{N}.v", "2d"),
    Stage("Qcur_normed-{N}", "MUL", "blk.{N}.q_norm", "3d"),
    Stage("Kcur_normed-{N}", "MUL", "blk.{N}.k_norm", "3d"),
    Stage("Qcur-{N}", "ROPE", "blk.{N}.q_rope", "3d"),
    Stage("Kcur-{N}", "ROPE", "blk.{N}.k_rope", "3d"),
    Stage("kqv_out-{N}", "CONT", "blk.{N}.attn_out", "2d"),
    Stage(UNNAMED, "MUL_MAT", "blk.{N}.attn_proj", "2d", input="kqv_out-{N}"),
    Stage("attn_post_norm-{N}", "MUL", "blk.{N}.attn_post_norm", "2d"),
    Stage("sa_out-{N}", "ADD", "blk.{N}.ffn_inp", "2d"),
    Stage("ffn_norm-{N}", "MUL", "blk.{N}.ffn_norm", "2d"),
    Stage("ffn_gate-{N}", "MUL_MAT", "blk.{N}.ffn_gate", "2d"),
    Stage("ffn_up-{N}", "MUL_MAT", "blk.{N}.ffn_up", "2d"),
    Stage("ffn_geglu-{N}", "GEGLU", "blk.{N}.ffn_act", "2d"),
    Stage("ffn_out-{N}", "MUL_MAT", "blk.{N}.ffn_out", "2d"),
    Stage("ffn_post_norm-{N}", "MUL", "blk.{N}.ffn_post_norm", "2d"),
    Stage("l_out-{N}", "ADD", "blk.{N}.out", "2d"),
    Stage("result_norm", "MUL", "output_norm", "2d"),
    Stage("result_output", "MUL_MAT", "logits", "2d"),
)
GEMMA3_NOT_EXPOSED: tuple[str, ...] = ()

# The qwen3 graph of the vendored src/models/qwen3.cpp + src/llama-graph.cpp (build_qkv, build_attn,
# build_ffn), in forward order. Differences from llama: no Q/K/V biases (Qcur-N is the MUL_MAT, as in
# llama), per-head RMSNorm of Q and K before RoPE (MUL "Qcur_normed-N" / "Kcur_normed-N", [head_dim,
# n_head, T], as gemma3), NeoX RoPE; the output projection is not named (the unnamed MUL_MAT whose input
# is "kqv_out-N", as qwen2).
QWEN3_STAGES: tuple[Stage, ...] = (
    Stage("embd", "GET_ROWS", "embed", "2d"),
    Stage("attn_norm-{N}", "MUL", "blk.{N}.attn_norm", "2d"),
    Stage("Qcur-{N}", "MUL_MAT", "blk.{N}.q", "2d"),
    Stage("Kcur-{N}", "MUL_MAT", "blk.{N}.k", "2d"),
    Stage("Vcur-{N}", "MUL_MAT", "blk.{N}.v", "2d"),
    Stage("Qcur_normed-{N}", "MUL", "blk.{N}.q_norm", "3d"),
    Stage("Kcur_normed-{N}", "MUL", "blk.{N}.k_norm", "3d"),
    Stage("Qcur-{N}", "ROPE", "blk.{N}.q_rope", "3d"),
    Stage("Kcur-{N}", "ROPE", "blk.{N}.k_rope", "3d"),
    Stage("kqv_out-{N}", "CONT", "blk.{N}.attn_out", "2d"),
    Stage(UNNAMED, "MUL_MAT", "blk.{N}.attn_proj", "2d", input="kqv_out-{N}"),
    Stage("ffn_inp-{N}", "ADD", "blk.{N}.ffn_inp", "2d"),
    Stage("ffn_norm-{N}", "MUL", "blk.{N}.ffn_norm", "2d"),
    Stage("ffn_gate-{N}", "MUL_MAT", "blk.{N}.ffn_gate", "2d"),
    Stage("ffn_up-{N}", "MUL_MAT", "blk.{N}.ffn_up", "2d"),
    Stage("ffn_swiglu-{N}", "SWIGLU", "blk.{N}.ffn_act", "2d"),
    Stage("ffn_out-{N}", "MUL_MAT", "blk.{N}.ffn_out", "2d"),
    Stage("l_out-{N}", "ADD", "blk.{N}.out", "2d"),
    Stage("result_norm", "MUL", "output_norm", "2d"),
    Stage("result_output", "MUL_MAT", "logits", "2d"),
)
QWEN3_NOT_EXPOSED: tuple[str, ...] = ()

# The gemma2 graph of the vendored src/models/gemma2.cpp (iswa: even layers local) + src/llama-graph.cpp,
# in forward order: gemma3's without the per-head Q/K norms. The attention logit soft-capping inside
# build_attn_mha (SCALE "kq_scaled_1-N", TANH "kq_tanh-N", SCALE "kq_scaled_2-N") is not a canonical
# stage (it is [n_kv, T, n_head]); the final soft-capping comes after the output matmul, so "result_output"
# is the last SCALE (the capped logits) and the raw MUL_MAT is unnamed. The post-FFN norm has no
# per-layer name (GEMMA2_NOT_EXPOSED).
GEMMA2_STAGES: tuple[Stage, ...] = (
    Stage("inp_scaled", "SCALE", "embed", "2d"),
    Stage("attn_norm-{N}", "MUL", "blk.{N}.attn_norm", "2d"),
    Stage("Qcur-{N}", "MUL_MAT", "blk.{N}.q", "2d"),
    Stage("Kcur-{N}", "MUL_MAT", "blk.{N}.k", "2d"),
    Stage("Vcur-{N}", "MUL_MAT", "blk.{N}.v", "2d"),
    Stage("Qcur-{N}", "ROPE", "blk.{N}.q_rope", "3d"),
    Stage("Kcur-{N}", "ROPE", "blk.{N}.k_rope", "3d"),
    Stage("kqv_out-{N}", "CONT", "blk.{N}.attn_out", "2d"),
    Stage(UNNAMED, "MUL_MAT", "blk.{N}.attn_proj", "2d", input="kqv_out-{N}"),
    Stage("attn_post_norm-{N}", "MUL", "blk.{N}.attn_post_norm", "2d"),
    Stage("sa_out-{N}", "ADD", "blk.{N}.ffn_inp", "2d"),
    Stage("ffn_norm-{N}", "MUL", "blk.{N}.ffn_norm", "2d"),
    Stage("ffn_gate-{N}", "MUL_MAT", "blk.{N}.ffn_gate", "2d"),
    Stage("ffn_up-{N}", "MUL_MAT", "blk.{N}.ffn_up", "2d"),
    Stage("ffn_geglu-{N}", "GEGLU", "blk.{N}.ffn_act", "2d"),
    Stage("ffn_out-{N}", "MUL_MAT", "blk.{N}.ffn_out", "2d"),
    Stage("l_out-{N}", "ADD", "blk.{N}.out", "2d"),
    Stage("result_norm", "MUL", "output_norm", "2d"),
    Stage("result_output", "SCALE", "logits", "2d"),
)
# gemma2.cpp names the post-FFN norm with il = -1 (`cb(cur, "ffn_post_norm", -1)`): every layer's MUL is
# "ffn_post_norm", so the nodes cannot be told apart by name. blk.N.out (= ffn_inp + ffn_post_norm) follows.
GEMMA2_NOT_EXPOSED: tuple[str, ...] = ("blk.{N}.ffn_post_norm",)

# The starcoder2 graph of the vendored src/models/starcoder2.cpp + src/llama-graph.cpp (build_norm with
# LLM_NORM, build_qkv, build_attn, build_ffn with LLM_FFN_GELU + LLM_FFN_SEQ), in forward order:
# - every norm is LayerNorm with a bias: NORM "norm-N", MUL "norm_w-N", then the bias ADD, which carries
#   the norm's name ("attn_norm-N", "ffn_norm-N", "result_norm");
# - Q/K/V have biases: the canonical projection is the bias ADD "Qcur-N" (as qwen2);
# - the output projection and its bias are both unnamed (build_attn: no cb after wo or wo_b): attn_proj
#   is the ADD whose input is the bias tensor "blk.N.attn_output.bias";
# - the FFN: MUL_MAT "ffn_up-N", bias ADD "ffn_up_b-N" (canonical ffn_up: what GELU reads), GELU
#   "ffn_gelu-N", MUL_MAT "ffn_down-N", bias ADD "ffn_out-N"; no gate (no ffn_gate stage).
STARCODER2_STAGES: tuple[Stage, ...] = (
    Stage("embd", "GET_ROWS", "embed", "2d"),
    Stage("attn_norm-{N}", "ADD", "blk.{N}.attn_norm", "2d"),
    Stage("Qcur-{N}", "ADD", "blk.{N}.q", "2d"),
    Stage("Kcur-{N}", "ADD", "blk.{N}.k", "2d"),
    Stage("Vcur-{N}", "ADD", "blk.{N}.v", "2d"),
    Stage("Qcur-{N}", "ROPE", "blk.{N}.q_rope", "3d"),
    Stage("Kcur-{N}", "ROPE", "blk.{N}.k_rope", "3d"),
    Stage("kqv_out-{N}", "CONT", "blk.{N}.attn_out", "2d"),
    Stage(UNNAMED, "ADD", "blk.{N}.attn_proj", "2d", input="blk.{N}.attn_output.bias"),
    Stage("ffn_inp-{N}", "ADD", "blk.{N}.ffn_inp", "2d"),
    Stage("ffn_norm-{N}", "ADD", "blk.{N}.ffn_norm", "2d"),
    Stage("ffn_up_b-{N}", "ADD", "blk.{N}.ffn_up", "2d"),
    Stage("ffn_gelu-{N}", "GELU", "blk.{N}.ffn_act", "2d"),
    Stage("ffn_out-{N}", "ADD", "blk.{N}.ffn_out", "2d"),
    Stage("l_out-{N}", "ADD", "blk.{N}.out", "2d"),
    Stage("result_norm", "ADD", "output_norm", "2d"),
    Stage("result_output", "MUL_MAT", "logits", "2d"),
)
STARCODER2_NOT_EXPOSED: tuple[str, ...] = ()

# The stablelm graph of the vendored src/models/stablelm.cpp + src/llama-graph.cpp, in forward order:
# LayerNorms with biases as starcoder2 (the bias ADD carries the norm's name), Q/K/V bias ADDs "Qcur-N"
# (StableLM 2; a file without them has the MUL_MAT only), NeoX RoPE over the first rope.dimension_count
# dims of each head, the unnamed output projection MUL_MAT whose input is "kqv_out-N" (no bias), and the
# SwiGLU FFN of llama.
STABLELM_STAGES: tuple[Stage, ...] = (
    Stage("embd", "GET_ROWS", "embed", "2d"),
    Stage("attn_norm-{N}", "ADD", "blk.{N}.attn_norm", "2d"),
    Stage("Qcur-{N}", "ADD", "blk.{N}.q", "2d"),
    Stage("Kcur-{N}", "ADD", "blk.{N}.k", "2d"),
    Stage("Vcur-{N}", "ADD", "blk.{N}.v", "2d"),
    Stage("Qcur-{N}", "ROPE", "blk.{N}.q_rope", "3d"),
    Stage("Kcur-{N}", "ROPE", "blk.{N}.k_rope", "3d"),
    Stage("kqv_out-{N}", "CONT", "blk.{N}.attn_out", "2d"),
    Stage(UNNAMED, "MUL_MAT", "blk.{N}.attn_proj", "2d", input="kqv_out-{N}"),
    Stage("ffn_inp-{N}", "ADD", "blk.{N}.ffn_inp", "2d"),
    Stage("ffn_norm-{N}", "ADD", "blk.{N}.ffn_norm", "2d"),
    Stage("ffn_gate-{N}", "MUL_MAT", "blk.{N}.ffn_gate", "2d"),
    Stage("ffn_up-{N}", "MUL_MAT", "blk.{N}.ffn_up", "2d"),
    Stage("ffn_swiglu-{N}", "SWIGLU", "blk.{N}.ffn_act", "2d"),
    Stage("ffn_out-{N}", "MUL_MAT", "blk.{N}.ffn_out", "2d"),
    Stage("l_out-{N}", "ADD", "blk.{N}.out", "2d"),
    Stage("result_norm", "ADD", "output_norm", "2d"),
    Stage("result_output", "MUL_MAT", "logits", "2d"),
)
STABLELM_NOT_EXPOSED: tuple[str, ...] = ()

# The phi3 graph of the vendored src/models/phi3.cpp (no SWA: llama.cpp disables it for Phi) +
# src/llama-graph.cpp (build_qkv's fused path, build_ffn with LLM_FFN_SWIGLU / LLM_FFN_SEQ), in forward order.
# Differences from llama:
# - Q/K/V come from ONE matmul, "wqkv-N" ([n_embd + 2·n_embd_gqa, T]); Q, K, V are strided views of it
#   (ggml_view_3d, never computed as nodes of their own): q/k/v are NOT_EXPOSED, and the first stage of the
#   attention a golden stores is the RoPE'd "Qcur-N" / "Kcur-N" (ROPE, NeoX), which read those views;
# - Q is then scaled by 1/sqrt(head_dim) (a SCALE node also named "Qcur-N": q_rope is the ROPE before it),
#   and build_attn runs with kq_scale = 1;
# - the output projection is not named (phi3.cpp has no cb "attn_out"): the unnamed MUL_MAT whose input
#   is "kqv_out-N", as qwen2; the residual ADD after it is unnamed too (no cb "ffn_inp") and its inputs
#   are that unnamed MUL_MAT and "embd" / "l_out-{N-1}", so no (op, input) pair names it in every layer:
#   ffn_inp is NOT_EXPOSED (blk.N.out = ffn_inp + ffn_out still checks it);
# - the FFN's gate and up are ONE matmul "ffn_up-N" ([2·n_ff, T]) and ggml_swiglu (GLU, not swapped: the
#   first half is the gate) reads its two halves: ffn_gate/ffn_up are NOT_EXPOSED as separate nodes;
#   "ffn_swiglu-N" (SWIGLU) is the activation and "ffn_out-N" the down projection (MUL_MAT, named by
#   phi3.cpp's cb after build_ffn returns), then "l_out-N".
PHI3_STAGES: tuple[Stage, ...] = (
    Stage("embd", "GET_ROWS", "embed", "2d"),
    Stage("attn_norm-{N}", "MUL", "blk.{N}.attn_norm", "2d"),
    Stage("Qcur-{N}", "ROPE", "blk.{N}.q_rope", "3d"),
    Stage("Kcur-{N}", "ROPE", "blk.{N}.k_rope", "3d"),
    Stage("kqv_out-{N}", "CONT", "blk.{N}.attn_out", "2d"),
    Stage(UNNAMED, "MUL_MAT", "blk.{N}.attn_proj", "2d", input="kqv_out-{N}"),
    Stage("ffn_norm-{N}", "MUL", "blk.{N}.ffn_norm", "2d"),
    Stage("ffn_swiglu-{N}", "SWIGLU", "blk.{N}.ffn_act", "2d"),
    Stage("ffn_out-{N}", "MUL_MAT", "blk.{N}.ffn_out", "2d"),
    Stage("l_out-{N}", "ADD", "blk.{N}.out", "2d"),
    Stage("result_norm", "MUL", "output_norm", "2d"),
    Stage("result_output", "MUL_MAT", "logits", "2d"),
)
# Views of the fused "wqkv-N" and "ffn_up-N" matmuls (no node of their own), and the unnamed residual ADD.
PHI3_NOT_EXPOSED: tuple[str, ...] = (
    "blk.{N}.ffn_inp",
    "blk.{N}.q",
    "blk.{N}.k",
    "blk.{N}.v",
    "blk.{N}.ffn_gate",
    "blk.{N}.ffn_up",
)

# The gpt2 graph of the vendored src/models/gpt2.cpp + src/llama-graph.cpp, in forward order. Differences
# from starcoder2 (whose LayerNorm, bias and GELU-FFN nodes it shares):
# - the embedding is the token rows plus the learned position rows: the ADD "inpL" (il = -1; "embd" is the
#   GET_ROWS of the token rows alone, "pos_embd" that of the position rows);
# - Q/K/V come from ONE matmul "wqkv-N" and its bias ADD "wqkv_b-N" (build_qkv's fused path); Q, K and V
#   are views of it that no node computes: q/k/v are NOT_EXPOSED;
# - no RoPE (learned absolute positions): the model has no q_rope/k_rope stage at all.
GPT2_STAGES: tuple[Stage, ...] = (
    Stage("inpL", "ADD", "embed", "2d"),
    Stage("attn_norm-{N}", "ADD", "blk.{N}.attn_norm", "2d"),
    Stage("kqv_out-{N}", "CONT", "blk.{N}.attn_out", "2d"),
    Stage(UNNAMED, "ADD", "blk.{N}.attn_proj", "2d", input="blk.{N}.attn_output.bias"),
    Stage("ffn_inp-{N}", "ADD", "blk.{N}.ffn_inp", "2d"),
    Stage("ffn_norm-{N}", "ADD", "blk.{N}.ffn_norm", "2d"),
    Stage("ffn_up_b-{N}", "ADD", "blk.{N}.ffn_up", "2d"),
    Stage("ffn_gelu-{N}", "GELU", "blk.{N}.ffn_act", "2d"),
    Stage("ffn_out-{N}", "ADD", "blk.{N}.ffn_out", "2d"),
    Stage("l_out-{N}", "ADD", "blk.{N}.out", "2d"),
    Stage("result_norm", "ADD", "output_norm", "2d"),
    Stage("result_output", "MUL_MAT", "logits", "2d"),
)
# Views of the fused "wqkv_b-N" (no node of their own).
GPT2_NOT_EXPOSED: tuple[str, ...] = ("blk.{N}.q", "blk.{N}.k", "blk.{N}.v")

# The gemma4 graph of the vendored src/models/gemma4.cpp + src/llama-graph.cpp (dense layers, no per-layer
# embeddings), in forward order. Differences from gemma3:
# - Q/K norms are "Qcur_normed-N"/"Kcur_normed-N", RoPE "Qcur_pos-N"/"Kcur_pos-N"; V's weightless RMS_NORM
#   "Vcur_normed-N" has no canonical id;
# - a full-attention layer without attn_v takes V = the key matmul, a node the later cb renames "Vcur-N":
#   blk.N.k is the MUL_MAT whose input is attn_k.weight (by input), blk.N.v the node named "Vcur-N" -- on such
#   a layer the same node, captured as both;
# - the output projection is unnamed (the MUL_MAT reading "kqv_out-N"); "attn_out-N" is the residual ADD
#   (canonical ffn_inp); "ffn_geglu-N" the activation;
# - the block's output is the MUL by layer_output_scale ("out_scaled", renamed "l_out-N" by the last cb);
# - the final norm is "h_nextn" (MUL), then "result_norm" picks the output rows (all here, GET_ROWS); the
#   logits are the final soft-capping's last SCALE "result_output".
GEMMA4_STAGES: tuple[Stage, ...] = (
    Stage("inp_scaled", "SCALE", "embed", "2d"),
    Stage("attn_norm-{N}", "MUL", "blk.{N}.attn_norm", "2d"),
    Stage("Qcur-{N}", "MUL_MAT", "blk.{N}.q", "2d"),
    Stage(UNNAMED, "MUL_MAT", "blk.{N}.k", "2d", input="blk.{N}.attn_k.weight"),
    Stage("Vcur-{N}", "MUL_MAT", "blk.{N}.v", "2d"),
    Stage("Qcur_normed-{N}", "MUL", "blk.{N}.q_norm", "3d"),
    Stage("Kcur_normed-{N}", "MUL", "blk.{N}.k_norm", "3d"),
    Stage("Qcur_pos-{N}", "ROPE", "blk.{N}.q_rope", "3d"),
    Stage("Kcur_pos-{N}", "ROPE", "blk.{N}.k_rope", "3d"),
    Stage("kqv_out-{N}", "CONT", "blk.{N}.attn_out", "2d"),
    Stage(UNNAMED, "MUL_MAT", "blk.{N}.attn_proj", "2d", input="kqv_out-{N}"),
    Stage("attn_post_norm-{N}", "MUL", "blk.{N}.attn_post_norm", "2d"),
    Stage("attn_out-{N}", "ADD", "blk.{N}.ffn_inp", "2d"),
    Stage("ffn_norm-{N}", "MUL", "blk.{N}.ffn_norm", "2d"),
    Stage("ffn_gate-{N}", "MUL_MAT", "blk.{N}.ffn_gate", "2d"),
    Stage("ffn_up-{N}", "MUL_MAT", "blk.{N}.ffn_up", "2d"),
    Stage("ffn_geglu-{N}", "GEGLU", "blk.{N}.ffn_act", "2d"),
    Stage("ffn_out-{N}", "MUL_MAT", "blk.{N}.ffn_out", "2d"),
    Stage("ffn_post_norm-{N}", "MUL", "blk.{N}.ffn_post_norm", "2d"),
    Stage("l_out-{N}", "MUL", "blk.{N}.out", "2d"),
    Stage("result_norm", "GET_ROWS", "output_norm", "2d"),
    Stage("result_output", "SCALE", "logits", "2d"),
)
GEMMA4_NOT_EXPOSED: tuple[str, ...] = ()

# The bert graph of the vendored src/models/bert.cpp + src/llama-graph.cpp (embeddings mode: no KV cache,
# build_attn_inp_no_cache, build_pooling), in forward order:
# - "inp_embd" is token + token_types[0] + position (an ADD); the LayerNorm's bias ADD "inp_norm-0" (bert.cpp
#   names it with il = 0) is the input of block 0: canonical "embed";
# - Q/K/V are the bias ADDs "Qcur-N" / "Kcur-N" / "Vcur-N" (no RoPE for BERT); "kqv_out-N" names two nodes: the
#   heads' CONT (attn_out) and, renamed by bert.cpp's cb after build_attn, the output projection's bias ADD
#   (attn_proj);
# - "ffn_inp-N" is the attention LayerNorm's bias ADD (post-norm: LN(x + attn)); the FFN as starcoder2's
#   (ffn_up_b, ffn_gelu, ffn_out); the layer output LN(ffn_inp + ffn_out) is the ADD of the
#   "blk.N.layer_output_norm.bias" (unnamed, or "result_embd" in the last layer);
# - "result_embd_pooled" is the pooled embedding, [n_embd, n_seqs]: MUL_MAT with inp_mean (mean) or GET_ROWS
#   (cls, last); one row ("seq" layout). No output norm, no logits.
BERT_STAGES: tuple[Stage, ...] = (
    Stage("inp_norm-0", "ADD", "embed", "2d"),
    Stage("Qcur-{N}", "ADD", "blk.{N}.q", "2d"),
    Stage("Kcur-{N}", "ADD", "blk.{N}.k", "2d"),
    Stage("Vcur-{N}", "ADD", "blk.{N}.v", "2d"),
    Stage("kqv_out-{N}", "CONT", "blk.{N}.attn_out", "2d"),
    Stage("kqv_out-{N}", "ADD", "blk.{N}.attn_proj", "2d"),
    Stage("ffn_inp-{N}", "ADD", "blk.{N}.ffn_inp", "2d"),
    Stage("ffn_up_b-{N}", "ADD", "blk.{N}.ffn_up", "2d"),
    Stage("ffn_gelu-{N}", "GELU", "blk.{N}.ffn_act", "2d"),
    Stage("ffn_out-{N}", "ADD", "blk.{N}.ffn_out", "2d"),
    Stage(UNNAMED, "ADD", "blk.{N}.out", "2d", input="blk.{N}.layer_output_norm.bias"),
    Stage("result_embd_pooled", "MUL_MAT", "pooled", "seq"),
    Stage("result_embd_pooled", "GET_ROWS", "pooled", "seq"),
)
BERT_NOT_EXPOSED: tuple[str, ...] = ()

# The encoder architectures: run in embeddings mode (Oracle.run(embeddings=True)), no decode steps.
ENCODER_ARCHS = ("bert",)

# architecture (GGUF general.architecture) -> (stage map, canonical stages without a node)
ARCH_STAGES: dict[str, tuple[tuple[Stage, ...], tuple[str, ...]]] = {
    "llama": (LLAMA_STAGES, LLAMA_NOT_EXPOSED),
    "qwen2": (QWEN2_STAGES, QWEN2_NOT_EXPOSED),
    "qwen3": (QWEN3_STAGES, QWEN3_NOT_EXPOSED),
    "gemma2": (GEMMA2_STAGES, GEMMA2_NOT_EXPOSED),
    "gemma3": (GEMMA3_STAGES, GEMMA3_NOT_EXPOSED),
    "starcoder2": (STARCODER2_STAGES, STARCODER2_NOT_EXPOSED),
    "stablelm": (STABLELM_STAGES, STABLELM_NOT_EXPOSED),
    "phi3": (PHI3_STAGES, PHI3_NOT_EXPOSED),
    "gpt2": (GPT2_STAGES, GPT2_NOT_EXPOSED),
    "gemma4": (GEMMA4_STAGES, GEMMA4_NOT_EXPOSED),
    "bert": (BERT_STAGES, BERT_NOT_EXPOSED),
}


def canonical_ids(stages: Sequence[Stage], n_layer: int) -> list[str]:
    """Every canonical id of ``stages`` for a model with ``n_layer`` layers, in forward order
    (per-layer stages layer by layer)."""
    out: list[str] = []
    pre = [s for s in stages if not s.per_layer and s.canonical in ("embed",)]
    post = [s for s in stages if not s.per_layer and s.canonical not in ("embed",)]
    out += [s.canonical for s in pre]
    for n in range(n_layer):
        out += [s.canonical.replace("{N}", str(n)) for s in stages if s.per_layer]
    out += [s.canonical for s in post]
    # a stage matched by more than one (name, op) row (bert's pooled: MUL_MAT or GET_ROWS) is one id
    return list(dict.fromkeys(out))


def tensor_rows(t: GgmlTensor, addr: int, n_tokens: int, layout: str) -> np.ndarray:
    """Copy a computed node out of host memory as float32 ``[n_tokens, width]``."""
    dtypes = {GGML_TYPE_F32: np.float32, GGML_TYPE_F16: np.float16}
    if t.type not in dtypes:
        raise ValueError(f"{t.name.decode()}: type {GGML.lib.ggml_type_name(t.type).decode()} is neither F32 nor F16")
    if not t.buffer or not GGML.lib.ggml_backend_buffer_is_host(t.buffer):
        raise ValueError(f"{t.name.decode()}: data is not in host memory")
    ne = [int(x) for x in t.ne]
    nb = [int(x) for x in t.nb]
    if layout == "2d":
        ok = ne[1] == n_tokens and ne[2] == 1 and ne[3] == 1
    elif layout == "3d":
        ok = ne[2] == n_tokens and ne[3] == 1
    elif layout == "seq":
        # one row per sequence (an encoder's pooled embedding, ne = [width, n_seqs]); one sequence here
        ok = ne[1] == 1 and ne[2] == 1 and ne[3] == 1
        n_tokens = 1
    else:
        raise ValueError(f"unknown layout {layout!r}")
    if not ok:
        raise ValueError(f"{t.name.decode()}: ne = {ne} does not fit layout {layout} with {n_tokens} tokens")
    dtype = np.dtype(dtypes[t.type])
    if nb[0] != dtype.itemsize:
        raise ValueError(f"{t.name.decode()}: nb[0] = {nb[0]} for a {dtype} tensor")
    nbytes = int(GGML.lib.ggml_nbytes(addr))
    extent = dtype.itemsize + sum((n - 1) * s for n, s in zip(ne, nb))
    if extent != nbytes:
        raise ValueError(f"{t.name.decode()}: ggml_nbytes = {nbytes} but ne/nb span {extent} bytes")
    buf = (ctypes.c_char * nbytes).from_address(t.data)
    view = np.ndarray(shape=tuple(reversed(ne)), dtype=dtype, buffer=buf, strides=tuple(reversed(nb)))
    # an explicit copy: the node's memory belongs to the compute buffer, reused by later nodes
    return np.array(view, dtype=np.float32, order="C", copy=True).reshape(n_tokens, -1)


class Capture:
    """The eval callback: copies the wanted (name, op) nodes of each graph evaluation.

    ``wanted`` maps a node name to {op: (canonical id, layout)}; ``by_input`` maps the name of an
    input node to {op: (canonical id, layout)} for stages whose own node is unnamed (a node matches
    when one of its ``src`` has that name and its op is that op). ``begin(n_tokens)`` must be called
    before every ``llama_decode``; ``finish()`` afterwards returns {canonical id: [n_tokens, width]}
    and raises if a wanted node was missing, seen twice, or could not be read."""

    def __init__(
        self,
        wanted: dict[str, dict[str, tuple[str, str]]],
        inventory: bool = False,
        by_input: Optional[dict[str, dict[str, tuple[str, str]]]] = None,
    ) -> None:
        self.wanted = wanted
        self.by_input = by_input or {}
        self.inventory: Optional[list[tuple[str, str, str, tuple[int, ...], tuple[str, ...]]]] = [] if inventory else None
        self.n_tokens = 0
        self.got: dict[str, np.ndarray] = {}
        self.errors: list[str] = []
        self._layout_checked = False
        self.cfunc = L.ggml_backend_sched_eval_callback(self._callback)

    def begin(self, n_tokens: int) -> None:
        self.n_tokens = n_tokens
        self.got = {}
        self.errors = []

    def finish(self) -> dict[str, np.ndarray]:
        missing = [
            c for table in (self.wanted, self.by_input) for ops in table.values() for (c, _) in ops.values()
            if c not in self.got
        ]
        if missing:
            self.errors.append(f"{len(missing)} wanted nodes never evaluated, e.g. {missing[:5]}")
        if self.errors:
            raise RuntimeError("capture failed: " + "; ".join(self.errors[:10]))
        return self.got

    @staticmethod
    def _src_names(t: GgmlTensor) -> list[str]:
        return [GgmlTensor.from_address(a).name.decode(errors="replace") for a in t.src if a]

    def _match(self, addr: int, t: GgmlTensor) -> list[tuple[str, str]]:
        """Every (canonical id, layout) this node is: by its name and op, and by an input and op. One node
        can be two stages: Gemma 4's full-attention layers have no V projection, so the key matmul (named
        "Vcur-N" by the later cb) is both blk.N.k (by its input attn_k.weight) and blk.N.v (by name)."""
        hits = []
        ops = self.wanted.get(t.name.decode(errors="replace"))
        if ops:
            hit = ops.get(GGML.lib.ggml_op_desc(addr).decode())
            if hit is not None:
                hits.append(hit)
        if self.by_input:
            op = None
            for src in self._src_names(t):
                ops = self.by_input.get(src)
                if ops:
                    op = op or GGML.lib.ggml_op_desc(addr).decode()
                    if op in ops and ops[op] not in hits:
                        hits.append(ops[op])
        return hits

    def _callback(self, addr: int, ask: bool, _user_data) -> bool:
        try:
            t = GgmlTensor.from_address(addr)
            if not self._layout_checked:
                name_addr = GGML.lib.ggml_get_name(addr)
                if name_addr != addr + GgmlTensor.name.offset:
                    raise RuntimeError("ggml_get_name disagrees with the GgmlTensor layout")
                self._layout_checked = True
            if ask:
                if self.inventory is not None:
                    self.inventory.append(
                        (t.name.decode(errors="replace"), GGML.lib.ggml_op_desc(addr).decode(),
                         GGML.lib.ggml_type_name(t.type).decode(), tuple(int(x) for x in t.ne),
                         tuple(self._src_names(t)))
                    )
                return bool(self._match(addr, t))
            for canonical, layout in self._match(addr, t):
                if canonical in self.got:
                    self.errors.append(f"{canonical}: node {t.name.decode()} evaluated twice")
                    continue
                self.got[canonical] = tensor_rows(t, addr, self.n_tokens, layout)
        except BaseException as e:  # never let an exception cross the C boundary
            self.errors.append(f"{type(e).__name__}: {e}")
        return True


def wanted_nodes(stages: Sequence[Stage], n_layer: int, by_input: bool = False) -> dict[str, dict[str, tuple[str, str]]]:
    """Expand the stage map into {node name: {op: (canonical id, layout)}} for every layer; with
    ``by_input``, the stages identified by their input instead: {input name: {op: ...}}."""
    wanted: dict[str, dict[str, tuple[str, str]]] = {}
    for s in stages:
        if (s.input is not None) != by_input:
            continue
        layers = range(n_layer) if s.per_layer else [None]
        key = s.input if by_input else s.oracle_name
        for n in layers:
            name = key if n is None else key.replace("{N}", str(n))
            canon = s.canonical if n is None else s.canonical.replace("{N}", str(n))
            wanted.setdefault(name, {})[s.op] = (canon, s.layout)
    return wanted


KV_TYPES = {"f32": L.GGML_TYPE_F32, "f16": L.GGML_TYPE_F16}

# x86 feature flags (as /proc/cpuinfo spells them) that select ggml-cpu kernels or change their
# reduction order: the goldens of a model are only bit-reproducible on a host with the same set.
CPU_FLAGS = (
    "sse3", "ssse3", "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "bmi2",
    "avx_vnni", "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512_vnni",
    "avx512_bf16", "avx512vbmi", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16",
)


# The ggml-cpu builds the oracle can run (LOCKSTEP_ORACLE_CPU, oracles/llamacpp/setup.sh): "native"
# (GGML_NATIVE, the SIMD branches of the host's CPU: the goldens record only the host's flags) or a
# build for a narrower CPU than the host, named by the flags of CPU_FLAGS it was compiled for. The
# goldens of such a build record them as ``ggml_cpu_flags``, which the harness prefers over
# ``host_cpu_flags`` to choose the ggml target (harness/src/golden.rs, OracleInfo::ggml_target).
ORACLE_CPU_BUILDS = {
    "avx2": {
        "flags": ("sse3", "ssse3", "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"),
        "cmake_args": "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "
        "-DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF",
        # llama_print_system_info() of the build must say these (compile-time features of ggml-cpu)
        "system_info_has": ("AVX2 = 1", "FMA = 1", "F16C = 1"),
        "system_info_lacks": ("AVX512 = 1", "AVX512_VNNI = 1", "AVX512_BF16 = 1", "AVX_VNNI = 1"),
    },
}


def oracle_cpu_build() -> str:
    """LOCKSTEP_ORACLE_CPU: ``native`` (default) or a key of ORACLE_CPU_BUILDS."""
    build = os.environ.get("LOCKSTEP_ORACLE_CPU", "native") or "native"
    if build != "native" and build not in ORACLE_CPU_BUILDS:
        raise SystemExit(f"LOCKSTEP_ORACLE_CPU={build!r}: expected native or one of {sorted(ORACLE_CPU_BUILDS)}")
    return build


def host_info() -> dict:
    """The oracle host's CPU, as recorded in every golden's ``oracle`` field: the CPU model name,
    which of ``CPU_FLAGS`` it has (and lacks), the logical CPU count, and ggml's own system info
    (``llama_print_system_info()``: the features the loaded ggml-cpu build was compiled with and
    detected). With LOCKSTEP_ORACLE_CPU=avx2 (a build narrower than the host) also
    ``ggml_cpu_build``, ``ggml_cpu_cmake_args`` and ``ggml_cpu_flags`` (the host's flags the build was
    compiled for); the loaded library must be that build (its system info is checked)."""
    import platform

    model, flags = None, set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model is None:
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    if "pni" in flags:  # /proc/cpuinfo calls SSE3 "pni" (Prescott New Instructions)
        flags.add("sse3")
    system_info = L.llama_print_system_info().decode(errors="replace").strip()
    info = {
        "host_cpu": model or platform.processor() or None,
        "host_cpu_flags": [f for f in CPU_FLAGS if f in flags],
        "host_cpu_flags_absent": [f for f in CPU_FLAGS if f not in flags],
        "host_machine": platform.machine(),
        "host_logical_cpus": os.cpu_count(),
        "ggml_system_info": system_info,
    }
    build = oracle_cpu_build()
    fields = {part.strip() for part in system_info.replace("|", "\n").splitlines()}
    if build == "native":
        # a narrower build loaded without saying so would record flags its kernels never used
        for flag, field in (("avx512f", "AVX512 = 1"), ("avx2", "AVX2 = 1")):
            if flag in flags and field not in fields:
                raise SystemExit(
                    f"the host has {flag} but the loaded ggml-cpu was not built for it ({system_info!r}): "
                    "not a native build; set LOCKSTEP_ORACLE_CPU to the build's target (oracles/README.md)"
                )
    else:
        b = ORACLE_CPU_BUILDS[build]
        missing = [f for f in b["system_info_has"] if f not in fields]
        extra = [f for f in b["system_info_lacks"] if f in fields]
        if missing or extra:
            raise SystemExit(
                f"LOCKSTEP_ORACLE_CPU={build} but the loaded ggml-cpu is another build (missing {missing}, "
                f"has {extra}): run oracles/llamacpp/setup.sh with LOCKSTEP_ORACLE_CPU={build} and use its venv"
            )
        lacking = [f for f in b["flags"] if f not in flags]
        if lacking:
            raise SystemExit(f"this host lacks {lacking}: it cannot run the {build} build")
        info["ggml_cpu_build"] = build
        info["ggml_cpu_cmake_args"] = b["cmake_args"]
        info["ggml_cpu_flags"] = [f for f in CPU_FLAGS if f in b["flags"]]
    return info


@dataclass
class Settings:
    """llama.cpp context settings; all recorded in the manifest."""

    n_threads: int = 2
    n_ctx: int = 512
    n_batch: int = 512
    n_ubatch: int = 512
    flash_attn: str = "disabled"  # llama_context_params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED

    def as_dict(self, kv: str) -> dict:
        return {
            "n_threads": self.n_threads,
            "n_threads_batch": self.n_threads,
            "n_ctx": self.n_ctx,
            "n_batch": self.n_batch,
            "n_ubatch": self.n_ubatch,
            "n_seq_max": 1,
            "flash_attn": self.flash_attn,
            "flash_attn_type": "LLAMA_FLASH_ATTN_TYPE_DISABLED",
            "type_k": kv,
            "type_v": kv,
            "n_gpu_layers": 0,
            "use_mmap": True,
            "seed": None,
            "sampling": "greedy: numpy argmax of the f32 logits (ties -> lowest token id); no llama.cpp sampler",
            "logits_requested": "every prompt position (batch.logits[i] = 1 for all i)",
        }


@dataclass
class RunResult:
    """What one prefill + decode run produced (all float32)."""

    tokens: np.ndarray  # int32 [T]
    logits: np.ndarray  # [T, V] from llama_get_logits_ith
    stages: dict[str, np.ndarray] = field(default_factory=dict)  # canonical -> [T, D]
    decode_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # [N]
    decode_logits: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))  # [N, V]
    decode_stages: dict[str, np.ndarray] = field(default_factory=dict)  # canonical -> [N, D]
    inventory: list = field(default_factory=list)
    # an encoder (embeddings mode): llama_get_embeddings_seq(ctx, 0), [1, n_embd]; logits is then [T, 0]
    pooled: Optional[np.ndarray] = None


_LOG_KEEP = {3, 4}  # GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR


class Oracle:
    """A loaded model plus the means to run it with or without capture."""

    def __init__(self, model_path: str, settings: Settings, quiet: bool = True) -> None:
        self.settings = settings
        if quiet:
            self._last_level = 0

            def _log(level, text, _ud):
                if level == 5:  # GGML_LOG_LEVEL_CONT continues the previous message
                    level = self._last_level
                self._last_level = level
                if level in _LOG_KEEP and text:
                    os.write(2, text)

            self._log_cb = L.llama_log_callback(_log)
            L.llama_log_set(self._log_cb, None)
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        mp.use_mmap = True
        self.model = L.llama_model_load_from_file(model_path.encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {model_path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.n_layer = L.llama_model_n_layer(self.model)
        self.n_embd = L.llama_model_n_embd(self.model)
        self.add_bos = bool(L.llama_vocab_get_add_bos(self.vocab))
        self.bos = int(L.llama_vocab_bos(self.vocab))
        self.eos = int(L.llama_vocab_eos(self.vocab))

    def close(self) -> None:
        if self.model:
            L.llama_model_free(self.model)
            self.model = None

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        raw = text.encode("utf-8")
        cap = len(raw) + 16
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(self.vocab, raw, len(raw), buf, cap, add_special, parse_special)
        if n < 0:
            raise RuntimeError(f"llama_tokenize needs {-n} tokens, more than {cap}")
        return [int(x) for x in buf[:n]]

    def piece(self, token: int, special: bool = True) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            raise RuntimeError(f"token {token}: piece longer than 256 bytes")
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def chat_template(self) -> Optional[str]:
        tmpl = L.llama_model_chat_template(self.model, None)
        return tmpl.decode() if tmpl else None

    def run(
        self,
        tokens: Sequence[int],
        kv: str,
        decode: Union[int, Sequence[int]],
        capture: bool,
        inventory: bool = False,
        stages: Sequence[Stage] = LLAMA_STAGES,
        embeddings: bool = False,
    ) -> RunResult:
        """Prefill ``tokens`` in one batch (logits at every position), then decode one token per
        ``llama_decode`` call: ``decode`` is either a step count (greedy: each fed token is the
        argmax of the previous logits) or the exact tokens to feed (teacher forcing).

        ``embeddings``: an encoder (BERT): the context is made with ``embeddings = true`` and the
        model's own pooling type (``LLAMA_POOLING_TYPE_UNSPECIFIED``), there is no KV cache and no
        decode step (``decode`` must be 0), ``RunResult.pooled`` is ``llama_get_embeddings_seq(ctx, 0)``
        and ``RunResult.logits`` is ``[T, 0]``."""
        s = self.settings
        if len(tokens) > s.n_batch or len(tokens) > s.n_ubatch:
            raise ValueError(f"prompt of {len(tokens)} tokens does not fit one batch of {s.n_ubatch}")
        n_steps = decode if isinstance(decode, int) else len(decode)
        if embeddings and n_steps:
            raise ValueError("an encoder has no decode steps (no KV cache): decode must be 0")
        if len(tokens) + n_steps > s.n_ctx:
            raise ValueError(f"{len(tokens)} + {n_steps} tokens exceed n_ctx = {s.n_ctx}")
        cap = (
            Capture(wanted_nodes(stages, self.n_layer), inventory=inventory,
                    by_input=wanted_nodes(stages, self.n_layer, by_input=True))
            if capture else None
        )

        cp = L.llama_context_default_params()
        cp.n_ctx = s.n_ctx
        cp.n_batch = s.n_batch
        cp.n_ubatch = s.n_ubatch
        cp.n_seq_max = 1
        cp.n_threads = s.n_threads
        cp.n_threads_batch = s.n_threads
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.type_k = KV_TYPES[kv]
        cp.type_v = KV_TYPES[kv]
        cp.embeddings = embeddings
        if embeddings:
            cp.pooling_type = L.LLAMA_POOLING_TYPE_UNSPECIFIED  # the model's bert.pooling_type
        cp.no_perf = True
        if cap is not None:
            cp.cb_eval = cap.cfunc
            cp.cb_eval_user_data = None
        ctx = L.llama_init_from_model(self.model, cp)
        if not ctx:
            raise RuntimeError("llama_init_from_model failed")
        batch = L.llama_batch_init(s.n_batch, 0, 1)
        try:
            if L.llama_n_threads(ctx) != s.n_threads or L.llama_n_threads_batch(ctx) != s.n_threads:
                raise RuntimeError("llama.cpp did not take the thread count")

            def step(toks: Sequence[int], pos0: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
                for i, t in enumerate(toks):
                    batch.token[i] = t
                    batch.pos[i] = pos0 + i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = 1
                batch.n_tokens = len(toks)
                if cap is not None:
                    cap.begin(len(toks))
                rc = L.llama_decode(ctx, batch)
                if rc != 0:
                    raise RuntimeError(f"llama_decode returned {rc}")
                got = cap.finish() if cap is not None else {}
                if embeddings:
                    return np.zeros((len(toks), 0), np.float32), got
                rows = np.empty((len(toks), self.n_vocab), np.float32)
                for i in range(len(toks)):
                    ptr = L.llama_get_logits_ith(ctx, i)
                    rows[i] = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
                return rows, got

            logits, got = step(tokens, 0)
            res = RunResult(tokens=np.asarray(tokens, np.int32), logits=logits, stages=got)
            if embeddings:
                ptr = L.llama_get_embeddings_seq(ctx, 0)
                if not ptr:
                    raise RuntimeError("llama_get_embeddings_seq returned NULL: no pooled embedding")
                res.pooled = np.array(np.ctypeslib.as_array(ptr, shape=(self.n_embd,)), np.float32).reshape(1, -1)
            if cap is not None and cap.inventory is not None:
                res.inventory = list(cap.inventory)
                cap.inventory = None
            fed: list[int] = []
            rows: list[np.ndarray] = []
            per_step: list[dict[str, np.ndarray]] = []
            last = logits[-1]
            for i in range(n_steps):
                tok = int(np.argmax(last)) if isinstance(decode, int) else int(decode[i])
                row, got = step([tok], len(tokens) + i)
                fed.append(tok)
                rows.append(row[0])
                per_step.append(got)
                last = row[0]
            res.decode_tokens = np.asarray(fed, np.int32)
            res.decode_logits = np.stack(rows) if rows else np.zeros((0, self.n_vocab), np.float32)
            if per_step and per_step[0]:
                res.decode_stages = {k: np.concatenate([g[k] for g in per_step]) for k in per_step[0]}
            return res
        finally:
            L.llama_batch_free(batch)
            L.llama_free(ctx)


def summarize_inventory(inventory: list, n_layer: int) -> list[dict]:
    """Collapse the per-node inventory of one graph into unique (name pattern, op, type) rows in
    graph order, with layer numbers replaced by {N} and the ne of the first occurrence."""
    import re

    seen: dict[tuple[str, str, str], dict] = {}
    for name, op, typ, ne, *_srcs in inventory:
        pat = re.sub(r"(?<=-)\d+(?= |$)", "{N}", name)
        pat = re.sub(r"(?<=_l)\d+(?= |$)", "{N}", pat)
        pat = re.sub(r"^node_\d+$", "node_<id>", pat)
        key = (pat, op, typ)
        if key not in seen:
            seen[key] = {"name": pat, "op": op, "type": typ, "ne": list(ne), "count": 0}
        seen[key]["count"] += 1
    return list(seen.values())


__all__ = [
    "LLAMA_CPP_COMMIT",
    "LLAMA_CPP_PYTHON_VERSION",
    "LLAMA_STAGES",
    "LLAMA_NOT_EXPOSED",
    "QWEN2_STAGES",
    "GEMMA3_STAGES",
    "ARCH_STAGES",
    "host_info",
    "Stage",
    "Settings",
    "Oracle",
    "RunResult",
    "build_problems",
    "canonical_ids",
    "summarize_inventory",
    "GGML",
]
