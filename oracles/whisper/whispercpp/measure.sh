#!/usr/bin/env bash
# whisper.cpp against transformers at the logits, end to end (issue 44; opt-in, not part of ci/test.sh):
#   1. libwhisper.so from the pinned pywhispercpp sdist (build.sh; cached);
#   2. a seeded Whisper whisper.cpp can hold: make_checkpoint.py --ffn-dim 256 (whisper.cpp builds its MLPs
#      4 x d_model wide; the committed whisper-seeded has 2 x);
#   3. its whisper.cpp file (convert.py, ftype 1) and the checkpoint with the same float16 roundings;
#   4. transformers goldens of that rounded checkpoint over the committed WAVs (make_goldens.py);
#   5. measure.py: whisper.cpp's logits against them, four settings (module docs), a Markdown table on stdout
#      and the figures in $OUT/measure.json.
#
#   oracles/whisper/whispercpp/measure.sh [OUT]      # OUT default: a new temporary directory
# Needs the transformers oracle's venv (oracles/transformers/setup.sh) and cmake + a C++ compiler.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
cache="${LOCKSTEP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lockstep}"
py="${TRANSFORMERS_PYTHON:-$cache/oracle-transformers/venv/bin/python}"
[ -x "$py" ] || { echo "[whisper.cpp] no transformers venv at $py (oracles/transformers/setup.sh)" >&2; exit 1; }
out="${1:-$(mktemp -d)}"
mkdir -p "$out"
lib="$("$here/build.sh" | tail -n1)"
"$py" "$here/../make_checkpoint.py" --seed 1 --ffn-dim 256 --out "$out/checkpoint" >&2
"$py" "$here/convert.py" --hf-dir "$out/checkpoint" --out "$out/model.bin" --rounded-hf-out "$out/checkpoint-f16"
mkdir -p "$out/golden"
cp -r "$root/golden/whisper-seeded/audio" "$out/golden/"
"$py" "$here/../make_goldens.py" --hf-dir "$out/checkpoint-f16" --golden-dir "$out/golden" --no-run-entries >&2
"$py" "$here/measure.py" --lib "$lib" --model "$out/model.bin" --golden-dir "$out/golden" --json "$out/measure.json"
echo "[whisper.cpp] figures: $out/measure.json" >&2
