#!/usr/bin/env python3
"""Runs the jobs of .github/workflows/lockstep.yml on this machine, every step in order (issue 46).

`act` needs Docker images, which this host cannot pull, and the registries' local executors wrap act; so this
script is the local runner: it reads the workflow (PyYAML), orders the jobs by `needs`, expands
`strategy.matrix`, evaluates `if:` and the `${{ }}` expressions the file uses, and runs each `run:` step with
`bash --noprofile --norc -eo pipefail` as GitHub does, in a job workspace of its own (a clone of the checkout's
HEAD, as `actions/checkout` makes it), with GitHub's variables: GITHUB_WORKSPACE, GITHUB_STEP_SUMMARY,
GITHUB_OUTPUT (read back as the step's outputs), GITHUB_ENV, GITHUB_PATH, CI, GITHUB_ACTIONS, RUNNER_OS,
RUNNER_TEMP, the workflow's, job's and step's `env`. The event is a push to refs/heads/main. Jobs run one
after another, every one in the same workspace path ($TMPDIR/lockstep-workflow-steps/work/lockstep, emptied
before each), as GitHub's runners all use /home/runner/work/<repo>/<repo>: reports record their inputs' paths.

The actions it uses are emulated on local directories under the scratch directory:
  actions/checkout                    a clone of HEAD into the job's workspace
  actions/cache, cache/restore, save  a store of keyed directory copies (hard links): a restore tries the key,
                                      then each restore-key prefix (newest first) and sets `cache-hit`;
                                      actions/cache saves at the job's end when the key missed;
                                      `fail-on-cache-miss` fails the step. Paths under ~ are not cached
                                      (the cargo registry: listed as such)
  upload-artifact, download-artifact  a store of named artifacts (`name`, `pattern`, `if-no-files-found`)
  upload-pages-artifact, deploy-pages the site must hold index.html; "deployed" to <scratch>/pages
Any other action is an error. A job's `timeout-minutes` bounds its steps.

Usage: ci/workflow-steps.py [--quick] [--keep] [--job NAME ...]
  --quick  a small matrix: LOCKSTEP_RUN_FILTERS and LOCKSTEP_BENCH_MODELS set to `--model synth-llama`, the
           `models` job's cache seeded from your model cache ($LOCKSTEP_CACHE or ~/.cache/lockstep, hard
           links) as an earlier run's entry under another key (so the restore-keys path is taken and no
           model is downloaded), and the `test` job's `ci/test.sh` (an hour and more) replaced by
           `bash -n ci/test.sh` — printed as a substitution, never silently.
CARGO_TARGET_DIR, when set, stands for each workspace's `target` (a link), so the build is incremental.
Exit status: 0 when every job that should run succeeded, 1 otherwise, 2 on a workflow this runner cannot run.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "lockstep.yml"
# every job's workspace (a fixed path, as on GitHub's runners; a rebuild reuses the last one's artifacts)
WORKSPACE = Path(tempfile.gettempdir()) / "lockstep-workflow-steps" / "work" / "lockstep"


class Unsupported(Exception):
    pass


# ---- expressions -------------------------------------------------------------------------------------------

TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>\d+(?:\.\d+)?)|(?P<op>==|!=|&&|\|\||!|\(|\)|,)"
    r"|(?P<id>[A-Za-z_][A-Za-z0-9_.\-]*))"
)


def evaluate(expr: str, ctx: dict):
    """A `${{ }}` expression of the subset the workflow uses: literals, context paths (`matrix.shard`,
    `steps.cache.outputs.cache-hit`, `needs.build.result`, `env.X`, `github.ref`, `runner.os`), `==`, `!=`,
    `!`, `&&`, `||`, parentheses, and the functions `always()`, `cancelled()`, `success()`, `failure()`,
    `hashFiles(...)`."""
    py = []
    pos = 0
    expr = expr.strip()
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if not m or m.end() == pos:
            raise Unsupported(f"expression {expr!r}: cannot read at {expr[pos:]!r}")
        pos = m.end()
        if m.group("str") is not None:
            py.append(repr(m.group("str")[1:-1].replace("''", "'")))
        elif m.group("num") is not None:
            py.append(m.group("num"))
        elif m.group("op") is not None:
            py.append({"&&": " and ", "||": " or ", "!": " not "}.get(m.group("op"), m.group("op")))
        else:
            name = m.group("id")
            if expr[pos:].lstrip().startswith("("):
                if name not in ("always", "cancelled", "success", "failure", "hashFiles"):
                    raise Unsupported(f"expression {expr!r}: function {name}")
                py.append(f"F_{name}")
            elif name in ("true", "false", "null"):
                py.append({"true": "True", "false": "False", "null": "None"}[name])
            else:
                py.append(repr(lookup(name, ctx)))
    funcs = {
        "F_always": lambda: True,
        "F_cancelled": lambda: False,
        "F_success": lambda: not ctx["failed"],
        "F_failure": lambda: ctx["failed"],
        "F_hashFiles": lambda *pats: hash_files(ctx["workspace"], pats),
    }
    return eval("".join(py), {"__builtins__": {}}, funcs)  # noqa: S307 (our own tokens only)


def lookup(path: str, ctx: dict):
    parts = path.split(".")
    v = ctx
    for p in parts:
        if isinstance(v, dict):
            v = v.get(p, "")
        else:
            return ""
    return v


def hash_files(workspace: Path, pats) -> str:
    h = hashlib.sha256()
    n = 0
    for pat in pats:
        for f in sorted(workspace.glob(pat)):
            if f.is_file():
                h.update(hashlib.sha256(f.read_bytes()).digest())
                n += 1
    return h.hexdigest() if n else ""


def substitute(text, ctx):
    if not isinstance(text, str):
        return text
    return re.sub(r"\$\{\{(.*?)\}\}", lambda m: str(fmt(evaluate(m.group(1), ctx))), text)


def fmt(v):
    if v is True:
        return "true"
    if v is False:
        return "false"
    return "" if v is None else v


def condition(cond, ctx, default_success=True) -> bool:
    if cond is None:
        return not ctx["failed"] if default_success else True
    c = str(cond).strip()
    if c.startswith("${{") and c.endswith("}}"):
        c = c[3:-2]
    funcs = ("always()", "cancelled()", "success()", "failure()")
    v = evaluate(c, ctx)
    # GitHub adds success() to a condition without a status function
    if not any(f in c for f in funcs):
        return bool(v) and not ctx["failed"]
    return bool(v)


# ---- stores ------------------------------------------------------------------------------------------------


def copy_tree(src: Path, dst: Path):
    """src into dst, hard links for files (cp -al), symlinks kept."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir() and not src.is_symlink():
        dst.mkdir(parents=True, exist_ok=True)
        a, b = f"{src}/.", str(dst)
    else:
        a, b = str(src), str(dst)
    # hard links where the two are on one file system, else a copy
    if subprocess.run(["cp", "-al", a, b], capture_output=True).returncode != 0:
        subprocess.run(["cp", "-a", a, b], check=True)


class Runner:
    def __init__(self, scratch: Path, quick: bool, log):
        self.scratch = scratch
        self.quick = quick
        self.log = log
        self.caches = scratch / "caches"
        self.artifacts = scratch / "artifacts"
        self.caches.mkdir()
        self.artifacts.mkdir()

    # cache paths: a list of lines; `~` paths are not cached
    def cache_paths(self, with_, ctx):
        paths = [substitute(p.strip(), ctx) for p in str(with_.get("path", "")).split("\n") if p.strip()]
        kept = [p for p in paths if not p.startswith("~")]
        skipped = [p for p in paths if p.startswith("~")]
        return kept, skipped

    def restore(self, with_, ctx, step_outputs) -> bool:
        key = substitute(with_["key"], ctx)
        prefixes = [substitute(k.strip(), ctx) for k in str(with_.get("restore-keys", "")).split("\n") if k.strip()]
        paths, skipped = self.cache_paths(with_, ctx)
        entry = self.caches / key
        hit = entry.is_dir()
        if not hit:
            for pre in prefixes:
                cands = sorted(
                    (d for d in self.caches.iterdir() if d.name.startswith(pre)),
                    key=lambda d: d.stat().st_mtime,
                    reverse=True,
                )
                if cands:
                    entry = cands[0]
                    break
            else:
                entry = None
        step_outputs["cache-hit"] = "true" if hit else "false"
        step_outputs["cache-matched-key"] = entry.name if entry else ""
        if entry is None:
            self.log(f"      cache: no entry for {key} (restore-keys {prefixes})")
            if with_.get("fail-on-cache-miss"):
                raise StepFailed(f"cache miss for {key} with fail-on-cache-miss")
            return False
        for i, p in enumerate(paths):
            src = entry / str(i)
            if src.exists():
                dst = Path(p) if os.path.isabs(p) else ctx["workspace"] / p
                if dst.is_symlink() or (dst.exists() and not dst.is_dir()):
                    dst.unlink()
                copy_tree(src, dst)
        self.log(
            f"      cache: restored {entry.name} ({'exact key' if hit else 'restore-key'})"
            + (f"; not cached here (home directory): {skipped}" if skipped else "")
        )
        return hit

    def save(self, with_, ctx):
        key = substitute(with_["key"], ctx)
        entry = self.caches / key
        if entry.exists():
            self.log(f"      cache: {key} exists, not saved again (GitHub: caches are immutable)")
            return
        paths, skipped = self.cache_paths(with_, ctx)
        tmp = self.caches / (".tmp-" + key)
        tmp.mkdir()
        for i, p in enumerate(paths):
            src = Path(p) if os.path.isabs(p) else ctx["workspace"] / p
            if not src.exists():
                raise StepFailed(f"cache save {key}: path {p} does not exist")
            copy_tree(src, tmp / str(i))
        tmp.rename(entry)
        self.log(f"      cache: saved {key}" + (f"; not cached here (home directory): {skipped}" if skipped else ""))

    def upload(self, name, with_, ctx, pages=False):
        paths = [substitute(p.strip(), ctx) for p in str(with_.get("path", "")).split("\n") if p.strip()]
        dst = self.artifacts / name
        if dst.exists():
            raise StepFailed(f"artifact {name} uploaded twice")
        found = []
        for p in paths:
            src = ctx["workspace"] / p
            if src.exists():
                found.append(p)
                target = dst if len(paths) == 1 and src.is_dir() else dst / (p.rstrip("/") if len(paths) > 1 else src.name)
                copy_tree(src, target)
        if not found:
            if with_.get("if-no-files-found", "warn") == "error" or pages:
                raise StepFailed(f"artifact {name}: no files at {paths}")
            self.log(f"      artifact {name}: no files (warning)")
            return
        if pages and not (dst / "index.html").is_file():
            raise StepFailed(f"pages artifact: {paths} holds no index.html")
        days = with_.get("retention-days")
        self.log(f"      artifact {name}: {', '.join(found)}" + (f" (kept {days} days)" if days else ""))

    def download(self, with_, ctx):
        path = ctx["workspace"] / substitute(with_.get("path", "."), ctx)
        if "name" in with_:
            names = [substitute(with_["name"], ctx)]
            src = self.artifacts / names[0]
            if not src.exists():
                raise StepFailed(f"artifact {names[0]} not found")
            copy_tree(src, path)
        else:
            pat = substitute(with_["pattern"], ctx)
            names = sorted(d.name for d in self.artifacts.iterdir() if Path(d.name).match(pat))
            if not names:
                raise StepFailed(f"no artifact matches {pat}")
            for n in names:
                copy_tree(self.artifacts / n, path / n)
        self.log(f"      downloaded {', '.join(names)} into {path.relative_to(ctx['workspace'])}")


class StepFailed(Exception):
    pass


# ---- jobs --------------------------------------------------------------------------------------------------


def order(jobs: dict) -> list[str]:
    done, out = set(), []
    pending = list(jobs)
    while pending:
        ready = [j for j in pending if set(needs_of(jobs[j])) <= done]
        if not ready:
            raise Unsupported(f"the needs graph has a cycle among {pending}")
        for j in ready:
            out.append(j)
            done.add(j)
            pending.remove(j)
    return out


def needs_of(job) -> list[str]:
    n = job.get("needs", [])
    return [n] if isinstance(n, str) else list(n)


def matrix_of(job) -> list[dict]:
    m = (job.get("strategy") or {}).get("matrix")
    if not m:
        return [{}]
    keys = [k for k in m if k not in ("include", "exclude")]
    if set(m) - set(keys):
        raise Unsupported("matrix include/exclude")
    return [dict(zip(keys, vals)) for vals in itertools.product(*(m[k] for k in keys))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--workflow", type=Path, default=WORKFLOW)
    ap.add_argument("--clone-of", type=Path, default=ROOT)
    args = ap.parse_args()

    wf = yaml.safe_load(args.workflow.read_text())
    jobs = wf["jobs"]
    scratch = Path(tempfile.mkdtemp(prefix="workflow-steps-"))
    lines = []

    def log(msg):
        print(msg, flush=True)
        lines.append(msg)

    runner = Runner(scratch, args.quick, log)
    head = subprocess.run(["git", "-C", str(args.clone_of), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    wenv = {k: str(v) for k, v in (wf.get("env") or {}).items()}
    if args.quick:
        wenv_over = {"LOCKSTEP_RUN_FILTERS": "--model synth-llama", "LOCKSTEP_BENCH_MODELS": "--model synth-llama"}
    else:
        wenv_over = {}
    user_cache = Path(os.environ.get("LOCKSTEP_CACHE", Path.home() / ".cache" / "lockstep"))
    if args.quick:
        # an earlier run's model cache, under another key: the models job takes it through restore-keys
        seed = runner.caches / "lockstep-models-earlier-run"
        (seed / "0").mkdir(parents=True)
        for sub in ("models", "variants", "corpora"):
            if (user_cache / sub).is_dir():
                copy_tree(user_cache / sub, seed / "0" / sub)
        os.utime(seed, (0, 0))
        log(f"quick: model cache seeded from {user_cache} as cache entry {seed.name}")
    results = {}
    t_all = time.monotonic()
    log(f"workflow {wf.get('name')} at {head[:12]}; scratch {scratch}")
    for name in order(jobs):
        job = jobs[name]
        needs = needs_of(job)
        ctx0 = {
            "github": {
                "workspace": "",
                "run_id": "4242",
                "run_attempt": "1",
                "ref": "refs/heads/main",
                "event_name": "push",
                "sha": head,
                "repository": "local/lockstep",
            },
            "runner": {"os": "Linux", "temp": ""},
            "needs": {n: {"result": results.get(n, "skipped")} for n in needs},
            "failed": any(results.get(n) != "success" for n in needs),
            "env": dict(wenv),
            "workspace": ROOT,
        }
        if not condition(job.get("if"), ctx0):
            results[name] = "skipped"
            log(f"job {name}: skipped (if: {job.get('if', 'needs succeeded')}; needs {ctx0['needs']})")
            continue
        outcomes = []
        for mvals in matrix_of(job):
            outcomes.append(run_job(name, job, mvals, ctx0, wenv, wenv_over, runner, scratch, args, log))
        results[name] = "success" if all(outcomes) else "failure"
        log(f"job {name}: {results[name]}")
    log(f"\njobs: " + ", ".join(f"{j} {r}" for j, r in results.items()) + f"; {time.monotonic() - t_all:.0f} s")
    (scratch / "summary.txt").write_text("\n".join(lines) + "\n")
    ok = all(r in ("success", "skipped") for r in results.values()) and all(
        r == "success" for r in results.values()
    )
    if not args.keep and ok:
        shutil.rmtree(scratch, ignore_errors=True)
    else:
        log(f"scratch kept: {scratch}")
    return 0 if ok else 1


def run_job(name, job, mvals, ctx0, wenv, wenv_over, runner, scratch, args, log) -> bool:
    label = name + (f" ({', '.join(f'{k}={v}' for k, v in mvals.items())})" if mvals else "")
    jdir = scratch / "jobs" / re.sub(r"[^A-Za-z0-9_.-]+", "-", label)
    # one workspace path for every job, emptied before each, as every GitHub runner checks out into
    # /home/runner/work/<repo>/<repo>: reports record their input files' paths, and the merge compares them
    ws = WORKSPACE
    if ws.exists():
        shutil.rmtree(ws)
    temp = jdir / "tmp"
    ws.mkdir(parents=True)
    temp.mkdir(parents=True)
    summary = jdir / "step-summary.md"
    summary.touch()
    ctx = dict(ctx0)
    ctx["github"] = dict(ctx0["github"], workspace=str(ws))
    ctx["runner"] = dict(ctx0["runner"], temp=str(temp))
    ctx["workspace"] = ws
    ctx["matrix"] = mvals
    ctx["steps"] = {}
    ctx["failed"] = False
    env = {}
    for k, v in wenv.items():
        env[k] = str(substitute(v, ctx))
    env.update(wenv_over)
    for k, v in (job.get("env") or {}).items():
        env[k] = str(substitute(v, ctx))
    ctx["env"] = env
    timeout = float(job["timeout-minutes"]) * 60
    t0 = time.monotonic()
    posts = []
    log(f"job {label}: {len(job['steps'])} steps, timeout {job['timeout-minutes']} min")
    for i, step in enumerate(job["steps"], 1):
        sname = step.get("name") or step.get("uses") or step["run"].split("\n")[0]
        sname = substitute(sname, ctx)
        if not condition(step.get("if"), ctx):
            log(f"  [{i}] {sname}: skipped (if: {step.get('if', 'success()')})")
            continue
        outputs = {}
        t1 = time.monotonic()
        try:
            if "uses" in step:
                run_action(step, ctx, runner, ws, posts, outputs, log)
            else:
                script = substitute(step["run"], ctx)
                if runner.quick and name == "test" and script.strip() == "ci/test.sh":
                    log("      quick: `ci/test.sh` (over an hour) replaced by `bash -n ci/test.sh` (its syntax)")
                    script = "bash -n ci/test.sh"
                run_script(script, step, ctx, env, ws, temp, summary, jdir, i, outputs, timeout - (time.monotonic() - t0))
            status = "ok"
        except StepFailed as e:
            ctx["failed"] = True
            status = f"FAILED: {e}"
        if "id" in step:
            ctx["steps"][step["id"]] = {"outputs": outputs}
        log(f"  [{i}] {sname}: {status} ({time.monotonic() - t1:.1f} s)")
    for with_ in posts:
        if not ctx["failed"]:
            runner.save(with_, ctx)
    text = summary.read_text()
    if text.strip():
        log("      $GITHUB_STEP_SUMMARY: " + " / ".join(l for l in text.splitlines() if l.strip())[:300])
    return not ctx["failed"]


def run_script(script, step, ctx, env, ws, temp, summary, jdir, i, outputs, remaining):
    out_file = jdir / f"output-{i}"
    env_file = jdir / f"env-{i}"
    path_file = jdir / f"path-{i}"
    for f in (out_file, env_file, path_file):
        f.touch()
    senv = dict(os.environ)
    senv.update(env)
    for k, v in (step.get("env") or {}).items():
        senv[k] = str(substitute(v, ctx))
    senv.update(
        {
            "CI": "true",
            "GITHUB_ACTIONS": "true",
            "GITHUB_WORKSPACE": str(ws),
            "GITHUB_STEP_SUMMARY": str(summary),
            "GITHUB_OUTPUT": str(out_file),
            "GITHUB_ENV": str(env_file),
            "GITHUB_PATH": str(path_file),
            "GITHUB_REF": ctx["github"]["ref"],
            "GITHUB_SHA": ctx["github"]["sha"],
            "GITHUB_EVENT_NAME": ctx["github"]["event_name"],
            "GITHUB_RUN_ID": ctx["github"]["run_id"],
            "RUNNER_OS": "Linux",
            "RUNNER_TEMP": str(temp),
        }
    )
    senv.pop("LOCKSTEP_ROOT", None)
    sfile = jdir / f"step-{i}.sh"
    sfile.write_text(script)
    log_file = jdir / f"step-{i}.log"
    with open(log_file, "w") as lf:
        try:
            p = subprocess.run(
                ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(sfile)],
                cwd=ws,
                env=senv,
                stdout=lf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=max(remaining, 1),
            )
        except subprocess.TimeoutExpired:
            raise StepFailed(f"the job's timeout-minutes ran out (log {log_file})")
    for l in out_file.read_text().splitlines():
        if "=" in l:
            k, v = l.split("=", 1)
            outputs[k] = v
    for l in env_file.read_text().splitlines():
        if "=" in l:
            k, v = l.split("=", 1)
            env[k] = v
    tail = log_file.read_text(errors="replace").strip().splitlines()[-3:]
    for l in tail:
        print(f"        | {l[:160]}")
    if p.returncode != 0:
        raise StepFailed(f"exit {p.returncode} (log {log_file})")


def run_action(step, ctx, runner, ws, posts, outputs, log):
    uses = step["uses"]
    action, _, version = uses.partition("@")
    with_ = {k: v for k, v in (step.get("with") or {}).items()}
    if action == "actions/checkout":
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(ws)], check=True)
        if os.environ.get("CARGO_TARGET_DIR"):
            (ws / "target").symlink_to(Path(os.environ["CARGO_TARGET_DIR"]).resolve())
        log(f"      checkout: clone of HEAD" + (" (target -> $CARGO_TARGET_DIR)" if os.environ.get("CARGO_TARGET_DIR") else ""))
    elif action == "actions/cache":
        hit = runner.restore(with_, ctx, outputs)
        if not hit:
            posts.append(with_)
    elif action == "actions/cache/restore":
        runner.restore(with_, ctx, outputs)
    elif action == "actions/cache/save":
        runner.save(with_, ctx)
    elif action == "actions/upload-artifact":
        runner.upload(substitute(with_["name"], ctx), with_, ctx)
    elif action == "actions/download-artifact":
        runner.download(with_, ctx)
    elif action == "actions/upload-pages-artifact":
        runner.upload("github-pages", with_, ctx, pages=True)
    elif action == "actions/deploy-pages":
        site = runner.artifacts / "github-pages"
        if not (site / "index.html").is_file():
            raise StepFailed("no github-pages artifact with index.html")
        dst = runner.scratch / "pages"
        copy_tree(site, dst)
        outputs["page_url"] = f"file://{dst}/index.html"
        log(f"      deployed: {outputs['page_url']} ({sum(1 for _ in dst.rglob('*.html'))} pages)")
    else:
        raise Unsupported(f"action {uses}")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Unsupported as e:
        print(f"workflow-steps: cannot run this workflow: {e}", file=sys.stderr)
        sys.exit(2)
