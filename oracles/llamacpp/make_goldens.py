"""Make the llama.cpp goldens: one .npz per (model file, prompt, KV-cache type) plus their entries in
golden/manifest.json. Normally run through oracles/regenerate.sh (which sets up the venv and finds
the model); oracles/README.md documents the arrays and the manifest.

    python make_goldens.py --model PATH [--model-id smollm2-135m-q4_1] [--out golden]
                           [--prompts oracles/prompts.json] [--list-nodes]

--model-id is one of MODELS (below); it selects the expected sha256, the architecture (hence the
stage map) and the storage policy. Only that model's goldens and manifest entries are rewritten;
other models' entries (and other architectures' stage maps) are kept as they are.

For every prompt and KV-cache type (f32 = the primary goldens, f16 = llama.cpp's default, kept
for the noise floor) llama.cpp runs once with the eval callback (capturing every stage of every
layer) and once without it; the logits of the two runs are compared and the largest difference
recorded (``capture_changes_logits``).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import sys
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ggml_capture as G  # noqa: E402

SCHEMA_VERSION = 1
ORACLE_NAME = "llama.cpp"

N_DECODE = 8  # teacher-forced greedy steps after the prompt, one token per llama_decode call
TOPK = 64  # logits_topk / logits_topk_ids (and logits_decode_topk*) width
# a prompt whose tokens and decode steps exceed the default n_ctx (512; e.g. `long_window`, longer than Gemma 3's
# sliding window of 512) runs with a context, batch and ubatch of 1024: still one ubatch for the whole prompt
LONG_SETTINGS = G.Settings(n_ctx=1024, n_batch=1024, n_ubatch=1024)

# --- what each golden stores: SmolLM2 (POLICY; V = 49152) ------------------------------------
# Budget (when these were made): golden/ <= 64 MiB, aim <= 48 MiB; SmolLM2 takes 46 MiB of the
# 96 MiB now allowed for all models. One prompt position with every stage of all 30 layers at f16
# is ~0.6 MB, a full logits row (49152 x f32) ~0.2 MB. So:
# - f32-KV (primary): every stage of every layer, prefill and decode, for `prose` (the reference
#   case for stage-by-stage bisection, including the KV-cache decode path) and for the prefill
#   of `one_token`; the other prompts keep the residual stream (embed, blk.N.out, output_norm),
#   which is what layer-level golden injection needs (the input of layer N is blk.N-1.out).
# - f16-KV (llama.cpp's default cache type; for the noise floor): blk.N.out and output_norm.
# Every golden has tokens, logits at the last prompt position, top-64 logits at every prompt
# position and the full decode logits.
ALL = ("*",)
RESIDUAL = ("embed", "blk.{N}.out", "output_norm")
NOISE_FLOOR = ("blk.{N}.out", "output_norm")
# "exact": stages kept in f32 whatever their f16 error, so that bit-exact comparisons stay possible:
# the residual stream of `prose` (prefill and decode) and every stage of `one_token`.
POLICY = {
    "f32": {
        "default": {"prefill": RESIDUAL, "decode": RESIDUAL, "exact": ()},
        "prose": {"prefill": ALL, "decode": ALL, "exact": RESIDUAL},
        "one_token": {"prefill": ALL, "decode": RESIDUAL, "exact": ALL},
    },
    "f16": {
        "default": {"prefill": NOISE_FLOOR, "decode": NOISE_FLOOR, "exact": ()},
    },
}

# --- large vocabularies: gemma3-270m (V = 262144) and qwen2.5-coder-0.5b (V = 151936) ----------
# Budget: golden/ <= 96 MiB all told, of which SmolLM2 (unchanged) takes 46 MiB: ~50 MiB for both.
# What things cost, compressed (deflate gains only ~7% on f16 activations, ~8% on f32 logits):
#   a full logits row, f32        gemma 0.92 MiB   qwen 0.54 MiB   (f16: half)
#   every stage of every layer    gemma 0.58 MiB   qwen 1.25 MiB   per position (f16)
#   the residual stream blk.N.out gemma 22 KiB     qwen 40 KiB     per position (f16)
# Every golden needs the full row at the last prompt position (`logits`, read by the harness and
# tests), so 24 rows are fixed costs; `prose` with every stage and full decode rows is ~17 / ~20 MiB.
# Hence, per model:
# - f32-KV `prose`: every stage of every layer (prefill), the residual stream (embed, blk.N.out,
#   output_norm) at each decode step, f32 logits at the last prompt position and full f32
#   decode.logits [8, V] -- the one golden that can be compared stage by stage and position by
#   position, decode included;
# - f32-KV other prompts: output_norm (prefill and decode), the f32 last-position row, top-64
#   logits at every prompt position, and the top-64 at each decode step
#   (logits_decode_topk{,_ids} [8, 64]) *instead of* decode.logits; `one_token` (T <= 2) also
#   keeps the prefill residual stream blk.N.out;
# - f16-KV (noise floor only; not gated): the last-position row and the top-64 stored as f16
#   (logits_f16: only if f16 keeps the argmax, see unambiguous_f16_argmax), decode top-64, and
#   the last layer's residual stream blk.{last}.out at the prompt positions (cheap; every golden
#   holds a stage). The noise-floor numbers (vs_f32kv in the manifest: KL, top-1, per-layer
#   cosines) are computed from the full f32 captures before anything is cut.
# Stages are stored as f16 by the criterion below (none is kept f32 on purpose: "exact" is empty).
# - `long_window` (a prompt longer than the model's sliding window, only for the models that have one and list
#   it in oracles/prompts.json `models`): COMPACT storage (issue 42) -- every stage would cost T x 0.58 MiB and
#   the residual stream alone T x 22 KiB, so the prefill stages blk.N.out and output_norm are stored only at
#   the positions of `stage_positions` (around the window boundary W: 0, W-2, W-1, W, W+1, W+2, (W+T)/2, T-1;
#   see window_positions), named by the i32 array `stage_positions`; the last prompt position's logits row and
#   top-64 as f16 (where that keeps the argmax; a f32 row alone is 0.92 MiB), top-64 at every prompt position,
#   output_norm and top-64 at each decode step. No f16-KV golden (None: not made). A compact golden cannot be
#   injected (a local pass needs every position's layer input): the harness holds it to its accumulated pass.
LARGE_VOCAB_POLICY = {
    "f32": {
        "default": {"prefill": ("output_norm",), "decode": ("output_norm",), "exact": (), "decode_logits": "topk"},
        "prose": {"prefill": ALL, "decode": RESIDUAL, "exact": (), "decode_logits": "full"},
        "one_token": {"prefill": ("blk.{N}.out", "output_norm"), "decode": ("output_norm",), "exact": (), "decode_logits": "topk"},
        "long_window": {"prefill": ("blk.{N}.out", "output_norm"), "decode": ("output_norm",), "exact": (),
                        "decode_logits": "topk", "logits_f16": True, "stage_positions": "window"},
    },
    "f16": {
        "default": {"prefill": ("blk.{last}.out",), "decode": (), "exact": (), "decode_logits": "topk", "logits_f16": True},
        "long_window": None,
    },
}
# --- quantization variants (issue 8, the quant axis): smollm2-135m-q4_1-<type> -----------------
# 14 files of SmolLM2 (F16 ... IQ4_XS, made by make_variants.sh; [[variants]] in models.toml), each its
# own model id. Budget: golden/ was 95.3 MiB of 96 before them; the variants get their own line in
# oracles/README.md, kept as small as honest: ONE prompt, `prose` (T = 14: llama.cpp's batched prefill
# paths differ at batch >= 4 and >= 8, so a shorter prompt would not test them), and per KV type:
# - f32-KV (gated): the residual stream blk.N.out of every layer and output_norm at every prompt position
#   (layer-level comparison and injection), output_norm at each of the 8 decode steps, the f32 logits row
#   at the last prompt position, top-64 at every prompt position, and top-64 at each decode step
#   (logits_decode_topk{,_ids}) instead of the full decode.logits rows (0.18 MiB each);
# - f16-KV (noise floor only): as the large vocabularies' f16-KV goldens -- blk.{last}.out, the last
#   row and top-64 as f16 where that keeps the argmax, decode top-64; the floor itself (vs_f32kv: KL,
#   top-1, per-layer cosines) is computed from the full f32 captures before anything is cut.
VARIANT_PROMPTS = ("prose",)
VARIANT_POLICY = {
    "f32": {
        "default": {"prefill": ("blk.{N}.out", "output_norm"), "decode": ("output_norm",), "exact": (), "decode_logits": "topk"},
    },
    "f16": LARGE_VOCAB_POLICY["f16"],
}
KV_ORDER = ("f32", "f16")  # f32 first: its greedy continuation is fed to the f16 run

# Models this oracle knows: the sha256 of the file (must match lockstep's registry, models.toml),
# the architecture (GGUF general.architecture; selects the stage map) and the storage policy.
# The order is the order of the models' entries in golden/manifest.json.
MODELS = {
    "smollm2-135m-q4_1": {
        "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "arch": "llama",
        "policy": POLICY,
    },
    "gemma3-270m-q4_k_m": {
        "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "arch": "gemma3",
        "policy": LARGE_VOCAB_POLICY,
        # the GGUF (the base model) has no tokenizer.chat_template; the chat prompt uses this
        # llama.cpp built-in template (<start_of_turn>user ... <end_of_turn> <start_of_turn>model)
        "builtin_chat_template": "gemma",
    },
    "qwen2.5-coder-0.5b-q4_k_m": {
        "sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "arch": "qwen2",
        "policy": LARGE_VOCAB_POLICY,
    },
}

ROOT = Path(__file__).resolve().parent.parent.parent


# --- tiny seeded models (issue 25): [[synth]] of models.toml, written by `lockstep synth` ----------
# V = 263, d_model 256, 2 blocks, one prompt (`synth`, 11 tokens), f32 KV only (no f16-KV noise-floor
# goldens: the real models carry that). Budget: golden/ may grow by 8 MiB for eleven architectures, both
# oracles and their variants, ~0.35 MiB per architecture and oracle. So:
# - the F32 model: every stage of every layer at every prompt position (f16 where rounding allows, see
#   store()), the residual stream at each decode step, and full f32 logits rows (last prompt position and
#   the 8 decode steps): a porter's stage-by-stage bisection on the smallest model that has every block;
# - its variants (`lockstep quantize --type T` of it): blk.N.out at the prompt positions (layer-level
#   localization) and the same full f32 logits rows (bit-exactness is judged on them): ~0.02 MiB each.
SYNTH_PROMPTS = ("synth",)
SYNTH_KV = ("f32",)
# "exact": the norms of the residual stream stay f32 -- an RMSNorm epsilon bug (eps/10) changes them by ~1e-7
# relative when the stream is large (Gemma's embedding x16), below f16 storage: stored f16, bisect could only
# name the next matmul.
SYNTH_POLICY = {"f32": {"default": {"prefill": ALL, "decode": RESIDUAL, "exact": ("blk.{N}.attn_norm", "blk.{N}.ffn_norm"), "decode_logits": "full"}}}
SYNTH_VARIANT_POLICY = {
    "f32": {"default": {"prefill": ("blk.{N}.out",), "decode": (), "exact": (), "decode_logits": "full"}}
}
# An encoder (bert): no decode steps and no logits; its output, the pooled embedding `pooled` [1, n_embd], is
# always stored f32 (variants too: see ENCODER_ALWAYS). Its norms are post-norms: embed, ffn_inp and out
# are the LayerNorm outputs, kept f32 so an epsilon bug shows at the norm that has it.
SYNTH_ENCODER_POLICY = {"f32": {"default": {"prefill": ALL, "decode": (), "exact": ("embed", "blk.{N}.ffn_inp", "blk.{N}.out", "pooled"), "decode_logits": "full"}}}
ENCODER_ALWAYS = ("pooled",)


def load_synth(models_toml: Path = ROOT / "models.toml") -> dict:
    """The [[synth]] entries of lockstep's registry (models.toml), as MODELS entries: sha256 of the file
    `lockstep synth` writes, the architecture, SYNTH_POLICY, the prompt, f32 KV only, and the recipe."""
    import tomllib

    reg = tomllib.loads(models_toml.read_text())
    out = {}
    for m in reg.get("synth", []):
        out[m["id"]] = {
            "sha256": m["sha256"],
            "arch": m["arch"],
            "policy": SYNTH_ENCODER_POLICY if m["arch"] in G.ENCODER_ARCHS else SYNTH_POLICY,
            "prompts": SYNTH_PROMPTS,
            "kv": SYNTH_KV,
            "synth": {
                "arch": m["arch"],
                "seed": m["seed"],
                "size": m["size"],
                "recipe": f"lockstep synth --arch {m['arch']} --seed {m['seed']} --out {m['id']}.gguf",
            },
        }
    return out



def load_variants(synth: dict, models_toml: Path = ROOT / "models.toml") -> dict:
    """The [[variants]] of lockstep's registry (models.toml), as MODELS entries: sha256 of the file
    the recipe makes, the source model's architecture, the policy, the prompts, and the recipe
    (make_variants.sh for a downloaded source; `lockstep quantize`, the same bytes, for a seeded one)."""
    import tomllib

    reg = tomllib.loads(models_toml.read_text())
    # a user registry's variant may name a model of the checkout's registry (MODELS, `synth`) as its source
    arch = {k: v["arch"] for k, v in {**MODELS, **synth}.items()}
    arch.update({m["id"]: m["arch"] for m in reg.get("models", []) + reg.get("synth", [])})
    synth_ids = set(synth) | {m["id"] for m in reg.get("synth", [])}
    out = {}
    for v in reg.get("variants", []):
        if v["type"] == "HF":
            continue  # the Hugging Face copy of its source: held to the source's goldens (ci/matrix.toml)
        if v["source"] in synth_ids:
            out[v["id"]] = {
                "sha256": v["sha256"],
                "arch": arch[v["source"]],
                "policy": SYNTH_VARIANT_POLICY,
                "prompts": SYNTH_PROMPTS,
                "kv": SYNTH_KV,
                "variant": {
                    "source_model": v["source"],
                    "source_sha256": synth[v["source"]]["sha256"],
                    "type": v["type"],
                    "size": v["size"],
                    "recipe": f"lockstep quantize --model {v['source']} --type {v['type']} --out {v['id']}.gguf",
                    "recipe_steps": [
                        f"lockstep synth --arch {arch[v['source']]} --seed {synth[v['source']]['synth']['seed']} --out {v['source']}.gguf",
                        f"lockstep quantize --model {v['source']}.gguf --type {v['type']} --out {v['id']}.gguf "
                        "(llama-quantize --pure's bytes: the exact F32 dequantization, then the type)",
                    ],
                    "tools": "lockstep (this repository)",
                },
            }
            continue
        out[v["id"]] = {
            "sha256": v["sha256"],
            "arch": arch[v["source"]],
            "policy": VARIANT_POLICY,
            "prompts": VARIANT_PROMPTS,
            "variant": {
                "source_model": v["source"],
                "source_sha256": MODELS[v["source"]]["sha256"],
                "type": v["type"],
                "size": v["size"],
                "recipe": f"oracles/llamacpp/make_variants.sh --model {v['source']} {v['type']}",
                "recipe_steps": [
                    f"llama-quantize --allow-requantize {v['source']}.gguf {v['source']}-F32.gguf F32",
                    f"llama-quantize --pure {v['source']}-F32.gguf {v['source']}-{v['type']}.gguf {v['type']}",
                ],
                "tools": "llama.cpp 0c1e570 (the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp), built by oracles/llamacpp/build_tools.sh",
            },
        }
    return out


# MODELS order (the order of golden/manifest.json): the downloaded models, their variants, the seeded
# models, their variants
_SYNTH = load_synth()
_VARIANTS = load_variants(_SYNTH)
MODELS.update({k: v for k, v in _VARIANTS.items() if v.get("kv") != SYNTH_KV})
MODELS.update(_SYNTH)
MODELS.update({k: v for k, v in _VARIANTS.items() if v.get("kv") == SYNTH_KV})


def add_user_registry(path: Path) -> None:
    """A user's registry file (lockstep's `--registry FILE`, the models.toml format): its [[synth]] entries and
    their [[variants]] (or variants of the checkout's seeded models) join MODELS, after the checkout's."""
    if not path.is_file():
        raise SystemExit(f"--registry {path}: no such file")
    user = load_synth(path)
    clash = sorted(set(user) & set(MODELS))
    if clash:
        raise SystemExit(f"--registry {path}: ids {clash} are already in the checkout's models.toml")
    MODELS.update(user)
    MODELS.update(load_variants({**_SYNTH, **user}, path))

# A stage is stored as f16 when rounding costs at most this much on every row (one position's
# vector): 1 - cosine(f16, f32) <= F16_MAX_ONE_MINUS_COS and ||f16 - f32|| / ||f32|| <=
# F16_MAX_REL_RMS. The thresholds these goldens are used against are ~1e-4 on 1 - cosine (cosine
# >= 0.9999 on blk.N.out) and 1e-3 on mean KL (logits, always f32), so storage stays far below a
# tenth of them. Anything that fails (or overflows f16) is stored as f32.
F16_MAX_ONE_MINUS_COS = 1e-6
F16_MAX_REL_RMS = 1e-3


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """np.savez_compressed, but byte-for-byte reproducible: fixed zip timestamps and order."""
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for name, arr in arrays.items():
            bio = io.BytesIO()
            np.lib.format.write_array(bio, np.ascontiguousarray(arr), allow_pickle=False)
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, bio.getvalue(), compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    os.replace(tmp, path)


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    na = np.linalg.norm(a, axis=-1)
    nb = np.linalg.norm(b, axis=-1)
    dot = np.sum(a * b, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.where((na == 0) & (nb == 0), 1.0, dot / (na * nb))
    return cos


def store(x: np.ndarray, allow_f16: bool, force_f16: bool = False) -> tuple[np.ndarray, dict]:
    """Choose the storage dtype of one float array and measure what storage costs (``force_f16``:
    f16 whenever it is finite, whatever the criterion says)."""
    x = np.asarray(x)
    if x.dtype.kind == "i":
        out = x.astype(np.int32)
        return out, {"dtype": "i32", "storage_max_abs_err": 0.0, "storage_max_rel_err": 0.0, "storage_min_cosine": 1.0}
    x32 = x.astype(np.float32)
    exact = {"dtype": "f32", "storage_max_abs_err": 0.0, "storage_max_rel_err": 0.0, "storage_min_cosine": 1.0}
    if not allow_f16:
        return x32, exact
    with np.errstate(over="ignore"):
        x16 = x32.astype(np.float16)
    if not np.all(np.isfinite(x16)):
        return x32, exact
    back = x16.astype(np.float32)
    d = (back.astype(np.float64) - x32.astype(np.float64))
    max_abs = float(np.max(np.abs(d))) if d.size else 0.0
    rms = float(np.sqrt(np.mean(x32.astype(np.float64) ** 2))) if x32.size else 0.0
    max_rel = max_abs / rms if rms > 0 else 0.0
    rows32 = x32.reshape(x32.shape[0], -1)
    rowsd = d.reshape(d.shape[0], -1)
    with np.errstate(invalid="ignore", divide="ignore"):
        rel_rms = np.linalg.norm(rowsd, axis=1) / np.linalg.norm(rows32.astype(np.float64), axis=1)
    rel_rms = np.nan_to_num(rel_rms, nan=0.0)
    min_cos = float(np.min(row_cosines(back.reshape(rows32.shape), rows32)))
    if force_f16 or (1.0 - min_cos <= F16_MAX_ONE_MINUS_COS and float(np.max(rel_rms)) <= F16_MAX_REL_RMS):
        return x16, {"dtype": "f16", "storage_max_abs_err": max_abs, "storage_max_rel_err": max_rel, "storage_min_cosine": min_cos}
    return x32, exact


def expand(patterns: Sequence[str], n_layer: int, all_ids: Sequence[str]) -> list[str]:
    """The canonical ids selected by ``patterns`` (``*`` = all; ``{N}`` = every layer, ``{last}``
    = the last layer), in forward order."""
    if "*" in patterns:
        return list(all_ids)
    wanted = set()
    for p in patterns:
        p = p.replace("{last}", str(n_layer - 1))
        if "{N}" in p:
            wanted.update(p.replace("{N}", str(n)) for n in range(n_layer))
        else:
            wanted.add(p)
    return [c for c in all_ids if c in wanted]


# --measure (oracles/yardstick/measure.sh): goldens made only to MEASURE distances (llama.cpp against transformers,
# and against itself with an f16 KV cache), written to a scratch directory and never committed. Every prompt of
# --prompts is run whatever the model's own prompt list, and every golden keeps, in f32, what the gate of a
# reference cell reads: the residual stream blk.N.out and output_norm at every prompt position and decode step, and
# full logits rows at the last prompt position and at every decode step.
MEASURE_POLICY = {"prefill": ("blk.{N}.out", "output_norm"), "decode": ("blk.{N}.out", "output_norm"),
                  "exact": ALL, "decode_logits": "full", "logits_f16": False}
MEASURE = False  # set by --measure


def policy(model_id: str, kv: str, prompt_id: str) -> dict:
    """The storage policy row of one golden: stage patterns ``prefill`` / ``decode`` / ``exact``,
    ``decode_logits`` ("full": decode.logits [N, V]; "topk": logits_decode_topk{,_ids} [N, 64]
    instead) and ``logits_f16`` (logits and logits_topk stored as f16 whenever rounding keeps the
    argmax, see unambiguous_f16_argmax; else both f32) and ``stage_positions`` (None: prefill stages at every
    prompt position; "window": only at window_positions, named by the array ``stage_positions``). ``None``
    when the policy makes no golden of this (KV type, prompt). With --measure, MEASURE_POLICY for every golden."""
    if MEASURE:
        return dict(MEASURE_POLICY)
    table = MODELS[model_id]["policy"][kv]
    row = table.get(prompt_id, table["default"])
    if row is None:
        return None
    row = dict(row)
    row.setdefault("decode_logits", "full")
    row.setdefault("logits_f16", False)
    row.setdefault("stage_positions", None)
    return row


def window_positions(T: int, window: int | None) -> list[int]:
    """The prompt positions a compact golden (policy ``stage_positions = "window"``) stores its prefill stages
    at: the first position, the two before the sliding window ``window`` starts dropping keys (W-2, W-1), the
    first three after (W, W+1, W+2: a window off by one shows first at W), one between W and the last, and
    the last (T-1). Sorted, distinct, in 0..T."""
    if window is None or T <= window:
        raise SystemExit(f"stage_positions = 'window' needs a prompt longer than the sliding window ({T} tokens, window {window})")
    return sorted({0, window - 2, window - 1, window, window + 1, window + 2, (window + T) // 2, T - 1} & set(range(T)))


def softmax64(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=-1, keepdims=True)


def kl(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    """KL(P || Q) in nats per row, P and Q the softmax of each row."""
    p = softmax64(p_logits)
    q = softmax64(q_logits)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(p > 0, p * (np.log(p) - np.log(q)), 0.0)
    return t.sum(axis=-1)


def unambiguous_f16_argmax(rows: np.ndarray, argmax: np.ndarray) -> bool:
    """Whether storing ``rows`` as f16 keeps each row's argmax (the lowest id among the largest
    values, as a reader finds it) equal to ``argmax`` (the f32 one): false when rounding to f16
    merges the largest logit with another one of a lower id, or overflows."""
    with np.errstate(over="ignore"):
        r16 = rows.astype(np.float16)
    if not np.all(np.isfinite(r16)):
        return False
    return bool(np.all(np.argmax(r16, axis=1) == argmax))


def logits_storage_note(pol: dict, logits_f16: bool) -> str:
    full = "decode.logits: full [N, V] f32" if pol["decode_logits"] == "full" else (
        "decode.logits not stored: logits_decode_topk_ids / logits_decode_topk [N, 64] (f32) instead"
    )
    last = "f16 (storage_* in arrays)" if logits_f16 else "f32"
    return f"logits: full row at logits_positions (last prompt position), {last}; logits_topk {last}; {full}"


def render_chat(prompt: dict, template: str) -> str:
    import jinja2

    env = jinja2.Environment()
    return env.from_string(template).render(messages=prompt["messages"], add_generation_prompt=True)


def llama_apply_template(template: str, messages: list[dict]) -> str:
    """llama.cpp's own (C++) rendering of the same template, as a cross-check."""
    import ctypes

    import llama_cpp as L

    n = len(messages)
    arr = (L.llama_chat_message * n)()
    keep = []
    for i, m in enumerate(messages):
        role, content = m["role"].encode(), m["content"].encode()
        keep += [role, content]
        arr[i].role = role
        arr[i].content = content
    buf = ctypes.create_string_buffer(8192)
    k = L.llama_chat_apply_template(template.encode(), arr, n, True, buf, len(buf))
    if k < 0 or k > len(buf):
        return ""
    return buf.raw[:k].decode("utf-8", errors="replace")


def gguf_metadata(path: Path) -> dict:
    import gguf

    r = gguf.GGUFReader(str(path))

    def get(key):
        f = r.fields.get(key)
        return None if f is None else f.contents()

    return {
        "general.name": get("general.name"),
        "general.architecture": get("general.architecture"),
        "tokenizer.chat_template": get("tokenizer.chat_template"),
        "tokenizer.ggml.add_bos_token": get("tokenizer.ggml.add_bos_token"),
        "tokenizer.ggml.pre": get("tokenizer.ggml.pre"),
        "sliding_window": get(f"{get('general.architecture')}.attention.sliding_window"),
    }


def stage_map_json(arch: str, inventory_summary: list[dict]) -> dict:
    stages, not_exposed = G.ARCH_STAGES[arch]
    return {
        "about": (
            "llama.cpp graph node (name, op) -> canonical stage id. {N} is the layer. op is "
            "ggml_op_desc of the node (the GLU sub-op for GGML_OP_GLU). Nodes sharing a name are "
            "told apart by op (Qcur-N: MUL_MAT = projection, RESHAPE = view of it, ROPE = after RoPE). "
            "Shapes are [T, width]; Q/K after RoPE (ggml ne [head_dim, n_head, T]) are flattened "
            "head-major to [T, n_head*head_dim]. not_exposed: canonical stages without a node."
            + (
                " A row with `input` is a node the graph leaves unnamed (ggml names it node_<index>): "
                "it is the node computed by `op` that consumes the node named `input`."
                if any(s.input is not None for s in stages) else ""
            )
        ),
        "stages": [s.as_json() for s in stages],
        "not_exposed": list(not_exposed),
        "observed_nodes": inventory_summary,
    }


def dump_manifest(manifest: dict) -> str:
    """golden/manifest.json's text layout: oracles/manifest_format.py (shared by both oracles)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import manifest_format  # noqa: E402

    return manifest_format.dump_manifest(manifest)


def entry_head(args, rel, want_sha, model_path, meta, arch, p, rendered, oracle, host, kv) -> dict:
    """The first fields of a golden's manifest entry, the same for a decoder's and an encoder's golden: the file
    (path under --out, sha256, bytes), the model, the prompt, the tokenizer, this oracle's build and host, the KV
    type."""
    pid = p["id"]
    return {
        "path": rel.as_posix(),
        "sha256": sha256_file(args.out / rel),
        "bytes": (args.out / rel).stat().st_size,
        "model_id": args.model_id,
        "model_sha256": want_sha,
        "model_file": model_path.name,
        "model_general_name": meta["general.name"],
        "arch": arch,
        "prompt_id": pid,
        "prompt_kind": p["kind"],
        "prompt": rendered[pid]["text"],
        "add_special": p["add_special"],
        "parse_special": p["parse_special"],
        "tokenizer": {"add_bos": oracle.add_bos, "bos_id": oracle.bos, "eos_id": oracle.eos},
        "oracle": {
            "name": ORACLE_NAME,
            "llama_cpp_python": G.LLAMA_CPP_PYTHON_VERSION,
            "llama_cpp_commit": G.LLAMA_CPP_COMMIT,
            "ggml_commit": G.GGML.commit(),
            "ggml_version": G.GGML.version(),
            "numpy": np.__version__,
            **host,
        },
        "kv_type": kv,
    }


def encoder_entry(args, oracle, meta, settings, host, res, p, rendered, kv, n_layer, all_ids, want_sha, model_path, arch, delta) -> dict:
    """Write the golden of an encoder (bert) run and return its manifest entry: ``tokens``, the stages of
    the policy (``pooled`` always, f32) and no logits and no decode arrays (``n_decode_steps = 0``,
    ``output = pooled``)."""
    pid = p["id"]
    pol = policy(args.model_id, kv, pid)
    prefill_ids = [c for c in expand(pol["prefill"], n_layer, all_ids) if c != "logits"]
    prefill_ids += [c for c in ENCODER_ALWAYS if c not in prefill_ids]
    exact = set(expand(pol["exact"], n_layer, all_ids)) | set(ENCODER_ALWAYS)
    raw = [("tokens", res.tokens, False)] + [(c, res.stages[c], c not in exact) for c in prefill_ids]
    arrays, listed = {}, {}
    for name, x, allow_f16 in raw:
        a, info = store(x, allow_f16)
        arrays[name] = a
        listed[name] = {"shape": list(a.shape), **info}
    rel = Path(args.model_id) / f"llama.cpp-{kv}kv" / f"{pid}.npz"
    write_npz(args.out / rel, arrays)
    T = len(res.tokens)
    entry = {
        **entry_head(args, rel, want_sha, model_path, meta, arch, p, rendered, oracle, host, kv),
        "settings": {**settings.as_dict(kv), "embeddings": True,
                     "pooling_type": "LLAMA_POOLING_TYPE_UNSPECIFIED (the model's bert.pooling_type)",
                     "logits_requested": "none: embeddings mode (an encoder has no output head)",
                     "kv_cache": "none: llama.cpp builds no KV cache for an encoder (build_attn_inp_no_cache); type_k/type_v unused"},
        "n_prompt_tokens": T,
        "n_decode_steps": 0,
        "decode_source": "none: an encoder has no KV cache and no decode step",
        "continuation": "",
        "output": "pooled",
        "capture_changes_logits": delta,
        "capture_changes_note": "an encoder: max |Δ| of the pooled embedding between the runs with and without the capture hooks",
        "stages_prefill": list(pol["prefill"]) + list(ENCODER_ALWAYS),
        "stages_decode": [],
        "stages_exact_f32": list(pol["exact"]) + list(ENCODER_ALWAYS),
        "logits_storage": "none: an encoder has no logits; `pooled` [1, n_embd] f32 is llama_get_embeddings_seq(ctx, 0), "
        "bit-equal to the graph's result_embd_pooled (not normalised)",
        "model_hparams": {"n_layer": n_layer, "n_embd": oracle.n_embd, "n_vocab": oracle.n_vocab},
        "arrays": listed,
    }
    for key in ("variant", "synth"):
        if key in MODELS[args.model_id]:
            entry[key] = MODELS[args.model_id][key]
    print(f"{rel.as_posix():55s} T={T:3d} {entry['bytes'] / 2**20:6.2f} MiB  capture Δpooled={delta:.3g}", flush=True)
    return entry


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = Path(__file__).resolve().parent
    ap.add_argument("--model", required=True, type=Path, help="path of the GGUF file")
    ap.add_argument("--model-id", default="smollm2-135m-q4_1")
    ap.add_argument("--out", type=Path, default=here.parent.parent / "golden", help="the golden/ directory")
    ap.add_argument("--prompts", type=Path, default=here.parent / "prompts.json",
                    help="the prompts file (oracles/prompts.json's format). A file of your own: every prompt in it "
                         "(that does not name other models in `models`) is made for the model, seeded or not")
    ap.add_argument("--registry", type=Path, action="append", default=[], metavar="FILE",
                    help="a user registry file (lockstep --registry): its [[synth]] models and their [[variants]] "
                         "can be --model-id (repeatable)")
    ap.add_argument("--list-nodes", action="store_true", help="print every graph node (name, op, type, ne) of one prefill")
    ap.add_argument("--prompt", action="append", default=None, metavar="ID",
                    help="(re)make only this prompt's goldens of the model (repeatable); its other goldens, their "
                         "manifest entries and the stage map are kept as they are")
    ap.add_argument("--measure", action="store_true",
                    help="scratch goldens for measuring distances (oracles/yardstick): every prompt of --prompts, "
                         "MEASURE_POLICY; never for golden/")
    args = ap.parse_args()
    global MEASURE
    MEASURE = args.measure
    # lockstep's order: $LOCKSTEP_REGISTRY's files (`:`-separated), then --registry
    env_files = [Path(f) for f in os.environ.get("LOCKSTEP_REGISTRY", "").split(":") if f]
    for f in env_files + args.registry:
        add_user_registry(f.resolve())
    user_prompts = args.prompts.resolve() != (here.parent / "prompts.json").resolve()
    if MEASURE and args.out.resolve() == (here.parent.parent / "golden").resolve():
        raise SystemExit("--measure writes scratch goldens: give --out a directory other than golden/")

    if args.model_id not in MODELS:
        raise SystemExit(f"unknown model id {args.model_id!r}; known: {sorted(MODELS)}")
    want_sha = MODELS[args.model_id]["sha256"]
    arch = MODELS[args.model_id]["arch"]
    stages, _not_exposed = G.ARCH_STAGES[arch]
    model_path = args.model.resolve()
    if not model_path.is_file():
        raise SystemExit(f"{model_path}: no such model file")
    have_sha = sha256_file(model_path)
    if have_sha != want_sha:
        raise SystemExit(f"{model_path}: sha256 is {have_sha}, expected {want_sha} for {args.model_id}")
    problems = G.build_problems()
    if problems:
        raise SystemExit("the loaded llama.cpp is not the pinned one: " + "; ".join(problems))

    meta = gguf_metadata(model_path)
    if meta["general.architecture"] != arch:
        raise SystemExit(f"{model_path}: general.architecture is {meta['general.architecture']!r}, MODELS says {arch!r}")
    settings = G.Settings()
    oracle = G.Oracle(str(model_path), settings)
    host = G.host_info()
    n_layer = oracle.n_layer
    all_ids = G.canonical_ids(stages, n_layer)
    template = meta["tokenizer.chat_template"]
    if template != oracle.chat_template():
        raise SystemExit("gguf and llama.cpp disagree on tokenizer.chat_template")
    prompts = json.loads(args.prompts.read_text())["prompts"]
    only = None if (MEASURE or user_prompts) else MODELS[args.model_id].get("prompts")
    if user_prompts:
        # a prompts file of the user's: all of it, but prompts that name other models
        prompts = [p for p in prompts if args.model_id in p.get("models", [args.model_id])]
        if not prompts:
            raise SystemExit(f"{args.prompts}: no prompt for {args.model_id}")
    elif MEASURE:
        prompts = [p for p in prompts if p["id"] not in SYNTH_PROMPTS]
    elif only is None:
        # the downloaded models: every prompt but the seeded models' own, and of the prompts that name the models
        # they are for (`models`: e.g. one longer than a sliding window), those that name this one
        prompts = [p for p in prompts if p["id"] not in SYNTH_PROMPTS and args.model_id in p.get("models", [args.model_id])]
    else:
        prompts = [p for p in prompts if p["id"] in only]
        if [p["id"] for p in prompts] != list(only):
            raise SystemExit(f"{args.model_id}: prompts {only} are not all in {args.prompts}")
    if args.prompt:
        unknown = sorted(set(args.prompt) - {p["id"] for p in prompts})
        if unknown:
            raise SystemExit(f"{args.model_id}: --prompt {unknown}: no such prompt for this model in {args.prompts}")
        prompts = [p for p in prompts if p["id"] in args.prompt]
    longest = 0

    # --- tokenize -------------------------------------------------------------------------
    rendered = {}
    for p in prompts:
        if p["kind"] == "chat" and template is None:
            # no tokenizer.chat_template in the GGUF (gemma3-270m is the base model): llama.cpp's
            # built-in template of the model family, named in MODELS, rendered by llama.cpp
            builtin = MODELS[args.model_id].get("builtin_chat_template")
            if builtin is None:
                raise SystemExit(f"{args.model_id}: the GGUF has no tokenizer.chat_template and MODELS names no builtin_chat_template")
            text = llama_apply_template(builtin, p["messages"])
            if not text:
                raise SystemExit(f"llama_chat_apply_template does not know the template {builtin!r}")
            rendered[p["id"]] = {
                "text": text,
                "template_source": (
                    f"the GGUF has no tokenizer.chat_template: llama.cpp's built-in template {builtin!r} "
                    "(llama_chat_apply_template(tmpl=name, add_ass=true))"
                ),
            }
        elif p["kind"] == "chat":
            text = render_chat(p, template)
            rendered[p["id"]] = {
                "text": text,
                "template_source": "GGUF tokenizer.chat_template rendered with jinja2 "
                + metadata.version("jinja2") + " (messages, add_generation_prompt=true)",
            }
            own = llama_apply_template(template, p["messages"])
            rendered[p["id"]]["llama_chat_apply_template"] = own
            rendered[p["id"]]["llama_chat_apply_template_agrees"] = own == text
        else:
            rendered[p["id"]] = {"text": p["text"]}
        toks = oracle.tokenize(rendered[p["id"]]["text"], p["add_special"], p["parse_special"])
        rendered[p["id"]]["tokens"] = toks
        # one text token, after the BOS the model adds (gemma3: add_bos_token = true)
        n_bos = int(oracle.add_bos and p["add_special"])
        if p["id"] == "one_token" and len(toks) != 1 + n_bos:
            raise SystemExit(f"one_token: {p['text']!r} is {len(toks)} tokens {toks}, not {1 + n_bos}")
        longest = max(longest, len(toks))
    if longest + N_DECODE > LONG_SETTINGS.n_ctx:
        raise SystemExit(f"the longest prompt ({longest} tokens) and {N_DECODE} decode steps do not fit n_ctx {LONG_SETTINGS.n_ctx}")

    # --- run ------------------------------------------------------------------------------
    model_dir = args.out / args.model_id
    kv_order = MODELS[args.model_id].get("kv", KV_ORDER)
    for kv in kv_order:
        d = model_dir / f"llama.cpp-{kv}kv"
        if args.prompt:
            # only the named prompts' goldens are rewritten
            d.mkdir(parents=True, exist_ok=True)
            for pid in args.prompt:
                (d / f"{pid}.npz").unlink(missing_ok=True)
            continue
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)

    inventory_summary: list[dict] = []
    entries = []
    results: dict[tuple[str, str], G.RunResult] = {}
    for p in prompts:
        pid = p["id"]
        toks = rendered[pid]["tokens"]
        # a prompt that with its decode steps does not fit the default context runs with LONG_SETTINGS (one
        # ubatch for the whole prompt, as for every other prompt)
        oracle.settings = settings if len(toks) + N_DECODE <= settings.n_ctx else LONG_SETTINGS
        for kv in kv_order:
            if policy(args.model_id, kv, pid) is None:
                continue  # the policy makes no golden of this KV type for this prompt
            listing = not inventory_summary
            encoder = arch in G.ENCODER_ARCHS
            if encoder:
                decode = 0
                decode_source = "none: an encoder has no KV cache and no decode step"
            elif kv == "f32":
                decode: int | list[int] = N_DECODE
                decode_source = "greedy: each fed token is the argmax of the previous step's logits"
            else:
                decode = [int(t) for t in results[(pid, "f32")].decode_tokens]
                decode_source = (
                    "teacher-forced with the llama.cpp-f32kv golden's greedy continuation, so both "
                    "KV-cache types are compared on the same tokens"
                )
            res = oracle.run(toks, kv, decode, capture=True, inventory=listing, stages=stages, embeddings=encoder)
            if listing:
                inventory_summary = G.summarize_inventory(res.inventory, n_layer)
                if args.list_nodes:
                    for name, op, typ, ne, srcs in res.inventory:
                        print(f"{name:40s} {op:10s} {typ:5s} {str(list(ne)):24s} <- {', '.join(srcs)}")
            plain = oracle.run(toks, kv, [int(t) for t in res.decode_tokens], capture=False, stages=stages, embeddings=encoder)
            if encoder:
                # the output is the pooled embedding: capture must not change it, and the graph's node is
                # what llama_get_embeddings_seq hands out, bit for bit
                delta = float(np.max(np.abs(plain.pooled - res.pooled)))
                cb_vs_api = float(np.max(np.abs(res.stages["pooled"] - res.pooled)))
                if cb_vs_api != 0.0:
                    raise SystemExit(f"{pid}/{kv}: result_embd_pooled differs from llama_get_embeddings_seq by {cb_vs_api}")
                results[(pid, kv)] = res
                entries.append(encoder_entry(args, oracle, meta, oracle.settings, host, res, p, rendered, kv, n_layer, all_ids, want_sha, model_path, arch, delta))
                continue
            delta = max(
                float(np.max(np.abs(plain.logits - res.logits))),
                float(np.max(np.abs(plain.decode_logits - res.decode_logits))) if len(res.decode_tokens) else 0.0,
            )
            cb_vs_api = float(np.max(np.abs(res.stages["logits"] - res.logits)))
            if cb_vs_api != 0.0:
                raise SystemExit(f"{pid}/{kv}: result_output differs from llama_get_logits by {cb_vs_api}")
            results[(pid, kv)] = res

            pol = policy(args.model_id, kv, pid)
            prefill_ids = [c for c in expand(pol["prefill"], n_layer, all_ids) if c != "logits"]
            decode_ids = [c for c in expand(pol["decode"], n_layer, all_ids) if c != "logits"]
            T = len(toks)
            positions = np.array([T - 1], np.int32)
            order = np.argsort(-res.logits, axis=1, kind="stable")[:, :TOPK].astype(np.int32)
            topk = np.take_along_axis(res.logits, order, axis=1)

            raw: list[tuple[str, np.ndarray, bool] | tuple[str, np.ndarray, bool, bool]] = [("tokens", res.tokens, False)]
            exact = set(expand(pol["exact"], n_layer, all_ids))
            # compact storage: the prefill stages at `stage_positions` only (rows in that order)
            stage_pos = None
            if pol.get("stage_positions") == "window":
                stage_pos = np.array(window_positions(T, meta["sliding_window"]), np.int32)
                raw += [("stage_positions", stage_pos, False)]
            elif pol.get("stage_positions") is not None:
                raise SystemExit(f"unknown stage_positions policy {pol['stage_positions']!r}")
            raw += [(c, res.stages[c] if stage_pos is None else res.stages[c][stage_pos], c not in exact) for c in prefill_ids]
            lf16 = bool(
                pol["logits_f16"]
                and unambiguous_f16_argmax(res.logits[positions], order[positions, 0])
                and np.all(np.abs(topk) < 65504.0)
            )
            # logits and logits_topk share one dtype (a reader checks topk[T-1, 0] == max(logits))
            raw += [
                ("logits", res.logits[positions], lf16, lf16),
                ("logits_positions", positions, False),
                ("logits_topk_ids", order, False),
                ("logits_topk", topk, lf16, lf16),
                ("decode.tokens", res.decode_tokens, False),
            ]
            if pol["decode_logits"] == "full":
                raw += [("decode.logits", res.decode_logits, False)]
            else:
                d_order = np.argsort(-res.decode_logits, axis=1, kind="stable")[:, :TOPK].astype(np.int32)
                raw += [
                    ("logits_decode_topk_ids", d_order, False),
                    ("logits_decode_topk", np.take_along_axis(res.decode_logits, d_order, axis=1), False),
                ]
            raw += [("decode." + c, res.decode_stages[c], c not in exact) for c in decode_ids]
            arrays, listed = {}, {}
            for name, x, allow_f16, *force in raw:
                a, info = store(x, allow_f16, bool(force and force[0]))
                arrays[name] = a
                listed[name] = {"shape": list(a.shape), **info}
            rel = Path(args.model_id) / f"llama.cpp-{kv}kv" / f"{pid}.npz"
            write_npz(args.out / rel, arrays)

            entry = {
                **entry_head(args, rel, want_sha, model_path, meta, arch, p, rendered, oracle, host, kv),
                "settings": oracle.settings.as_dict(kv),
                "n_prompt_tokens": T,
                "n_decode_steps": len(res.decode_tokens),
                "decode_source": decode_source,
                "continuation": oracle.detokenize(res.decode_tokens),
                "decode_own_argmax_agreement": float(
                    np.mean(np.argmax(np.vstack([res.logits[-1:], res.decode_logits[:-1]]), axis=1) == res.decode_tokens)
                ),
                "capture_changes_logits": delta,
                "stages_prefill": list(pol["prefill"]),
                "stages_decode": list(pol["decode"]),
                "stages_exact_f32": list(pol["exact"]),
                **({} if stage_pos is None else {
                    "stage_positions_note": (
                        f"compact: the prefill stages are stored at the {len(stage_pos)} prompt positions of the array "
                        f"stage_positions {stage_pos.tolist()} (around the sliding window of "
                        f"{meta['sliding_window']} positions), row r at position stage_positions[r]; not injectable"
                    ),
                }),
                "logits_storage": logits_storage_note(pol, lf16),
                "model_hparams": {"n_layer": n_layer, "n_embd": oracle.n_embd, "n_vocab": oracle.n_vocab},
                "arrays": listed,
            }
            for key in ("variant", "synth"):
                if key in MODELS[args.model_id]:
                    entry[key] = MODELS[args.model_id][key]
            if p["kind"] == "chat":
                entry["chat"] = {"messages": p["messages"], **{k: v for k, v in rendered[pid].items() if k not in ("text", "tokens")}}
            entries.append(entry)
            # keep only what the noise floor below needs (the residual stream and the logits)
            keep_ids = {f"blk.{n}.out" for n in range(n_layer)}
            res.stages = {k: v for k, v in res.stages.items() if k in keep_ids}
            res.decode_stages = {k: v for k, v in res.decode_stages.items() if k in keep_ids}
            print(
                f"{rel.as_posix():55s} T={T:3d} {entry['bytes'] / 2**20:6.2f} MiB  capture Δlogits={delta:.3g}  "
                f"-> {entry['continuation']!r}",
                flush=True,
            )

    # --- noise floor: f16 KV cache vs f32 KV cache, recorded on the f16 entries -----------
    for e in entries:
        if e["kv_type"] != "f16":
            continue
        a, b = results[(e["prompt_id"], "f32")], results[(e["prompt_id"], "f16")]
        la = np.vstack([a.logits, a.decode_logits])
        lb = np.vstack([b.logits, b.decode_logits])
        top1 = np.argmax(la, axis=1) == np.argmax(lb, axis=1)
        cos_prefill = min(float(np.min(row_cosines(a.stages[f"blk.{n}.out"], b.stages[f"blk.{n}.out"]))) for n in range(n_layer))
        cos_decode = min(
            float(np.min(row_cosines(a.decode_stages[f"blk.{n}.out"], b.decode_stages[f"blk.{n}.out"])))
            for n in range(n_layer)
        )
        e["vs_f32kv"] = {
            "about": "llama.cpp with an F16 vs an F32 KV cache on the same tokens (P = f32kv, Q = f16kv)",
            "kl_last_prompt_position": float(kl(a.logits[-1:], b.logits[-1:])[0]),
            "kl_mean_decode": float(np.mean(kl(a.decode_logits, b.decode_logits))),
            "kl_max_all": float(np.max(kl(la, lb))),
            "top1_agreement": float(np.mean(top1)),
            "top1_positions": int(top1.size),
            "min_cosine_blk_out_prefill": cos_prefill,
            "min_cosine_blk_out_decode": cos_decode,
            "max_abs_logits_diff": float(np.max(np.abs(la - lb))),
        }

    # --- manifest -------------------------------------------------------------------------
    manifest_path = args.out / "manifest.json"
    manifest = {"schema_version": SCHEMA_VERSION, "stage_map": {}, "goldens": []}
    if manifest_path.exists():
        old = json.loads(manifest_path.read_text())
        if old.get("schema_version") == SCHEMA_VERSION:
            manifest = old
    manifest["schema_version"] = SCHEMA_VERSION
    manifest["about"] = (
        "Goldens for lockstep's parity harness. Regenerate with oracles/regenerate.sh; the arrays "
        "and fields are documented in oracles/README.md and harness/src/golden.rs."
    )
    # only this architecture's stage map is (re)written; the others are kept. A seeded model (or its
    # variant) writes it only for an architecture no downloaded model has: the observed nodes of a real
    # model's graph are the better record
    maps = manifest.setdefault("stage_map", {}).setdefault(ORACLE_NAME, {})
    seeded = "synth" in MODELS[args.model_id] or MODELS[args.model_id].get("kv") == SYNTH_KV
    if args.prompt and arch in maps:
        pass  # --prompt: the stage map of the model's full run is kept
    elif not (seeded and arch in maps and any(m.get("arch") == arch and "synth" not in MODELS.get(i, {}) and MODELS.get(i, {}).get("kv") != SYNTH_KV for i, m in MODELS.items())):
        maps[arch] = stage_map_json(arch, inventory_summary)
    keep = [
        g for g in manifest.get("goldens", [])
        if not (g.get("oracle", {}).get("name") == ORACLE_NAME and g.get("model_id") == args.model_id
                and (not args.prompt or g.get("prompt_id") in args.prompt))
    ]
    # model by model in MODELS order (unknown models last), then by path: other models' entries
    # keep their place whichever model is regenerated
    rank = {m: i for i, m in enumerate(MODELS)}
    if args.prompt:
        # --prompt: every other entry keeps its place; the new ones go where the old ones were, or else after
        # the last entry of this model's goldens of the same directory (oracle and KV type) that sorts before them
        goldens = list(manifest.get("goldens", []))
        for e in entries:
            old_at = [i for i, g in enumerate(goldens) if g["path"] == e["path"]]
            if old_at:
                goldens[old_at[0]] = e
                continue
            same_dir = [i for i, g in enumerate(goldens)
                        if g.get("model_id") == args.model_id and g["path"].rsplit("/", 1)[0] == e["path"].rsplit("/", 1)[0]]
            before = [i for i in same_dir if goldens[i]["path"] < e["path"]]
            at = (before[-1] + 1) if before else (same_dir[0] if same_dir else len(goldens))
            goldens.insert(at, e)
    else:
        goldens = sorted(keep + entries, key=lambda g: (rank.get(g.get("model_id"), len(rank)), g["path"]))
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "about": manifest["about"],
        "stage_map": manifest["stage_map"],
        "goldens": goldens,
        # the measured cross-oracle distances (oracles/yardstick/record.py) are kept as they are
        **({"cross_oracle": manifest["cross_oracle"]} if "cross_oracle" in manifest else {}),
    }
    manifest_path.write_text(dump_manifest(manifest))
    oracle.close()
    total = sum(e["bytes"] for e in entries)
    print(f"wrote {len(entries)} goldens, {total / 2**20:.2f} MiB, and {manifest_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
