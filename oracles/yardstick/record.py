"""Record one model's measured distances (distance.py's output) in golden/manifest.json under `cross_oracle`.

    python record.py --distances D.json --scratch SCRATCH --prompts P.json --command "..." [--manifest golden/manifest.json]

The record says how it was measured, per llama.cpp CPU build (avx2, avx512: the build that made the llama.cpp
scratch goldens; a second build's rows are added beside the first's): the command, the date, both oracles'
versions and host (read from the scratch goldens' manifest entries); the prompt file and its sha256; and per
prompt and build the sha256 of the three scratch goldens the distance was computed from (they are not committed: the sha256 identifies them if they are made
again) and the distances themselves. `ci/thresholds.toml`'s cross-oracle rules are derived from these records
(harness/src/gate/yardstick.rs; the test `cross_oracle_rules_are_derived_from_the_manifest` checks every number).
Other models' records and everything else in the manifest are kept. stdlib only.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from manifest_format import dump_manifest  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent.parent
KEEP = ("kl", "kl_last", "kl_mean_full", "flips", "max_flip_margin", "top5_mean", "min_cos_out", "min_cos_at", "positions", "full_rows")
ORACLE_KEYS = ("llama_cpp_python", "llama_cpp_commit", "ggml_commit", "torch", "transformers", "gguf", "host_cpu",
               "host_cpu_flags", "ggml_cpu_build", "ggml_cpu_flags")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--distances", type=Path, required=True)
    ap.add_argument("--scratch", type=Path, required=True, help="the scratch golden directory the distances come from")
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--command", required=True, help="the command that measured them, as a user reruns it")
    ap.add_argument("--manifest", type=Path, default=ROOT / "golden" / "manifest.json")
    args = ap.parse_args()
    d = json.loads(args.distances.read_text())
    mid = d["model_id"]
    scratch = json.loads((args.scratch / "manifest.json").read_text())
    oracles = {}
    for g in scratch["goldens"]:
        if g["model_id"] != mid:
            continue
        name = g["path"].split("/")[1]
        o = g["oracle"]
        oracles.setdefault(name, {k: o[k] for k in ORACLE_KEYS if k in o})
    if set(oracles) != {"llama.cpp-f32kv", "llama.cpp-f16kv", "transformers-f32"}:
        raise SystemExit(f"{args.scratch}/manifest.json: the goldens of {mid} are not of the three oracles: {sorted(oracles)}")
    rel = args.prompts.resolve()
    try:
        rel = rel.relative_to(ROOT)
    except ValueError:
        pass
    # which ggml-cpu build made the llama.cpp goldens: their distance from transformers depends on it (AVX2 vs
    # AVX-512 reductions), so a record keeps one set of rows per build and the rule covers both
    lc = oracles["llama.cpp-f32kv"]
    flags = lc.get("ggml_cpu_flags") or lc.get("host_cpu_flags") or []
    build = "avx2" if lc.get("ggml_cpu_build") == "avx2" or "avx512f" not in flags else "avx512"
    rows = [
        {"prompt_id": r["prompt_id"], "build": build, "n_prompt_tokens": r["n_prompt_tokens"],
         "goldens_sha256": r["goldens_sha256"],
         "cross_oracle": {k: r["cross_oracle"][k] for k in KEEP}, "f16kv": {k: r["f16kv"][k] for k in KEEP},
         **({"cross_oracle_tf_ref": {k: r["cross_oracle_tf_ref"][k] for k in KEEP}} if "cross_oracle_tf_ref" in r else {})}
        for r in d["prompts"]
    ]
    prompts_sha256 = hashlib.sha256(args.prompts.read_bytes()).hexdigest()
    import fcntl

    lock = open(Path(os.environ.get("TMPDIR", "/tmp")) / "lockstep-transformers-manifest.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)  # the oracles' make_goldens.py take the same lock
    manifest = json.loads(args.manifest.read_text())
    records = manifest.get("cross_oracle", {})
    old = records.get(mid, {})
    if old.get("prompts_sha256") not in (None, prompts_sha256):
        old = {}  # measured on another prompt file: every build is measured again
    builds = {b: v for b, v in old.get("builds", {}).items() if b != build}
    builds[build] = {"command": args.command, "measured": datetime.date.today().isoformat(), "oracles": oracles}
    records[mid] = {
        "about": ("llama.cpp-f32kv against transformers-f32 (cross_oracle) and against llama.cpp-f16kv (f16kv), per "
                  "prompt and llama.cpp CPU build, in the gated metrics of a reference cell "
                  "(oracles/yardstick/distance.py); the rules of ci/thresholds.toml derive from them "
                  "(harness/src/gate/yardstick.rs)"),
        "prompts_file": rel.as_posix(),
        "prompts_sha256": prompts_sha256,
        "builds": dict(sorted(builds.items())),
        "prompts": [r for r in old.get("prompts", []) if r.get("build") != build] + rows,
    }
    order = {g["model_id"]: i for i, g in reversed(list(enumerate(manifest["goldens"])))}
    manifest["cross_oracle"] = dict(sorted(records.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))
    tmp = args.manifest.with_suffix(".json.tmp")
    tmp.write_text(dump_manifest(manifest))
    os.replace(tmp, args.manifest)
    print(f"{args.manifest}: cross_oracle[{mid}], build {build}: {len(rows)} prompts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
