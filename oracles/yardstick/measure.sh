#!/usr/bin/env bash
# Measures llama.cpp's own distance from transformers (and from itself with an f16 KV cache) on one model, per
# prompt, in the gated metrics of a reference cell: the yardstick of reference mode against llama.cpp goldens
# (oracles/yardstick/README.md).
#
#   oracles/yardstick/measure.sh --model ID [--prompts FILE] [--scratch DIR] [--record]
#
# FILE defaults to oracles/yardstick/prompts-derive.json. Both oracles write scratch goldens of every prompt
# (make_goldens.py --measure) into DIR (default: a new directory under ${TMPDIR:-/tmp}), never into golden/;
# oracles/yardstick/distance.py compares them and writes DIR/distance-ID.json. --record also writes the
# distances, with this command and both oracles' versions, into golden/manifest.json (`cross_oracle`), from
# which ci/thresholds.toml's cross-oracle rules are derived; LOCKSTEP_ORACLE_CPU=avx2 measures llama.cpp's AVX2
# build (oracles/README.md), recorded beside the native build's rows. Needs both oracles' environments
# (oracles/llamacpp/setup.sh: compiles llama.cpp the first time; oracles/transformers/setup.sh: torch, ~5 GB).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
model="" prompts="$here/prompts-derive.json" scratch="" record=0
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --prompts) prompts="$2"; shift 2 ;;
    --scratch) scratch="$2"; shift 2 ;;
    --record) record=1; shift ;;
    *) echo "measure.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$model" ] || { echo "measure.sh: --model ID is required" >&2; exit 2; }
[ -f "$prompts" ] || { echo "measure.sh: $prompts: no such prompt file" >&2; exit 2; }
prompts="$(cd "$(dirname "$prompts")" && pwd)/$(basename "$prompts")"
[ -n "$scratch" ] || scratch="$(mktemp -d "${TMPDIR:-/tmp}/lockstep-yardstick-XXXXXX")"
mkdir -p "$scratch"
case "$(cd "$scratch" && pwd)" in "$root/golden"*) echo "measure.sh: the scratch directory may not be golden/" >&2; exit 2 ;; esac

llama_py="$("$root/oracles/llamacpp/setup.sh" | tail -n 1)"
tf_py="$("$root/oracles/transformers/setup.sh" | tail -n 1)"
# LOCKSTEP: a lockstep binary to fetch with (default: this checkout's, through cargo)
# shellcheck disable=SC2086  # a command and its arguments
path="$(cd "$root" && ${LOCKSTEP:-cargo run --quiet --release -p lockstep --} fetch "$model" | tail -n 1)"
echo "[yardstick] $model: $path; scratch goldens in $scratch" >&2

"$llama_py" "$root/oracles/llamacpp/make_goldens.py" --measure --model "$path" --model-id "$model" \
  --out "$scratch" --prompts "$prompts" >"$scratch/llamacpp-$model.log"
"$tf_py" "$root/oracles/transformers/make_goldens.py" --measure --no-f64 --model-id "$model" --model "$path" \
  --out "$scratch" >"$scratch/transformers-$model.log"
"$tf_py" "$here/distance.py" --golden "$scratch" --model-id "$model" --out "$scratch/distance-$model.json"
if [ "$record" = 1 ]; then
  rel="${prompts#"$root"/}"
  env_prefix=""
  [ "${LOCKSTEP_ORACLE_CPU:-native}" = native ] || env_prefix="LOCKSTEP_ORACLE_CPU=$LOCKSTEP_ORACLE_CPU "
  python3 "$here/record.py" --distances "$scratch/distance-$model.json" --scratch "$scratch" --prompts "$prompts" \
    --command "${env_prefix}oracles/yardstick/measure.sh --model $model --prompts $rel --record"
fi
