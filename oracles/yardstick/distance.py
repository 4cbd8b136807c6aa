"""The distance between two oracles' goldens of one model, per prompt, in the gated metrics of a reference cell.

    python distance.py --golden SCRATCH --model-id ID --out distances.json

Reads SCRATCH/<ID>/llama.cpp-f32kv/<prompt>.npz (the reference: what a cell's golden is) and, as the "engine"
compared with it, SCRATCH/<ID>/transformers-f32/<prompt>.npz (the cross-oracle distance) and
SCRATCH/<ID>/llama.cpp-f16kv/<prompt>.npz (llama.cpp against itself with an f16 KV cache: the F16-KV floor); and
with the roles swapped, transformers-f32 as the reference and llama.cpp-f32kv as the engine (cross_oracle_tf_ref:
what a ggml-mode cell shows against a transformers golden); all
made with make_goldens.py --measure (full logits rows at the last prompt position and every decode step, the
residual stream at every position, f32). numpy only.

Each metric is the one lockstep's gate reads for a cell (harness/src/metrics.rs, harness/src/gate/verdict.rs):
- kl_last: KL(P_ref || P_eng) at the last prompt position, nats (log-softmax in float64); kl_mean_full: its mean
  over every full row (the last prompt position and every decode step). A committed golden holds full rows either
  at the last prompt position only (Gemma 3, Qwen2.5, the variants) or there and at every decode step (SmolLM2):
  `kl` = max(kl_last, kl_mean_full) bounds the gate's mean_kl for either storage.
- flips: positions (prompt and decode) where the two top-1 tokens differ, with the reference's margin (its top-1
  logit minus its logit of the engine's top-1; from the reference's top-64 where no full row is stored, the 64th
  value when the engine's choice is outside them, as metrics::logit_position does).
- top5_mean: mean over every position of |top5(ref) & top5(eng)| / 5.
- min_cos_out: smallest cosine of blk.N.out and output_norm rows, prompt and decode positions.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

PAIRS = {"transformers-f32": "cross_oracle", "llama.cpp-f16kv": "f16kv"}
REFERENCE = "llama.cpp-f32kv"
# the same two goldens with the roles swapped: transformers-f32 as the reference, llama.cpp as the engine -- what a
# ggml-mode cell (llama.cpp bit for bit) shows against a transformers golden
SWAPPED = ("transformers-f32", "llama.cpp-f32kv", "cross_oracle_tf_ref")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def log_softmax(row: np.ndarray) -> np.ndarray:
    x = row.astype(np.float64)
    m = np.max(x)
    return x - m - np.log(np.sum(np.exp(x - m)))


def kl(p_row: np.ndarray, q_row: np.ndarray) -> float:
    lp, lq = log_softmax(p_row), log_softmax(q_row)
    return max(float(np.sum(np.exp(lp) * (lp - lq))), 0.0)


def top_ids(row: np.ndarray, k: int) -> list[int]:
    """metrics::top_k: descending by value, ties by the smaller id."""
    order = np.lexsort((np.arange(row.size), -row.astype(np.float64)))
    return [int(i) for i in order[:k]]


class Logits:
    """One golden's logits per position: full rows where stored, top-64 elsewhere."""

    def __init__(self, z):
        self.T = int(z["tokens"].shape[0])
        self.full: dict[int, np.ndarray] = {}
        for i, pos in enumerate(z["logits_positions"]):
            self.full[int(pos)] = z["logits"][i].astype(np.float32)
        self.topk_ids = {p: z["logits_topk_ids"][p] for p in range(self.T)}
        self.topk = {p: z["logits_topk"][p].astype(np.float32) for p in range(self.T)}
        n_dec = int(z["decode.tokens"].shape[0])
        if "decode.logits" in z.files:
            for i in range(n_dec):
                self.full[self.T + i] = z["decode.logits"][i].astype(np.float32)
        else:
            for i in range(n_dec):
                self.topk_ids[self.T + i] = z["logits_decode_topk_ids"][i]
                self.topk[self.T + i] = z["logits_decode_topk"][i].astype(np.float32)
        self.n = self.T + n_dec

    def top10(self, p: int) -> list[int]:
        if p in self.full:
            return top_ids(self.full[p], 10)
        return [int(i) for i in self.topk_ids[p][:10]]

    def margin(self, p: int, eng_top: int) -> float:
        if p in self.full:
            r = self.full[p]
            return float(r[top_ids(r, 1)[0]]) - float(r[eng_top])
        ids, vals = list(self.topk_ids[p]), self.topk[p]
        j = ids.index(eng_top) if eng_top in ids else len(ids) - 1
        return float(vals[0]) - float(vals[j])


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64).reshape(a.shape[0], -1)
    b = b.astype(np.float64).reshape(b.shape[0], -1)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    dot = np.sum(a * b, axis=1)
    out = np.where((na == 0) & (nb == 0), 1.0, dot / np.where(na * nb == 0, 1.0, na * nb))
    return np.where((na == 0) ^ (nb == 0), 0.0, out)


def residual_ids(files: list[str]) -> list[str]:
    out = []
    for f in files:
        base = f.removeprefix("decode.")
        if base == "output_norm" or (base.startswith("blk.") and base.endswith(".out")):
            out.append(f)
    return out


def distance(ref_z, eng_z) -> dict:
    ref, eng = Logits(ref_z), Logits(eng_z)
    if (ref.T, ref.n) != (eng.T, eng.n) or not np.array_equal(ref_z["tokens"], eng_z["tokens"]):
        raise SystemExit("the two goldens are not on the same tokens")
    if not np.array_equal(ref_z["decode.tokens"], eng_z["decode.tokens"]):
        raise SystemExit("the two goldens are not on the same decode tokens")
    full = sorted(set(ref.full) & set(eng.full))
    last = ref.T - 1
    if last not in full:
        raise SystemExit("no full logits row at the last prompt position on both sides (make_goldens.py --measure)")
    kls = {p: kl(ref.full[p], eng.full[p]) for p in full}
    flips, top5 = [], []
    for p in range(ref.n):
        r10, e10 = ref.top10(p), eng.top10(p)
        top5.append(len(set(r10[:5]) & set(e10[:5])) / 5.0)
        if r10[0] != e10[0]:
            flips.append([p, round(ref.margin(p, e10[0]), 6)])
    common = sorted(set(residual_ids(ref_z.files)) & set(residual_ids(eng_z.files)))
    if not common:
        raise SystemExit("no residual-stream stage (blk.N.out, output_norm) on both sides")
    min_cos, at = 2.0, ""
    for c in common:
        cos = row_cosines(ref_z[c], eng_z[c])
        i = int(np.argmin(cos))
        if cos[i] < min_cos:
            min_cos, at = float(cos[i]), f"{c}@{i}"
    kl_mean = float(np.mean(list(kls.values())))
    return {
        "positions": ref.n,
        "full_rows": len(full),
        "kl_last": kls[last],
        "kl_mean_full": kl_mean,
        "kl": max(kls[last], kl_mean),
        "flips": flips,
        "max_flip_margin": max((m for _, m in flips), default=0.0),
        "top5_mean": float(np.mean(top5)),
        "min_cos_out": min_cos,
        "min_cos_at": at,
        "residual_stages": len(common),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--golden", type=Path, required=True, help="the scratch golden directory (make_goldens.py --measure)")
    ap.add_argument("--model-id", required=True)
    ap.add_argument("--out", type=Path, required=True, help="where to write the per-prompt distances (JSON)")
    args = ap.parse_args()
    ref_dir = args.golden / args.model_id / REFERENCE
    prompts = sorted(p.stem for p in ref_dir.glob("*.npz"))
    if not prompts:
        raise SystemExit(f"{ref_dir}: no goldens")
    rows = []
    for pid in prompts:
        ref_path = ref_dir / f"{pid}.npz"
        ref_z = np.load(ref_path)
        row = {"prompt_id": pid, "n_prompt_tokens": int(ref_z["tokens"].shape[0]),
               "goldens_sha256": {REFERENCE: sha256_file(ref_path)}}
        for eng_name, key in PAIRS.items():
            eng_path = args.golden / args.model_id / eng_name / f"{pid}.npz"
            if not eng_path.is_file():
                raise SystemExit(f"{eng_path}: missing (both oracles must have every prompt)")
            row[key] = distance(ref_z, np.load(eng_path))
            row["goldens_sha256"][eng_name] = sha256_file(eng_path)
        ref_name, eng_name, key = SWAPPED
        row[key] = distance(np.load(args.golden / args.model_id / ref_name / f"{pid}.npz"), ref_z)
        rows.append(row)
        c, f = row["cross_oracle"], row["f16kv"]
        print(f"{args.model_id:28s} {pid:12s} T={row['n_prompt_tokens']:3d}  cross-oracle KL {c['kl']:.3g} flips "
              f"{len(c['flips'])} (max margin {c['max_flip_margin']:.3f}) top5 {c['top5_mean']:.3f} cos {c['min_cos_out']:.5f}"
              f"  | f16kv KL {f['kl']:.3g} flips {len(f['flips'])} ({f['max_flip_margin']:.3f}) top5 {f['top5_mean']:.3f} "
              f"cos {f['min_cos_out']:.5f}", flush=True)
    args.out.write_text(json.dumps({"model_id": args.model_id, "prompts": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
