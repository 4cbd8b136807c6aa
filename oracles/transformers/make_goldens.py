"""Make the transformers-f32 goldens: transformers (PyTorch, float32, eager attention) on the same GGUF file as
llama.cpp, dequantized by transformers' GGUF loader (the `gguf` package), fed the SAME token ids as the
llama.cpp-f32kv goldens (their `tokens` and teacher-forced `decode.tokens`). Also runs the model in float64
(transformers' forced-float32 spots patched, tf_capture.py) and records the float32-vs-float64 floor per stage
kind. oracles/transformers/README.md documents everything.

    python make_goldens.py --model-id smollm2-135m-q4_1 [--model PATH] [--out golden] [--no-f64]
    python make_goldens.py --model-id synth-qwen3-q4_k --model /path/to/synth-qwen3-q4_k.gguf
    python make_goldens.py --hf-dir DIR --model-id ID --golden-dir OUT [--prompts FILE] [--stage-map FILE]

The last is the HF route (main_hf): from_pretrained(DIR) in float32, no GGUF loader, hooked by the stage map of
config.json's model_type (stage_maps/<model_type>.toml); token ids from the model's llama.cpp-f32kv goldens in OUT
where there are some, else the prompts of FILE tokenized with DIR's tokenizer.json.

Model ids: the three downloaded models below, and the seeded models of models.toml ([[synth]]) with their
[[variants]] (read from models.toml, as oracles/llamacpp/make_goldens.py does).

Writes golden/<model-id>/transformers-f32/<prompt>.npz for every prompt the model's llama.cpp-f32kv goldens
have, this oracle's entries of the model in golden/manifest.json (others kept), the stage map
stage_map.transformers.<arch>, and the floor (`floor_f32_vs_f64`) in every entry of the model.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import platform
import shutil
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tf_capture as C  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent.parent
ORACLE_NAME = "transformers"
DIR_NAME = "transformers-f32"
SOURCE_DIR = "llama.cpp-f32kv"  # the goldens whose token ids are fed
TOPK = 64
SCHEMA_VERSION = 1

MODELS = {
    "smollm2-135m-q4_1": {"sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "arch": "llama"},
    "gemma3-270m-q4_k_m": {"sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", "arch": "gemma3"},
    "qwen2.5-coder-0.5b-q4_k_m": {"sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "arch": "qwen2"},
}

# --- storage policy (golden/ <= 140 MiB all told; it was 106.7 MiB before these) ----------------------------
# transformers-f32 is compared with reference mode at the float32 summation-order floor (NMSE ~1e-13..1e-9 per
# stage, floors.md), far below f16 storage error (~1e-8 NMSE), so an array meant for gating at the floor must be
# f32 ("exact"). Every full logits row is f32 (KL ~1e-10 is only visible in f32). What the budget allows
# (~33 MiB for three models; measured per model in README "Budget"):
# - `one_token` (T = 1; Gemma 2): EVERY stage of every layer at the prompt positions, f32 except ffn_gate and
#   ffn_up (f16 by the storage criterion: their product ffn_act is f32, and they are half of the bytes); the
#   residual stream (embed, blk.N.out, output_norm) at each of the 8 decode steps, f32 -- decode runs through
#   transformers' KV cache over 9..10 positions, so attention over several positions is covered at the floor;
# - `prose`: the residual stream (embed, blk.N.out, output_norm) at every prompt position, f32 (the batched
#   prefill at the floor); output_norm at each decode step, f32;
# - the other prompts: blk.N.out and output_norm at every prompt position, output_norm at each decode step,
#   stored f16 where llama.cpp's criterion allows (their storage error is in the manifest per array);
# - logits: the f32 row at the last prompt position and the top-64 at every prompt position for every golden;
#   decode: the top-64 per step (logits_decode_topk{,_ids}), no full rows (SmolLM2 0.19 MiB per row, Gemma 3
#   1 MiB, Qwen2.5 0.55 MiB).
# "f16_ok" takes ids out of "exact" (stored by the f16 criterion).
RESIDUAL = ("embed", "blk.{N}.out", "output_norm")
POLICY = {
    "default": {"prefill": ("blk.{N}.out", "output_norm"), "decode": ("output_norm",), "exact": (), "f16_ok": ()},
    "prose": {"prefill": RESIDUAL, "decode": ("output_norm",), "exact": RESIDUAL, "f16_ok": ()},
    "one_token": {"prefill": ("*",), "decode": RESIDUAL, "exact": ("*",), "f16_ok": ("blk.{N}.ffn_gate", "blk.{N}.ffn_up")},
}
FULL_DECODE_LOGITS: set[tuple[str, str]] = set()  # (model, prompt) with full decode.logits rows; none fit the budget

# --- storage policy of the seeded models (issue 25; [[synth]] and their [[variants]] in models.toml) ----------
# (Issue 42: what each golden holds is chosen below; HOW it is stored is SEEDED_F32 -- every stage array f32 --
# wherever the text below says "f16 by the criterion", which describes the issue-25 goldens.)
# Tiny (2 blocks, d 256, V 263), one prompt `synth` (11 tokens + 8 teacher-forced decode steps). Budget: at most
# ~0.38 MiB per architecture for this oracle, the base golden and its 6 variant goldens together (golden/ may grow
# by ~8 MiB for eleven architectures, both oracles, variants included; oracles/llamacpp/make_goldens.py SYNTH_POLICY).
# Measured per id in README "Budget" (0.36-0.378 MiB per architecture). The policy (a policy dict per model, as
# POLICY is per prompt):
# - the F32 synth model (0.22-0.24 MiB): EVERY stage of every layer at every prompt position (a porter's
#   stage-by-stage bisection on the smallest model that has every block), f16 by the storage criterion, except
#   blk.N.out, f32 ("exact": every layer's output gated at the float32 floor); embed and output_norm f16 by the
#   criterion (f32 did not fit Gemma 3: 9 KiB more; embed is a lookup that blk.0.out gates at the floor, and the
#   f32 logits_topk values gate output_norm -> lm_head at every prompt position); the residual stream (embed,
#   blk.N.out, output_norm) at each decode step (the KV-cache path), f16 by the criterion ("decode_exact" empty:
#   f32 there did not fit, 15 KiB more); logits: the f32 row at the last prompt position, the top-64 at every
#   prompt position, and the FULL decode.logits rows [8, 263] f32 (V is tiny: 1 KiB a row) -- so the decode steps
#   are gated at the float32 floor through their full logits rows, and localized through the f16 residual stream;
# - each variant (~0.023 MiB): blk.N.out at the prompt positions (layer-level localization), f16 by the criterion
#   (f32 did not fit: 6 x 5 KiB more); the same f32 logits arrays (full rows: bit-exactness and the floor).
SYNTH_POLICY = {
    "default": {"prefill": ("*",), "decode": RESIDUAL, "exact": ("blk.{N}.out",), "decode_exact": (), "f16_ok": (),
                "decode_logits": "full"},
}
# Issue 42: the f16 storage of these goldens' stages put a ~1e-7 NMSE floor under every comparison (f16's relative
# spacing ~5e-4, against the float32 floor ~1e-13), and the seeded models are tiny: so every stage array of every
# seeded golden -- base models and variants, prefill and decode, the encoder's too -- is stored f32, whatever the f16
# criterion says (`seeded_all_f32`, applied to every policy below by load_registry/ENCODER_*). What each golden
# holds (which stages, which positions) is unchanged. Cost, measured (du -sb golden, 2026-11-29): README "Budget".
SEEDED_F32 = {"exact": ("*",), "decode_exact": ("*",), "f16_ok": ()}


def seeded_all_f32(policy: dict) -> dict:
    """The policy dict (per prompt) with every stored stage f32 (SEEDED_F32)."""
    return {pid: {**pol, **SEEDED_F32} for pid, pol in policy.items()}

# gemma4 (synth-gemma4: layer 1 has heads of 128, so its q/q_norm/q_rope/attn_out rows are 512 wide and k/v/k_norm/
# k_rope 256): SYNTH_POLICY gives 283610 B for the base golden, 431519 B with the six variants -- over the 0.4 MiB
# (419430 B) this architecture may add. Trimmed, least informative first:
# - blk.N.v on the layers without attn_v (V = K): the same array as blk.N.k (the same node in llama.cpp's graph, the
#   same k_proj output here; check_gemma4 asserts V = K on exactly those layers) -- nothing lost (5.3 KB);
# - output_norm at the decode steps: lm_head's input, gated through the f32 logits (the full rows at every decode
#   step). Issue 42 stores it again at the prompt positions (11 rows, 11 KB in f32): without it a final-norm bug
#   cannot be localized against this oracle alone (bisect names no stage; the llama.cpp golden stores it).
# Measured in README "Budget".
SYNTH_POLICY_GEMMA4 = {
    "default": {"prefill": ("*",), "decode": ("embed", "blk.{N}.out"), "exact": ("blk.{N}.out",), "decode_exact": (),
                "f16_ok": (), "decode_logits": "full", "skip_v_eq_k": True},
}
SYNTH_POLICY_BY_ARCH = {"gemma4": SYNTH_POLICY_GEMMA4}
SYNTH_VARIANT_POLICY = {
    "default": {"prefill": ("blk.{N}.out",), "decode": (), "exact": (), "f16_ok": (), "decode_logits": "full"},
}
# The four architectures added last (phi3, starcoder2, stablelm, gpt2) under what remained of issue 25's budget:
# their 28 goldens and manifest entries together <= 1.3 MiB (the whole issue may grow golden/ by 8 MiB; ~2.3 MiB
# remained for these, gemma4 and bert). The policy above costs ~0.36 MiB of .npz and ~0.07 MiB of manifest per
# architecture (1.7 MiB for four), so, measured per id in README "Budget":
# - the F32 file: every stage of LAYER 0 at every prompt position (every block of these architectures is in each
#   layer -- no alternating layers, no window here -- so a stage-by-stage bisection meets each block once), the
#   residual stream of every layer (embed, blk.N.out f32, output_norm), the decode steps' residual stream and the
#   full decode.logits rows, all as in SYNTH_POLICY; layer 1's sub-layer stages (~85 KiB an architecture) are what
#   did not fit. The llama.cpp golden of the same F32 file holds them at the float32 floor too (NMSE <= 2.3e-7 vs
#   this oracle, README "Cross-oracle floor"; f16 stored, as they would be here);
# - each variant: the LAST layer's output (f16 by the criterion) instead of every layer's (min_cosine_out's
#   residual check at the layer the logits read), plus the same f32 logits arrays;
# - compact manifest entries (COMPACT): the floor restricted to the stage kinds the golden holds (plus the logits
#   and KL), every float of the floor, the storage errors and vs_llamacpp_f32kv_max_nmse rounded to 3 significant
#   digits -- upward for error bounds, downward for cosines -- and the floor's `about` pointing to the README.
SYNTH_POLICY_COMPACT = {
    "default": {"prefill": ("embed", "blk.0.*", "blk.{N}.out", "output_norm"), "decode": RESIDUAL,
                "exact": ("blk.{N}.out",), "decode_exact": (), "f16_ok": (), "decode_logits": "full", "compact": True},
}
SYNTH_VARIANT_POLICY_COMPACT = {
    "default": {"prefill": ("blk.{last}.out",), "decode": (), "exact": (), "f16_ok": (), "decode_logits": "full",
                "compact": True},
}
COMPACT_ARCHS = ("phi3", "starcoder2", "stablelm", "gpt2")


def registry_files() -> list[Path]:
    """lockstep's registry files in its order: the checkout's models.toml, then $LOCKSTEP_REGISTRY's (`:`-separated;
    a user's own models, e.g. other seeds: README "Your own models, prompts and goldens")."""
    return [ROOT / "models.toml"] + [Path(f) for f in os.environ.get("LOCKSTEP_REGISTRY", "").split(":") if f]


def load_registry(files: list[Path] | None = None) -> dict:
    """The [[synth]] entries of the registry files and the [[variants]] made from them, as MODELS entries (synth
    models first, then their variants, in registry order): sha256, architecture, storage policy, and what they
    are. A user file's variant may name a checkout model as its source."""
    import tomllib

    reg = {"synth": [], "variants": []}
    for f in files or registry_files():
        if not f.is_file():
            raise SystemExit(f"registry file {f}: no such file ($LOCKSTEP_REGISTRY)")
        r = tomllib.loads(f.read_text())
        reg["synth"] += r.get("synth", [])
        reg["variants"] += r.get("variants", [])
    synth = {m["id"]: m for m in reg.get("synth", [])}
    out = {}
    for m in synth.values():
        pol = SYNTH_POLICY_BY_ARCH.get(m["arch"], SYNTH_POLICY_COMPACT if m["arch"] in COMPACT_ARCHS else SYNTH_POLICY)
        pol = seeded_all_f32(pol)
        out[m["id"]] = {"sha256": m["sha256"], "arch": m["arch"], "policy": pol,
                        "default_file": f"models/{m['id']}.gguf"}
    for v in reg.get("variants", []):
        if v["type"] == "HF":
            continue  # the Hugging Face copy of its source: held to the source's goldens (ci/matrix.toml)
        if v["source"] in MODELS:
            # a downloaded model's quantization variant (SmolLM2's quant axis): no committed goldens of this
            # oracle (budget), but measured with --measure (oracles/yardstick: llama.cpp's distance from
            # transformers on it)
            out[v["id"]] = {"sha256": v["sha256"], "arch": MODELS[v["source"]]["arch"], "policy": POLICY,
                            "default_file": f"variants/{v['source']}/{v['source']}-{v['type']}.gguf",
                            "type": v["type"]}
        elif v["source"] in synth:
            arch = synth[v["source"]]["arch"]
            pol = seeded_all_f32(SYNTH_VARIANT_POLICY_COMPACT if arch in COMPACT_ARCHS else SYNTH_VARIANT_POLICY)
            out[v["id"]] = {"sha256": v["sha256"], "arch": arch, "policy": pol,
                            "default_file": f"variants/{v['source']}/{v['source']}-{v['type']}.gguf"}
    return out


MODELS.update(load_registry())


# --measure (oracles/yardstick/measure.sh): scratch goldens for measuring llama.cpp's distance from transformers,
# never committed: the residual stream (blk.N.out, output_norm) at every prompt position and decode step in f32,
# and full f32 logits rows at every decode step, as oracles/llamacpp/make_goldens.py --measure stores them.
MEASURE_POLICY = {"prefill": ("blk.{N}.out", "output_norm"), "decode": ("blk.{N}.out", "output_norm"),
                  "exact": ("*",), "f16_ok": ()}
MEASURE = False  # set by --measure


def policy_of(mid: str, pid: str) -> dict:
    if MEASURE:
        return dict(MEASURE_POLICY)
    policies = MODELS[mid].get("policy", POLICY)
    return policies.get(pid, policies["default"])


def full_decode_logits(mid: str, pid: str) -> bool:
    if MEASURE:
        return True
    return (mid, pid) in FULL_DECODE_LOGITS or policy_of(mid, pid).get("decode_logits") == "full"


def prefill_skip(pol: dict, n_layer: int, ids: list[str], has_v: list[bool] | None) -> set[str]:
    """The prefill ids a policy leaves out of a golden: "prefill_skip" (patterns), and with "skip_v_eq_k" (gemma4)
    blk.N.v of every layer without attn_v, whose V is the K projection (the same array as blk.N.k)."""
    skip = set(expand(pol.get("prefill_skip", ()), n_layer, ids))
    if pol.get("skip_v_eq_k"):
        skip |= {f"blk.{il}.v" for il, has in enumerate(has_v) if not has}
    return skip


def exact_ids(pol: dict, n_layer: int, ids: list[str], decode: bool = False) -> set[str]:
    """The ids stored f32 whatever the f16 criterion says: "exact" minus "f16_ok"; at the decode steps
    "decode_exact" instead of "exact" where the policy has one (the seeded models)."""
    exact = pol.get("decode_exact", pol["exact"]) if decode else pol["exact"]
    return set(expand(exact, n_layer, ids)) - set(expand(pol["f16_ok"], n_layer, ids))

# check_against_llamacpp's NMSE limit per stage kind when every tensor of the file is F32 (the seeded base models):
# llama.cpp then takes the f32 matmul path and the two oracles agree at ~1e-8..2e-7 (ggml's GELU table; README);
# otherwise 3e-2 (llama.cpp's 8-bit matmul input rounding).
F32_FILE_LIMIT = 1e-5

# --measure on a 2- or 3-bit variant of a downloaded model: check_against_llamacpp's limit (see main)
LOW_BIT_TYPES = ("Q2_K", "Q3_K")
LOW_BIT_MEASURE_LIMIT = 0.3

F16_MAX_ONE_MINUS_COS = 1e-6
F16_MAX_REL_RMS = 1e-3

CPU_FLAGS = (
    "sse3", "ssse3", "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "bmi2",
    "avx_vnni", "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512_vnni",
    "avx512_bf16", "avx512vbmi", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16",
)


def host_info() -> dict:
    """The host CPU (as the llama.cpp oracle records it: ggml mode takes its target from host_cpu_flags)."""
    model, flags = None, set()
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and model is None:
                model = value.strip()
            elif key == "flags" and not flags:
                flags = set(value.split())
    if "pni" in flags:
        flags.add("sse3")
    return {
        "host_cpu": model or platform.processor() or None,
        "host_cpu_flags": [f for f in CPU_FLAGS if f in flags],
        "host_cpu_flags_absent": [f for f in CPU_FLAGS if f not in flags],
        "host_machine": platform.machine(),
        "host_logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_parallel_info_cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Byte-for-byte reproducible npz (fixed zip timestamps and order), as oracles/llamacpp/make_goldens.py."""
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
        return np.where((na == 0) & (nb == 0), 1.0, dot / (na * nb))


def row_nmse(a: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """NMSE per row, sum (a - ref)^2 / sum ref^2 (llama.cpp test-backend-ops' definition; ref = reference)."""
    a = a.astype(np.float64)
    ref = ref.astype(np.float64)
    num = np.sum((a - ref) ** 2, axis=-1)
    den = np.sum(ref**2, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den == 0, np.where(num == 0, 0.0, np.inf), num / den)


def store(x: np.ndarray, allow_f16: bool) -> tuple[np.ndarray, dict]:
    """llama.cpp oracle's storage rule (oracles/llamacpp/make_goldens.py `store`)."""
    x = np.asarray(x)
    if x.dtype.kind == "i":
        return x.astype(np.int32), {"dtype": "i32", "storage_max_abs_err": 0.0, "storage_max_rel_err": 0.0, "storage_min_cosine": 1.0}
    x32 = x.astype(np.float32)
    exact = {"dtype": "f32", "storage_max_abs_err": 0.0, "storage_max_rel_err": 0.0, "storage_min_cosine": 1.0}
    if not allow_f16:
        return x32, exact
    with np.errstate(over="ignore"):
        x16 = x32.astype(np.float16)
    if not np.all(np.isfinite(x16)):
        return x32, exact
    back = x16.astype(np.float32)
    d = back.astype(np.float64) - x32.astype(np.float64)
    max_abs = float(np.max(np.abs(d))) if d.size else 0.0
    rms = float(np.sqrt(np.mean(x32.astype(np.float64) ** 2))) if x32.size else 0.0
    rows32 = x32.reshape(x32.shape[0], -1)
    rowsd = d.reshape(d.shape[0], -1)
    with np.errstate(invalid="ignore", divide="ignore"):
        rel_rms = np.nan_to_num(np.linalg.norm(rowsd, axis=1) / np.linalg.norm(rows32.astype(np.float64), axis=1), nan=0.0)
    min_cos = float(np.min(row_cosines(back.reshape(rows32.shape), rows32)))
    if 1.0 - min_cos <= F16_MAX_ONE_MINUS_COS and float(np.max(rel_rms)) <= F16_MAX_REL_RMS:
        return x16, {"dtype": "f16", "storage_max_abs_err": max_abs, "storage_max_rel_err": max_abs / rms if rms > 0 else 0.0,
                     "storage_min_cosine": min_cos}
    return x32, exact


def expand(patterns, n_layer: int, all_ids: list[str]) -> list[str]:
    if "*" in patterns:
        return list(all_ids)
    wanted = set()
    for p in patterns:
        if p.endswith(".*"):
            wanted.update(c for c in all_ids if c.startswith(p[:-1]))
        elif "{last}" in p:
            wanted.add(p.replace("{last}", str(n_layer - 1)))
        elif "{N}" in p:
            wanted.update(p.replace("{N}", str(n)) for n in range(n_layer))
        else:
            wanted.add(p)
    return [c for c in all_ids if c in wanted]


def softmax64(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=-1, keepdims=True)


def kl(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    p, q = softmax64(p_logits), softmax64(q_logits)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(p > 0, p * (np.log(p) - np.log(q)), 0.0)
    return t.sum(axis=-1)


def sig3(x: float, direction: str = "near") -> float:
    """x to 3 significant digits: "up" (an error bound stays a bound), or to the nearest."""
    if x == 0 or not np.isfinite(x):
        return float(x)
    t = f"{x:.2e}"
    if direction == "up" and float(t) < x:
        mant, exp = t.split("e")
        t = f"{float(mant) + (0.01 if x > 0 else -0.01):.2f}e{exp}"
    return float(t)


def compact_entry(entry: dict) -> None:
    """SYNTH_POLICY_COMPACT's manifest entry (in place): the floor restricted to the stage kinds the golden stores
    (and the logits), its numbers and the storage errors to 3 significant digits (maxima and error bounds rounded
    up), vs_llamacpp_f32kv_max_nmse likewise. Array specs keep their shape, dtype and storage_min_cosine as they are."""
    for spec in entry["arrays"].values():
        for k in ("storage_max_abs_err", "storage_max_rel_err"):
            spec[k] = sig3(spec[k], "up")
    if "vs_llamacpp_f32kv_max_nmse" in entry:
        entry["vs_llamacpp_f32kv_max_nmse"] = {k: sig3(v, "up") for k, v in entry["vs_llamacpp_f32kv_max_nmse"].items()}
    floor = entry.get("floor_f32_vs_f64")
    if floor is None:
        return
    kinds = {kind_of(n.removeprefix("decode.")) for n in entry["arrays"] if not n.startswith(("logits", "tokens", "decode.tokens"))}
    kinds.discard("decode.logits")
    kinds.add("logits")
    floor["about"] = ("transformers float32 vs float64 on this golden's token ids, NMSE per row (reference float64) of "
                      "the stage kinds this golden stores, KL(P64 || P32) per logits row; oracles/transformers/README.md "
                      "'The float32-vs-float64 floor'")
    floor["nmse"] = {k: {"median": sig3(v["median"]), "p99": sig3(v["p99"], "up"), "max": sig3(v["max"], "up"), "rows": v["rows"]}
                     for k, v in floor["nmse"].items() if k in kinds}
    floor["kl"] = {"median": sig3(floor["kl"]["median"]), "max": sig3(floor["kl"]["max"], "up"), "rows": floor["kl"]["rows"]}


def kind_of(cid: str) -> str:
    parts = cid.split(".")
    return ".".join(parts[2:]) if parts[0] == "blk" else cid


def dump_manifest(manifest: dict) -> str:
    """golden/manifest.json's text layout: oracles/manifest_format.py (shared by both oracles)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import manifest_format  # noqa: E402

    return manifest_format.dump_manifest(manifest)


def stage_map_json(arch) -> dict:
    """The manifest's stage_map.transformers.<arch>: the rows of the stage map file (tf_capture.read_stage_map)."""
    smap = C.stage_map(arch)
    rows = []
    for s in smap.stages:
        path = s.oracle_name
        if s.hook == "columns":
            path = f"{path} output, {C.COLUMNS[s.columns][1]}"
        rows.append({"oracle_name": path, "op": C.HOOKS[s.hook], "canonical": s.id})
    about = (
        "transformers module (path in the model, {N} = layer) -> canonical stage id. op: forward_hook = the "
        "module's output, forward_pre_hook = its input, attention_function = the registered attention function "
        "lockstep_eager (Q and K after RoPE; K: this step's rows only). Shapes [T, width], the batch dimension "
        "dropped; per-head tensors flattened head-major. llama only: q, k, q_rope, k_rope are reordered from "
        "transformers' RoPE-halves layout to the GGUF file's interleaved layout (llama.cpp's), so that every "
        "array means what the llama.cpp golden's does. oracles/transformers/README.md."
    )
    if smap.about:
        about += " " + smap.about
    return {
        "about": about,
        "stages": rows,
        "not_exposed": [],
        # no graph to list (llama.cpp's maps hold its graph's nodes here); empty, as the llama.cpp oracle's
        # manifest writer leaves every stage map it rewrites, ours included
        "observed_nodes": [],
    }


def load_source_goldens(golden: Path, model_id: str) -> tuple[dict, list[dict]]:
    manifest = json.loads((golden / "manifest.json").read_text())
    src = [g for g in manifest["goldens"] if g["model_id"] == model_id and g["path"].split("/")[1] == SOURCE_DIR]
    if not src:
        raise SystemExit(f"no {SOURCE_DIR} goldens for {model_id} in {golden}/manifest.json: make them first")
    return manifest, src


# --- known traps: each fails loudly (README "Known traps") ------------------------------------------------


def gguf_fields(path: Path) -> dict:
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    out = {}
    for k, f in r.fields.items():
        if k.startswith("tokenizer.ggml."):
            continue
        try:
            v = f.contents()
        except Exception:  # noqa: BLE001
            continue
        out[k] = v
    return out, r


def check_traps(model, arch: str, gguf_path: Path, golden: Path, src_entries: list[dict]) -> dict:
    """Assert the loader got every known trap right; returns what was checked (recorded in the manifest)."""
    if arch in NEW_ARCHS:
        return check_new_arch(model, arch, gguf_path, src_entries)
    cfg = model.config
    fields, reader = gguf_fields(gguf_path)
    a = fields["general.architecture"]
    checks = {}
    tensors = {t.name: t for t in reader.tensors}

    # tied embeddings: no output.weight in the file <=> lm_head shares embed_tokens' storage
    tied_file = "output.weight" not in tensors
    tied_model = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    if tied_file != tied_model or bool(cfg.tie_word_embeddings) != tied_file:
        raise SystemExit(f"tied embeddings: file {tied_file}, config {cfg.tie_word_embeddings}, model {tied_model}")
    checks["tied_embeddings"] = f"{tied_file} (file has {'no ' if tied_file else ''}output.weight; lm_head shares embed_tokens: {tied_model})"

    from gguf import dequantize

    def deq(name):
        t = tensors[name]
        return np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(list(reversed([int(x) for x in t.shape])))

    # llama's Q/K permutation: transformers un-permutes; our reorder must give back the file's rows exactly
    wq = model.model.layers[0].self_attn.q_proj.weight.detach().numpy()
    wk = model.model.layers[0].self_attn.k_proj.weight.detach().numpy()
    fq, fk = deq("blk.0.attn_q.weight"), deq("blk.0.attn_k.weight")
    if arch == "llama":
        gq = C.llama_gguf_order(torch.from_numpy(wq.T.copy()), cfg.num_attention_heads).numpy().T
        gk = C.llama_gguf_order(torch.from_numpy(wk.T.copy()), cfg.num_key_value_heads).numpy().T
        if not (np.array_equal(gq, fq) and np.array_equal(gk, fk)):
            raise SystemExit("llama Q/K permutation: transformers' q_proj/k_proj reordered to GGUF order differ from the file")
        if np.array_equal(wq, fq):
            raise SystemExit("llama Q/K permutation: transformers did not un-permute q_proj (equals the file's rows)")
        checks["llama_qk_permutation"] = "q_proj/k_proj of layer 0 reordered to GGUF order equal attn_q/attn_k exactly; unreordered they differ"
    else:
        if not (np.array_equal(wq, fq) and np.array_equal(wk, fk)):
            raise SystemExit(f"{arch}: q_proj/k_proj differ from the file's attn_q/attn_k (no permutation expected)")
        checks["qk_layout"] = "q_proj/k_proj equal the file's attn_q/attn_k (NEOX RoPE, no permutation)"

    if arch in ("gemma2", "gemma3"):
        # norm weights: the file stores w + 1 (convert_hf_to_gguf), the loader subtracts 1 (Gemma2TensorProcessor,
        # used for gemma2 and gemma3), Gemma2RMSNorm / Gemma3RMSNorm add 1 back in float32: (w_file - 1) + 1 must
        # be w_file again, bit for bit, for every norm weight (llama.cpp multiplies by w_file as stored)
        bad, total = 0, 0
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight"):
                continue
            gname = hf_to_gguf_norm(name)
            f = deq(gname).reshape(-1)
            back = (1.0 + p.detach().to(torch.float32)).numpy().reshape(-1)
            total += f.size
            bad += int(np.sum(back != f))
            if not np.allclose(back, f, rtol=0, atol=1e-6):
                raise SystemExit(f"gemma norm weight {name}: 1 + loaded != file {gname} (max {np.max(np.abs(back - f))})")
        if bad:
            raise SystemExit(f"gemma norm weights: {bad} of {total} values of 1 + (w_file - 1) differ from w_file in float32")
        checks["gemma_norm_plus_one"] = f"1 + (w_file - 1) == w_file bit for bit for all {total} norm weights (float32)"
    if arch == "gemma2":
        check_gemma2(model, fields, tensors, deq, src_entries, checks)
    if arch == "gemma4":
        check_gemma4(model, gguf_path, tensors, deq, src_entries, checks)
    if arch == "gemma3":
        # query_pre_attn_scalar: llama.cpp scales Q by 1/sqrt(head_dim) (gemma3 270m); transformers by
        # query_pre_attn_scalar**-0.5
        hd = int(fields[f"{a}.attention.key_length"])
        if cfg.query_pre_attn_scalar != hd or cfg.head_dim != hd:
            raise SystemExit(f"gemma3 query_pre_attn_scalar {cfg.query_pre_attn_scalar} / head_dim {cfg.head_dim} != key_length {hd}")
        for layer in model.model.layers:
            assert abs(layer.self_attn.scaling - hd**-0.5) == 0.0, layer.self_attn.scaling
        checks["gemma3_query_pre_attn_scalar"] = (
            f"{cfg.query_pre_attn_scalar} == head_dim {hd}: Q scaled by 1/sqrt({hd}), as llama.cpp (tf_capture.load "
            "sets it from head_dim if the loader's default differs; for 270m it does not)"
        )
        # embedding scale sqrt(d), in float32 as transformers applies it
        es = float(model.model.embed_tokens.embed_scale.to(torch.float32))
        if es != float(np.float32(np.sqrt(cfg.hidden_size))):
            raise SystemExit(f"gemma embed scale {es} != float32 sqrt({cfg.hidden_size})")
        checks["gemma_embed_scale"] = f"embed_tokens output x {es} (float32 sqrt({cfg.hidden_size}))"
        # sliding window and the two RoPE bases
        sw = int(fields[f"{a}.attention.sliding_window"])
        if cfg.sliding_window != sw:
            raise SystemExit(f"gemma3 sliding_window {cfg.sliding_window} != file {sw}")
        full = [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"]
        want_full = [i for i in range(cfg.num_hidden_layers) if i % 6 == 5]  # llama.cpp: swa pattern 6, last of each 6 global
        if full != want_full:
            raise SystemExit(f"gemma3 full-attention layers {full} != llama.cpp's {want_full}")
        base = float(fields[f"{a}.rope.freq_base"])
        rp = cfg.rope_parameters
        if rp["full_attention"]["rope_theta"] != base or rp["sliding_attention"]["rope_theta"] != 10000.0:
            raise SystemExit(f"gemma3 RoPE bases {rp} != full {base} / local 10000 (llama.cpp)")
        if any(rp[t]["rope_type"] != "default" for t in rp) or f"{a}.rope.scaling.type" in fields:
            raise SystemExit(f"gemma3 RoPE scaling: {rp}")
        longest = max(g["n_prompt_tokens"] + g["n_decode_steps"] for g in src_entries)
        sliding = [i for i in range(cfg.num_hidden_layers) if i not in full]
        for i in sliding:
            if model.model.layers[i].self_attn.sliding_window != sw:
                raise SystemExit(f"gemma3 layer {i}: attention sliding_window {model.model.layers[i].self_attn.sliding_window} != file {sw}")
        if longest <= sw:
            checks["gemma3_sliding_window"] = (
                f"window {sw} (file) for layers {sliding}, global layers {full}; "
                f"RoPE base {base} global, 10000 local, no scaling; the longest sequence here is {longest} <= {sw} positions, "
                "so the window never masks anything in these goldens"
            )
        else:
            # a seeded gemma3 (window 4, 2 layers): the window masks; main() checks the prefill masks themselves
            checks["gemma3_sliding_window"] = (
                f"window {sw} (file) for layers {sliding}, global layers {full} (llama.cpp's SWA pattern, "
                f"tf_capture.llamacpp_gemma3_layer_types); RoPE base {base} global, 10000 local, no scaling; the longest "
                f"sequence here is {longest} > {sw} positions, so the window masks: query p sees keys p-{sw - 1}..p, as "
                "llama.cpp (LLAMA_SWA_TYPE_STANDARD masks p1 - p0 >= n_swa); the prefill masks of every layer are checked "
                "against that rule (attention_masks)"
            )
        if cfg.final_logit_softcapping is not None or cfg.attn_logit_softcapping is not None:
            raise SystemExit(f"gemma3 softcapping set: {cfg.final_logit_softcapping} / {cfg.attn_logit_softcapping}")
    if arch == "qwen3":
        # head_dim: the loader ignores qwen3.attention.key_length (tf_capture.load sets it; a wrong head_dim
        # would not even load, but check the value llama.cpp uses)
        hd = int(fields[f"{a}.attention.key_length"])
        if cfg.head_dim != hd or model.model.layers[0].self_attn.head_dim != hd:
            raise SystemExit(f"qwen3 head_dim {cfg.head_dim} != the file's key_length {hd}")
        for layer in model.model.layers:
            assert layer.self_attn.scaling == hd**-0.5, layer.self_attn.scaling
        # no Q/K/V bias (qwen2 has them), no sliding window
        at = model.model.layers[0].self_attn
        if any(getattr(at, n).bias is not None for n in ("q_proj", "k_proj", "v_proj", "o_proj")) or any(
            n.endswith(".bias") for n in tensors
        ):
            raise SystemExit("qwen3: a bias in the model or the file")
        if any(t != "full_attention" for t in cfg.layer_types) or cfg.use_sliding_window:
            raise SystemExit(f"qwen3: sliding window set ({cfg.layer_types}, {cfg.use_sliding_window}); llama.cpp has none")
        # q_norm/k_norm (and every other norm) weights are the file's, no offset (Qwen3RMSNorm: weight * x)
        total = 0
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                gname = hf_to_gguf_norm(name, llama_like=True)
                f = deq(gname).reshape(-1)
                if not np.array_equal(p.detach().numpy().reshape(-1), f):
                    raise SystemExit(f"qwen3 norm weight {name} != the file's {gname}")
                total += f.size
        checks["qwen3_head_dim_and_qk_norm"] = (
            f"head_dim {hd} == the file's key_length (" + ("; ".join(getattr(model, "lockstep_load_notes", [])) or "as loaded")
            + f"), Q scaled by 1/sqrt({hd}); q_norm/k_norm weight [{hd}] per head and every norm weight equal the file's "
            f"({total} values, no offset); no bias; no sliding window"
        )
    eps = float(fields[f"{a}.attention.layer_norm_rms_epsilon"])
    if abs(cfg.rms_norm_eps - eps) > 0:
        raise SystemExit(f"rms_norm_eps {cfg.rms_norm_eps} != file {eps}")
    if arch not in ("gemma3", "gemma4"):  # gemma4: per layer type, check_gemma4
        base = float(fields[f"{a}.rope.freq_base"])
        if cfg.rope_parameters["rope_theta"] != base or cfg.rope_parameters["rope_type"] != "default":
            raise SystemExit(f"rope {cfg.rope_parameters} != file base {base}")
    checks["rms_norm_eps_and_rope"] = "rms_norm_eps and rope theta equal the file's"
    return checks


# --- phi3, starcoder2, stablelm, gpt2 (issue 25's seeded models) --------------------------------------------------
NEW_ARCHS = ("phi3", "starcoder2", "stablelm", "gpt2")

# transformers parameter name (layer N as {N}) -> (GGUF tensor, transposed). Every parameter of the model and every
# tensor of the file must be matched (check_new_arch). "T": the loader transposes the file's matrix
# (GPT2TensorProcessor: HF GPT-2's Conv1D keeps weights as [in, out]; llama.cpp's converter transposed them).
_LLAMA_LIKE_W = {
    "model.layers.{N}.input_layernorm.weight": ("blk.{N}.attn_norm.weight", False),
    "model.layers.{N}.input_layernorm.bias": ("blk.{N}.attn_norm.bias", False),
    "model.layers.{N}.post_attention_layernorm.weight": ("blk.{N}.ffn_norm.weight", False),
    "model.layers.{N}.post_attention_layernorm.bias": ("blk.{N}.ffn_norm.bias", False),
    "model.layers.{N}.self_attn.q_proj.weight": ("blk.{N}.attn_q.weight", False),
    "model.layers.{N}.self_attn.q_proj.bias": ("blk.{N}.attn_q.bias", False),
    "model.layers.{N}.self_attn.k_proj.weight": ("blk.{N}.attn_k.weight", False),
    "model.layers.{N}.self_attn.k_proj.bias": ("blk.{N}.attn_k.bias", False),
    "model.layers.{N}.self_attn.v_proj.weight": ("blk.{N}.attn_v.weight", False),
    "model.layers.{N}.self_attn.v_proj.bias": ("blk.{N}.attn_v.bias", False),
    "model.layers.{N}.self_attn.o_proj.weight": ("blk.{N}.attn_output.weight", False),
    "model.layers.{N}.self_attn.o_proj.bias": ("blk.{N}.attn_output.bias", False),
    "model.embed_tokens.weight": ("token_embd.weight", False),
    "model.norm.weight": ("output_norm.weight", False),
    "model.norm.bias": ("output_norm.bias", False),
    "lm_head.weight": ("output.weight", False),
}
NEW_ARCH_WEIGHTS = {
    "phi3": {**_LLAMA_LIKE_W,
             "model.layers.{N}.self_attn.qkv_proj.weight": ("blk.{N}.attn_qkv.weight", False),
             "model.layers.{N}.mlp.gate_up_proj.weight": ("blk.{N}.ffn_up.weight", False),
             "model.layers.{N}.mlp.down_proj.weight": ("blk.{N}.ffn_down.weight", False)},
    "starcoder2": {**_LLAMA_LIKE_W,
                   "model.layers.{N}.mlp.c_fc.weight": ("blk.{N}.ffn_up.weight", False),
                   "model.layers.{N}.mlp.c_fc.bias": ("blk.{N}.ffn_up.bias", False),
                   "model.layers.{N}.mlp.c_proj.weight": ("blk.{N}.ffn_down.weight", False),
                   "model.layers.{N}.mlp.c_proj.bias": ("blk.{N}.ffn_down.bias", False)},
    "stablelm": {**_LLAMA_LIKE_W,
                 "model.layers.{N}.mlp.gate_proj.weight": ("blk.{N}.ffn_gate.weight", False),
                 "model.layers.{N}.mlp.up_proj.weight": ("blk.{N}.ffn_up.weight", False),
                 "model.layers.{N}.mlp.down_proj.weight": ("blk.{N}.ffn_down.weight", False)},
    "gpt2": {
        "transformer.wte.weight": ("token_embd.weight", False),
        "transformer.wpe.weight": ("position_embd.weight", False),
        "transformer.h.{N}.ln_1.weight": ("blk.{N}.attn_norm.weight", False),
        "transformer.h.{N}.ln_1.bias": ("blk.{N}.attn_norm.bias", False),
        "transformer.h.{N}.attn.c_attn.weight": ("blk.{N}.attn_qkv.weight", True),
        "transformer.h.{N}.attn.c_attn.bias": ("blk.{N}.attn_qkv.bias", False),
        "transformer.h.{N}.attn.c_proj.weight": ("blk.{N}.attn_output.weight", True),
        "transformer.h.{N}.attn.c_proj.bias": ("blk.{N}.attn_output.bias", False),
        "transformer.h.{N}.ln_2.weight": ("blk.{N}.ffn_norm.weight", False),
        "transformer.h.{N}.ln_2.bias": ("blk.{N}.ffn_norm.bias", False),
        "transformer.h.{N}.mlp.c_fc.weight": ("blk.{N}.ffn_up.weight", True),
        "transformer.h.{N}.mlp.c_fc.bias": ("blk.{N}.ffn_up.bias", False),
        "transformer.h.{N}.mlp.c_proj.weight": ("blk.{N}.ffn_down.weight", True),
        "transformer.h.{N}.mlp.c_proj.bias": ("blk.{N}.ffn_down.bias", False),
        "transformer.ln_f.weight": ("output_norm.weight", False),
        "transformer.ln_f.bias": ("output_norm.bias", False),
        "lm_head.weight": ("output.weight", False),
    },
}


def check_new_arch(model, arch: str, gguf_path: Path, src_entries: list[dict]) -> dict:
    """The traps of phi3, starcoder2, stablelm and gpt2 (README "Known traps"), each failing loudly; returns what was
    checked (the manifest's `loader_checks`). Bit-for-bit weights: a fused tensor split the wrong way, a Conv1D
    weight left untransposed or a swapped gate/up would otherwise pass as "a different model"."""
    import re

    from gguf import dequantize

    cfg = model.config
    fields, reader = gguf_fields(gguf_path)
    a = fields["general.architecture"]
    tensors = {t.name: t for t in reader.tensors}
    checks = {}

    def deq(name):
        t = tensors[name]
        return np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(list(reversed([int(x) for x in t.shape])))

    # every parameter = the file's tensor, dequantized, bit for bit; every file tensor used
    table = NEW_ARCH_WEIGHTS[arch]
    used, n_values = set(), 0
    tied = "output.weight" not in tensors
    emb = model.get_input_embeddings()
    if tied != (model.lm_head.weight.data_ptr() == emb.weight.data_ptr()) or bool(cfg.tie_word_embeddings) != tied:
        raise SystemExit(f"{arch} tied embeddings: file {tied}, config {cfg.tie_word_embeddings}, model "
                         f"{model.lm_head.weight.data_ptr() == emb.weight.data_ptr()}")
    checks["tied_embeddings"] = f"{tied} (file has {'no ' if tied else ''}output.weight; lm_head shares the token embedding: {tied})"
    for name, p in model.named_parameters():
        key = re.sub(r"\.(\d+)\.", ".{N}.", name, count=1)
        if key not in table:
            raise SystemExit(f"{arch}: parameter {name} has no GGUF counterpart in NEW_ARCH_WEIGHTS")
        gname, transposed = table[key]
        m = re.search(r"\.(\d+)\.", name)
        gname = gname.replace("{N}", m.group(1)) if m else gname
        if gname not in tensors:
            raise SystemExit(f"{arch}: parameter {name}: the file has no {gname}")
        f = deq(gname)
        w = p.detach().numpy()
        w = w.T if transposed else w
        if w.shape != f.shape or not np.array_equal(w, f):
            raise SystemExit(f"{arch}: parameter {name} != the file's {gname}{' transposed' if transposed else ''} "
                             f"(shapes {w.shape} / {f.shape})")
        used.add(gname)
        n_values += f.size
    if tied:
        used.add("token_embd.weight")  # lm_head: the same storage (checked above)
    if used != set(tensors):
        raise SystemExit(f"{arch}: file tensors not used by the model: {sorted(set(tensors) - used)}")
    checks["weights_bit_exact"] = (
        f"all {len(used)} tensors of the file = the model's parameters, dequantized, bit for bit ({n_values} values; "
        + ("Conv1D weights compared transposed, as GPT2TensorProcessor loads them; " if arch == "gpt2" else "")
        + ("fused attn_qkv = qkv_proj and ffn_up = gate_up_proj [gate | up] as stored; " if arch == "phi3" else "")
        + "no tensor unused, no parameter without a tensor)"
    )
    # norms: kind and epsilon
    eps_key = f"{a}.attention.layer_norm_rms_epsilon" if arch == "phi3" else f"{a}.attention.layer_norm_epsilon"
    eps = float(fields[eps_key])
    norms = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.LayerNorm) or n.endswith(("layernorm", "norm"))]
    for n, m in norms:
        if arch == "phi3":
            got = m.variance_epsilon
        else:
            if not isinstance(m, torch.nn.LayerNorm) or m.bias is None or not m.elementwise_affine:
                raise SystemExit(f"{arch}: {n} is not a LayerNorm with weight and bias ({type(m).__name__})")
            got = m.eps
        if got != eps:
            raise SystemExit(f"{arch}: {n} epsilon {got} != the file's {eps_key} {eps}")
    checks["norms"] = (f"{len(norms)} {'RMSNorms' if arch == 'phi3' else 'LayerNorms with weight and bias (nn.LayerNorm)'}, "
                       f"epsilon {eps} = the file's {eps_key.split('.', 1)[1]}")
    # attention: scale 1/sqrt(head_dim) (phi3: llama.cpp scales Q after RoPE, transformers the scores: the same
    # factor), no soft-capping, no window (phi3: the file's sliding_window is ignored by llama.cpp; check_masks
    # checks the masks transformers built are causal only)
    layers = model.base_model.h if arch == "gpt2" else model.base_model.layers
    n_q = cfg.num_attention_heads
    hd = cfg.hidden_size // n_q
    for il, layer in enumerate(layers):
        att = layer.attn if arch == "gpt2" else layer.self_attn
        if att.scaling != hd**-0.5:
            raise SystemExit(f"{arch} layer {il}: attention scaling {att.scaling} != {hd}**-0.5")
    if getattr(cfg, "sliding_window", None) is not None:
        raise SystemExit(f"{arch}: sliding_window {cfg.sliding_window} set; llama.cpp's {arch} has none")
    sw = fields.get(f"{a}.attention.sliding_window")
    checks["attention"] = (
        f"scaling 1/sqrt({hd}) on every layer; no soft-capping; no sliding window"
        + (f" (the file's {a}.attention.sliding_window {sw} is ignored, as llama.cpp's phi3 does: 'Phi SWA is "
           "currently disabled'; the prefill masks are checked causal-only: attention_masks)" if sw is not None else "")
    )
    if arch == "gpt2":
        if cfg.scale_attn_by_inverse_layer_idx or cfg.reorder_and_upcast_attn or not cfg.scale_attn_weights:
            raise SystemExit(f"gpt2 attention options: scale_attn_weights {cfg.scale_attn_weights}, by layer "
                             f"{cfg.scale_attn_by_inverse_layer_idx}, reorder_and_upcast {cfg.reorder_and_upcast_attn}")
        n_pos = int(fields[f"{a}.context_length"])
        if model.transformer.wpe.weight.shape[0] != n_pos or cfg.n_positions != n_pos:
            raise SystemExit(f"gpt2 wpe rows {model.transformer.wpe.weight.shape[0]} != the file's context_length {n_pos}")
        checks["gpt2_positions"] = (
            f"learned absolute positions: wpe [{n_pos}, {cfg.hidden_size}] = the file's position_embd; embed = wte(tokens) "
            "+ wpe(position), decode steps at positions T, T+1, ... (transformers: past_key_values.get_seq_length(); "
            "checked against llama.cpp's inpL at every decode step when its golden holds decode.embed); no RoPE"
        )
    else:
        rp = cfg.rope_parameters
        base = float(fields[f"{a}.rope.freq_base"])
        n_rot = int(fields.get(f"{a}.rope.dimension_count", hd))
        rot = model.base_model.rotary_emb
        if rp["rope_theta"] != base or rp["rope_type"] != "default" or f"{a}.rope.scaling.type" in fields:
            raise SystemExit(f"{arch} RoPE {rp} != the file's base {base}, no scaling")
        if any(t.startswith("rope_factors") for t in tensors):
            raise SystemExit(f"{arch}: LongRoPE factor tensors: not supported here")
        if 2 * rot.inv_freq.shape[0] != n_rot:
            raise SystemExit(f"{arch}: RoPE over {2 * rot.inv_freq.shape[0]} dims != the file's rope.dimension_count {n_rot}")
        if arch == "stablelm" and any(l.self_attn.rotary_ndims != n_rot for l in layers):
            raise SystemExit(f"stablelm rotary_ndims {[l.self_attn.rotary_ndims for l in layers]} != {n_rot}")
        checks["rope"] = (f"NeoX RoPE (rotate_half) base {base} = the file's, no scaling, over the first {n_rot} of {hd} "
                          f"dims of each head (the file's rope.dimension_count" + (": partial rotary" if n_rot != hd else "") + ")")
    # the FFN and its activation (llama.cpp: phi3 and stablelm SwiGLU; starcoder2 and gpt2 GELU, tanh-approximated)
    x = torch.linspace(-8, 8, 4097, dtype=torch.float32)
    if arch in ("phi3", "stablelm"):
        act = layers[0].mlp.activation_fn if arch == "phi3" else layers[0].mlp.act_fn
        if cfg.hidden_act != "silu" or not torch.equal(act(x), torch.nn.functional.silu(x)):
            raise SystemExit(f"{arch} activation {cfg.hidden_act} is not SiLU")
        checks["ffn"] = "SwiGLU: silu(gate) * up (down_proj's input), as llama.cpp's ffn_swiglu"
    else:
        act = layers[0].mlp.act
        d = float(torch.max(torch.abs(act(x) - torch.nn.functional.gelu(x, approximate="tanh"))))
        if d > 1e-6:
            raise SystemExit(f"{arch} activation {type(act).__name__} is not the tanh-approximated GELU (max diff {d})")
        checks["ffn"] = (f"non-gated GELU FFN with biases: {type(act).__name__} = the tanh-approximated GELU (max |diff| "
                         f"vs torch gelu(approximate='tanh') {d:.1e} on [-8, 8]), as llama.cpp's ggml_gelu")
    if arch == "stablelm":
        want_par = f"blk.0.ffn_norm.weight" not in tensors
        want_bias = "blk.0.attn_q.bias" in tensors
        want_qkn = "blk.0.attn_q_norm.weight" in tensors
        if cfg.use_parallel_residual != want_par or cfg.use_qkv_bias != want_bias or cfg.qk_layernorm != want_qkn:
            raise SystemExit(f"stablelm parallel residual {cfg.use_parallel_residual} / qkv bias {cfg.use_qkv_bias} / qk "
                             f"layernorm {cfg.qk_layernorm} != the file's {want_par} / {want_bias} / {want_qkn}")
        checks["stablelm_block"] = (f"sequential residual (the file has ffn_norm), Q/K/V biases {want_bias}, no per-head "
                                    "Q/K LayerNorm: as llama.cpp's stablelm.cpp builds this file")
    return checks


def check_fused_views(arch: str, model, res: C.RunResult, where: str) -> str:
    """The stages read as columns of a fused output (phi3 q/k/v and ffn_gate/ffn_up, gpt2 q/k/v), and phi3's ffn_inp,
    which llama.cpp's golden cannot hold, checked bit for bit against what transformers computed from them:
    - Q and K: at position 0 RoPE is the identity (cos 1, sin 0), so q_rope[0] == q[0] and k_rope[0] == k[0]
      (phi3); without RoPE (gpt2) attention receives q and k themselves, at every position;
    - V: prefill position 0 attends to itself alone (softmax of one score = 1), so attn_out[0] == v[0], each
      query head taking its K/V group's head;
    - gate/up (phi3): ffn_act == up * silu(gate), recomputed in transformers' order;
    - ffn_inp (phi3): == embed / blk.(N-1).out + attn_proj at every position (the residual add)."""
    cfg = model.config
    n_layer = cfg.num_hidden_layers
    n_q = cfg.num_attention_heads
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_q
    hd = cfg.hidden_size // n_q
    st = res.stages
    done = []
    for il in range(n_layer):
        q, k, v = st[f"blk.{il}.q"], st[f"blk.{il}.k"], st[f"blk.{il}.v"]
        if arch == "gpt2":
            aq, ak = res.attn_in[0][il]
            if not (np.array_equal(q, aq) and np.array_equal(k, ak)):
                raise SystemExit(f"{where}: blk.{il}.q/k (c_attn columns) != the Q/K attention received")
        else:
            if not (np.array_equal(st[f"blk.{il}.q_rope"][0], q[0]) and np.array_equal(st[f"blk.{il}.k_rope"][0], k[0])):
                raise SystemExit(f"{where}: blk.{il}.q/k (qkv_proj columns) at position 0 != q_rope/k_rope there")
        att0 = st[f"blk.{il}.attn_out"][0].reshape(n_q, hd)
        v0 = v[0].reshape(n_kv, hd)[np.arange(n_q) // (n_q // n_kv)]
        if not np.array_equal(att0, v0):
            raise SystemExit(f"{where}: blk.{il}.v (fused columns) at position 0 != attn_out there")
        if arch == "phi3":
            g = torch.from_numpy(st[f"blk.{il}.ffn_gate"])
            u = torch.from_numpy(st[f"blk.{il}.ffn_up"])
            if not np.array_equal((u * torch.nn.functional.silu(g)).numpy(), st[f"blk.{il}.ffn_act"]):
                raise SystemExit(f"{where}: blk.{il}.ffn_act != up * silu(gate) of the captured gate_up_proj halves")
            prev = st["embed"] if il == 0 else st[f"blk.{il - 1}.out"]
            if not np.array_equal((torch.from_numpy(prev) + torch.from_numpy(st[f"blk.{il}.attn_proj"])).numpy(), st[f"blk.{il}.ffn_inp"]):
                raise SystemExit(f"{where}: blk.{il}.ffn_inp != the layer input + attn_proj")
    if arch == "gpt2":
        done.append("q/k (c_attn columns) == the Q/K attention received, every position and layer")
    else:
        done.append("q/k (qkv_proj columns) == q_rope/k_rope at position 0 (RoPE the identity there)")
    done.append("v == attn_out at prefill position 0 (one key: softmax weight 1) in every layer")
    if arch == "phi3":
        done.append("ffn_act == up * silu(gate) of the gate_up_proj halves; ffn_inp == layer input + attn_proj; bit for bit")
    return "; ".join(done)


def check_gemma2(model, fields: dict, tensors: dict, deq, src_entries: list[dict], checks: dict) -> None:
    """Gemma 2 as llama.cpp 0c1e570 runs it (src/models/gemma2.cpp): the Q scale, the two soft-cappings, the
    embedding scale and weights, the SWA layers and window, one RoPE base, GeGLU with tanh GELU. Adds to checks."""
    cfg = model.config
    a = fields["general.architecture"]
    layers = model.model.layers
    n_layer = cfg.num_hidden_layers
    notes = "; ".join(getattr(model, "lockstep_load_notes", []))
    # Q scale: llama.cpp f_attention_scale = 1/sqrt(n_embd_head_k) (the file's key_length), or 1/sqrt(n_embd/n_head)
    # for the 46-layer 27B; transformers scales by query_pre_attn_scalar**-0.5 (not in the GGUF: tf_capture.load)
    hd = int(fields[f"{a}.attention.key_length"])
    qpas = cfg.hidden_size // cfg.num_attention_heads if n_layer == 46 else hd
    if cfg.head_dim != hd or cfg.query_pre_attn_scalar != qpas:
        raise SystemExit(f"gemma2 head_dim {cfg.head_dim} / query_pre_attn_scalar {cfg.query_pre_attn_scalar} != llama.cpp's {hd} / {qpas}")
    for layer in layers:
        if layer.self_attn.scaling != qpas**-0.5:
            raise SystemExit(f"gemma2 layer {layer.self_attn.layer_idx}: scaling {layer.self_attn.scaling} != {qpas}**-0.5")
    checks["gemma2_query_pre_attn_scalar"] = (
        f"{cfg.query_pre_attn_scalar} == head_dim {hd} (the file's key_length): every layer's Q scaled by 1/sqrt({qpas}), "
        "as llama.cpp's f_attention_scale; the GGUF has no query_pre_attn_scalar and Gemma2Config's default is 256 "
        "(tf_capture.load sets it; lockstep_eager's scaling argument checked at every call)"
    )
    # soft-capping: the file's values (llama.cpp's defaults 50 / 30 if absent); transformers' GGUF loader reads neither
    caps = {}
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        v = fields.get(f"{a}.{key}")
        caps[key] = float(C.LLAMACPP_GEMMA2_DEFAULTS[key] if v is None else v)
        if getattr(cfg, key) != caps[key]:
            raise SystemExit(f"gemma2 {key} {getattr(cfg, key)} != llama.cpp's {caps[key]} (the file's {a}.{key}: {v})")
    for layer in layers:
        if layer.self_attn.attn_logit_softcapping != caps["attn_logit_softcapping"]:
            raise SystemExit(f"gemma2 layer {layer.self_attn.layer_idx}: attn_logit_softcapping {layer.self_attn.attn_logit_softcapping}")
    checks["gemma2_softcapping"] = (
        f"attention {caps['attn_logit_softcapping']}, final {caps['final_logit_softcapping']} (the file's "
        f"{a}.attn_logit_softcapping / final_logit_softcapping; transformers' GGUF config map reads neither and "
        f"Gemma2Config's defaults are 50.0 / 30.0: {notes or 'as loaded'}); every layer's attention module holds the "
        "attention cap, lockstep_eager receives it at every call and applies cap * tanh(scores / cap) before the mask "
        "(as eager_attention_forward); the stored logits are the model's output, after the final cap, checked bit for "
        "bit against cap * tanh(lm_head / cap) (final_softcap)"
    )
    # embedding: token_embd as dequantized, x float32 sqrt(d) (llama.cpp's inp_scaled: ggml_scale by sqrtf(n_embd))
    w = model.model.embed_tokens.weight.detach().numpy()
    if not np.array_equal(w, deq("token_embd.weight")):
        raise SystemExit("gemma2 embed_tokens.weight != the file's token_embd (dequantized)")
    es = float(model.model.embed_tokens.embed_scale.to(torch.float32))
    if es != float(np.float32(np.sqrt(cfg.hidden_size))):
        raise SystemExit(f"gemma embed scale {es} != float32 sqrt({cfg.hidden_size})")
    checks["gemma_embed_scale"] = (
        f"embed_tokens output x {es} (float32 sqrt({cfg.hidden_size})); embed_tokens.weight == the file's token_embd "
        "dequantized, every row (pad_token_id row included)"
    )
    # sliding window: llama.cpp n_swa = the file's (4096 if absent), LLAMA_SWA_TYPE_STANDARD, load_swa_pattern(ml, 2)
    sw_file = fields.get(f"{a}.attention.sliding_window")
    sw = int(sw_file) if sw_file else C.LLAMACPP_GEMMA2_DEFAULTS["sliding_window"]
    pattern = fields.get(f"{a}.attention.sliding_window_pattern")
    want = C.llamacpp_gemma2_layer_types(
        {"n_layer": n_layer, "sliding_window": sw, "sliding_window_pattern": pattern}
    )
    if pattern is None and want != ["sliding_attention" if il % 2 == 0 else "full_attention" for il in range(n_layer)]:
        raise SystemExit(f"gemma2 SWA rule: {want}")
    if cfg.sliding_window != sw or list(cfg.layer_types) != want:
        raise SystemExit(f"gemma2 sliding_window {cfg.sliding_window} / layer_types {cfg.layer_types} != llama.cpp's {sw} / {want}")
    for il, layer in enumerate(layers):
        got = layer.self_attn.sliding_window
        if got != (sw if want[il] == "sliding_attention" else None):
            raise SystemExit(f"gemma2 layer {il}: attention sliding_window {got} ({want[il]})")
    local = [i for i, t in enumerate(want) if t == "sliding_attention"]
    longest = max(g["n_prompt_tokens"] + g["n_decode_steps"] for g in src_entries)
    # one RoPE base for every layer (llama.cpp: rope_freq_base_train_swa = rope_freq_base_train unless the file
    # has rope.freq_base_swa, which tf_capture.load refuses), NEOX, no scaling
    base = float(fields[f"{a}.rope.freq_base"])
    rp = cfg.rope_parameters
    if rp["rope_theta"] != base or rp["rope_type"] != "default" or f"{a}.rope.scaling.type" in fields or f"{a}.rope.freq_base_swa" in fields:
        raise SystemExit(f"gemma2 RoPE {rp} != the file's base {base}, no scaling, no SWA base")
    checks["gemma2_sliding_window"] = (
        f"window {sw} ({'the file' if sw_file else 'llama.cpp default'}) on layers {local}, global layers "
        f"{[i for i in range(n_layer) if i not in local]} (llama.cpp load_swa_pattern(ml, 2): local iff il % 2 == 0; "
        "tf_capture.llamacpp_gemma2_layer_types; each layer's attention module holds it); RoPE base "
        f"{base} on every layer (no rope.freq_base_swa), no scaling; the longest sequence here is {longest} positions"
        + (f" > {sw}, so the window masks: the prefill masks of every layer are checked against llama.cpp's rule "
           "(attention_masks)" if longest > sw else f" <= {sw}: the window masks nothing")
    )
    # GeGLU: llama.cpp LLM_FFN_GELU + LLM_FFN_PAR -> ggml_geglu (tanh-approximated GELU of the gate times up)
    act = layers[0].mlp.act_fn
    x = torch.linspace(-8, 8, 4097, dtype=torch.float32)
    if cfg.hidden_activation != "gelu_pytorch_tanh" or not torch.equal(act(x), nn_gelu_tanh(x)):
        raise SystemExit(f"gemma2 activation {cfg.hidden_activation} ({act}) is not the tanh-approximated GELU")
    checks["gemma2_geglu"] = (
        "hidden_activation gelu_pytorch_tanh: mlp.act_fn equals torch gelu(approximate='tanh') bit for bit; ffn_act = "
        "act(gate) * up (down_proj's input), as llama.cpp's GEGLU node"
    )


# gemma4: transformers state_dict name (layer part after model.layers.N.) -> the file's tensor (llama.cpp gemma4.cpp
# load_arch_tensors / gguf-py constants), written out here rather than taken from gguf's name map (which the loader
# uses), so the two are checked against each other
GEMMA4_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "layer_scalar": "layer_output_scale.weight",
}


def gemma4_gguf_name(name: str, tied: bool) -> str:
    if name == "model.embed_tokens.weight" or (name == "lm_head.weight" and tied):
        return "token_embd.weight"
    if name == "lm_head.weight":
        return "output.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    parts = name.split(".")
    if parts[:2] != ["model", "layers"] or ".".join(parts[3:]) not in GEMMA4_TENSORS:
        raise SystemExit(f"gemma4: model tensor {name} has no place in llama.cpp's gemma4 (not expected here)")
    return f"blk.{parts[2]}.{GEMMA4_TENSORS['.'.join(parts[3:])]}"


def check_gemma4(model, gguf_path: Path, tensors: dict, deq, src_entries: list[dict], checks: dict) -> None:
    """Gemma 4 as llama.cpp 0c1e570 runs it (src/models/gemma4.cpp), on the model tf_capture.load built (its LOADER
    FIXES: gemma4_config, gemma4_layer_scalars): per-layer head widths, V = K, V's weightless norm, the Q scale 1,
    every weight (norms without offset, layer_output_scale) bit for bit, both RoPEs against llama.cpp's angles,
    the window, the final cap, the embedding scale, GeGLU; no per-layer embeddings, KV sharing or MoE. Adds to checks."""
    cfg = model.config
    f = C.gemma4_file(gguf_path)
    layers = model.model.layers
    n_layer = cfg.num_hidden_layers
    types = ["sliding_attention" if bool(x) else "full_attention" for x in f["sliding_window_pattern"]]
    sw = int(f["sliding_window"])
    n_embd, n_head, n_kv = cfg.hidden_size, int(f["n_head"]), int(f["n_head_kv"])
    if list(cfg.layer_types) != types or cfg.sliding_window != sw:
        raise SystemExit(f"gemma4 layer_types {cfg.layer_types} / window {cfg.sliding_window} != the file's {types} / {sw}")
    if cfg.num_attention_heads != n_head or cfg.num_key_value_heads != n_kv:
        raise SystemExit(f"gemma4 heads {cfg.num_attention_heads}/{cfg.num_key_value_heads} != the file's {n_head}/{n_kv}")
    per_layer = []
    for il, layer in enumerate(layers):
        at = layer.self_attn
        local = types[il] == "sliding_attention"
        hd = int(f["key_length_swa"] if local else f["key_length"])
        kv = cfg.per_layer_config[il].num_key_value_heads
        shapes = {
            "q_proj": (tuple(at.q_proj.weight.shape), (n_head * hd, n_embd)),
            "k_proj": (tuple(at.k_proj.weight.shape), (n_kv * hd, n_embd)),
            "o_proj": (tuple(at.o_proj.weight.shape), (n_embd, n_head * hd)),
            "q_norm": (tuple(at.q_norm.weight.shape), (hd,)),
            "k_norm": (tuple(at.k_norm.weight.shape), (hd,)),
        }
        if at.head_dim != hd or cfg.per_layer_config[il].head_dim != hd or kv != n_kv or any(a != b for a, b in shapes.values()):
            raise SystemExit(f"gemma4 layer {il} ({types[il]}): head_dim {at.head_dim}, kv heads {kv}, shapes {shapes} "
                             f"!= llama.cpp's head width {hd} (key_length{'_swa' if local else ''})")
        if (at.v_proj is None) != (not f["has_attn_v"][il]):
            raise SystemExit(f"gemma4 layer {il}: v_proj {'absent' if at.v_proj is None else 'present'} but the file "
                             f"{'has' if f['has_attn_v'][il] else 'has no'} attn_v (llama.cpp: V = K without it)")
        if at.v_norm.with_scale or hasattr(at.v_norm, "weight") or not at.q_norm.with_scale or not at.k_norm.with_scale:
            raise SystemExit(f"gemma4 layer {il}: V's norm must be weightless (llama.cpp ggml_rms_norm), Q/K's weighted")
        # llama.cpp: f_attention_scale = 1.0 (gemma4.cpp); transformers: self.scaling = 1.0
        if at.scaling != 1.0:
            raise SystemExit(f"gemma4 layer {il}: scaling {at.scaling} != llama.cpp's 1.0")
        if at.sliding_window != (sw if local else None) or at.is_sliding != local or not at.is_causal:
            raise SystemExit(f"gemma4 layer {il}: sliding_window {at.sliding_window}, causal {at.is_causal} ({types[il]})")
        if at.is_kv_shared_layer or at.store_full_length_kv or getattr(layer, "per_layer_input_gate", None) is not None \
                or layer.enable_moe_block:
            raise SystemExit(f"gemma4 layer {il}: KV sharing / per-layer input / MoE on (llama.cpp: none in this file)")
        per_layer.append(f"{il}: {types[il].split('_')[0]} head {hd}, V {'= K' if at.v_proj is None else 'own'}")
    if cfg.hidden_size_per_layer_input or hasattr(model.model, "embed_tokens_per_layer") or cfg.num_kv_shared_layers \
            or cfg.enable_moe_block or f["embedding_length_per_layer_input"] or f["shared_kv_layers"] or f["has_moe"]:
        raise SystemExit("gemma4: per-layer embeddings / KV sharing / MoE in the model or the file")
    checks["gemma4_attention"] = (
        f"per layer ({'; '.join(per_layer)}): head widths = the file's key_length_swa / key_length (transformers' GGUF "
        f"config: head_dim 256 and no V = K; set by tf_capture.gemma4_config: loader_config_fixes); q/k/o_proj and q/k_norm "
        "shaped by them; V = the K projection (before k_norm) exactly on the layers whose attn_v the file lacks "
        "(attention_k_eq_v); v_norm weightless, q/k_norm weighted; every layer's scaling 1.0 = llama.cpp's "
        "f_attention_scale (checked at every lockstep_eager call: attention_calls); no per-layer embeddings "
        "(hidden_size_per_layer_input 0 = embedding_length_per_layer_input), no KV sharing, no MoE"
    )
    # every tensor the model holds (parameters and the layer_scalar buffers) = the file's, dequantized, bit for bit:
    # the name mapping, no Gemma +1 norm offset (llama.cpp's converter: Gemma4Model.norm_shift 0; Gemma4RMSNorm
    # multiplies by the weight as is; transformers uses the plain TensorProcessor for gemma4), layer_output_scale
    tied = "output.weight" not in tensors
    used, n_norm, scalars = set(), 0, []
    for name, t in model.state_dict().items():
        gname = gemma4_gguf_name(name, tied)
        want = deq(gname)
        got = t.detach().to(torch.float32).numpy()
        if want.size != got.size or not np.array_equal(got.reshape(-1), want.reshape(-1)) or (got.ndim == 2 and want.shape != got.shape):
            raise SystemExit(f"gemma4 {name} != the file's {gname} (dequantized)")
        used.add(gname)
        if "norm" in name:
            n_norm += got.size
        if name.endswith("layer_scalar"):
            scalars.append(float(got.reshape(-1)[0]))
    unused = sorted(set(tensors) - used)
    if unused != ["rope_freqs.weight"]:
        raise SystemExit(f"gemma4: file tensors the model does not hold: {unused} (only rope_freqs.weight is expected)")
    checks["gemma4_weights"] = (
        f"all {len(model.state_dict())} model tensors equal the file's dequantized tensors bit for bit (explicit "
        f"name map GEMMA4_TENSORS; every file tensor but rope_freqs.weight used); the {n_norm} norm weights with no "
        f"offset (llama.cpp's Gemma4Model.norm_shift 0, Gemma4RMSNorm: x * w); layer_scalar = the file's "
        f"layer_output_scale {scalars} (transformers' loader leaves it 1.0: tf_capture.gemma4_layer_scalars)"
    )
    # RoPE vs llama.cpp's angles: theta_i = pos * base^(-2i/n_rot) / freq_factor_i (ggml_rope_ext, NEOX); sliding
    # layers: base rope.freq_base_swa (10000 default), n_rot_swa, no factors; full layers: rope.freq_base, n_rot,
    # rope_freqs (factor 1 turns, 1e30 does not: transformers' proportional RoPE has frequency 0 there)
    rot = model.model.rotary_emb
    base_swa = float(10000.0 if f["rope_freq_base_swa"] is None else f["rope_freq_base_swa"])
    base = float(f["rope_freq_base"])
    ff = f["rope_freqs"].astype(np.float64)
    rope_notes = []
    for lt, b, n_rot, fac in (("sliding_attention", base_swa, int(f["rope_dim_swa"]), None),
                              ("full_attention", base, int(f["rope_dim"]), ff)):
        if lt not in types:
            continue
        inv = getattr(rot, f"{lt}_inv_freq").detach().to(torch.float64).numpy()
        want = b ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
        turning = np.ones(len(want), bool) if fac is None else fac == 1.0
        if fac is not None:
            want = want / fac
        if inv.shape != want.shape or getattr(rot, f"{lt}_attention_scaling") != 1.0:
            raise SystemExit(f"gemma4 {lt} RoPE: {inv.shape[0]} frequencies (want {want.shape[0]} = n_rot/2), scaling "
                             f"{getattr(rot, f'{lt}_attention_scaling')}")
        rel = np.max(np.abs(inv[turning] - want[turning]) / want[turning])
        if not rel <= 1e-6 or np.any(inv[~turning] != 0.0) or np.any(want[~turning] > 1e-20):
            raise SystemExit(f"gemma4 {lt} RoPE frequencies != llama.cpp's: max rel {rel:.3g}, non-turning {inv[~turning]}")
        rope_notes.append(f"{lt}: base {b}, {int(turning.sum())} of {len(want)} pairs turn (max rel diff of the "
                          f"frequency {rel:.1e}){'' if fac is None else ', the other pairs frequency 0 (llama.cpp: factor 1e30)'}")
    checks["gemma4_rope"] = (
        "NEOX RoPE, transformers' inv_freq vs llama.cpp's base^(-2i/n_rot)/freq_factor: " + "; ".join(rope_notes)
        + f" (config rope_parameters {cfg.rope_parameters}; transformers' GGUF config: full_attention theta 1e6)"
    )
    # final soft-capping (checked per run: final_softcap), embedding scale, GeGLU, window
    cap = f["final_logit_softcapping"]
    if cfg.final_logit_softcapping != (float(cap) if cap else None):
        raise SystemExit(f"gemma4 final_logit_softcapping {cfg.final_logit_softcapping} != the file's {cap}")
    es = float(model.model.embed_tokens.embed_scale.to(torch.float32))
    if es != float(np.float32(np.sqrt(n_embd))):
        raise SystemExit(f"gemma embed scale {es} != float32 sqrt({n_embd})")
    act = layers[0].mlp.act_fn
    x = torch.linspace(-8, 8, 4097, dtype=torch.float32)
    if cfg.hidden_activation != "gelu_pytorch_tanh" or any(not torch.equal(lay.mlp.act_fn(x), nn_gelu_tanh(x)) for lay in layers):
        raise SystemExit(f"gemma4 activation {cfg.hidden_activation} ({act}) is not the tanh-approximated GELU")
    longest = max(g["n_prompt_tokens"] + g["n_decode_steps"] for g in src_entries)
    checks["gemma4_softcap_embed_geglu_window"] = (
        f"final_logit_softcapping {cfg.final_logit_softcapping} = the file's (transformers' GGUF config: None); "
        f"embed_tokens output x {es} (float32 sqrt({n_embd})); gelu_pytorch_tanh = torch's tanh GELU bit for bit "
        f"(llama.cpp GEGLU); window {sw} on layers {[i for i, t in enumerate(types) if t == 'sliding_attention']} "
        f"(the file's sliding_window_pattern), causal; the longest sequence here is {longest} positions"
        + (f" > {sw}: the prefill masks are checked against llama.cpp's rule (attention_masks)" if longest > sw else "")
    )


def nn_gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x, approximate="tanh")


def logits_vs_llamacpp(logits: np.ndarray, decode_logits: np.ndarray, src_npz) -> float:
    """One NMSE over the logits the llama.cpp golden holds: its full rows (the last prompt position,
    decode.logits) and its top-64 values at every prompt position (ours at its top-64 ids); reference llama.cpp."""
    pos = src_npz["logits_positions"]
    pairs = [(logits[pos], src_npz["logits"]),
             (np.take_along_axis(logits, src_npz["logits_topk_ids"].astype(np.int64), axis=1), src_npz["logits_topk"])]
    if "decode.logits" in src_npz.files:
        pairs.append((decode_logits, src_npz["decode.logits"]))
    num = sum(float(np.sum((o.astype(np.float64) - r.astype(np.float64)) ** 2)) for o, r in pairs)
    den = sum(float(np.sum(r.astype(np.float64) ** 2)) for _, r in pairs)
    return num / den


# check_final_softcap: how much closer llama.cpp's logits must be to the capped than to the uncapped ones (NMSE
# ratio). The cap is a property of llama.cpp's graph, not of the weight type, so the full separation (10x) is asked
# of files whose weights are float (F32, F16, BF16: llama.cpp computes their matmuls on float inputs); on the
# quantized ones llama.cpp rounds every matmul input to 8 bits, and since issue 42 the seeded Gemma files' logits
# are realistic (|logit| <= ~10, cap 10), which the cap moves by NMSE ~4.5e-3 (gemma2) .. 6.5e-3 (gemma4): the
# same order as that rounding (measured 2026-11-29: llama.cpp's logits NMSE 6.5e-4 from transformers' capped ones on
# synth-gemma2-q4_k, ratio 7.1; 1.6e-3 on synth-gemma4-q8_0, ratio 4.0). There they need only be closer to the
# capped logits (an absent cap gives a ratio ~1/(1 + noise), below 1) -- the F32 file of the same architecture
# holds the graph to 10x.
CAP_SEPARATION_FLOAT = 10
CAP_SEPARATION_QUANT = 1
FLOAT_FILE_TYPES = ("F32", "F16", "BF16")


def check_final_softcap(model, res: C.RunResult, src_npz, where: str, separation: float) -> str:
    """gemma2: the stored logits are the model's output, cap * tanh(lm_head / cap) with the file's final cap,
    recomputed here bit for bit from lm_head's output (Gemma2ForCausalLM.forward's ops, in its order); and
    llama.cpp's logits must be closer to them than to the uncapped lm_head output by `separation` x in NMSE
    (CAP_SEPARATION_*), i.e. the comparison with llama.cpp sees the cap (on synth-gemma2 the cap moves the logits
    by NMSE ~4.5e-3 only: below check_against_llamacpp's generic 3e-2)."""
    cap = model.config.final_logit_softcapping
    if cap is None:
        raise SystemExit(f"{where}: the config has no final_logit_softcapping, but llama.cpp's logits are after a final cap")
    raw = np.vstack([res.lm_head_logits, res.lm_head_decode_logits])
    got = np.vstack([res.logits, res.decode_logits])
    want = (torch.tanh(torch.from_numpy(raw) / cap) * cap).numpy()
    if not np.array_equal(got, want):
        raise SystemExit(f"{where}: the logits are not cap * tanh(lm_head / cap) with cap {cap}")
    nm = float(np.sum((raw.astype(np.float64) - got) ** 2) / np.sum(got.astype(np.float64) ** 2))
    capped = logits_vs_llamacpp(res.logits, res.decode_logits, src_npz)
    uncapped = logits_vs_llamacpp(res.lm_head_logits, res.lm_head_decode_logits, src_npz)
    if not capped * separation < uncapped:
        raise SystemExit(f"{where}: llama.cpp's logits are not clearly capped like ours: NMSE {capped:.3g} capped, "
                         f"{uncapped:.3g} uncapped")
    return (f"logits == {cap} * tanh(lm_head / {cap}) bit for bit at all {raw.shape[0]} rows; the cap moves them by NMSE "
            f"{nm:.2e} (max |lm_head| {np.max(np.abs(raw)):.3g} -> max |logits| {np.max(np.abs(got)):.3g}); vs llama.cpp's "
            f"logits: NMSE {capped:.2e} capped, {uncapped:.2e} uncapped (lm_head's output)")


def check_attention_calls(model, res: C.RunResult, where: str) -> str:
    """Every lockstep_eager call (every layer, prefill and each decode step) got the Q scale and the attention
    soft-cap the config holds (gemma2: the file's; None elsewhere)."""
    cfg = model.config
    want_cap = getattr(cfg, "attn_logit_softcapping", None)
    n = 0
    for call in res.attn_args:
        if sorted(call) != list(range(cfg.num_hidden_layers)):
            raise SystemExit(f"{where}: lockstep_eager called for layers {sorted(call)}")
        for layer, (scaling, softcap) in call.items():
            if scaling != model.model.layers[layer].self_attn.scaling or softcap != want_cap:
                raise SystemExit(f"{where}: layer {layer}: lockstep_eager got scaling {scaling}, softcap {softcap} (want {want_cap})")
            n += 1
    return f"all {n} lockstep_eager calls got softcap {want_cap} and their layer's scaling"


def hf_to_gguf_norm(name: str, llama_like: bool = False) -> str:
    # model.layers.3.input_layernorm.weight -> blk.3.attn_norm.weight (Gemma 3; llama_like: Llama/Qwen, whose
    # post_attention_layernorm is the pre-FFN norm, ffn_norm)
    if name == "model.norm.weight":
        return "output_norm.weight"
    parts = name.split(".")
    n = parts[2]
    tail = ".".join(parts[3:])
    table = {
        "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight" if llama_like else "post_attention_norm.weight",
        "pre_feedforward_layernorm.weight": "ffn_norm.weight",
        "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
        "self_attn.q_norm.weight": "attn_q_norm.weight",
        "self_attn.k_norm.weight": "attn_k_norm.weight",
    }
    return f"blk.{n}.{table[tail]}"


def summary_vs_llamacpp(res: C.RunResult, src_npz, n_layer: int) -> str:
    """One line for the log: KL(P_tf || P_lc) at the full logits rows both hold, top-1 agreement at every prompt
    position and decode step, top-1 at the decode steps alone (= llama.cpp's fed tokens), min row cosine of
    blk.N.out / output_norm (what compare_oracles.py tabulates from the stored files)."""
    rows_tf, rows_lc = [res.logits[-1:]], [src_npz["logits"][-1:]]
    if "decode.logits" in src_npz.files and len(res.decode_logits):
        rows_tf.append(res.decode_logits)
        rows_lc.append(src_npz["decode.logits"])
    k = kl(np.vstack(rows_tf), np.vstack(rows_lc))
    top1_pre = np.argmax(res.logits, axis=1) == src_npz["logits_topk_ids"][:, 0]
    dec_lc = src_npz["decode.logits"].argmax(1) if "decode.logits" in src_npz.files else src_npz["logits_decode_topk_ids"][:, 0]
    top1_dec = np.argmax(res.decode_logits, axis=1) == dec_lc if len(dec_lc) else np.zeros(0, bool)
    cos = []
    for name in [f"blk.{n}.out" for n in range(n_layer)] + ["output_norm"]:
        for key, ours in ((name, res.stages.get(name)), ("decode." + name, res.decode_stages.get(name))):
            if ours is not None and key in src_npz.files:
                cos.append(float(np.min(row_cosines(ours, src_npz[key]))))
    return (f"KL(tf||lc) {len(k)} full rows: last prompt pos {k[0]:.2e}, max {np.max(k):.2e}; top-1 agree "
            f"{int(top1_pre.sum() + top1_dec.sum())}/{top1_pre.size + top1_dec.size} (decode {int(top1_dec.sum())}/{top1_dec.size}); "
            f"min cosine out/output_norm {min(cos) if cos else float('nan'):.7f}")


def check_masks(model, res: C.RunResult, where: str) -> str:
    """The prefill attention masks transformers built, layer by layer, against llama.cpp's rule: causal, and for a
    sliding layer (Gemma 2, Gemma 3) key p0 hidden from query p1 when p1 - p0 >= window (LLAMA_SWA_TYPE_STANDARD)."""
    cfg = model.config
    types = getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers
    T = res.logits.shape[0]
    q, k = np.arange(T)[:, None], np.arange(T)[None, :]
    n_masked = {}
    for layer, t in enumerate(types):
        m = res.prefill_masks.get(layer)
        want = k <= q
        if t == "sliding_attention":
            want = want & (q - k < cfg.sliding_window)
        if m is None:
            if T > 1:
                raise SystemExit(f"{where}: layer {layer}: no attention mask over {T} positions")
            continue
        if m.shape != (T, T) or not np.array_equal(m, want):
            raise SystemExit(f"{where}: layer {layer} ({t}): transformers' mask != llama.cpp's rule")
        n_masked[layer] = int(np.sum(~want & (k <= q)))
    return (f"prefill masks equal llama.cpp's (causal; sliding layers: p1 - p0 < window); keys hidden by the window "
            f"beyond causality per layer at the longest prompt: {n_masked}")


def check_against_llamacpp(arch: str, res: C.RunResult, src_npz: dict, where: str, limit: float = 3e-2) -> dict:
    """Every stage the llama.cpp golden holds, compared (NMSE of the whole array): llama.cpp rounds matmul inputs
    to 8 bits (NMSE ~1e-5 per stage, growing to ~1e-3 at the logits); a trap (wrong permutation, norm offset,
    scale) gives ~1e-1..1 -- but a subtler one (gemma2's attention cap 50 instead of 5: 1.6e-3; its Q scale 1/16
    instead of 1/8: 1.7e-2 at blk.N.out) less, so a file whose weights are all F32, where llama.cpp computes in
    f32 too and the two oracles agree to ~1e-7, is held to `limit` = F32_FILE_LIMIT (main). Where the logits are
    read from the model's output (gemma2: after the final soft-capping, which no other stage covers) they are
    compared too (logits_vs_llamacpp)."""
    worst = {}
    for k in src_npz.files:
        if k in ("tokens", "logits_positions", "decode.tokens") or k.startswith("logits"):
            continue
        if k.startswith("decode."):
            if k[7:] not in res.decode_stages or k == "decode.logits":
                continue
            ours = res.decode_stages[k[7:]]
        elif k in res.stages:
            ours = res.stages[k]
        else:
            continue
        ref = src_npz[k].astype(np.float64)
        # over the whole array: single rows of ffn_act are near zero, where llama.cpp's 8-bit rounding alone
        # gives a row NMSE ~1
        n = float(np.sum((ours.astype(np.float64) - ref) ** 2) / np.sum(ref**2))
        kind = kind_of(k.removeprefix("decode."))
        worst[kind] = max(worst.get(kind, 0.0), n)
    if C.stage_map(arch).has("logits_result"):
        # logits read from the model's output (gemma2: after the final soft-capping, which no other stage covers):
        # llama.cpp's full rows (last prompt position; decode.logits) and its top-64 values at every prompt
        # position (our logits at its top-64 ids), as one NMSE
        worst["logits"] = logits_vs_llamacpp(res.logits, res.decode_logits, src_npz)
    for kind, n in worst.items():
        if not n < limit:
            raise SystemExit(f"{where}: stage {kind} differs from llama.cpp by NMSE {n:.3g} (limit {limit:g}): a loader trap? (README)")
    return worst


# An encoder (bert): the F32 model stores every stage, a variant blk.N.out and pooled; no logits, no decode steps.
# Every array f32 (issue 42, SEEDED_F32 above; until then only embed / ffn_inp / out and pooled were).
ENCODER_POLICY = {"prefill": ("*",), "exact": ("*",)}
ENCODER_VARIANT_POLICY = {"prefill": ("blk.{N}.out", "pooled"), "exact": ("*",)}


def check_hf_copy(model, gguf_path: Path) -> str:
    """The Hugging Face copy lockstep wrote holds the GGUF's weights: every BertModel parameter equals the
    `gguf` package's dequantization of its tensor, bit for bit (a mismatch stops the run)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    names = {
        "token_embd.weight": "embeddings.word_embeddings.weight",
        "position_embd.weight": "embeddings.position_embeddings.weight",
        "token_types.weight": "embeddings.token_type_embeddings.weight",
        "token_embd_norm.weight": "embeddings.LayerNorm.weight",
        "token_embd_norm.bias": "embeddings.LayerNorm.bias",
    }
    per_layer = {
        "attn_q": "attention.self.query", "attn_k": "attention.self.key", "attn_v": "attention.self.value",
        "attn_output": "attention.output.dense", "attn_output_norm": "attention.output.LayerNorm",
        "ffn_up": "intermediate.dense", "ffn_down": "output.dense", "layer_output_norm": "output.LayerNorm",
    }
    sd = model.state_dict()
    n = 0
    for t in GGUFReader(str(gguf_path)).tensors:
        if t.name in names:
            hf = names[t.name]
        else:
            _, layer, tensor, suffix = t.name.split(".")
            hf = f"encoder.layer.{layer}.{per_layer[tensor]}.{suffix}"
        want = np.asarray(dequantize(t.data, t.tensor_type), np.float32).reshape(sd[hf].shape)
        if not np.array_equal(sd[hf].numpy(), want):
            raise SystemExit(f"{gguf_path}: {t.name} -> {hf}: the Hugging Face copy differs from the GGUF's dequantization")
        n += 1
    if n != len(sd):
        raise SystemExit(f"{gguf_path}: {n} GGUF tensors for {len(sd)} BertModel parameters")
    return f"all {n} BertModel parameters equal the gguf package's dequantization of the GGUF, bit for bit"


def main_encoder(args, mid: str, arch: str, path: Path) -> int:
    """The transformers-f32 goldens of an encoder (bert): BertModel (f32, eager attention) loaded from lockstep's
    Hugging Face copy of the GGUF (`lockstep export-hf`; transformers' GGUF loader has no bert), fed the
    llama.cpp-f32kv golden's token ids; every stage and the pooled embedding; the f32-vs-f64 floor."""
    hf_dir = (args.hf_dir or path.parent / "hf" / mid).resolve()
    if not (hf_dir / "config.json").is_file():
        raise SystemExit(f"{hf_dir}: no Hugging Face copy (cargo run --release -p lockstep -- export-hf --model {mid} --out {hf_dir})")
    manifest, src = load_source_goldens(args.out, mid)
    src = sorted(src, key=lambda g: g["path"])
    t0 = time.time()
    model = C.load_hf_encoder(hf_dir, torch.float32)
    traps = {"hf_copy": check_hf_copy(model, path)}
    from gguf import GGMLQuantizationType, GGUFReader

    all_f32 = all(t.tensor_type == GGMLQuantizationType.F32 for t in GGUFReader(str(path)).tensors)
    limit = F32_FILE_LIMIT if all_f32 else 3e-2
    cfg = model.config
    n_layer = cfg.num_hidden_layers
    all_ids = C.canonical_ids(arch, n_layer)
    variant = "variant" in src[0] if src else False
    pol = ENCODER_VARIANT_POLICY if variant else ENCODER_POLICY
    runs32, vs = {}, {}
    for g in src:
        z = np.load(args.out / g["path"])
        toks = [int(t) for t in z["tokens"]]
        r = C.run_encoder(model, arch, toks)
        missing = [c for c in all_ids if c not in r.stages]
        if missing:
            raise SystemExit(f"{g['prompt_id']}: stages not captured: {missing[:5]}")
        vs[g["prompt_id"]] = check_against_llamacpp(arch, r, z, f"{mid}/{g['prompt_id']}", limit)
        runs32[g["prompt_id"]] = r
        print(f"  f32 {g['prompt_id']}: vs llama.cpp {json.dumps({k: float(f'{v:.3g}') for k, v in vs[g['prompt_id']].items()})}", flush=True)
    del model
    floor = None
    if not args.no_f64:
        model64 = C.load_hf_encoder(hf_dir, torch.float64)
        per_kind: dict[str, list[float]] = {}
        for g in src:
            z = np.load(args.out / g["path"])
            r64 = C.run_encoder(model64, arch, [int(t) for t in z["tokens"]])
            r32 = runs32[g["prompt_id"]]
            for c in all_ids:
                per_kind.setdefault(kind_of(c), []).extend(row_nmse(r32.stages[c], r64.stages[c]).tolist())
        del model64
        floor = {
            "about": "transformers float32 vs the same BertModel in float64 (weights widened exactly) on this model's "
            "goldens' token ids: NMSE (reference = float64) per (layer, position) row of each stage kind",
            "f64_patches": [],
            "nmse": {k: {"median": float(np.median(v)), "p99": float(np.percentile(v, 99)), "max": float(np.max(v)), "rows": len(v)}
                     for k, v in per_kind.items()},
        }
        print(json.dumps(floor["nmse"])[:1500], flush=True)
    d = args.out / mid / DIR_NAME
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    host = C.versions() | host_info()
    entries = []
    exact = set(expand(pol["exact"], n_layer, all_ids))
    for g in src:
        pid = g["prompt_id"]
        r = runs32[pid]
        z = np.load(args.out / g["path"])
        raw = [("tokens", z["tokens"].astype(np.int32), False)]
        raw += [(c, r.stages[c], c not in exact) for c in expand(pol["prefill"], n_layer, all_ids)]
        arrays, listed = {}, {}
        for name, x, allow in raw:
            a, info = store(x, allow)
            arrays[name] = a
            listed[name] = {"shape": list(a.shape), **info}
        rel = Path(mid) / DIR_NAME / f"{pid}.npz"
        write_npz(args.out / rel, arrays)
        entry = {
            "path": rel.as_posix(),
            "sha256": sha256_file(args.out / rel),
            "bytes": (args.out / rel).stat().st_size,
            **{k: g[k] for k in ("model_id", "model_sha256", "model_file", "model_general_name", "arch", "prompt_id",
                                 "prompt_kind", "prompt", "add_special", "parse_special", "tokenizer") if k in g},
            "oracle": {
                "name": ORACLE_NAME,
                **host,
                "dtype": "float32",
                "attn_implementation": "eager (BertModel, attn_implementation='eager')",
                "loader": "BertModel.from_pretrained(hf_dir, add_pooling_layer=False): lockstep export-hf's copy of the "
                "GGUF (config.json + model.safetensors, f32), checked against the gguf package's dequantization",
            },
            "kv_type": "f32",
            "settings": {
                "n_threads": torch.get_num_threads(),
                "seed": None,
                "cache": "none: an encoder",
                "prefill": "one forward call over the prompt (attention_mask ones, token_type_ids zeros)",
                "decode": "none: an encoder has no decode step",
                "sampling": "none",
            },
            "n_prompt_tokens": len(z["tokens"]),
            "n_decode_steps": 0,
            "decode_source": "none: an encoder has no KV cache and no decode step",
            "continuation": "",
            "output": "pooled",
            "capture_changes_logits": 0.0,
            "capture_note": "forward hooks only read tensors; an encoder has no logits: `pooled` is the mean of "
            "last_hidden_state over the sequence (checked equal to blk.{last}.out's rows)",
            "stages_prefill": list(pol["prefill"]),
            "stages_decode": [],
            "stages_exact_f32": list(pol["exact"]),
            "logits_storage": "none: an encoder has no logits; `pooled` [1, n_embd] f32",
            "model_hparams": {"n_layer": n_layer, "n_embd": cfg.hidden_size, "n_vocab": cfg.vocab_size},
            "loader_checks": traps,
            "vs_llamacpp_f32kv_max_nmse": vs[pid],
            "arrays": listed,
        }
        for key in ("synth", "variant"):
            if key in g:
                entry[key] = g[key]
        if floor is not None:
            entry["floor_f32_vs_f64"] = floor
        entries.append(entry)
        print(f"{rel.as_posix():55s} {entry['bytes'] / 2**20:6.2f} MiB", flush=True)
    write_manifest(args, arch, mid, entries)
    print(f"wrote {len(entries)} goldens, {sum(e['bytes'] for e in entries) / 2**20:.2f} MiB; {time.time() - t0:.0f}s")
    return 0


def measure_floor(model64, arch: str, notes64: list[str], inputs: list, runs32: dict, all_ids: list[str]) -> dict:
    """The float32-vs-float64 floor (`floor_f32_vs_f64`): `model64` (the float64 model, to_float64's patches noted
    in notes64) run on every input (golden entry or prompt, token ids, decode token ids), against the float32 runs
    runs32 (prompt id -> RunResult): NMSE per (layer, position) row of each stage kind, KL per logits row."""
    per_kind: dict[str, list[float]] = {}
    kl_rows = []
    for g, toks, dec in inputs:
        toks, dec = [int(t) for t in toks], [int(t) for t in dec]
        t1 = time.time()
        r64 = C.run(model64, arch, toks, dec)
        r32 = runs32[g["prompt_id"]]
        for c in all_ids:
            if c == "logits":
                continue
            k = kind_of(c)
            per_kind.setdefault(k, []).extend(row_nmse(r32.stages[c], r64.stages[c]).tolist())
            if dec:
                per_kind[k].extend(row_nmse(r32.decode_stages[c], r64.decode_stages[c]).tolist())
        la = np.vstack([r64.logits, r64.decode_logits])
        lb = np.vstack([r32.logits, r32.decode_logits])
        per_kind.setdefault("logits", []).extend(row_nmse(lb, la).tolist())
        kl_rows.extend(kl(la, lb).tolist())
        print(f"  f64 {g['prompt_id']:10s} {time.time() - t1:5.1f}s", flush=True)
    floor = {
        "about": (
            "transformers float32 vs the same model in float64 (weights widened exactly; RMSNorm, RoPE, softmax "
            "and Gemma's embedding scale patched to follow the dtype, tf_capture.py PATCH 1-4) on this model's "
            "goldens' token ids: NMSE (reference = float64) per (layer, position) row of each stage kind, over every "
            "prompt, prefill and decode positions; KL(P64 || P32) at every logits row"
        ),
        "f64_patches": notes64 + C.patch_notes(arch),
        "nmse": {
            k: {"median": float(np.median(v)), "p99": float(np.percentile(v, 99)), "max": float(np.max(v)), "rows": len(v)}
            for k, v in per_kind.items()
        },
        "kl": {"median": float(np.median(kl_rows)), "max": float(np.max(kl_rows)), "rows": len(kl_rows)},
    }
    print(json.dumps(floor["nmse"], indent=None)[:2000], floor["kl"], flush=True)
    return floor


def goldens_entries(args, mid: str, arch: str, inputs: list, runs32: dict, floor: dict | None, traps: dict,
                    vs_llamacpp: dict, lm_class: str, has_v: list[bool] | None, n_layer: int, n_embd: int,
                    loader: str) -> list[dict]:
    """Write OUT/<mid>/transformers-f32/<prompt>.npz for every input (g, token ids, decode token ids; g = the
    llama.cpp-f32kv golden's manifest entry or prompt_inputs' stand-in) by the model's storage policy, and return
    their manifest entries (the floor, the loader checks and the distances from llama.cpp's goldens in each)."""
    all_ids = C.canonical_ids(arch, n_layer)
    d = args.out / mid / DIR_NAME
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    host = C.versions() | host_info()
    entries = []
    for g, toks, dec_toks in inputs:
        pid = g["prompt_id"]
        r = runs32[pid]
        pol = policy_of(mid, pid)
        full_decode = full_decode_logits(mid, pid)
        T = r.logits.shape[0]
        positions = np.array([T - 1], np.int32)
        order = np.argsort(-r.logits, axis=1, kind="stable")[:, :TOPK].astype(np.int32)
        exact = exact_ids(pol, n_layer, all_ids)
        exact_dec = exact_ids(pol, n_layer, all_ids, decode=True)
        raw = [("tokens", toks, False)]
        skip = prefill_skip(pol, n_layer, all_ids, has_v)
        raw += [(c, r.stages[c], c not in exact) for c in expand(pol["prefill"], n_layer, all_ids) if c != "logits" and c not in skip]
        raw += [
            ("logits", r.logits[positions], False),
            ("logits_positions", positions, False),
            ("logits_topk_ids", order, False),
            ("logits_topk", np.take_along_axis(r.logits, order, axis=1), False),
            ("decode.tokens", dec_toks, False),
        ]
        if full_decode:
            raw.append(("decode.logits", r.decode_logits, False))
        else:
            do = np.argsort(-r.decode_logits, axis=1, kind="stable")[:, :TOPK].astype(np.int32)
            raw += [("logits_decode_topk_ids", do, False), ("logits_decode_topk", np.take_along_axis(r.decode_logits, do, axis=1), False)]
        raw += [("decode." + c, r.decode_stages[c], c not in exact_dec) for c in expand(pol["decode"], n_layer, all_ids) if c != "logits"]
        arrays, listed = {}, {}
        for name, x, allow in raw:
            a, info = store(x, allow)
            arrays[name] = a
            listed[name] = {"shape": list(a.shape), **info}
        rel = Path(mid) / DIR_NAME / f"{pid}.npz"
        write_npz(args.out / rel, arrays)
        full = np.vstack([r.logits[-1:], r.decode_logits])
        own_argmax = np.argmax(np.vstack([r.logits[-1:], r.decode_logits[:-1]]), axis=1) if len(dec_toks) else np.zeros(0)
        entry = {
            "path": rel.as_posix(),
            "sha256": sha256_file(args.out / rel),
            "bytes": (args.out / rel).stat().st_size,
            **{k: g[k] for k in ("model_id", "model_sha256", "model_file", "model_general_name", "arch", "prompt_id",
                                 "prompt_kind", "prompt", "add_special", "parse_special", "tokenizer") if k in g},
            "oracle": {
                "name": ORACLE_NAME,
                **host,
                "dtype": "float32",
                "attn_implementation": f"{C.ATTN} (transformers' eager attention, registered through AttentionInterface)",
                "loader": loader,
            },
            "kv_type": "f32",
            "settings": {
                "n_threads": torch.get_num_threads(),
                "seed": None,
                "cache": "transformers DynamicCache (float32)",
                "prefill": "one forward call over the prompt",
                "decode": "one forward call per token through the cache",
                "sampling": g.get("sampling_tf") or "none: teacher-forced with the llama.cpp-f32kv golden's decode.tokens",
            },
            "n_prompt_tokens": T,
            "n_decode_steps": int(len(dec_toks)),
            "decode_source": g.get("decode_source_tf") or f"teacher-forced with the {SOURCE_DIR} golden's decode.tokens ({g['path']}): the same token ids",
            "continuation": g.get("continuation", ""),
            "decode_own_argmax_agreement": float(np.mean(own_argmax == dec_toks)) if len(dec_toks) else 1.0,
            "capture_changes_logits": 0.0,
            "capture_note": "forward hooks only read tensors; the logits are "
            + (f"the model's output logits ({lm_class}: lm_head, then the final soft-capping)"
               if C.stage_map(arch).has("logits_result") else "lm_head's output itself"),
            "stages_prefill": list(pol["prefill"]),
            **({"stages_prefill_skipped": sorted(skip, key=all_ids.index)} if skip else {}),
            "stages_decode": list(pol["decode"]),
            "stages_exact_f32": list(pol["exact"]),
            "stages_f16_allowed": list(pol["f16_ok"]),
            **({"stages_decode_exact_f32": list(pol["decode_exact"])} if "decode_exact" in pol else {}),
            "logits_storage": "logits: f32 row at the last prompt position; logits_topk f32; decode: "
            + ("full decode.logits [N, V] f32" if full_decode else "logits_decode_topk{,_ids} [N, 64] (no full rows)"),
            "model_hparams": {"n_layer": n_layer, "n_embd": n_embd, "n_vocab": int(r.logits.shape[1])},
            "loader_checks": traps,
            **({"vs_llamacpp_f32kv_max_nmse": vs_llamacpp[pid]} if pid in vs_llamacpp else {}),
            "arrays": listed,
        }
        if "chat" in g:
            entry["chat"] = g["chat"]
        for key in ("synth", "variant", "hf_dir"):  # what a seeded model / variant / HF directory is
            if key in g:
                entry[key] = g[key]
        if floor is not None:
            entry["floor_f32_vs_f64"] = floor
        if pol.get("compact"):
            compact_entry(entry)
        entries.append(entry)
        print(f"{rel.as_posix():55s} {entry['bytes'] / 2**20:6.2f} MiB", flush=True)

    return entries


# --- the HF route: from_pretrained(hf_dir), no GGUF loader (README "The HF route") ------------------------------

N_DECODE = 8  # greedy decode steps after a prompt this oracle tokenizes itself (as the llama.cpp oracle's N_DECODE)
# The storage policy of a model the registry does not know (a porter's HF checkpoint): SYNTH_POLICY with every array
# f32 -- every stage at every prompt position, the residual stream at each decode step, full decode logits rows.
# Meant for tiny checkpoints (the porter's fixtures); a large model's goldens would be large.
HF_NEW_MODEL_POLICY = seeded_all_f32(SYNTH_POLICY)


def hf_dir_digest(hf_dir: Path) -> tuple[str, list[str]]:
    """The sha256 of a Hugging Face directory (the convention shared with lockstep's registry, `format = "hf"`):
    sha256 of the text of one line "<lowercase hex sha256 of the file>  <file name>\\n" per file, for config.json,
    tokenizer.json, model.safetensors.index.json (each if present) and every *.safetensors, sorted by file name.
    Returns (digest, the file names). SystemExit if the directory has no config.json or no *.safetensors."""
    hf_dir = Path(hf_dir)
    if not (hf_dir / "config.json").is_file():
        raise SystemExit(f"{hf_dir}: no config.json (not a Hugging Face model directory)")
    names = [n for n in ("config.json", "tokenizer.json", "model.safetensors.index.json") if (hf_dir / n).is_file()]
    shards = [p.name for p in hf_dir.glob("*.safetensors") if p.is_file()]
    if not shards:
        raise SystemExit(f"{hf_dir}: no *.safetensors file")
    names = sorted(names + shards)
    text = "".join(f"{sha256_file(hf_dir / n)}  {n}\n" for n in names)
    return hashlib.sha256(text.encode()).hexdigest(), names


def hf_all_f32(hf_dir: Path) -> bool:
    """Every tensor of every *.safetensors of the directory is F32 (read from the headers only)."""
    for p in sorted(Path(hf_dir).glob("*.safetensors")):
        with open(p, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        if any(v["dtype"] != "F32" for k, v in header.items() if k != "__metadata__"):
            return False
    return True


def prompt_inputs(hf_dir: Path, model, mid: str, arch: str, prompts_file: Path, ids: list[str] | None,
                  n_decode: int, digest: str) -> list:
    """Inputs for a model without llama.cpp-f32kv goldens: every prompt of `prompts_file` (oracles/prompts.json's
    format; a prompt with a `models` list only for those ids; `ids` restricts to those prompt ids), tokenized with
    the directory's tokenizer (transformers' AutoTokenizer over tokenizer.json: add_special -> add_special_tokens,
    parse_special false -> split_special_tokens; a chat prompt's messages through the tokenizer's chat template,
    add_generation_prompt), then `n_decode` greedy steps of the float32 model through its KV cache (argmax; the
    golden's run is teacher-forced with them, so decode_own_argmax_agreement is 1). Returns (g, tokens, decode
    tokens) with g standing in for the llama.cpp golden's manifest entry."""
    from transformers import AutoTokenizer

    if not (hf_dir / "tokenizer.json").is_file():
        raise SystemExit(f"{hf_dir}: no tokenizer.json: this oracle tokenizes the prompts itself when the model has no "
                         f"{SOURCE_DIR} goldens")
    try:
        spec = json.loads(Path(prompts_file).read_text())
        prompts = spec["prompts"]
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(f"{prompts_file}: not a prompts file (a JSON object with a `prompts` array, oracles/prompts.json): {e}") from e
    chosen = []
    for p in prompts:
        for k in ("id", "kind"):
            if k not in p:
                raise SystemExit(f"{prompts_file}: a prompt without `{k}`: {json.dumps(p)[:200]}")
        if ids is not None and p["id"] not in ids:
            continue
        if ids is None and "models" in p and mid not in p["models"]:
            continue
        chosen.append(p)
    if ids is not None and sorted(ids) != sorted(p["id"] for p in chosen):
        raise SystemExit(f"{prompts_file}: no prompt {sorted(set(ids) - {p['id'] for p in chosen})}")
    if not chosen:
        raise SystemExit(f"{prompts_file}: no prompt for {mid}")
    out = []
    for p in chosen:
        tok = AutoTokenizer.from_pretrained(str(hf_dir), split_special_tokens=not p.get("parse_special", False))
        if p["kind"] == "text":
            toks = tok(p["text"], add_special_tokens=p.get("add_special", True))["input_ids"]
            shown = p["text"]
        elif p["kind"] == "chat":
            if not tok.chat_template:
                raise SystemExit(f"{hf_dir}: prompt {p['id']} is a chat but the tokenizer has no chat template "
                                 f"(choose other prompts: --prompt-ids)")
            toks = tok.apply_chat_template(p["messages"], add_generation_prompt=True, tokenize=True)
            if isinstance(toks, dict) or hasattr(toks, "keys"):
                toks = toks["input_ids"]
            shown = tok.apply_chat_template(p["messages"], add_generation_prompt=True, tokenize=False)
        else:
            raise SystemExit(f"{prompts_file}: prompt {p['id']}: kind {p['kind']!r} (text or chat)")
        toks = [int(t) for t in toks]
        if not toks:
            raise SystemExit(f"{prompts_file}: prompt {p['id']} tokenizes to nothing")
        dec = []
        with torch.no_grad():
            out_ = model(input_ids=torch.tensor([toks]), use_cache=True)
            for _ in range(n_decode):
                t = int(torch.argmax(out_.logits[0, -1]))
                dec.append(t)
                out_ = model(input_ids=torch.tensor([[t]]), past_key_values=out_.past_key_values, use_cache=True)
        g = {
            "model_id": mid, "model_sha256": digest, "model_file": hf_dir.name, "arch": arch, "prompt_id": p["id"],
            "prompt_kind": p["kind"], "prompt": shown, "add_special": p.get("add_special", True),
            "parse_special": p.get("parse_special", False),
            "tokenizer": {"source": "tokenizer.json (transformers AutoTokenizer)", "bos_id": tok.bos_token_id,
                          "eos_id": tok.eos_token_id},
            "continuation": tok.decode(dec),
            "decode_source_tf": "greedy: this oracle's own float32 argmax at each step (no llama.cpp golden of this model)",
            "sampling_tf": "greedy (argmax of the float32 logits), then teacher-forced with those tokens",
        }
        if p["kind"] == "chat":
            g["chat"] = {"messages": p["messages"], "template": "the tokenizer's chat_template", "add_generation_prompt": True}
        out.append((g, np.array(toks, np.int32), np.array(dec, np.int32)))
    return out


def main_hf(args) -> int:
    """The HF route: AutoModelForCausalLM (the stage map's class).from_pretrained(hf_dir, dtype=float32), eager
    attention (lockstep_eager), hooked by the stage map of config.json's model_type (or --stage-map); token ids from
    the model's llama.cpp-f32kv goldens where OUT has them (as the GGUF route), else from --prompts through the
    directory's tokenizer; float64 floor by the same route (to_float64). Writes OUT/<id>/transformers-f32/<prompt>.npz
    and their manifest entries (OUT/manifest.json, created if absent)."""
    hf_dir = args.hf_dir.resolve()
    digest, files = hf_dir_digest(hf_dir)
    cfg_json = json.loads((hf_dir / "config.json").read_text())
    if "model_type" not in cfg_json:
        raise SystemExit(f"{hf_dir}/config.json: no model_type")
    if args.stage_map:
        smap = C.read_stage_map(args.stage_map)
        if smap.model_type != cfg_json["model_type"]:
            raise SystemExit(f"{args.stage_map}: model_type {smap.model_type!r}, {hf_dir}/config.json says {cfg_json['model_type']!r}")
        C.use_stage_map(smap)
    else:
        smap = C.stage_map(cfg_json["model_type"])
    arch = smap.arch
    mid = args.model_id
    if smap.encoder:
        raise SystemExit(f"{mid}: {smap.path} is an encoder's map: encoders are made from their GGUF's Hugging Face copy "
                         f"(--model-id <registered id> --hf-dir DIR without --prompts; README)")
    if mid in MODELS and MODELS[mid]["arch"] != arch:
        raise SystemExit(f"{mid}: the registry's architecture is {MODELS[mid]['arch']}, {hf_dir} is {arch} ({smap.path})")
    mpath = args.out / "manifest.json"
    manifest = json.loads(mpath.read_text()) if mpath.is_file() else {"goldens": []}
    src = sorted((g for g in manifest["goldens"] if g["model_id"] == mid and g["path"].split("/")[1] == SOURCE_DIR),
                 key=lambda g: g["path"])
    t0 = time.time()
    model, _ = C.load_hf(hf_dir, smap, torch.float32)
    lm_class = type(model).__name__
    cfg = model.config
    n_layer = cfg.num_hidden_layers
    all_ids = C.canonical_ids(smap, n_layer)
    # dir_sha256: hf_dir_digest (README "The HF route")
    hf_rec = {"dir_sha256": digest, "files": files, "dir_name": hf_dir.name}
    traps = {"hf_dir": "from_pretrained(hf_dir) (entry's hf_dir): no GGUF loader, no loader fixes"}
    if src:
        if args.prompts:
            raise SystemExit(f"{mid}: {args.out}/manifest.json has {SOURCE_DIR} goldens of it: their token ids are used "
                             f"(drop --prompts, or give another --golden-dir)")
        inputs = []
        for g in src:
            z = np.load(args.out / g["path"])
            dec = z["decode.tokens"] if "decode.tokens" in z.files else np.zeros(0, np.int32)
            inputs.append(({**g, "hf_dir": hf_rec}, z["tokens"].astype(np.int32), dec.astype(np.int32)))
    else:
        if not args.prompts:
            raise SystemExit(f"{mid}: no {SOURCE_DIR} goldens in {args.out}/manifest.json: give --prompts FILE "
                             f"(oracles/prompts.json's format) for this oracle to tokenize")
        ids = args.prompt_ids.split(",") if args.prompt_ids else None
        inputs = [({**g, "hf_dir": hf_rec}, t, d)
                  for g, t, d in prompt_inputs(hf_dir, model, mid, arch, args.prompts, ids, args.n_decode, digest)]
        if mid not in MODELS:
            MODELS[mid] = {"sha256": digest, "arch": arch, "policy": HF_NEW_MODEL_POLICY}
    runs32, vs_llamacpp = {}, {}
    for g, toks, dec in inputs:
        t1 = time.time()
        r = C.run(model, smap, [int(t) for t in toks], [int(t) for t in dec])
        missing = [c for c in all_ids if c != "logits" and c not in r.stages]
        if missing:
            raise SystemExit(f"{g['prompt_id']}: stages not captured: {missing[:5]}")
        where = f"{mid}/{g['prompt_id']}"
        mask_note = check_masks(model, r, where)
        if g is max((i[0] for i in inputs), key=lambda e: len(e.get("prompt", ""))):
            traps["attention_masks"] = mask_note
        if "path" in g:  # a llama.cpp golden of this model: the distance from it, as the GGUF route checks it
            z = np.load(args.out / g["path"])
            lc_only = sorted({k.removeprefix("decode.") for k in z.files if not k.startswith(
                ("logits", "tokens", "decode.tokens", "decode.logits"))} - set(all_ids))
            if lc_only:
                raise SystemExit(f"{where}: llama.cpp's golden has stages this map lacks: {lc_only[:5]}")
            limit = F32_FILE_LIMIT if hf_all_f32(hf_dir) and "synth" in g and "variant" not in g else 3e-2
            vs_llamacpp[g["prompt_id"]] = check_against_llamacpp(arch, r, z, where, limit)
            if smap.has("logits_result"):
                traps["final_softcap"] = check_final_softcap(model, r, z, where, CAP_SEPARATION_FLOAT if limit ==
                                                             F32_FILE_LIMIT else CAP_SEPARATION_QUANT)
            print(f"  vs llama.cpp {g['prompt_id']}: {summary_vs_llamacpp(r, z, n_layer)}", flush=True)
        runs32[g["prompt_id"]] = r
        print(f"  f32 {g['prompt_id']:10s} T={len(toks):3d} N={len(dec)} {time.time() - t1:5.1f}s", flush=True)
    has_v = None
    if any(policy_of(mid, g["prompt_id"]).get("skip_v_eq_k") for g, _, _ in inputs):
        has_v = [getattr(layer.self_attn, "v_proj", None) is not None for layer in model.model.layers]
    del model
    floor = None
    if not args.no_f64:
        model64, notes64 = C.load_hf(hf_dir, smap, torch.float64)
        floor = measure_floor(model64, arch, notes64, inputs, runs32, all_ids)
        del model64
    loader = (f"{smap.cls}.from_pretrained(hf_dir, dtype=torch.float32) (the HF route: no GGUF loader); stage map "
              f"{smap.path.name}")
    entries = goldens_entries(args, mid, arch, inputs, runs32, floor, traps, vs_llamacpp, lm_class, has_v, n_layer,
                              cfg.hidden_size, loader)
    write_manifest(args, arch, mid, entries)
    print(f"wrote {len(entries)} goldens, {sum(e['bytes'] for e in entries) / 2**20:.2f} MiB; {time.time() - t0:.0f}s")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-id", required=True,
                    help="a registered id (models.toml / MODELS) or, with --hf-dir, any id for a new model")
    ap.add_argument("--model", type=Path, help="the GGUF (default: the lockstep cache)")
    ap.add_argument("--hf-dir", type=Path,
                    help="a Hugging Face directory: the HF route (from_pretrained, no GGUF loader); for an encoder "
                    "(bert), its GGUF's Hugging Face copy (default: hf/<id> beside the GGUF; lockstep export-hf)")
    ap.add_argument("--out", "--golden-dir", dest="out", type=Path, default=ROOT / "golden")
    ap.add_argument("--prompts", type=Path, help="HF route, a model without llama.cpp-f32kv goldens: the prompts "
                    "(oracles/prompts.json's format), tokenized with the directory's tokenizer.json")
    ap.add_argument("--prompt-ids", help="HF route with --prompts: only these prompt ids (comma-separated)")
    ap.add_argument("--n-decode", type=int, default=N_DECODE, help="HF route with --prompts: greedy decode steps")
    ap.add_argument("--stage-map", type=Path, help="HF route: this stage map file instead of stage_maps/<model_type>.toml")
    ap.add_argument("--no-f64", action="store_true", help="skip the float64 run (no floor recorded)")
    ap.add_argument("--measure", action="store_true",
                    help="scratch goldens for measuring distances (oracles/yardstick): MEASURE_POLICY; never for golden/")
    args = ap.parse_args()
    global MEASURE
    MEASURE = args.measure
    if MEASURE and args.out.resolve() == (ROOT / "golden").resolve():
        raise SystemExit("--measure writes scratch goldens: give --out a directory other than golden/")
    torch.set_num_threads(int(os.environ.get("LOCKSTEP_TORCH_THREADS", "2")))
    mid = args.model_id
    if args.hf_dir is not None and (args.prompts or args.stage_map or mid not in MODELS
                                    or not C.stage_map(MODELS[mid]["arch"]).encoder):
        return main_hf(args)
    if mid not in MODELS:
        raise SystemExit(f"{mid}: not a registered model ({', '.join(sorted(MODELS))}); a new model needs --hf-dir")
    arch = MODELS[mid]["arch"]
    C.stage_map(arch)  # SystemExit if stage_maps/ has none
    cache = Path(os.environ.get("LOCKSTEP_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lockstep")
    path = (args.model or cache / MODELS[mid].get("default_file", f"models/{mid}.gguf")).resolve()
    if not path.is_file():
        raise SystemExit(f"{path}: no such model file (cargo run --release -p lockstep -- fetch {mid})")
    if sha256_file(path) != MODELS[mid]["sha256"]:
        raise SystemExit(f"{path}: sha256 is not {MODELS[mid]['sha256']}")
    if C.stage_map(arch).encoder:
        return main_encoder(args, mid, arch, path)
    manifest, src = load_source_goldens(args.out, mid)
    src = sorted(src, key=lambda g: g["path"])

    t0 = time.time()
    model, _ = C.load(path, torch.float32)
    lm_class = type(model).__name__  # the capture note names it (a logits_result map: its forward applies the cap)
    from gguf import GGMLQuantizationType, GGUFReader

    all_f32 = all(t.tensor_type == GGMLQuantizationType.F32 for t in GGUFReader(str(path)).tensors)
    limit = F32_FILE_LIMIT if all_f32 else 3e-2
    float_file = all(t.tensor_type.name in FLOAT_FILE_TYPES for t in GGUFReader(str(path)).tensors)
    if MEASURE and MODELS[mid].get("type") in LOW_BIT_TYPES:
        # 2- and 3-bit weights: llama.cpp's 8-bit input rounding alone moves output_norm by NMSE ~0.1 (SmolLM2
        # Q2_K: 0.099 on `json`), the size of a loader trap; the loader is the one the downloaded model's committed
        # goldens validate (same architecture, same `gguf` dequantization), and measuring that distance is the point
        limit = LOW_BIT_MEASURE_LIMIT
    cfg = model.config
    n_layer = cfg.num_hidden_layers
    all_ids = C.canonical_ids(arch, n_layer)
    traps = check_traps(model, arch, path, args.out, src)
    if model.lockstep_load_notes:  # config values tf_capture.load corrected (transformers' GGUF loader got them wrong)
        traps["loader_config_fixes"] = "; ".join(model.lockstep_load_notes)
    print(f"{mid}: loaded in {time.time() - t0:.0f}s; traps checked: {', '.join(traps)}", flush=True)

    runs32: dict[str, C.RunResult] = {}
    vs_llamacpp = {}
    for g in src:
        z = np.load(args.out / g["path"])
        toks = [int(t) for t in z["tokens"]]
        dec = [int(t) for t in z["decode.tokens"]] if "decode.tokens" in z.files else []
        t1 = time.time()
        r = C.run(model, arch, toks, dec)
        missing = [c for c in all_ids if c != "logits" and c not in r.stages]
        if missing:
            raise SystemExit(f"{g['prompt_id']}: stages not captured: {missing[:5]}")
        # every stage llama.cpp's golden holds must have a place in this map, or check_against_llamacpp would skip it
        lc_only = sorted({k.removeprefix("decode.") for k in z.files if not k.startswith(("logits", "tokens", "decode.tokens",
                          "decode.logits"))} - set(all_ids))
        if lc_only:
            raise SystemExit(f"{g['prompt_id']}: llama.cpp's golden has stages this map lacks: {lc_only[:5]}")
        vs_llamacpp[g["prompt_id"]] = check_against_llamacpp(arch, r, z, f"{mid}/{g['prompt_id']}", limit)
        mask_note = check_masks(model, r, f"{mid}/{g['prompt_id']}")
        if arch in ("phi3", "gpt2"):
            traps["fused_views"] = check_fused_views(arch, model, r, f"{mid}/{g['prompt_id']}")
        if arch in ("gemma2", "gemma4"):
            traps["attention_calls"] = check_attention_calls(model, r, f"{mid}/{g['prompt_id']}")
            sep = CAP_SEPARATION_FLOAT if float_file else CAP_SEPARATION_QUANT
            traps["final_softcap"] = check_final_softcap(model, r, z, f"{mid}/{g['prompt_id']}", sep)
        print(f"  vs llama.cpp {g['prompt_id']}: {summary_vs_llamacpp(r, z, n_layer)}", flush=True)
        if g is max(src, key=lambda e: e["n_prompt_tokens"]):
            traps["attention_masks"] = mask_note
        runs32[g["prompt_id"]] = r
        print(f"  f32 {g['prompt_id']:10s} T={len(toks):3d} N={len(dec)} {time.time() - t1:5.1f}s", flush=True)
    has_v = C.gemma4_file(path)["has_attn_v"] if arch == "gemma4" else None
    del model

    inputs = []
    for g in src:
        z = np.load(args.out / g["path"])
        dec = z["decode.tokens"] if "decode.tokens" in z.files else np.zeros(0, np.int32)
        inputs.append((g, z["tokens"].astype(np.int32), dec.astype(np.int32)))
    floor = None
    if not args.no_f64:
        model64, notes64 = C.load(path, torch.float64)
        floor = measure_floor(model64, arch, notes64, inputs, runs32, all_ids)
        del model64
    loader = "AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., dtype=torch.float32); dequantized by gguf"
    entries = goldens_entries(args, mid, arch, inputs, runs32, floor, traps, vs_llamacpp, lm_class, has_v, n_layer,
                              cfg.hidden_size, loader)
    write_manifest(args, arch, mid, entries)
    print(f"wrote {len(entries)} goldens, {sum(e['bytes'] for e in entries) / 2**20:.2f} MiB; {time.time() - t0:.0f}s")
    return 0


NEW_MANIFEST_ABOUT = ("lockstep goldens: one entry per .npz (path relative to this directory), with the model, prompt, "
                      "oracle, settings and arrays it holds; stage_map.<oracle>.<arch> maps each oracle's names to the "
                      "canonical stage ids. Started by oracles/transformers/make_goldens.py --hf-dir.")


def write_manifest(args, arch: str, mid: str, entries: list[dict]) -> None:
    """This model's entries (and the architecture's stage map) into golden/manifest.json, under a lock."""
    import fcntl

    lock = open(Path(os.environ.get("TMPDIR", "/tmp")) / "lockstep-transformers-manifest.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)  # several models may be made at once: read-modify-write under a lock
    if (args.out / "manifest.json").is_file():
        manifest = json.loads((args.out / "manifest.json").read_text())
    else:  # a golden directory of the user's own (the HF route): started here
        manifest = {"about": NEW_MANIFEST_ABOUT, "goldens": []}
    maps = manifest.setdefault("stage_map", {}).setdefault(ORACLE_NAME, {})
    new_map = stage_map_json(arch)
    # rewritten only if it says something else: an unchanged map stays byte for byte as it is
    if arch not in maps or any(maps[arch].get(k) != v for k, v in new_map.items()):
        maps[arch] = new_map
    keep = [g for g in manifest["goldens"] if not (g["oracle"]["name"] == ORACLE_NAME and g["model_id"] == mid)]
    order_ids = {}
    for g in manifest["goldens"]:
        order_ids.setdefault(g["model_id"], len(order_ids))
    goldens = sorted(keep + entries, key=lambda g: (order_ids.get(g["model_id"], len(order_ids)), g["path"]))
    out = {"schema_version": SCHEMA_VERSION, "about": manifest["about"], "stage_map": manifest["stage_map"], "goldens": goldens,
           # the measured cross-oracle distances (oracles/yardstick/record.py) are kept as they are
           **({"cross_oracle": manifest["cross_oracle"]} if "cross_oracle" in manifest else {})}
    tmp = args.out / "manifest.json.tmp"
    tmp.write_text(dump_manifest(out))
    os.replace(tmp, args.out / "manifest.json")
    fcntl.flock(lock, fcntl.LOCK_UN)


if __name__ == "__main__":
    sys.exit(main())
