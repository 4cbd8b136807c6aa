#!/usr/bin/env bash
# Installs the pinned Python environment of the transformers oracle (oracles/transformers/README.md).
#
#   oracles/transformers/setup.sh      # prints the venv's python as its last stdout line
#
# The venv lives outside the repository, under
#   ${LOCKSTEP_CACHE:-${XDG_CACHE_HOME:-~/.cache}/lockstep}/oracle-transformers/venv
# and holds requirements.txt exactly (torch 2.15.0, transformers 5.23.0, gguf 0.19.0, accelerate 1.15.0 and
# their pinned dependencies). Later runs find it in the pinned state (check_env.py) and return in a second.
#
# Size: torch from PyPI is the ~5 GB CUDA build (torch plus the nvidia-*/cuda-*/triton wheels it depends on).
# That is fine for the oracle, which runs on the CPU and is only needed to REGENERATE the transformers goldens;
# CI, `cargo test` and `lockstep run` never need it (they read the committed goldens).
# PYTHON selects the interpreter used to create the venv (default: python3; the goldens were made with 3.11).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${LOCKSTEP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lockstep}"
oracle="$cache/oracle-transformers"
venv="$oracle/venv"
req="$here/requirements.txt"
python="${PYTHON:-python3}"

log() { echo "[transformers oracle setup] $*" >&2; }

mkdir -p "$oracle"
if [ ! -x "$venv/bin/python" ]; then
  log "creating the venv $venv with $python"
  "$python" -m venv "$venv"
fi
if "$venv/bin/python" "$here/check_env.py" "$req" >/dev/null 2>&1; then
  log "venv $venv is in the pinned state"
  echo "$venv/bin/python"
  exit 0
fi
log "installing $req into $venv (torch's CUDA build: ~5 GB the first time)"
"$venv/bin/python" -m pip install --disable-pip-version-check --quiet -r "$req"
"$venv/bin/python" "$here/check_env.py" "$req" >&2
echo "$venv/bin/python"
