# Sourced by the opt-in paths that compile llama.cpp (build_tools.sh, setup.sh) before any other work:
# checks that cmake and a C++ compiler are on PATH. Where they are missing it installs them when it may
# (root, Debian's apt-get, LOCKSTEP_NO_INSTALL unset), else it prints the command that installs them and
# exits 2 — in a second, never after minutes of downloading.
#
#   require_toolchain "[llama.cpp tools]"     # the prefix of its log lines
require_toolchain() {
  local who="$1" missing=() t
  command -v cmake >/dev/null 2>&1 || missing+=(cmake)
  { command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1; } || missing+=("a C++ compiler (c++/g++)")
  [ ${#missing[@]} -eq 0 ] && return 0
  local names="${missing[0]}"
  [ ${#missing[@]} -gt 1 ] && names="${missing[0]} and ${missing[1]}"
  local install="apt-get install -y cmake g++"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && [ -z "${LOCKSTEP_NO_INSTALL:-}" ]; then
    echo "$who $names not found: installing them ($install; LOCKSTEP_NO_INSTALL=1 stops this)" >&2
    if apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake g++ >&2; then
      for t in cmake c++; do
        command -v "$t" >/dev/null 2>&1 || { echo "$who $t still not found after $install" >&2; exit 2; }
      done
      return 0
    fi
    echo "$who '$install' failed" >&2
    exit 2
  fi
  echo "$who this step compiles llama.cpp and needs $names, which are not on PATH." >&2
  echo "$who install them first (Debian/Ubuntu, as root):  $install" >&2
  exit 2
}
