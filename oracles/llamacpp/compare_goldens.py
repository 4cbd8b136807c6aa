"""Compare two golden directories array by array (reproducibility of oracles/regenerate.sh), or
print the F16-KV vs F32-KV noise floor recorded in a manifest.

    python compare_goldens.py DIR_A DIR_B        # every golden of A's manifest against B's
    python compare_goldens.py --noise-floor DIR  # the vs_f32kv metrics of DIR/manifest.json
    python compare_goldens.py --agreement DIR_A DIR_B
        # the logits of the goldens A and B both list, A's against B's (e.g. the same llama.cpp built for AVX2 and for AVX-512):
        # KL(A || B) at the last prompt position, top-1 agreement over the prompt positions, the decode
        # steps both take alike (teacher forcing uses each golden's own greedy tokens, so the steps are
        # compared only up to the first token that differs) and top-5 overlap over all compared positions

The comparison reports, per golden, whether the file's sha256 is the same, the largest |A - B| over
its float arrays (computed in float64 on the stored values) and, for integer arrays (token ids,
top-k ids — identifiers, whose differences mean nothing), how many elements differ; it exits 1 if any
array differs in name, shape, dtype or value.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def compare(a_dir: Path, b_dir: Path) -> int:
    ma = json.loads((a_dir / "manifest.json").read_text())
    mb = json.loads((b_dir / "manifest.json").read_text())
    b_by_path = {g["path"]: g for g in mb["goldens"]}
    worst = 0.0
    bad = 0
    for g in ma["goldens"]:
        gb = b_by_path.get(g["path"])
        if gb is None:
            print(f"{g['path']}: not in {b_dir}/manifest.json")
            bad += 1
            continue
        with np.load(a_dir / g["path"]) as za, np.load(b_dir / g["path"]) as zb:
            names_a, names_b = set(za.files), set(zb.files)
            if names_a != names_b:
                print(f"{g['path']}: arrays differ: only in A {sorted(names_a - names_b)}, only in B {sorted(names_b - names_a)}")
                bad += 1
                continue
            diffs = {}
            id_diffs = {}
            for n in sorted(names_a):
                x, y = za[n], zb[n]
                if x.shape != y.shape or x.dtype != y.dtype:
                    print(f"{g['path']}: {n}: {x.shape} {x.dtype} vs {y.shape} {y.dtype}")
                    bad += 1
                    continue
                if np.issubdtype(x.dtype, np.integer):
                    k = int(np.count_nonzero(x != y))
                    if k:
                        id_diffs[n] = k
                    continue
                d = float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))) if x.size else 0.0
                if d != 0.0 or not np.array_equal(x, y):
                    diffs[n] = d
            same_sha = g["sha256"] == gb["sha256"]
            m = max(diffs.values(), default=0.0)
            worst = max(worst, m)
            bad += bool(diffs or id_diffs)
            print(
                f"{g['path']:55s} arrays={len(names_a):4d} sha256 {'same' if same_sha else 'DIFFERS'}  "
                f"max|Δ|={m:.3g}" + (f"  differing: {sorted(diffs)[:8]}" if diffs else "")
                + (f"  integer arrays with differing ids: {id_diffs}" if id_diffs else "")
            )
    print(f"max |Δ| over all float arrays: {worst:.6g}; goldens with differences: {bad}")
    return 1 if bad else 0


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def _decode_top_ids(z) -> np.ndarray:
    """Decode steps' top-64 token ids: stored (``logits_decode_topk_ids``) or from the full rows."""
    if "logits_decode_topk_ids" in z.files:
        return z["logits_decode_topk_ids"]
    return np.argsort(-z["decode.logits"], axis=1, kind="stable")[:, :64]


def agreement(a_dir: Path, b_dir: Path) -> int:
    ma = json.loads((a_dir / "manifest.json").read_text())
    mb = json.loads((b_dir / "manifest.json").read_text())
    b_paths = {g["path"] for g in mb["goldens"]}
    print("| golden | KL last prompt pos (nats) | prompt top-1 | decode steps alike | decode top-1 | top-5 mean |")
    print("|---|--:|--:|--:|--:|--:|")
    bad = 0
    common = [g for g in ma["goldens"] if g["path"] in b_paths]
    if not common:
        print(f"no golden of {a_dir} is in {b_dir}/manifest.json", file=sys.stderr)
        return 1
    for g in common:
        with np.load(a_dir / g["path"]) as za, np.load(b_dir / g["path"]) as zb:
            if not np.array_equal(za["tokens"], zb["tokens"]):
                print(f"{g['path']}: the prompts' tokens differ", file=sys.stderr)
                bad += 1
                continue
            la, lb = _log_softmax(za["logits"][-1]), _log_softmax(zb["logits"][-1])
            kl = float((np.exp(la) * (la - lb)).sum())
            pa, pb = za["logits_topk_ids"], zb["logits_topk_ids"]
            da, db = za["decode.tokens"], zb["decode.tokens"]
            n = len(da)
            alike = next((i for i in range(n) if da[i] != db[i]), n)
            # step i's logits come after token i: they are comparable while tokens 0..i agree
            steps = min(alike + 1, n)
            ka, kb = _decode_top_ids(za)[:steps], _decode_top_ids(zb)[:steps]
            top1_p = int((pa[:, 0] == pb[:, 0]).sum())
            top1_d = int((ka[:, 0] == kb[:, 0]).sum())
            rows = list(zip(np.concatenate([pa, ka]), np.concatenate([pb, kb])))
            top5 = float(np.mean([len(set(x[:5]) & set(y[:5])) / 5 for x, y in rows]))
            print(
                f"| {g['path']} | {kl:.3e} | {top1_p}/{len(pa)} | {alike}/{n} | {top1_d}/{steps} | {top5:.3f} |"
            )
    return 1 if bad else 0


def noise_floor(d: Path) -> int:
    m = json.loads((d / "manifest.json").read_text())
    print("| model | prompt | T | KL last pos (nats) | mean KL decode | top-1 agreement | min cos blk.N.out prefill | min cos blk.N.out decode |")
    print("|---|---|---|---|---|---|---|---|")
    for g in m["goldens"]:
        v = g.get("vs_f32kv")
        if not v:
            continue
        print(
            f"| {g['model_id']} | {g['prompt_id']} | {g['n_prompt_tokens']} | {v['kl_last_prompt_position']:.3g} | "
            f"{v['kl_mean_decode']:.3g} | {v['top1_agreement'] * v['top1_positions']:.0f}/{v['top1_positions']} "
            f"({v['top1_agreement']:.1%}) | {v['min_cosine_blk_out_prefill']:.5f} | {v['min_cosine_blk_out_decode']:.5f} |"
        )
    return 0


def main() -> int:
    args = sys.argv[1:]
    if len(args) == 3 and args[0] == "--agreement":
        return agreement(Path(args[1]), Path(args[2]))
    if len(args) == 2 and args[0] == "--noise-floor":
        return noise_floor(Path(args[1]))
    if len(args) == 2:
        return compare(Path(args[0]), Path(args[1]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
