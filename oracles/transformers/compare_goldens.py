"""Compare two golden directories' transformers-f32 goldens of the same models, array by array: bit equality, and
the NMSE (reference = the first directory's) of every float array that differs. Used to show that a change of
route (stage maps as data; the HF route from_pretrained(hf_dir) against the GGUF route) leaves the goldens what
they were, or within the float32 floor (README "The HF route").

    python compare_goldens.py A_GOLDEN_DIR B_GOLDEN_DIR MODEL_ID [MODEL_ID ...] [--oracle-dir transformers-f32]
        [--manifest] [--json OUT]

Exit status 1 if a golden or an array is missing on one side or shapes differ; differing values are reported,
not refused (the caller judges them against the floor). --manifest also compares the two manifests' entries of
these goldens, key by key, ignoring `sha256`/`bytes` of the file (which follow the arrays) and the host record.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HOST_KEYS = ("host_cpu", "host_cpu_flags", "host_cpu_flags_absent", "host_machine", "host_logical_cpus", "torch_threads",
             "torch_parallel_info_cpu_capability")


def nmse(a: np.ndarray, ref: np.ndarray) -> float:
    a, ref = a.astype(np.float64), ref.astype(np.float64)
    den = float(np.sum(ref**2))
    num = float(np.sum((a - ref) ** 2))
    return 0.0 if num == 0 else (num / den if den else float("inf"))


def compare(a_dir: Path, b_dir: Path, model: str, oracle_dir: str) -> dict:
    """Per golden file of `model`: {file: {"bit_equal": bool, "arrays": n, "differ": {name: nmse}, "max_nmse": x}}."""
    a_files = sorted((a_dir / model / oracle_dir).glob("*.npz"))
    b_files = sorted((b_dir / model / oracle_dir).glob("*.npz"))
    if not a_files:
        raise SystemExit(f"{a_dir / model / oracle_dir}: no goldens")
    if [p.name for p in a_files] != [p.name for p in b_files]:
        raise SystemExit(f"{model}: golden files differ: {[p.name for p in a_files]} vs {[p.name for p in b_files]}")
    out = {}
    for pa, pb in zip(a_files, b_files):
        za, zb = np.load(pa), np.load(pb)
        if sorted(za.files) != sorted(zb.files):
            raise SystemExit(f"{pa} / {pb}: arrays differ: only in A {sorted(set(za.files) - set(zb.files))}, "
                             f"only in B {sorted(set(zb.files) - set(za.files))}")
        differ, dtypes = {}, []
        for k in za.files:
            x, y = za[k], zb[k]
            if x.shape != y.shape or x.dtype != y.dtype:
                raise SystemExit(f"{pa.name} {k}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}")
            if not np.array_equal(x, y):
                differ[k] = nmse(y, x) if x.dtype.kind == "f" else float("inf")
        out[pa.name] = {"bit_equal": not differ, "arrays": len(za.files), "differ": differ,
                        "max_nmse": max(differ.values(), default=0.0)}
    return out


def manifest_diff(a_dir: Path, b_dir: Path, model: str, oracle_dir: str) -> list[str]:
    def entries(d):
        m = json.loads((d / "manifest.json").read_text())
        return {g["path"]: g for g in m["goldens"] if g["model_id"] == model and g["path"].split("/")[1] == oracle_dir}

    ea, eb = entries(a_dir), entries(b_dir)
    diffs = []
    for path in sorted(set(ea) | set(eb)):
        if path not in ea or path not in eb:
            diffs.append(f"{path}: only in {'A' if path in ea else 'B'}")
            continue
        a, b = dict(ea[path]), dict(eb[path])
        for g in (a, b):
            g.pop("sha256", None)
            g.pop("bytes", None)
            g["oracle"] = {k: v for k, v in g["oracle"].items() if k not in HOST_KEYS}
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                diffs.append(f"{path}: {k}: {json.dumps(a.get(k))[:200]} -> {json.dumps(b.get(k))[:200]}")
    return diffs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--oracle-dir", default="transformers-f32")
    ap.add_argument("--manifest", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    report = {}
    for m in args.models:
        report[m] = compare(args.a, args.b, m, args.oracle_dir)
        for f, r in report[m].items():
            worst = max(r["differ"], key=r["differ"].get) if r["differ"] else None
            print(f"{m}/{f}: {'bit-equal' if r['bit_equal'] else 'DIFFERS'} ({r['arrays']} arrays"
                  + (f"; {len(r['differ'])} differ, max NMSE {r['max_nmse']:.3g} at {worst})" if worst else ")"))
        if args.manifest:
            d = manifest_diff(args.a, args.b, m, args.oracle_dir)
            report[m]["manifest_diffs"] = d
            print(f"{m}: manifest entries " + ("identical (host record aside)" if not d else "differ:\n  " + "\n  ".join(d)))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
