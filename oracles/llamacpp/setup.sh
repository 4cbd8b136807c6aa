#!/usr/bin/env bash
# Builds (once) and installs the pinned Python environment of the llama.cpp oracle.
#
#   oracles/llamacpp/setup.sh        # prints the venv's python as its last stdout line
#
# Everything lives outside the repository, under
#   ${LOCKSTEP_CACHE:-${XDG_CACHE_HOME:-~/.cache}/lockstep}/oracle/
#     venv/     the virtualenv (requirements.txt, exactly)
#     wheels/   llama_cpp_python-<version>-*.whl, built once from the PyPI sdist
#     build.log the log of that build
# The first run compiles llama.cpp (about 10 minutes on 2 cores); later runs find the venv in the
# pinned state and return in about a second. If the venv is missing or differs from
# requirements.txt it is (re)filled from the cached wheel without compiling anything.
# The wheel is built with llama-cpp-python's default CMake options: CMAKE_ARGS and FORCE_CMAKE are
# cleared for the build so that a stray environment variable cannot change the oracle.
# PYTHON selects the interpreter used to create the venv (default: python3).
#
# LOCKSTEP_ORACLE_CPU selects the ggml-cpu build (the CPU the goldens record, see oracles/README.md):
#   native (default)  GGML_NATIVE: the SIMD branches of this machine's CPU      -> .../oracle/
#   avx2              an AVX2-only build, whatever this machine has beyond it:  -> .../oracle-avx2/
#                     CMAKE_ARGS="$AVX2_CMAKE_ARGS" (below), the goldens it makes record
#                     ggml_cpu_build = "avx2" and the flags ggml mode follows (ggml_cpu_flags)
# Both keep their own venv, wheel and build.log; pip's wheel cache is bypassed (--no-cache-dir) so
# that one build's wheel is never reused for the other.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${LOCKSTEP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lockstep}"
AVX2_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF"
case "${LOCKSTEP_ORACLE_CPU:-native}" in
  native) oracle="$cache/oracle"; cmake_args="" ;;
  avx2) oracle="$cache/oracle-avx2"; cmake_args="$AVX2_CMAKE_ARGS" ;;
  *) echo "[oracle setup] LOCKSTEP_ORACLE_CPU=${LOCKSTEP_ORACLE_CPU} is not native or avx2" >&2; exit 2 ;;
esac
venv="$oracle/venv"
wheels="$oracle/wheels"
req="$here/requirements.txt"
python="${PYTHON:-python3}"

log() { echo "[oracle setup] $*" >&2; }

version="$(sed -n 's/^llama-cpp-python==\([^ #]*\).*/\1/p' "$req")"
if [ -z "$version" ]; then
  log "no 'llama-cpp-python==<version>' line in $req"
  exit 1
fi

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

shopt -s nullglob
whl=("$wheels"/llama_cpp_python-"$version"-*.whl)
if [ ${#whl[@]} -eq 0 ]; then
  # a missing cmake or C++ compiler stops here, before any download
  . "$here/require_toolchain.sh"
  require_toolchain "[oracle setup]"
  log "no cached wheel in $wheels: building llama-cpp-python==$version from the PyPI sdist"
  log "(compiles llama.cpp, ~10 min on 2 cores; log: $oracle/build.log)"
  mkdir -p "$wheels"
  if ! (unset CMAKE_ARGS FORCE_CMAKE
        if [ -n "$cmake_args" ]; then export CMAKE_ARGS="$cmake_args"; fi
        "$venv/bin/python" -m pip wheel --disable-pip-version-check --no-deps --no-cache-dir \
          --no-binary llama-cpp-python -w "$wheels" "llama-cpp-python==$version") \
       >"$oracle/build.log" 2>&1; then
    tail -n 40 "$oracle/build.log" >&2
    log "building the wheel failed; see $oracle/build.log"
    exit 1
  fi
  whl=("$wheels"/llama_cpp_python-"$version"-*.whl)
  if [ ${#whl[@]} -eq 0 ]; then
    log "pip reported success but left no llama_cpp_python-$version wheel in $wheels"
    exit 1
  fi
fi
if [ ${#whl[@]} -ne 1 ]; then
  log "several cached wheels match llama_cpp_python-$version: ${whl[*]}; keep one"
  exit 1
fi

log "installing ${whl[0]} and requirements.txt into $venv"
"$venv/bin/python" -m pip install --disable-pip-version-check --quiet --no-deps "${whl[0]}"
"$venv/bin/python" -m pip install --disable-pip-version-check --quiet -r "$req"
"$venv/bin/python" "$here/check_env.py" "$req" >&2
echo "$venv/bin/python"
