#!/usr/bin/env bash
# Builds (once) llama.cpp's own command-line tools — llama-bench, llama-quantize, llama-perplexity — from
# the llama.cpp vendored by the pinned llama-cpp-python source distribution (requirements.txt), and prints
# the directory holding the binaries as its last stdout line.
#
#   oracles/llamacpp/build_tools.sh            # ~10-25 min the first time on 2 cores, ~1 s after
#   LOCKSTEP_TOOLS_CACHED_ONLY=1 oracles/llamacpp/build_tools.sh   # only look (exit 1 if not built)
#   LOCKSTEP_ORACLE_CPU=avx2 oracles/llamacpp/build_tools.sh       # AVX2-only tools, on any AVX2+FMA+F16C host
#
# LOCKSTEP_ORACLE_CPU selects the ggml-cpu target, as for the oracle venv (oracles/llamacpp/setup.sh):
#   native (default)  GGML_NATIVE: this machine's CPU         -> llamacpp-tools/<version>-<flags hash>/
#   avx2              -DGGML_NATIVE=OFF and AVX2_CMAKE_ARGS     -> llamacpp-tools/<version>-avx2-<flags hash>/
#                     (AVX-512 off: what llama-bench runs on an AVX2-only CPU, for `lockstep bench --simd avx2`)
#
# Cache, outside the repository, keyed by the pinned version and this CPU's flags (GGML_NATIVE compiles
# for the build host, so a binary built on an AVX-512 machine must not be reused on an AVX2-only one):
#   ${LOCKSTEP_CACHE:-${XDG_CACHE_HOME:-~/.cache}/lockstep}/llamacpp-tools/<version>-<flags hash>/
#     bin/             llama-bench, llama-quantize, llama-perplexity
#     build-info.json  version, sdist sha256, vendored commit, cmake flags, compiler, CPU model and flags
#     build.log        the cmake log
# The source distribution carries no git metadata, so llama-bench itself reports build_commit "unknown";
# build-info.json records the vendored commit instead (VENDORED_COMMIT below, checked against the
# sdist's sha256 so that a different sdist cannot be mislabelled).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${LOCKSTEP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lockstep}"
req="$here/requirements.txt"
python="${PYTHON:-python3}"

# llama-cpp-python 0.3.36's sdist: its sha256 and the llama.cpp commit it vendors.
PINNED_VERSION="0.3.36"
PINNED_SDIST_SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
VENDORED_COMMIT="0c1e570"
BASE_CMAKE_FLAGS=(-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=OFF)
# the same AVX2-only flags as setup.sh's AVX2_CMAKE_ARGS
AVX2_CMAKE_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF
  -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF)
case "${LOCKSTEP_ORACLE_CPU:-native}" in
  native) cpu_build="native"; key_tag=""; CMAKE_FLAGS=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON "${BASE_CMAKE_FLAGS[@]:1}") ;;
  avx2) cpu_build="avx2"; key_tag="avx2-"; CMAKE_FLAGS=("${BASE_CMAKE_FLAGS[@]}" "${AVX2_CMAKE_FLAGS[@]}") ;;
  *) echo "[llama.cpp tools] LOCKSTEP_ORACLE_CPU=${LOCKSTEP_ORACLE_CPU} is not native or avx2" >&2; exit 2 ;;
esac
TARGETS=(llama-bench llama-quantize llama-perplexity)

log() { echo "[llama.cpp tools] $*" >&2; }

version="$(sed -n 's/^llama-cpp-python==\([^ #]*\).*/\1/p' "$req")"
if [ "$version" != "$PINNED_VERSION" ]; then
  log "requirements.txt pins llama-cpp-python==$version but this script knows the vendored commit of $PINNED_VERSION only; update VENDORED_COMMIT"
  exit 1
fi

flags="$(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2 | xargs)"
cpu_model="$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
flags_hash="$(printf '%s' "$flags" | sha256sum | cut -c1-12)"
out="$cache/llamacpp-tools/$version-$key_tag$flags_hash"
if [ "$cpu_build" = avx2 ]; then
  for f in avx2 fma f16c; do
    case " $flags " in *" $f "*) ;; *) log "LOCKSTEP_ORACLE_CPU=avx2 needs a CPU with $f (/proc/cpuinfo has not)"; exit 1 ;; esac
  done
fi
bin="$out/bin"

have_all() {
  for t in "${TARGETS[@]}"; do [ -x "$bin/$t" ] || return 1; done
  [ -f "$out/build-info.json" ]
}
if have_all; then
  log "cached: $bin"
  echo "$bin"
  exit 0
fi
if [ -n "${LOCKSTEP_TOOLS_CACHED_ONLY:-}" ]; then
  log "not built for this CPU yet ($out)"
  exit 1
fi

# a missing cmake or C++ compiler stops here, before any download
. "$here/require_toolchain.sh"
require_toolchain "[llama.cpp tools]"

mkdir -p "$out"
src="$out/src"
rm -rf "$src" && mkdir -p "$src"
log "downloading the llama-cpp-python==$version source distribution"
"$python" -m pip download --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
  -d "$src" "llama-cpp-python==$version" >"$out/build.log" 2>&1
tarball="$(ls "$src"/llama_cpp_python-"$version".tar.gz)"
sdist_sha="$(sha256sum "$tarball" | cut -d' ' -f1)"
if [ -n "$PINNED_SDIST_SHA256" ] && [ "$sdist_sha" != "$PINNED_SDIST_SHA256" ]; then
  log "$tarball has sha256 $sdist_sha, expected $PINNED_SDIST_SHA256"
  exit 1
fi
tar -xzf "$tarball" -C "$src"
llama="$src/llama_cpp_python-$version/vendor/llama.cpp"

log "configuring and building ${TARGETS[*]} (~10-25 min on 2 cores; log: $out/build.log)"
if ! { cmake -S "$llama" -B "$src/build" "${CMAKE_FLAGS[@]}" &&
       cmake --build "$src/build" -j "$(nproc)" --target "${TARGETS[@]}"; } >>"$out/build.log" 2>&1; then
  tail -n 40 "$out/build.log" >&2
  log "build failed; see $out/build.log"
  exit 1
fi

mkdir -p "$bin"
for t in "${TARGETS[@]}"; do cp "$src/build/bin/$t" "$bin/"; done
compiler="$(sed -n 's/^CMAKE_C_COMPILER:[^=]*=//p' "$src/build/CMakeCache.txt")"
compiler_version="$("$compiler" --version | head -n1)"
"$python" - "$out/build-info.json" <<EOF
import json, sys
json.dump({
    "llama_cpp_python": "$version",
    "sdist_sha256": "$sdist_sha",
    "vendored_llama_cpp_commit": "$VENDORED_COMMIT",
    "ggml_cpu_build": "$cpu_build",
    "cmake_flags": "${CMAKE_FLAGS[*]}".split(),
    "targets": "${TARGETS[*]}".split(),
    "compiler": "$compiler_version",
    "cpu_model": "$cpu_model",
    "cpu_flags": "$flags".split(),
}, open(sys.argv[1], "w"), indent=2)
EOF
rm -rf "$src"
log "built: $bin"
echo "$bin"
