#!/bin/sh
# The porter's goldens (issue 43): transformers-f32 goldens of the two committed HF checkpoints through the HF
# route of the transformers oracle (from_pretrained of the directory, hooked by stage_maps/<model_type>.toml),
# the prompts of oracles/porter/prompts.json, 6 greedy decode steps teacher-forced. Writes
# golden/porter-<arch>/transformers-f32/*.npz and their golden/manifest.json entries. Needs the transformers
# oracle's venv (oracles/transformers/setup.sh).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py="${LOCKSTEP_CACHE:-$HOME/.cache/lockstep}/oracle-transformers/venv/bin/python"
for arch in olmo2 granite; do
  "$py" "$root/oracles/transformers/make_goldens.py" --hf-dir "$root/oracles/porter/checkpoints/porter-$arch" \
    --model-id "porter-$arch" --golden-dir "${1:-$root/golden}" --prompts "$here/prompts.json" --n-decode 6
done
