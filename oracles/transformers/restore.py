"""Re-store existing transformers-f32 goldens under make_goldens.py's current storage policy, without running
the model again: an f32-stored array IS the captured value, so converting it to f16 by the storage criterion,
dropping an array, or replacing full decode logits by their top-64 gives exactly the file make_goldens.py would
write now. (Nothing can be made MORE precise this way: an array already stored f16 stays as it is, and a
policy that asks for an array the file lacks is an error.) Updates the manifest entries (sha256, bytes,
arrays, stages_*, logits_storage); the floor and everything else recorded are kept.

    python oracles/transformers/restore.py --model-id smollm2-135m-q4_1 [--out golden]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_goldens as M  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-id", required=True, choices=sorted(M.MODELS))
    ap.add_argument("--out", type=Path, default=M.ROOT / "golden")
    args = ap.parse_args()
    mid = args.model_id
    import fcntl
    import os

    lock = open(Path(os.environ.get("TMPDIR", "/tmp")) / "lockstep-transformers-manifest.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    manifest = json.loads((args.out / "manifest.json").read_text())
    for g in manifest["goldens"]:
        if not (g["oracle"]["name"] == M.ORACLE_NAME and g["model_id"] == mid):
            continue
        pid = g["prompt_id"]
        n_layer = g["model_hparams"]["n_layer"]
        z = np.load(args.out / g["path"])
        have = {k: z[k] for k in z.files}
        pol = M.policy_of(mid, pid)
        full_decode = M.full_decode_logits(mid, pid)
        all_ids = [k for k in have if k not in ("tokens", "decode.tokens", "logits_positions") and not k.startswith("logits")
                   and not k.startswith("decode.")]
        # canonical order as stored (forward order) for prefill; decode ids from the decode.* names
        dec_ids = [k[7:] for k in have if k.startswith("decode.") and k not in ("decode.tokens", "decode.logits")]
        exact = M.exact_ids(pol, n_layer, all_ids + dec_ids)
        exact_dec = M.exact_ids(pol, n_layer, all_ids + dec_ids, decode=True)
        raw = [("tokens", have["tokens"], False)]
        pre = M.expand(pol["prefill"], n_layer, all_ids)
        raw += [(c, have[c], c not in exact) for c in pre]
        raw += [(k, have[k], False) for k in ("logits", "logits_positions", "logits_topk_ids", "logits_topk", "decode.tokens")]
        if full_decode:
            raw.append(("decode.logits", have["decode.logits"], False))
        elif "decode.logits" in have:
            d = have["decode.logits"]
            do = np.argsort(-d, axis=1, kind="stable")[:, : M.TOPK].astype(np.int32)
            raw += [("logits_decode_topk_ids", do, False), ("logits_decode_topk", np.take_along_axis(d, do, axis=1), False)]
        else:
            raw += [(k, have[k], False) for k in ("logits_decode_topk_ids", "logits_decode_topk")]
        dec = M.expand(pol["decode"], n_layer, dec_ids)
        raw += [("decode." + c, have["decode." + c], c not in exact_dec) for c in dec]
        arrays, listed = {}, {}
        for name, x, allow in raw:
            old = g["arrays"][name] if name in g["arrays"] else None
            if old is not None and old["dtype"] == "f16":
                arrays[name] = x  # already f16: kept as stored, with its recorded storage error
                listed[name] = old
                continue
            a, info = M.store(x, allow)
            arrays[name] = a
            listed[name] = {"shape": list(a.shape), **info}
        M.write_npz(args.out / g["path"], arrays)
        g["sha256"] = M.sha256_file(args.out / g["path"])
        g["bytes"] = (args.out / g["path"]).stat().st_size
        g["arrays"] = listed
        g["stages_prefill"] = list(pol["prefill"])
        g["stages_decode"] = list(pol["decode"])
        g["stages_exact_f32"] = list(pol["exact"])
        g["stages_f16_allowed"] = list(pol["f16_ok"])
        if "decode_exact" in pol:
            g["stages_decode_exact_f32"] = list(pol["decode_exact"])
        g["logits_storage"] = "logits: f32 row at the last prompt position; logits_topk f32; decode: " + (
            "full decode.logits [N, V] f32" if full_decode else "logits_decode_topk{,_ids} [N, 64] (no full rows)")
        print(f"{g['path']:55s} {g['bytes'] / 2**20:6.2f} MiB")
    tmp = args.out / "manifest.json.tmp"
    tmp.write_text(M.dump_manifest(manifest))
    os.replace(tmp, args.out / "manifest.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
