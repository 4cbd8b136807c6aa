"""The text layout of golden/manifest.json, shared by both oracles' make_goldens.py (stdlib only).

One line per golden entry and one line per stage map (oracle x architecture), the top level indented: a
regeneration's diff is one line per golden it rewrote, and the file stays small (golden/ has a size budget:
issue 25 measured 0.33 MiB saved over one line per field). The harness reads it as ordinary JSON
(harness/src/golden.rs); the layout carries no meaning.
"""
from __future__ import annotations

import json


def _line(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def dump_manifest(manifest: dict) -> str:
    """The manifest as text: top-level keys one per line; `stage_map` one line per (oracle, architecture);
    `goldens` one line per entry. json.loads of the result equals `manifest`."""
    out = ["{"]
    keys = list(manifest)
    for ki, key in enumerate(keys):
        value = manifest[key]
        comma = "," if ki < len(keys) - 1 else ""
        if key == "goldens":
            out.append(' "goldens": [')
            out.append(",\n".join("  " + _line(e) for e in value))
            out.append(" ]" + comma)
        elif key == "stage_map":
            out.append(' "stage_map": {')
            oracles = list(value)
            for oi, oracle in enumerate(oracles):
                out.append(f"  {json.dumps(oracle)}: {{")
                out.append(",\n".join(f"   {json.dumps(a)}: {_line(sm)}" for a, sm in value[oracle].items()))
                out.append("  }" + ("," if oi < len(oracles) - 1 else ""))
            out.append(" }" + comma)
        elif key == "cross_oracle":
            # one line per model: its measured distances (oracles/yardstick/record.py)
            out.append(' "cross_oracle": {')
            out.append(",\n".join(f"  {json.dumps(m)}: {_line(r)}" for m, r in value.items()))
            out.append(" }" + comma)
        else:
            out.append(f" {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}{comma}")
    out.append("}")
    text = "\n".join(out) + "\n"
    if json.loads(text) != manifest:
        raise AssertionError("manifest layout lost information")
    return text
