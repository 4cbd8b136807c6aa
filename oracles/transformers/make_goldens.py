"""Make the transformers-f32 goldens: transformers (PyTorch, float32, eager attention) on the same GGUF file as
llama.cpp, dequantized by transformers' GGUF loader (the `gguf` package), fed the SAME token ids as the
llama.cpp-f32kv goldens (their `tokens` and teacher-forced `decode.tokens`). Also runs the model in float64
(transformers' forced-float32 spots patched, tf_capture.py) and records the float32-vs-float64 floor per stage
kind. oracles/transformers/README.md documents everything.

    python make_goldens.py --model-id smollm2-135m-q4_1 [--model PATH] [--out golden] [--no-f64]
    python make_goldens.py --model-id synth-qwen3-q4_k --model /path/to/synth-qwen3-q4_k.gguf

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
# gemma4 (synth-gemma4: layer 1 has heads of 128, so its q/q_norm/q_rope/attn_out rows are 512 wide and k/v/k_norm/
# k_rope 256): SYNTH_POLICY gives 283610 B for the base golden, 431519 B with the six variants -- over the 0.4 MiB
# (419430 B) this architecture may add. Trimmed, least informative first:
# - blk.N.v on the layers without attn_v (V = K): the same array as blk.N.k (the same node in llama.cpp's graph, the
#   same k_proj output here; check_gemma4 asserts V = K on exactly those layers) -- nothing lost (5.3 KB);
# - output_norm at the prompt positions and at the decode steps: lm_head's input, gated through the f32 logits
#   (top-64 at every prompt position, the full rows at T-1 and at every decode step); a fault there is localized to
#   `logits`, the next stage (9.2 KB).
# Measured in README "Budget".
SYNTH_POLICY_GEMMA4 = {
    "default": {"prefill": ("*",), "decode": ("embed", "blk.{N}.out"), "exact": ("blk.{N}.out",), "decode_exact": (),
                "f16_ok": (), "decode_logits": "full", "prefill_skip": ("output_norm",), "skip_v_eq_k": True},
}
SYNTH_POLICY_BY_ARCH = {"gemma4": SYNTH_POLICY_GEMMA4}
SYNTH_VARIANT_POLICY = {
    "default": {"prefill": ("blk.{N}.out",), "decode": (), "exact": (), "f16_ok": (), "decode_logits": "full"},
}


def load_registry(models_toml: Path = ROOT / "models.toml") -> dict:
    """The [[synth]] entries of models.toml and the [[variants]] made from them, as MODELS entries (synth models
    first, then their variants, in registry order): sha256, architecture, storage policy, and what they are."""
    import tomllib

    reg = tomllib.loads(models_toml.read_text())
    synth = {m["id"]: m for m in reg.get("synth", [])}
    out = {}
    for m in synth.values():
        out[m["id"]] = {"sha256": m["sha256"], "arch": m["arch"], "policy": SYNTH_POLICY_BY_ARCH.get(m["arch"], SYNTH_POLICY),
                        "default_file": f"models/{m['id']}.gguf"}
    for v in reg.get("variants", []):
        if v["source"] in synth:
            out[v["id"]] = {"sha256": v["sha256"], "arch": synth[v["source"]]["arch"], "policy": SYNTH_VARIANT_POLICY,
                            "default_file": f"variants/{v['source']}/{v['source']}-{v['type']}.gguf"}
    return out


MODELS.update(load_registry())


def policy_of(mid: str, pid: str) -> dict:
    policies = MODELS[mid].get("policy", POLICY)
    return policies.get(pid, policies["default"])


def full_decode_logits(mid: str, pid: str) -> bool:
    return (mid, pid) in FULL_DECODE_LOGITS or policy_of(mid, pid).get("decode_logits") == "full"


def prefill_skip(pol: dict, n_layer: int, ids: list[str], gguf: Path) -> set[str]:
    """The prefill ids a policy leaves out of a golden: "prefill_skip" (patterns), and with "skip_v_eq_k" (gemma4)
    blk.N.v of every layer without attn_v, whose V is the K projection (the same array as blk.N.k)."""
    skip = set(expand(pol.get("prefill_skip", ()), n_layer, ids))
    if pol.get("skip_v_eq_k"):
        skip |= {f"blk.{il}.v" for il, has in enumerate(C.gemma4_file(gguf)["has_attn_v"]) if not has}
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
        if "{N}" in p:
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


def kind_of(cid: str) -> str:
    parts = cid.split(".")
    return ".".join(parts[2:]) if parts[0] == "blk" else cid


def dump_manifest(manifest: dict) -> str:
    """The llama.cpp oracle's layout: one line per array spec and per stage-map row."""
    compact: dict[str, str] = {}

    def mark(obj) -> str:
        key = f"@@compact{len(compact)}@@"
        compact[key] = json.dumps(obj, ensure_ascii=False)
        return key

    doc = json.loads(json.dumps(manifest))
    for per_arch in doc.get("stage_map", {}).values():
        for sm in per_arch.values():
            sm["stages"] = [mark(x) for x in sm.get("stages", [])]
            if "observed_nodes" in sm:
                sm["observed_nodes"] = [mark(x) for x in sm.get("observed_nodes", [])]
    for g in doc.get("goldens", []):
        g["arrays"] = {k: mark(v) for k, v in g.get("arrays", {}).items()}
    text = json.dumps(doc, indent=1, ensure_ascii=False)
    for key, value in compact.items():
        text = text.replace(f'"{key}"', value, 1)
    return text + "\n"


# The causal-LM class whose forward applies the final logit soft-capping after lm_head (stage maps with a "result"
# row read the logits from its output).
CAUSAL_LM_CLASS = {"gemma2": "Gemma2ForCausalLM", "gemma4": "Gemma4ForCausalLM"}


def stage_map_json(arch: str) -> dict:
    rows = []
    for cid, path, kind in C.ARCH_STAGES[arch]:
        op = {"out": "forward_hook", "in": "forward_pre_hook", "attn": "attention_function", "result": "model_output",
              "v_or_k": "forward_hook"}[kind]
        rows.append({"oracle_name": path, "op": op, "canonical": cid})
    about = (
        "transformers module (path in the model, {N} = layer) -> canonical stage id. op: forward_hook = the "
        "module's output, forward_pre_hook = its input, attention_function = the registered attention function "
        "lockstep_eager (Q and K after RoPE; K: this step's rows only). Shapes [T, width], the batch dimension "
        "dropped; per-head tensors flattened head-major. llama only: q, k, q_rope, k_rope are reordered from "
        "transformers' RoPE-halves layout to the GGUF file's interleaved layout (llama.cpp's), so that every "
        "array means what the llama.cpp golden's does. oracles/transformers/README.md."
    )
    if any(kind == "result" for _, _, kind in C.ARCH_STAGES[arch]):
        about += (
            f" model_output = the model's forward output ({CAUSAL_LM_CLASS[arch]} applies the final logit soft-capping after "
            "lm_head, so logits are read there, as llama.cpp's result_output is after its final cap)."
        )
    if any(kind == "v_or_k" for _, _, kind in C.ARCH_STAGES[arch]):
        about += (
            " gemma4 blk.N.v: v_proj's output, or k_proj's on the full-attention layers that have no v_proj "
            "(attention_k_eq_v: V = the K projection, as llama.cpp's Vcur = Kcur there)."
        )
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


def check_final_softcap(model, res: C.RunResult, src_npz, where: str) -> str:
    """gemma2: the stored logits are the model's output, cap * tanh(lm_head / cap) with the file's final cap,
    recomputed here bit for bit from lm_head's output (Gemma2ForCausalLM.forward's ops, in its order); and
    llama.cpp's logits must be far closer to them than to the uncapped lm_head output (>= 10x in NMSE), i.e. the
    comparison with llama.cpp sees the cap (on synth-gemma2 the cap moves the logits by NMSE ~2e-2 only: below
    check_against_llamacpp's generic 3e-2)."""
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
    if not capped * 10 <= uncapped:
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
    if any(kind == "result" for _, _, kind in C.ARCH_STAGES[arch]):
        # logits read from the model's output (gemma2: after the final soft-capping, which no other stage covers):
        # llama.cpp's full rows (last prompt position; decode.logits) and its top-64 values at every prompt
        # position (our logits at its top-64 ids), as one NMSE
        worst["logits"] = logits_vs_llamacpp(res.logits, res.decode_logits, src_npz)
    for kind, n in worst.items():
        if not n < limit:
            raise SystemExit(f"{where}: stage {kind} differs from llama.cpp by NMSE {n:.3g} (limit {limit:g}): a loader trap? (README)")
    return worst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-id", required=True, choices=sorted(MODELS))
    ap.add_argument("--model", type=Path, help="the GGUF (default: the lockstep cache)")
    ap.add_argument("--out", type=Path, default=ROOT / "golden")
    ap.add_argument("--no-f64", action="store_true", help="skip the float64 run (no floor recorded)")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("LOCKSTEP_TORCH_THREADS", "2")))
    mid = args.model_id
    arch = MODELS[mid]["arch"]
    if arch not in C.ARCH_STAGES:
        raise SystemExit(f"{mid}: architecture {arch} has no stage map here (tf_capture.ARCH_STAGES): not supported yet")
    cache = Path(os.environ.get("LOCKSTEP_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lockstep")
    path = (args.model or cache / MODELS[mid].get("default_file", f"models/{mid}.gguf")).resolve()
    if not path.is_file():
        raise SystemExit(f"{path}: no such model file (cargo run --release -p lockstep -- fetch {mid})")
    if sha256_file(path) != MODELS[mid]["sha256"]:
        raise SystemExit(f"{path}: sha256 is not {MODELS[mid]['sha256']}")
    manifest, src = load_source_goldens(args.out, mid)
    src = sorted(src, key=lambda g: g["path"])

    t0 = time.time()
    model, _ = C.load(path, torch.float32)
    from gguf import GGMLQuantizationType, GGUFReader

    all_f32 = all(t.tensor_type == GGMLQuantizationType.F32 for t in GGUFReader(str(path)).tensors)
    limit = F32_FILE_LIMIT if all_f32 else 3e-2
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
        vs_llamacpp[g["prompt_id"]] = check_against_llamacpp(arch, r, z, f"{mid}/{g['prompt_id']}", limit)
        mask_note = check_masks(model, r, f"{mid}/{g['prompt_id']}")
        if arch in ("gemma2", "gemma4"):
            traps["attention_calls"] = check_attention_calls(model, r, f"{mid}/{g['prompt_id']}")
            traps["final_softcap"] = check_final_softcap(model, r, z, f"{mid}/{g['prompt_id']}")
        print(f"  vs llama.cpp {g['prompt_id']}: {summary_vs_llamacpp(r, z, n_layer)}", flush=True)
        if g is max(src, key=lambda e: e["n_prompt_tokens"]):
            traps["attention_masks"] = mask_note
        runs32[g["prompt_id"]] = r
        print(f"  f32 {g['prompt_id']:10s} T={len(toks):3d} N={len(dec)} {time.time() - t1:5.1f}s", flush=True)
    del model

    floor = None
    if not args.no_f64:
        model64, notes64 = C.load(path, torch.float64)
        per_kind: dict[str, list[float]] = {}
        kl_rows = []
        for g in src:
            z = np.load(args.out / g["path"])
            toks = [int(t) for t in z["tokens"]]
            dec = [int(t) for t in z["decode.tokens"]] if "decode.tokens" in z.files else []
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
        del model64
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

    # --- write ---------------------------------------------------------------------------------------------
    d = args.out / mid / DIR_NAME
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    host = C.versions() | host_info()
    entries = []
    for g in src:
        pid = g["prompt_id"]
        r = runs32[pid]
        z = np.load(args.out / g["path"])
        pol = policy_of(mid, pid)
        full_decode = full_decode_logits(mid, pid)
        T = r.logits.shape[0]
        toks = z["tokens"].astype(np.int32)
        dec_toks = z["decode.tokens"].astype(np.int32)
        positions = np.array([T - 1], np.int32)
        order = np.argsort(-r.logits, axis=1, kind="stable")[:, :TOPK].astype(np.int32)
        exact = exact_ids(pol, n_layer, all_ids)
        exact_dec = exact_ids(pol, n_layer, all_ids, decode=True)
        raw = [("tokens", toks, False)]
        skip = prefill_skip(pol, n_layer, all_ids, path)
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
                "loader": "AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., dtype=torch.float32); dequantized by gguf",
            },
            "kv_type": "f32",
            "settings": {
                "n_threads": torch.get_num_threads(),
                "seed": None,
                "cache": "transformers DynamicCache (float32)",
                "prefill": "one forward call over the prompt",
                "decode": "one forward call per token through the cache",
                "sampling": "none: teacher-forced with the llama.cpp-f32kv golden's decode.tokens",
            },
            "n_prompt_tokens": T,
            "n_decode_steps": int(len(dec_toks)),
            "decode_source": f"teacher-forced with the {SOURCE_DIR} golden's decode.tokens ({g['path']}): the same token ids",
            "continuation": g.get("continuation", ""),
            "decode_own_argmax_agreement": float(np.mean(own_argmax == dec_toks)) if len(dec_toks) else 1.0,
            "capture_changes_logits": 0.0,
            "capture_note": "forward hooks only read tensors; the logits are "
            + (f"the model's output logits ({CAUSAL_LM_CLASS.get(arch)}: lm_head, then the final soft-capping)"
               if any(k == "result" for _, _, k in C.ARCH_STAGES[arch]) else "lm_head's output itself"),
            "stages_prefill": list(pol["prefill"]),
            **({"stages_prefill_skipped": sorted(skip, key=all_ids.index)} if skip else {}),
            "stages_decode": list(pol["decode"]),
            "stages_exact_f32": list(pol["exact"]),
            "stages_f16_allowed": list(pol["f16_ok"]),
            **({"stages_decode_exact_f32": list(pol["decode_exact"])} if "decode_exact" in pol else {}),
            "logits_storage": "logits: f32 row at the last prompt position; logits_topk f32; decode: "
            + ("full decode.logits [N, V] f32" if full_decode else "logits_decode_topk{,_ids} [N, 64] (no full rows)"),
            "model_hparams": {"n_layer": n_layer, "n_embd": cfg.hidden_size, "n_vocab": int(r.logits.shape[1])},
            "loader_checks": traps,
            "vs_llamacpp_f32kv_max_nmse": vs_llamacpp[pid],
            "arrays": listed,
        }
        if "chat" in g:
            entry["chat"] = g["chat"]
        for key in ("synth", "variant"):  # what a seeded model / variant is, as the llama.cpp golden records it
            if key in g:
                entry[key] = g[key]
        if floor is not None:
            entry["floor_f32_vs_f64"] = floor
        entries.append(entry)
        print(f"{rel.as_posix():55s} {entry['bytes'] / 2**20:6.2f} MiB", flush=True)

    import fcntl

    lock = open(Path(os.environ.get("TMPDIR", "/tmp")) / "lockstep-transformers-manifest.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)  # several models may be made at once: read-modify-write under a lock
    manifest = json.loads((args.out / "manifest.json").read_text())
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
    out = {"schema_version": SCHEMA_VERSION, "about": manifest["about"], "stage_map": manifest["stage_map"], "goldens": goldens}
    tmp = args.out / "manifest.json.tmp"
    tmp.write_text(dump_manifest(out))
    os.replace(tmp, args.out / "manifest.json")
    fcntl.flock(lock, fcntl.LOCK_UN)
    print(f"wrote {len(entries)} goldens, {sum(e['bytes'] for e in entries) / 2**20:.2f} MiB; {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
