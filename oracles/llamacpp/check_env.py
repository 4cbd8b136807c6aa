"""Checks that the running interpreter holds exactly the pinned oracle environment.

    python check_env.py requirements.txt

Exit status 0 when every ``name==version`` line of the requirements file is installed at that
version and the llama.cpp library that llama-cpp-python loads reports the commit recorded in
``ggml_capture.LLAMA_CPP_COMMIT``; otherwise 1, with one line per mismatch on stderr.
``setup.sh`` uses it to decide whether anything needs installing.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path


def pinned(requirements: Path) -> list[tuple[str, str]]:
    """The ``(name, version)`` pairs of the ``name==version`` lines of a requirements file."""
    pins = []
    for line in requirements.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        if not m:
            raise SystemExit(f"{requirements}: not a pinned 'name==version' line: {line!r}")
        pins.append((m.group(1), m.group(2)))
    return pins


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    problems = []
    for name, want in pinned(Path(sys.argv[1])):
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            problems.append(f"{name}: not installed (want {want})")
            continue
        if have != want:
            problems.append(f"{name}: {have} installed, want {want}")
    if not problems:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        try:
            import ggml_capture

            problems.extend(ggml_capture.build_problems())
        except Exception as e:  # an unloadable library is a mismatch, not a crash
            problems.append(f"llama_cpp: cannot be loaded: {e}")
    for p in problems:
        print(p, file=sys.stderr)
    if not problems:
        print("oracle environment matches requirements.txt", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
