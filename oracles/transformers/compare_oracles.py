"""The cross-oracle floor: llama.cpp-f32kv goldens vs transformers-f32 goldens of the same model and prompt
(same token ids), per stage kind. Reads only the committed goldens (numpy; no torch, no llama.cpp).

    python oracles/transformers/compare_oracles.py [--golden golden] [--markdown]
    python oracles/transformers/compare_oracles.py --floors   # the f32-vs-f64 floor table (floors.md)

Per model and stage kind (the canonical id without `blk.N.`), over every array both goldens hold (prefill
rows and decode steps, every prompt, every layer): NMSE per row, sum (tf - lc)^2 / sum lc^2 (reference =
transformers, the f32 implementation on the exact dequantized weights), its median and max; the smallest row
cosine. At the logits: KL(P_tf || P_lc) at every full row both hold (the last prompt position; decode rows
where both store them), top-1 agreement at every prompt position (logits_topk_ids) and decode step.
The distance is llama.cpp's own arithmetic (8-bit Q8_1/Q8_K rounding of every matmul input, f16 in places)
against an f32 computation: the number a porter needs to tell a bug from a difference of references.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent.parent


def kind_of(cid: str) -> str:
    parts = cid.split(".")
    return ".".join(parts[2:]) if parts[0] == "blk" else cid


def row_nmse(a: np.ndarray, ref: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64)
    ref = ref.astype(np.float64)
    den = np.sum(ref**2, axis=-1)
    num = np.sum((a - ref) ** 2, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den == 0, np.where(num == 0, 0.0, np.inf), num / den)


def row_cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    na, nb = np.linalg.norm(a, axis=-1), np.linalg.norm(b, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((na == 0) & (nb == 0), 1.0, np.sum(a * b, axis=-1) / (na * nb))


def kl(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    def sm(z):
        z = z.astype(np.float64)
        z = z - z.max(axis=-1, keepdims=True)
        p = np.exp(z)
        return p / p.sum(axis=-1, keepdims=True)

    p, q = sm(p_logits), sm(q_logits)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(p > 0, p * (np.log(p) - np.log(q)), 0.0).sum(axis=-1)


def compare(golden: Path) -> dict:
    manifest = json.loads((golden / "manifest.json").read_text())
    tf = [g for g in manifest["goldens"] if g["oracle"]["name"] == "transformers"]
    out: dict = {}
    for g in tf:
        model, pid = g["model_id"], g["prompt_id"]
        lc_path = golden / model / "llama.cpp-f32kv" / f"{pid}.npz"
        a = np.load(golden / g["path"])
        b = np.load(lc_path)
        if not (np.array_equal(a["tokens"], b["tokens"]) and np.array_equal(a["decode.tokens"], b["decode.tokens"])):
            raise SystemExit(f"{g['path']}: not the token ids of {lc_path}")
        m = out.setdefault(model, {"kinds": {}, "kl": [], "top1": [], "kl_last_by_prompt": {}})
        for name in a.files:
            if name in ("tokens", "decode.tokens", "logits_positions") or name.startswith("logits") or name == "decode.logits":
                continue
            if name not in b.files:
                continue
            k = kind_of(name.removeprefix("decode."))
            d = m["kinds"].setdefault(k, {"nmse": [], "cos": []})
            d["nmse"].extend(row_nmse(b[name], a[name]).tolist())
            d["cos"].extend(row_cos(b[name], a[name]).tolist())
        k_last = kl(a["logits"], b["logits"])
        m["kl"].extend(k_last.tolist())
        m["kl_last_by_prompt"][pid] = float(k_last[-1])
        rows = k_last.tolist()
        if "decode.logits" in a.files and "decode.logits" in b.files:
            rows += kl(a["decode.logits"], b["decode.logits"]).tolist()
            m["kl"].extend(rows[len(k_last):])
        cos_out = [float(np.min(row_cos(b[n], a[n]))) for n in a.files if n in b.files
                   and kind_of(n.removeprefix("decode.")) in ("out", "output_norm")]
        pp = m.setdefault("per_prompt", {}).setdefault(pid, {})
        pp["kl_mean_full_rows"] = float(np.mean(rows))
        pp["min_cosine_out"] = min(cos_out) if cos_out else None
        m["top1"].extend((a["logits_topk_ids"][:, 0] == b["logits_topk_ids"][:, 0]).tolist())
        da = a["decode.logits"].argmax(1) if "decode.logits" in a.files else a["logits_decode_topk_ids"][:, 0]
        db = b["decode.logits"].argmax(1) if "decode.logits" in b.files else b["logits_decode_topk_ids"][:, 0]
        m["top1"].extend((da == db).tolist())
        # top-1 flips with transformers' margin (its logit of its top-1 minus its logit of llama.cpp's top-1:
        # the margin a cell judged against the transformers golden sees), and top-5 overlap
        ids_a = np.vstack([a["logits_topk_ids"], a["logits_decode_topk_ids"] if "logits_decode_topk_ids" in a.files
                           else np.argsort(-a["decode.logits"], axis=1, kind="stable")[:, :64]])
        val_a = np.vstack([a["logits_topk"], a["logits_decode_topk"] if "logits_decode_topk" in a.files
                           else np.take_along_axis(a["decode.logits"], ids_a[len(a["logits_topk_ids"]):], axis=1)])
        ids_b = np.vstack([b["logits_topk_ids"], b["logits_decode_topk_ids"] if "logits_decode_topk_ids" in b.files
                           else np.argsort(-b["decode.logits"], axis=1, kind="stable")[:, :64]])
        t5 = []
        for r in range(len(ids_a)):
            t5.append(len(set(ids_a[r, :5]) & set(ids_b[r, :5])) / 5)
            m.setdefault("top5", []).append(t5[-1])
            if ids_a[r, 0] != ids_b[r, 0]:
                hit = np.nonzero(ids_a[r] == ids_b[r, 0])[0]
                margin = float(val_a[r, 0] - val_a[r, hit[0]]) if len(hit) else float("inf")
                m.setdefault("flips", []).append({"prompt": pid, "row": r, "tf_margin": margin})
        pp["top5_mean"] = float(np.mean(t5))
    # recorded at generation time from the full captures (every stage of `prose`, which the llama.cpp goldens
    # store in full): NMSE of the whole array, max over layers, per stage kind
    recorded = {}
    for g in tf:
        v = g.get("vs_llamacpp_f32kv_max_nmse")
        if v and g["prompt_id"] == "prose":
            recorded[g["model_id"]] = v
    res = {}
    for model, m in out.items():
        res[model] = {
            "kinds": {
                k: {
                    "nmse_median": float(np.median(v["nmse"])),
                    "nmse_max": float(np.max(v["nmse"])),
                    "min_cosine": float(np.min(v["cos"])),
                    "rows": len(v["nmse"]),
                }
                for k, v in m["kinds"].items()
            },
            "kl_median": float(np.median(m["kl"])),
            "kl_max": float(np.max(m["kl"])),
            "kl_rows": len(m["kl"]),
            "kl_last_by_prompt": m["kl_last_by_prompt"],
            "top1_agreement": float(np.mean(m["top1"])),
            "top5_mean": float(np.mean(m["top5"])),
            "flips": m.get("flips", []),
            "per_prompt": m["per_prompt"],
            "prose_capture_nmse": recorded.get(model, {}),
            "top1_positions": len(m["top1"]),
        }
    return res


ORDER = ["embed", "attn_norm", "q", "k", "v", "q_norm", "k_norm", "q_rope", "k_rope", "attn_out", "attn_proj",
         "attn_post_norm", "ffn_inp", "ffn_norm", "ffn_gate", "ffn_up", "ffn_act", "ffn_out", "ffn_post_norm", "out",
         "output_norm"]


def flips(r: dict) -> str:
    return ", ".join("%.3f" % f["tf_margin"] for f in r["flips"]) or "none"


def markdown(res: dict) -> str:
    lines = []
    for model, r in res.items():
        lines.append(f"**{model}** — KL(tf ‖ llama.cpp) at {r['kl_rows']} full rows: median {r['kl_median']:.2e}, "
                     f"max {r['kl_max']:.2e}; top-1 agreement {r['top1_agreement']:.3f} over {r['top1_positions']} positions "
                     f"(flips at transformers margins {flips(r)}); "
                     f"top-5 overlap mean {r['top5_mean']:.3f}; KL at the last prompt position per prompt: "
                     + ", ".join(f"{k} {v:.2e}" for k, v in sorted(r['kl_last_by_prompt'].items())))
        lines.append("")
        lines.append("| prompt | mean KL (full rows) | top-5 mean | min cosine blk.N.out / output_norm |")
        lines.append("|---|--:|--:|--:|")
        for pid, v in sorted(r["per_prompt"].items()):
            lines.append(f"| `{pid}` | {v['kl_mean_full_rows']:.2e} | {v['top5_mean']:.3f} | {v['min_cosine_out']:.6f} |")
        lines.append("")
        lines.append("| stage kind | NMSE median (stored rows) | NMSE max | min cosine | rows | `prose`, whole array, max over layers (captures) |")
        lines.append("|---|--:|--:|--:|--:|--:|")
        rec = r["prose_capture_nmse"]
        for k in sorted(set(r["kinds"]) | set(rec), key=lambda k: ORDER.index(k) if k in ORDER else 99):
            v = r["kinds"].get(k)
            p = f"{rec[k]:.2e}" if k in rec else "—"
            if v:
                lines.append(f"| `{k}` | {v['nmse_median']:.2e} | {v['nmse_max']:.2e} | {v['min_cosine']:.6f} | {v['rows']} | {p} |")
            else:
                lines.append(f"| `{k}` | — | — | — | 0 | {p} |")
        lines.append("")
    return "\n".join(lines)


def floors_markdown(golden: Path) -> str:
    """The float32-vs-float64 floor recorded by make_goldens.py (`floor_f32_vs_f64`, one per model)."""
    manifest = json.loads((golden / "manifest.json").read_text())
    seen = {}
    for g in manifest["goldens"]:
        if g["oracle"]["name"] == "transformers" and "floor_f32_vs_f64" in g:
            seen.setdefault(g["model_id"], g["floor_f32_vs_f64"])
    models = list(seen)
    kinds = []
    for f in seen.values():
        kinds += [k for k in f["nmse"] if k not in kinds]
    kinds.sort(key=lambda k: ORDER.index(k) if k in ORDER else (98 if k == "logits" else 99))
    head = "| stage kind | " + " | ".join(f"{m} median | max" for m in models) + " |"
    lines = [head, "|---|" + "--:|--:|" * len(models)]
    for k in kinds:
        cells = []
        for m in models:
            v = seen[m]["nmse"].get(k)
            cells += [f"{v['median']:.2e}", f"{v['max']:.2e}"] if v else ["—", "—"]
        lines.append(f"| `{k}` | " + " | ".join(cells) + " |")
    cells = []
    for m in models:
        cells += [f"{seen[m]['kl']['median']:.2e}", f"{seen[m]['kl']['max']:.2e}"]
    lines.append("| KL(P64 ‖ P32), logits | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--golden", type=Path, default=ROOT / "golden")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--floors", action="store_true", help="print the f32-vs-f64 floor table instead")
    args = ap.parse_args()
    if args.floors:
        print(floors_markdown(args.golden))
        return 0
    res = compare(args.golden)
    print(markdown(res) if args.markdown else json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
