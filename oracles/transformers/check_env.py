"""Checks that the running interpreter holds exactly the pinned transformers-oracle environment.

    python check_env.py requirements.txt

Exit status 0 when every ``name==version`` line is installed at that version, else 1 with one line per
mismatch on stderr (setup.sh uses it to decide whether anything needs installing).
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    problems = []
    for line in Path(sys.argv[1]).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        if not m:
            problems.append(f"not a pinned 'name==version' line: {line!r}")
            continue
        name, want = m.groups()
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            problems.append(f"{name}: not installed (want {want})")
            continue
        if have != want:
            problems.append(f"{name}: {have} installed, want {want}")
    for p in problems:
        print(p, file=sys.stderr)
    if not problems:
        print("transformers oracle environment matches requirements.txt", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
