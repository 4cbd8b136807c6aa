#!/usr/bin/env bash
# Makes the quantization variants of one registered model with llama.cpp's own quantizer, into the cache
# (never the repository), and records what it made.
#
# lockstep makes the same files itself, byte for byte and without cmake or a C++ compiler (`lockstep
# quantize`; `lockstep fetch VARIANT` by default). This script is the reference that made models.toml's
# [[variants]] and the opt-in cross-check: LOCKSTEP_VARIANT_RECIPE=oracles/llamacpp/make_variants.sh makes
# `lockstep fetch` run it instead; oracles/llamacpp/gguf_first_diff.py compares two files.
#
#   oracles/llamacpp/make_variants.sh                          # SmolLM2, every type below
#   oracles/llamacpp/make_variants.sh --model ID Q8_0 Q4_K     # some types of another model
#
# Recipe (the same bytes every time; checked by making each file twice, see --check):
#   1. the registered file (`lockstep fetch ID`, sha256-verified) is dequantized to F32 by
#      `llama-quantize --allow-requantize SRC ID-F32.gguf F32` — ggml's dequantize_row_* of every tensor,
#      exact: the F32 file holds the very values the shipped file encodes;
#   2. every other type is quantized from that F32 file by `llama-quantize --pure F32 OUT TYPE`
#      (--pure: every weight matrix of that type, no K-quant mix). Where a row length does not fit the
#      type's block (SmolLM2's 576-wide rows are not a multiple of 256), llama.cpp falls back to another
#      type for that tensor: `tensor_types` in the record names what each file actually holds.
# llama-quantize comes from build_tools.sh (the pinned llama.cpp; built once, ~10-25 min).
#
# Output: ${LOCKSTEP_CACHE:-~/.cache/lockstep}/variants/ID/ID-TYPE.gguf and variants.json beside them:
# per file its type, sha256, size, bits per weight, tensor types (`lockstep inspect --json`), the exact
# llama-quantize command, and the tool build record (commit, flags, CPU). Prints the json's path last.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cache="${LOCKSTEP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lockstep}"

ALL_TYPES=(F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS)
model="smollm2-135m-q4_1"
check=""
types=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --check) check=1; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) types+=("$1"); shift ;;
  esac
done
[ ${#types[@]} -gt 0 ] || types=("${ALL_TYPES[@]}")

log() { echo "[variants] $*" >&2; }

bin="$("$here/build_tools.sh" | tail -n 1)"
quantize="$bin/llama-quantize"
(cd "$root" && cargo build --quiet --release -p lockstep)
lockstep="$root/target/release/lockstep"
src="$("$lockstep" fetch "$model" | tail -n 1)"

out="$cache/variants/$model"
mkdir -p "$out"
threads="$(nproc)"

# quantize TYPE INPUT OUTPUT [FLAGS...]: into a temporary name, then renamed (no half-written variant)
quantize() {
  local ty="$1" in="$2" dst="$3"; shift 3
  local tmp="$dst.partial"
  rm -f "$tmp"
  if ! "$quantize" "$@" "$in" "$tmp" "$ty" "$threads" >"$dst.log" 2>&1; then
    tail -n 20 "$dst.log" >&2
    log "llama-quantize failed for $ty; see $dst.log"
    exit 1
  fi
  mv "$tmp" "$dst"
}

f32="$out/$model-F32.gguf"
records=()
record() { # TYPE FILE COMMAND...
  local ty="$1" f="$2"; shift 2
  local info sha
  info="$("$lockstep" inspect --model "$f" --json)"
  sha="$(sha256sum "$f" | cut -d' ' -f1)"
  records+=("$(python3 -c '
import json, sys
ty, sha, cmd, info = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
print(json.dumps({"type": ty, "file": info["path"], "sha256": sha, "size": info["file_size"],
                  "bits_per_weight": info["bits_per_weight"], "n_params": info["n_params"],
                  "tensor_types": {t["type"]: t["tensors"] for t in info["types"]},
                  "command": cmd}))' "$ty" "$sha" "$*" "$info")")
}

log "F32 from $src"
quantize F32 "$src" "$f32" --allow-requantize
record F32 "$f32" llama-quantize --allow-requantize "$(basename "$src")" "$(basename "$f32")" F32
for ty in "${types[@]}"; do
  [ "$ty" = F32 ] && continue
  dst="$out/$model-$ty.gguf"
  log "$ty"
  quantize "$ty" "$f32" "$dst" --pure
  if [ -n "$check" ]; then
    first="$(sha256sum "$dst" | cut -d' ' -f1)"
    quantize "$ty" "$f32" "$dst" --pure
    second="$(sha256sum "$dst" | cut -d' ' -f1)"
    if [ "$first" != "$second" ]; then
      log "$ty is not reproducible: $first then $second"
      exit 1
    fi
  fi
  record "$ty" "$dst" llama-quantize --pure "$(basename "$f32")" "$(basename "$dst")" "$ty"
done

python3 - "$out/variants.json" "$model" "$src" "$(dirname "$bin")/build-info.json" "${records[@]}" <<'EOF'
import json, sys
path, model, src, build_info, *records = sys.argv[1:]
doc = {
    "schema": 1,
    "model": model,
    "source": src,
    "recipe": "oracles/llamacpp/make_variants.sh",
    "llama_cpp_tools": json.load(open(build_info)),
    "variants": [json.loads(r) for r in records],
}
# keep the records of types this call did not remake
try:
    old = json.load(open(path))
    made = {v["type"] for v in doc["variants"]}
    if old.get("model") == model:
        doc["variants"] += [v for v in old.get("variants", []) if v["type"] not in made]
except FileNotFoundError:
    pass
order = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
         "Q6_K", "IQ4_NL", "IQ4_XS"]
doc["variants"].sort(key=lambda v: order.index(v["type"]) if v["type"] in order else len(order))
tmp = path + ".partial"
with open(tmp, "w") as f:
    json.dump(doc, f, indent=2)
import os
os.replace(tmp, path)
EOF
echo "$out/variants.json"
