#!/usr/bin/env bash
# Regenerates one model's goldens from scratch — the one command (oracles/README.md):
#
#   oracles/regenerate.sh                 # writes golden/smollm2-135m-q4_1/llama.cpp-*kv/*.npz + golden/manifest.json
#   oracles/regenerate.sh --model ID      # the same for another model of make_goldens.py's MODELS
#                                         # (gemma3-270m-q4_k_m, qwen2.5-coder-0.5b-q4_k_m); other
#                                         # models' goldens and manifest entries are left alone
#   oracles/regenerate.sh --model smollm2-135m-q4_1-q8_0   # a quantization variant ([[variants]] of
#                                         # models.toml; `lockstep fetch` makes its file with the recipe)
#   oracles/regenerate.sh --variants      # every variant of models.toml, one after the other
#   oracles/regenerate.sh --out DIR       # writes them under DIR instead (e.g. to compare two runs)
#   oracles/regenerate.sh --list-nodes    # also prints every llama.cpp graph node of one prefill
#
# 1. sets up the pinned oracle venv if needed (oracles/llamacpp/setup.sh; the first time this
#    compiles llama.cpp, afterwards it takes a second);
# 2. gets the model through lockstep's cache: `cargo run --release -p lockstep -- fetch <id>`
#    prints the cached path as its last stdout line; when that is unavailable it falls back to
#    ${LOCKSTEP_CACHE:-${XDG_CACHE_HOME:-~/.cache}/lockstep}/models/<id>.gguf (make_goldens.py
#    verifies the sha256 before use either way). LOCKSTEP_NO_CARGO=1 skips the cargo step;
# 3. runs oracles/llamacpp/make_goldens.py, which rewrites this oracle's goldens of the model
#    and its entries in golden/manifest.json (entries of other models and oracles are kept).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
model_id="smollm2-135m-q4_1"
cache="${LOCKSTEP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lockstep}"
out="$root/golden"
extra=()
variants=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --out=*) out="${1#--out=}"; shift ;;
    --model) model_id="$2"; shift 2 ;;
    --model=*) model_id="${1#--model=}"; shift ;;
    --variants) variants=1; shift ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) extra+=("$1"); shift ;;
  esac
done
log() { echo "[regenerate] $*" >&2; }

python="$("$root/oracles/llamacpp/setup.sh" | tail -n 1)"

# one model id: find its file, make its goldens
one() {
  local model_id="$1" model="" fetched
  if [ -z "${LOCKSTEP_NO_CARGO:-}" ] && command -v cargo >/dev/null 2>&1; then
    log "asking lockstep for $model_id (cargo run --release -p lockstep -- fetch $model_id)"
    if fetched="$(cd "$root" && cargo run --quiet --release -p lockstep -- fetch "$model_id" 2>/dev/null | tail -n 1)" \
       && [ -n "$fetched" ] && [ -f "$fetched" ]; then
      model="$fetched"
    else
      log "lockstep fetch is not available; falling back to the cache path"
    fi
  fi
  if [ -z "$model" ]; then
    # a variant lives where make_variants.sh writes it, a downloaded model in models/
    model="$("$python" -c 'import sys, tomllib
reg, cache, mid = tomllib.load(open(sys.argv[1], "rb")), sys.argv[2], sys.argv[3]
v = [v for v in reg.get("variants", []) if v["id"] == mid]
print(cache + "/variants/" + v[0]["source"] + "/" + v[0]["source"] + "-" + v[0]["type"] + ".gguf" if v else cache + "/models/" + mid + ".gguf")' \
      "$root/models.toml" "$cache" "$model_id")"
  fi
  if [ ! -f "$model" ]; then
    log "no model file at $model; run: cargo run --release -p lockstep -- fetch $model_id"
    exit 1
  fi
  log "model: $model"
  mkdir -p "$out"
  "$python" "$root/oracles/llamacpp/make_goldens.py" --model "$model" --model-id "$model_id" \
    --out "$out" --prompts "$root/oracles/prompts.json" ${extra[@]+"${extra[@]}"}
}

if [ -n "$variants" ]; then
  ids="$("$python" -c 'import sys, tomllib; print(" ".join(v["id"] for v in tomllib.load(open(sys.argv[1], "rb")).get("variants", []) if v["type"] != "HF"))' "$root/models.toml")"
  if [ -z "${LOCKSTEP_NO_CARGO:-}" ] && command -v cargo >/dev/null 2>&1; then
    # make every missing variant file in one recipe call (one F32 dequantization) before the loop
    log "cargo run --release -p lockstep -- fetch <every variant>"
    (cd "$root" && cargo run --quiet --release -p lockstep -- fetch $ids >/dev/null)
  fi
  for id in $ids; do one "$id"; done
else
  one "$model_id"
fi
