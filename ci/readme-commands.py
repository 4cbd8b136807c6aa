#!/usr/bin/env python3
"""Runs every command of README.md's fenced shell blocks as written, on a fresh clone (issue 46).

Usage:
  ci/readme-commands.py --list             every command, numbered, with what happens to it
  ci/readme-commands.py --check            every command accounted for (the suite's fast test,
                                           harness/tests/readme_commands.rs); exit 1 naming what is not
  ci/readme-commands.py [--long] [--keep] [--only N,M] [--clone-of DIR]
                                           clone DIR's committed HEAD (default: this checkout) into a
                                           scratch directory and run the blocks there; print a summary

What counts as a command: the blocks fenced ```sh, ```bash or ```shell (```text and ```toml hold no
commands; an untagged fence is an error, so that no block of commands goes unnoticed). In a block, one
command is one line, with `\\` continuation lines and here-documents (`<<EOF` … `EOF`) joined to it; comment
lines and blank lines are not commands. A command is named by its text: continuations joined, runs of
whitespace collapsed, a trailing `# comment` dropped.

What happens to a command is ci/readme-commands.toml's entry for it; a command without an entry runs as
written and must exit 0. An entry is `[[command]]` with `text` (the command's name as above) and one of:
  skip = "reason"      not run: it needs what this machine lacks or takes hours; printed with the reason
  instead = "command"  the README line is a synopsis (placeholders such as ID, <run id>, [optional parts]):
                       this concrete form of it runs in its place (with `why`, the reason)
  long = "reason"      run only with --long (minutes to hours); otherwise listed with the reason
and optionally `exit = N`, the status it is expected to give (lockstep: 1 = failing cells or a bug found).

Each block runs as one bash script in the clone's root, its commands in order (a `cd`, a variable or an
`export` carries to the next command of the block, not to the next block), with:
  R              the clone's root (the README's transcripts name the checkout $R)
  PATH           $SCRATCH/cargo-root/bin first: the README's install step (`cargo install --path harness`)
                 installs there (CARGO_INSTALL_ROOT), so `lockstep` is the clone's build
  LOCKSTEP_CACHE as in your environment (default ~/.cache/lockstep): models are fetched into the cache you
                 have, not re-downloaded for the clone
  PYTHONPATH     numpy for python3 as ci/test.sh finds it ($LOCKSTEP_CACHE/python-numpy when python3 has none)
CARGO_TARGET_DIR is kept if set (the clone then builds incrementally over your target directory, and the
clone's `target` is a link to it, so that `target/release/lockstep` is the clone's build as the README says).
A command's output goes to $SCRATCH/logs/<block>-<n>.log; the summary lists every command and its result.
Exit status: 0 when every command run gave its expected status, 1 otherwise, 2 on a bad README or manifest.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHELL_TAGS = {"sh", "bash", "shell"}
OTHER_TAGS = {"text", "toml", "json", "yaml", "python", "rust", "console-output"}


class Bad(Exception):
    """A README or manifest problem: exit 2 with the message."""


@dataclass
class Command:
    block: int  # 1-based index among the shell blocks
    line: int  # README line of the command's first line
    source: str  # as written (continuations and here-document included)
    text: str  # its name: joined, collapsed, trailing comment dropped
    entry: dict = field(default_factory=dict)

    def action(self) -> str:
        for k in ("skip", "instead", "long"):
            if k in self.entry:
                return k
        return "run"


@dataclass
class Block:
    index: int
    line: int
    commands: list[Command]


def strip_comment(line: str) -> str:
    """`line` without a trailing `# comment` (a `#` at a word start, outside quotes)."""
    quote = None
    prev = " "
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and prev in " \t":
            return line[:i].rstrip()
        prev = c
    return line.rstrip()


def name_of(source: str) -> str:
    """The command's name: continuation lines joined, a here-document's body kept, whitespace collapsed,
    the trailing comment of each line dropped."""
    lines = source.split("\n")
    head, body = [], []
    in_doc = False
    for i, l in enumerate(lines):
        if in_doc:
            body.append(l)
            continue
        s = strip_comment(l)
        if s.endswith("\\"):
            head.append(s[:-1])
        else:
            head.append(s)
            in_doc = i + 1 < len(lines)
    text = " ".join(" ".join(head).split())
    if body:
        # the here-document's lines (its delimiter line dropped), ` | `-separated
        text += " <<" + " | ".join(" ".join(b.split()) for b in body[:-1])
    return text


HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")


def extract(readme: str) -> list[Block]:
    """The shell blocks of `readme` and their commands, in order."""
    blocks: list[Block] = []
    lines = readme.split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^(```+)\s*(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        fence, tag, start = m.group(1), m.group(2), i + 1
        j = i + 1
        while j < len(lines) and not lines[j].startswith(fence):
            j += 1
        if j == len(lines):
            raise Bad(f"README.md:{start}: a fenced block that never closes")
        if tag == "":
            raise Bad(
                f"README.md:{start}: a fenced block without a language tag: tag it ```sh if it holds "
                f"commands (they are run by ci/readme-commands.py), ```text otherwise"
            )
        if tag in SHELL_TAGS:
            blocks.append(Block(len(blocks) + 1, start, commands_of(lines[i + 1 : j], start + 1, len(blocks) + 1)))
        elif tag not in OTHER_TAGS:
            raise Bad(f"README.md:{start}: unknown fence tag {tag!r} (shell: {sorted(SHELL_TAGS)})")
        i = j + 1
    return blocks


def commands_of(lines: list[str], first_line: int, block: int) -> list[Command]:
    out: list[Command] = []
    k = 0
    while k < len(lines):
        l = lines[k]
        if not l.strip() or l.lstrip().startswith("#"):
            k += 1
            continue
        start = k
        src = [l]
        while strip_comment(src[-1]).endswith("\\") and k + 1 < len(lines):
            k += 1
            src.append(lines[k])
        doc = HEREDOC.search(strip_comment(" ".join(src)))
        if doc:
            delim = doc.group(2)
            while True:
                k += 1
                if k == len(lines):
                    raise Bad(f"README.md:{first_line + start}: here-document {delim} never ends")
                src.append(lines[k])
                if lines[k].strip() == delim:
                    break
        source = "\n".join(src)
        out.append(Command(block, first_line + start, source, name_of(source)))
        k += 1
    return out


def load_manifest(path: Path) -> list[dict]:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise Bad(f"{path}: {e}")
    unknown = set(data) - {"command"}
    if unknown:
        raise Bad(f"{path}: unknown top-level keys {sorted(unknown)}")
    entries = data.get("command", [])
    for n, e in enumerate(entries, 1):
        where = f"{path} [[command]] #{n}"
        if not isinstance(e.get("text"), str) or not e["text"].strip():
            raise Bad(f"{where}: no `text`")
        keys = set(e) - {"text", "exit", "why"}
        if keys - {"skip", "instead", "long"}:
            raise Bad(f"{where}: unknown keys {sorted(keys - {'skip', 'instead', 'long'})}")
        if len(keys) > 1:
            raise Bad(f"{where}: at most one of skip, instead, long (has {sorted(keys)})")
        for k in ("skip", "long"):
            if k in e and (not isinstance(e[k], str) or len(e[k].strip()) < 10):
                raise Bad(f"{where}: `{k}` must give the reason, in words")
        if "instead" in e and not str(e.get("why", "")).strip():
            raise Bad(f"{where}: `instead` needs `why` (what the README line leaves open)")
        if "exit" in e and not isinstance(e["exit"], int):
            raise Bad(f"{where}: `exit` must be an integer")
    return entries


def account(blocks: list[Block], entries: list[dict]) -> list[str]:
    """Attaches each entry to its command; the problems: an entry that names no README command (stale),
    an entry named twice. (A command without an entry runs as written: it is accounted for.)"""
    problems = []
    by_text: dict[str, list[Command]] = {}
    for b in blocks:
        for c in b.commands:
            by_text.setdefault(c.text, []).append(c)
    seen = set()
    for e in entries:
        t = " ".join(e["text"].split())
        if t in seen:
            problems.append(f"ci/readme-commands.toml: {t!r} has two entries")
        seen.add(t)
        if t not in by_text:
            problems.append(
                f"ci/readme-commands.toml: {t!r} is no command of README.md (changed or removed? "
                f"`ci/readme-commands.py --list` prints the commands' names)"
            )
            continue
        for c in by_text[t]:
            c.entry = e
    return problems


def describe(c: Command) -> str:
    a = c.action()
    exit_ = f", exit {c.entry['exit']}" if "exit" in c.entry else ""
    if a == "run":
        return f"run{exit_}"
    if a == "instead":
        return f"instead: {c.entry['instead']}{exit_} ({c.entry['why']})"
    return f"{a}: {c.entry[a]}{exit_}"


def numpy_path(cache: Path) -> str | None:
    """A PYTHONPATH entry giving python3 numpy, as ci/test.sh makes it; None when python3 has numpy."""
    if subprocess.run(["python3", "-c", "import numpy"], capture_output=True).returncode == 0:
        return None
    site = cache / "python-numpy"
    subprocess.run(
        ["python3", "-m", "pip", "install", "--quiet", "--target", str(site), "numpy>=1.24"],
        check=False,
        env={**os.environ, "PYTHONPATH": str(site)},
    ) if not (site / "numpy").is_dir() else None
    return str(site)


def script_for(block: Block, long_: bool, status: Path) -> tuple[str, list[Command]]:
    """The bash script of a block: each command run (as written or its `instead`) in order, its exit
    status appended to `status` as `<n> <status>`; skipped ones not in it."""
    parts = ['cd "$R" || exit 2']
    ran = []
    for n, c in enumerate(block.commands, 1):
        a = c.action()
        if a == "skip" or (a == "long" and not long_):
            continue
        src = c.entry["instead"] if a == "instead" else c.source
        log = f'"$LOGS/{block.index:02}-{n:02}.log"'
        # the command runs in this shell (so cd, variables and exports carry on); its output to its log
        parts.append(f"exec 3>&1 4>&2 1>>{log} 2>&1")
        parts.append(src)
        parts.append(f"__rc=$?; exec 1>&3 2>&4; echo \"{n} $__rc\" >> {status}")
        ran.append(c)
    return "\n".join(parts) + "\n", ran


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--long", action="store_true", help="also run the commands marked long")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("--only", help="block numbers to run, comma-separated (see --list)")
    ap.add_argument("--clone-of", type=Path, default=ROOT, help="the checkout whose HEAD is cloned")
    ap.add_argument("--readme", type=Path, default=None)
    ap.add_argument("--manifest", type=Path, default=None)
    ap.add_argument("--block-timeout", type=float, default=3 * 3600)
    args = ap.parse_args()
    readme = args.readme or args.clone_of / "README.md"
    manifest = args.manifest or args.clone_of / "ci" / "readme-commands.toml"
    try:
        blocks = extract(readme.read_text())
        problems = account(blocks, load_manifest(manifest))
    except (Bad, OSError) as e:
        print(f"readme-commands: {e}", file=sys.stderr)
        return 2
    counts: dict[str, int] = {}
    for b in blocks:
        for c in b.commands:
            counts[c.action()] = counts.get(c.action(), 0) + 1
    total = sum(counts.values())
    if args.list or args.check:
        if args.list:
            for b in blocks:
                print(f"block {b.index} (README.md:{b.line})")
                for n, c in enumerate(b.commands, 1):
                    print(f"  {n:2}. {c.text}\n      -> {describe(c)}")
        for p in problems:
            print(p, file=sys.stderr)
        print(
            f"{total} commands in {len(blocks)} shell blocks: "
            + ", ".join(f"{counts[k]} {k}" for k in ("run", "instead", "long", "skip") if k in counts)
            + ("" if not problems else f"; {len(problems)} manifest problems")
        )
        return 1 if problems else 0
    if problems:
        for p in problems:
            print(p, file=sys.stderr)
        return 2

    only = {int(x) for x in args.only.split(",")} if args.only else None
    scratch = Path(tempfile.mkdtemp(prefix="readme-commands-"))
    clone = scratch / "lockstep"
    logs = scratch / "logs"
    logs.mkdir()
    head = subprocess.run(
        ["git", "-C", str(args.clone_of), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(args.clone_of), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    if dirty:
        print("readme-commands: note: the checkout has uncommitted changes; the clone has HEAD only", file=sys.stderr)
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(args.clone_of), str(clone)], check=True)
    if os.environ.get("CARGO_TARGET_DIR"):
        # the README's `target/release/lockstep` is the clone's build: there, in the target directory given
        Path(os.environ["CARGO_TARGET_DIR"]).mkdir(parents=True, exist_ok=True)
        (clone / "target").symlink_to(Path(os.environ["CARGO_TARGET_DIR"]).resolve())
    cache = Path(os.environ.get("LOCKSTEP_CACHE", Path.home() / ".cache" / "lockstep"))
    env = dict(os.environ)
    env["R"] = str(clone)
    env["LOGS"] = str(logs)
    env["CARGO_INSTALL_ROOT"] = str(scratch / "cargo-root")
    env["PATH"] = f"{scratch / 'cargo-root' / 'bin'}:{env['PATH']}"
    env.pop("LOCKSTEP_ROOT", None)
    env.pop("LOCKSTEP_REGISTRY", None)
    np_site = numpy_path(cache)
    if np_site:
        env["PYTHONPATH"] = np_site + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    print(f"readme-commands: README.md of {head} in {clone}; logs in {logs}", flush=True)

    results = []  # (command, outcome, seconds or reason)
    failed = 0
    for b in blocks:
        if only is not None and b.index not in only:
            for c in b.commands:
                results.append((c, "not selected", ""))
            continue
        status = scratch / f"status-{b.index}"
        status.touch()
        script, ran = script_for(b, args.long, status)
        (scratch / f"block-{b.index:02}.sh").write_text(script)
        t0 = time.monotonic()
        try:
            subprocess.run(
                ["bash", str(scratch / f"block-{b.index:02}.sh")],
                env=env,
                cwd=clone,
                timeout=args.block_timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            pass
        dt = time.monotonic() - t0
        got = {}
        for l in status.read_text().split("\n"):
            if l.strip():
                n, rc = l.split()
                got[int(n)] = int(rc)
        for n, c in enumerate(b.commands, 1):
            a = c.action()
            if a == "skip":
                results.append((c, "skipped", c.entry["skip"]))
            elif a == "long" and not args.long:
                results.append((c, "long, not run", c.entry["long"]))
            elif n not in got:
                failed += 1
                results.append((c, "FAILED", "did not finish (block timed out or the shell exited)"))
            else:
                want = c.entry.get("exit", 0)
                ok = got[n] == want
                failed += not ok
                how = "instead" if a == "instead" else "as written"
                results.append(
                    (c, ("ok" if ok else "FAILED") + f" ({how})", f"exit {got[n]}" + ("" if ok else f", expected {want}; log {logs}/{b.index:02}-{n:02}.log"))
                )
        print(f"block {b.index} (README.md:{b.line}): {len(ran)} run, {dt:.0f} s", flush=True)

    print("\nREADME commands, as run on a fresh clone of " + head)
    for c, outcome, detail in results:
        print(f"  README.md:{c.line:<4} {outcome:<22} {c.text[:90]}{'…' if len(c.text) > 90 else ''}")
        if detail:
            print(f"  {'':<12}{detail}")
    tally: dict[str, int] = {}
    for _, outcome, _ in results:
        key = outcome.split(" (")[0]
        tally[key] = tally.get(key, 0) + 1
    print(
        f"\n{len(results)} commands: " + ", ".join(f"{v} {k}" for k, v in sorted(tally.items()))
    )
    if not args.keep and not failed:
        shutil.rmtree(scratch, ignore_errors=True)
    else:
        print(f"scratch kept: {scratch}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
