"""Every command shown in README.md and docs/*.md still parses its arguments (issue 25).

The commands are the fenced ``bash``/``sh``/``shell`` blocks (every line a command, ``\\`` continuations joined),
the ``$ `` lines of any fenced block (``console`` blocks: the other lines are output), and the inline code spans
that start like a command (``python -m …``, ``./lab …``).  Each is split as the shell splits it: environment
assignments, ``sudo``, ``&&``, ``;``, pipes, redirections and ``mpirun``'s own options (its ``:``-separated
programs each checked) are taken off, and every program left is checked:

* ``python -m X …``, ``python benchmarks/….py …``, ``python scripts/….py …``, ``pytest …``: the same program
  with ``--help`` must exit 0, and every option the documented command uses must appear in that help (a
  subcommand's own help for ``visualize KIND``; ``tracing COMMAND`` must name COMMAND);
* ``./lab SUB …``: ``./lab --help`` must list ``./lab SUB``, and the options go to the program SUB hands them to
  (``main`` → ``python -m collectives.ring``, ``bench`` → ``benchmarks/allreduce_vs_mpi.py``, ``test`` →
  pytest);
* ``mpirun``'s own options must appear in ``mpirun --help``;
* every argument that names a file of the repository (``topologies/…``, ``tests/…``) must exist;
* shell tools in a pipe (``grep``, ``head``) must be installed.

Nothing is run for real: a ``--help`` per program, about 30 of them in parallel, well under a minute.  What cannot
run here is listed in ``NOT_RUN`` with the reason, and each entry must still match a documented command.  The docs'
relative links and the repository paths they name must exist, and the lab's variables they name must be read
somewhere in the code.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

# Programs a documented command may name that this test does not start, and why; each is still checked as far
# as it can be (see plan()).  An entry that matches no documented command any more fails
# test_every_exemption_is_used.
NOT_RUN = {
    # the user's own script in "mpirun -n 4 python my_script.py": a placeholder, there is nothing to run
    "my_script.py": "the user's own script (a placeholder)",
    # needs root, iproute2 and network namespaces: checked for existence, the execute bit, `bash -n` and the
    # variables the documented command sets (each must appear in the script), never run
    "scripts/netns_test.sh": "needs root and network namespaces",
    # torchrun (torch's launcher, --standalone or across hosts with a rendezvous) is torch's program, not ours;
    # its flags are torch's and importing torch costs seconds: not checked (tests/test_torchrun.py runs it)
    "torchrun": "torch's launcher, not ours",
}

SHELL_TOOLS = {"grep", "head", "tail", "cut", "tr", "sort", "uniq", "wc", "cat", "ls", "diff", "less", "tee"}
REPO_DIRS = ("collectives", "transports", "tracing", "visualize", "tests", "benchmarks", "scripts", "docs",
             "topologies")
SUBCOMMANDS = {"visualize": "help", "tracing": "word"}  # python -m X SUB: SUB's own help / SUB named in X's help
LAB_TARGETS = {  # ./lab SUB FLAGS: which program FLAGS reach
    "main": ("-m", "collectives.ring"),
    "bench": ("benchmarks/allreduce_vs_mpi.py",),
    "test": ("-m", "pytest"),
}
# MPICH hydra's options this test knows, with the number of values each takes
MPIRUN_OPTS = {"-n": 1, "-np": 1, "-ppn": 1, "-hosts": 1, "-host": 1, "-f": 1, "-wdir": 1, "-configfile": 1,
               "-genvlist": 1, "-envlist": 1, "-genv": 2, "-env": 2, "-genvall": 0, "-genvnone": 0, "-envall": 0,
               "-envnone": 0, "-l": 0, "-prepend-rank": 0, "-bind-to": 1, "-map-by": 1, "-launcher": 1}
INLINE_START = re.compile(r"^(python3? (-m |benchmarks/|scripts/|tests/)|\.venv/bin/python |\./lab\b|mpirun |pytest )")
ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class Command:
    doc: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


@dataclass(frozen=True)
class Need:
    """Run ``argv`` (cwd: the repository) and expect exit 0 and each of ``words`` in its output."""
    argv: tuple[str, ...]
    words: tuple[str, ...]
    what: str


@dataclass
class Plan:
    needs: list[Need] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    not_run: list[str] = field(default_factory=list)


# --- extraction --------------------------------------------------------------------------------------------------
def docs(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def fences(text: str):
    """(language, first line number, lines) of each fenced block, and the text outside them (fences blanked)."""
    blocks, outside, lines = [], [], text.splitlines()
    i = 0
    while i < len(lines):
        s = lines[i].strip()
        if s.startswith("```"):
            lang, start, body = s[3:].strip().lower(), i + 1, []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                body.append(lines[i])
                i += 1
            blocks.append((lang, start + 1, body))
            outside += [""] * (len(body) + 2)
        else:
            outside.append(lines[i])
        i += 1
    return blocks, outside


def extract(path: Path, root: Path = ROOT) -> tuple[list[Command], list[str]]:
    """The commands of one markdown file, and the command-like lines of blocks not marked as shell."""
    name = str(path.relative_to(root))
    blocks, outside = fences(path.read_text())
    cmds, unmarked = [], []
    for lang, first, body in blocks:
        pending, pending_line = "", 0
        for k, raw in enumerate(body):
            s = raw.strip()
            if lang in ("bash", "sh", "shell"):
                if pending:
                    s, start = pending + " " + s, pending_line
                else:
                    start = first + k
                if not s or s.startswith("#"):
                    continue
                if s.endswith("\\"):
                    pending, pending_line = s[:-1], start
                    continue
                pending = ""
                cmds.append(Command(name, start, s))
            elif s.startswith("$ "):
                cmds.append(Command(name, first + k, s[2:].strip()))
            elif INLINE_START.match(s) and lang not in ("python", "console"):
                unmarked.append(f"{name}:{first + k}: {s}")
    # inline spans, possibly wrapped over two lines of a paragraph
    text = "\n".join(outside)
    for m in re.finditer(r"`([^`\n]+(?:\n[^`\n]+)?)`", text):
        span = " ".join(m.group(1).split())
        if INLINE_START.match(span):
            cmds.append(Command(name, text.count("\n", 0, m.start()) + 1, span))
    return cmds, unmarked


@lru_cache(maxsize=None)
def all_commands(root: Path = ROOT) -> tuple[Command, ...]:
    return tuple(c for d in docs(root) for c in extract(d, root)[0])


# --- planning ----------------------------------------------------------------------------------------------------
def words(text: str) -> list[str]:
    text = re.sub(r"\s\d*(>>?|<)&?\s*\S+", " ", " " + text)  # redirections: 2>&1, > out, < in
    lex = shlex.shlex(text, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    return list(lex)


def segments(tokens: list[str]) -> list[list[str]]:
    out, cur = [], []
    for t in tokens:
        if t in ("|", "||", "&&", ";", "&"):
            out.append(cur)
            cur = []
        else:
            cur.append(t)
    out.append(cur)
    return [s for s in out if s]


def options(args: list[str]) -> list[str]:
    """The options a command line uses: -x, --long (a --long=value's name), brackets of a usage line taken off."""
    found = []
    for a in args:
        a = a.strip("[]")
        if re.fullmatch(r"-{1,2}[A-Za-z][\w-]*(=.*)?", a):
            found.append(a.split("=", 1)[0])
    return found


def repo_paths(args: list[str], root: Path) -> list[str]:
    missing = []
    for a in args:
        a = a.strip("[]")
        for part in a.split("="):
            if re.match(rf"^({'|'.join(REPO_DIRS)})/", part) and not list(root.glob(part)):
                missing.append(part)
    return missing


def python_program(args: list[str], root: Path, plan: Plan, what: str) -> None:
    """``python -m MOD ARGS`` or ``python SCRIPT ARGS`` (args start after ``python``)."""
    if args[:1] == ["-m"] and len(args) >= 2:
        mod, rest = args[1], args[2:]
        argv: tuple[str, ...] = (PY, "-m", mod)
        if mod in SUBCOMMANDS:
            sub = next((a for a in rest if not a.startswith("-")), None)
            if sub and not sub.isupper():  # KIND, COMMAND: a placeholder in prose
                if SUBCOMMANDS[mod] == "help":
                    plan.needs.append(Need((*argv, sub, "--help"), tuple(options(rest)), f"{what}: python -m {mod} {sub}"))
                    plan.problems += [f"missing file {p}" for p in repo_paths(rest, root)]
                    return
                plan.needs.append(Need((*argv, "--help"), (sub, *options(rest)), f"{what}: python -m {mod}"))
                plan.problems += [f"missing file {p}" for p in repo_paths(rest, root)]
                return
        plan.needs.append(Need((*argv, "--help"), tuple(options(rest)), f"{what}: python -m {mod}"))
        plan.problems += [f"missing file {p}" for p in repo_paths(rest, root)]
        return
    if not args:
        plan.problems.append(f"{what}: python with no program")
        return
    script, rest = args[0], args[1:]
    if script in NOT_RUN:
        plan.not_run.append(f"{script}: {NOT_RUN[script]}")
        return
    if not (root / script).is_file():
        plan.problems.append(f"{what}: no such script {script}")
        return
    plan.needs.append(Need((PY, script, "--help"), tuple(options(rest)), f"{what}: python {script}"))
    plan.problems += [f"missing file {p}" for p in repo_paths(rest, root)]


def program(seg: list[str], root: Path, plan: Plan, what: str) -> None:
    while seg and (ENV_ASSIGN.match(seg[0]) or seg[0] in ("sudo", "env", "time")):
        seg = seg[1:]
    if not seg:
        return
    prog, args = seg[0], seg[1:]
    if prog in ("python", "python3", ".venv/bin/python", PY):
        python_program(args, root, plan, what)
    elif prog in ("pytest", ".venv/bin/pytest"):
        python_program(["-m", "pytest", *args], root, plan, what)
    elif prog in ("mpirun", "mpiexec"):
        mpirun(args, root, plan, what)
    elif prog == "./lab":
        sub = args[0] if args else None
        if sub is None or sub in ("-h", "--help", "help"):
            plan.needs.append(Need(("./lab", "--help"), (), "./lab"))
            return
        plan.needs.append(Need(("./lab", "--help"), (f"./lab {sub}",), "./lab"))
        if sub not in LAB_TARGETS:
            plan.problems.append(f"{what}: ./lab {sub}: the test does not know where its flags go")
            return
        target = LAB_TARGETS[sub]
        flags = options(args[1:])
        if target[0] == "-m":
            plan.needs.append(Need((PY, *target, "--help"), tuple(flags), f"{what}: ./lab {sub} → python {' '.join(target)}"))
        else:
            plan.needs.append(Need((PY, *target, "--help"), tuple(flags), f"{what}: ./lab {sub} → python {target[0]}"))
        plan.problems += [f"missing file {p}" for p in repo_paths(args[1:], root)]
    elif prog in NOT_RUN:
        plan.not_run.append(f"{prog}: {NOT_RUN[prog]}")
        script = root / prog
        if script.is_file():
            if not os.access(script, os.X_OK):
                plan.problems.append(f"{what}: {prog} is not executable")
            r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
            if r.returncode:
                plan.problems.append(f"{what}: bash -n {prog}: {r.stderr.strip()}")
            body = script.read_text()
            for a in seg:
                if ENV_ASSIGN.match(a) and a.split("=")[0] not in body:
                    plan.problems.append(f"{what}: {prog} never reads {a.split('=')[0]}")
        elif "/" in prog:
            plan.problems.append(f"{what}: no such script {prog}")
    elif prog in SHELL_TOOLS:
        if shutil.which(prog) is None:
            plan.problems.append(f"{what}: {prog} is not installed")
    else:
        plan.problems.append(f"{what}: unknown program {prog!r}: teach tests/test_doc_commands.py how to check it")


def mpirun(args: list[str], root: Path, plan: Plan, what: str) -> None:
    used, i = [], 0
    while i <= len(args):
        # one section: options, then the program and its arguments up to ':'
        while i < len(args) and args[i].startswith("-"):
            opt = args[i]
            if opt not in MPIRUN_OPTS:
                plan.problems.append(f"{what}: mpirun option {opt} unknown to tests/test_doc_commands.py")
                return
            used.append(opt)
            i += 1 + MPIRUN_OPTS[opt]
        end = args.index(":", i) if ":" in args[i:] else len(args)
        if i < end:
            program(args[i:end], root, plan, what)
        i = end + 1
    plan.needs.append(Need(("mpirun", "--help"), tuple(dict.fromkeys(used)), f"{what}: mpirun"))


def plan_for(cmd: Command, root: Path = ROOT) -> Plan:
    plan = Plan()
    try:
        tokens = words(cmd.text)
    except ValueError as e:
        plan.problems.append(f"cannot split it as the shell would: {e}")
        return plan
    for seg in segments(tokens):
        program(seg, root, plan, seg[0] if not ENV_ASSIGN.match(seg[0]) else "the command")
    return plan


# --- running -----------------------------------------------------------------------------------------------------
def run_help(argv: tuple[str, ...], root: Path) -> tuple[int, str]:
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(PY) + os.pathsep + env.get("PATH", "")
    env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    try:
        r = subprocess.run(list(argv), cwd=root, env=env, capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return 127, str(e)
    return r.returncode, r.stdout + r.stderr


def missing_words(expected: tuple[str, ...], help_text: str) -> list[str]:
    """The options (or names) of ``expected`` that ``help_text`` does not contain as a whole word."""
    return [w for w in expected if not re.search(rf"(?<![\w-]){re.escape(w)}(?![\w-])", help_text)]


def helps(plans, root: Path) -> dict[tuple[str, ...], tuple[int, str]]:
    argvs = sorted({n.argv for p in plans for n in p.needs})
    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(argvs, pool.map(lambda a: run_help(a, root), argvs)))


def check(cmds, root: Path = ROOT) -> dict[Command, list[str]]:
    """Each command's problems (an empty list: it parses)."""
    plans = {c: plan_for(c, root) for c in cmds}
    outputs = helps(plans.values(), root)
    result = {}
    for c, p in plans.items():
        problems = list(p.problems)
        for n in p.needs:
            rc, out = outputs[n.argv]
            if rc != 0:
                problems.append(f"{n.what}: `{' '.join(n.argv[1:] if n.argv[0] == PY else n.argv)}` exited {rc}: "
                                f"{out.strip().splitlines()[-1] if out.strip() else ''}")
            elif missing_words(n.words, out):
                problems.append(f"{n.what}: its --help has no {', '.join(missing_words(n.words, out))}")
        result[c] = problems
    return result


@pytest.fixture(scope="module")
def results():
    return check(all_commands())


def test_the_docs_show_commands():
    names = {c.doc for c in all_commands()}
    assert "README.md" in names and len(all_commands()) > 50, names


@pytest.mark.parametrize("cmd", all_commands(), ids=lambda c: f"{c.doc}:{c.line}")
def test_command_parses(cmd, results):
    assert not results[cmd], f"{cmd}\n  " + "\n  ".join(results[cmd])


def test_every_exemption_is_used():
    plans = [plan_for(c) for c in all_commands()]
    used = {n.split(":")[0] for p in plans for n in p.not_run}
    unused = set(NOT_RUN) - used
    assert not unused, f"NOT_RUN entries that match no documented command any more: {sorted(unused)}"


def test_no_command_hides_in_an_unmarked_block():
    found = [u for d in docs() for u in extract(d)[1]]
    assert not found, "commands in blocks not marked bash/sh/console (so never checked):\n" + "\n".join(found)


# --- links, paths, variables ---------------------------------------------------------------------------------------
def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    h = re.sub(r"[`*_\[\]()]", "", heading.strip().lower())
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    _, outside = fences(path.read_text())
    return {slug(m.group(1)) for line in outside if (m := re.match(r"#{1,6}\s+(.*)", line))}


@pytest.mark.parametrize("doc", docs(), ids=lambda p: p.name)
def test_links_and_paths_exist(doc):
    _, outside = fences(doc.read_text())
    text = "\n".join(outside)
    problems = []
    for m in re.finditer(r"\]\(([^)\s]+)\)", text):
        target = m.group(1)
        if re.match(r"^[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            problems.append(f"link to {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"link to {target}: no such heading")
    # repository paths in code spans; in a table row, a bare name after a path is taken in that path's folder
    for line in text.splitlines():
        cells = line.split("|")[1:2] if line.startswith("|") else [line]
        for cell in cells:
            folder = None
            for span in re.findall(r"`([^`]+)`", cell):
                span = span.strip()
                if re.fullmatch(rf"({'|'.join(REPO_DIRS)})/[\w./*-]*", span):
                    module_attr = re.fullmatch(r"(.+)\.[A-Za-z_]\w*", span)  # transports/base.Transport
                    if not list(ROOT.glob(span.rstrip("/"))) and not (
                            module_attr and (ROOT / (module_attr.group(1) + ".py")).is_file()):
                        problems.append(f"`{span}`: no such file or folder")
                    folder = span if span.endswith("/") else span.rsplit("/", 1)[0] + "/"
                elif folder and line.startswith("|") and re.fullmatch(r"[\w-]+(\.py|/)", span):
                    if not (ROOT / folder / span).exists():
                        problems.append(f"`{span}` (in {folder}): no such file or folder")
    assert not problems, f"{doc.name}:\n  " + "\n  ".join(problems)


@lru_cache(maxsize=None)
def code_text() -> str:
    files = [ROOT / "lab", *ROOT.glob("scripts/*"), *ROOT.glob("benchmarks/*")]
    for d in ("collectives", "transports", "tracing", "visualize"):
        files += (ROOT / d).rglob("*.py")
    return "\n".join(f.read_text(errors="replace") for f in files if f.is_file())


@pytest.mark.parametrize("doc", docs(), ids=lambda p: p.name)
def test_documented_variables_are_read(doc):
    """Each ``NCCLLAB_`` variable a doc names, and each variable of docs/environment.md, is in the code."""
    text = doc.read_text()
    names = set(re.findall(r"\bNCCLLAB_[A-Z0-9_]*[A-Z0-9]\b", text))
    if doc.name == "environment.md":
        names |= set(re.findall(r"`(NCCL_[A-Z0-9_]*[A-Z0-9])`", text))
        names |= set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)`", text, re.M))
    missing = sorted(n for n in names if not re.search(rf"\b{n}\b", code_text()))
    assert not missing, f"{doc.name} names variables no code reads: {missing}"


# --- the checker itself ------------------------------------------------------------------------------------------
def test_a_removed_flag_fails(tmp_path):
    """A documented option the program no longer has is reported, naming the option (end to end: a program
    and a doc in a scratch repository)."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "prog.py").write_text(
        "import argparse\np = argparse.ArgumentParser()\np.add_argument('--kept')\np.parse_args()\n")
    (tmp_path / "README.md").write_text(
        "```bash\npython scripts/prog.py --kept 1 --removed 2\nmpirun -n 2 python scripts/prog.py --kept 1\n```\n"
        "and inline `python scripts/prog.py --gone`.\n")
    cmds = [c for d in docs(tmp_path) for c in extract(d, tmp_path)[0]]
    assert [c.text for c in cmds] == ["python scripts/prog.py --kept 1 --removed 2",
                                      "mpirun -n 2 python scripts/prog.py --kept 1",
                                      "python scripts/prog.py --gone"]
    got = check(cmds, tmp_path)
    assert ["--removed" in p for p in got[cmds[0]]] == [True], got
    assert got[cmds[1]] == [], got
    assert any("--gone" in p for p in got[cmds[2]]), got
    assert missing_words(("--nodes", "-g"), "usage: x [-g N] [--nodes-x]") == ["--nodes"]


def test_the_shell_is_split_as_the_shell_splits_it():
    plan = plan_for(Command("x", 1, "NCCL_NET=IB python -m collectives.ring -g 4 --nodes 2 2>&1 | grep 'a\\|b' "
                                    "&& python -m visualize ibseq t -o ibseq   # comment --not-an-option"))
    assert [(n.argv[1:], n.words) for n in plan.needs] == [
        (("-m", "collectives.ring", "--help"), ("-g", "--nodes")),
        (("-m", "visualize", "ibseq", "--help"), ("-o",))], plan
    plan = plan_for(Command("x", 1, "mpirun -genv A B -n 2 -env C D python -m collectives.ring : -n 2 python -m "
                                    "collectives.tree -b 8"))
    assert [n.argv[-2:] for n in plan.needs] == [("collectives.ring", "--help"), ("collectives.tree", "--help"),
                                                  ("mpirun", "--help")], plan
    assert plan.needs[-1].words == ("-genv", "-n", "-env"), plan


# --- ./lab bench's table -----------------------------------------------------------------------------------------
def test_bench_table_writes_the_table_between_its_markers(tmp_path):
    import json
    (tmp_path / "allreduce_vs_mpi-n2.json").write_text(json.dumps([
        {"label": "nccl-lab AllReduce Ring n=2, beside MPI",
         "points": [{"size": 8, "time_us": 5.0, "busbw": 0.0, "algbw": 0.0},
                    {"size": 1 << 21, "time_us": 900.0, "busbw": 2.33, "algbw": 2.33}]},
        {"label": "MPI Allreduce n=2 (MPICH)",
         "points": [{"size": 8, "time_us": 2.5, "busbw": 0.0, "algbw": 0.0},
                    {"size": 1 << 21, "time_us": 800.0, "busbw": 2.62, "algbw": 2.62}]}]))
    (tmp_path / "allreduce_vs_mpi-n2.txt").write_text(
        "# AllReduce float32 sum, n=2, nchannels=2: nccl-lab (...) vs MPI (MPICH Version:      5.0.2)\n"
        "#       size   algo/proto     lab us  lab busbw     mpi us  mpi busbw  lab/mpi    fifo us fifo busbw "
        "xcore GB/s\n"
        "           8      Ring/LL        5.0       0.00        2.5       0.00     0.50          -          - "
        "      41.2\n"
        "     2097152  Ring/Simple      900.0       2.33      800.0       2.62     0.89     1000.0       2.10 "
        "      23.9\n"
        "# 8 B: 5.0 us vs MPI 2.5 us = 2.0x MPI's time (goal <= 3x: met)\n")
    (tmp_path / "latency-n2.txt").write_text(
        "# AllReduce float32 sum latency (us), n=2, mean over ranks; MPI = MPICH Version:      5.0.2\n"
        "#       size        LL     LL128    Simple       MPI   LL/MPI\n"
        "           8       5.5      40.0      30.0       2.6      2.1\n")
    page = tmp_path / "measured.md"
    page.write_text("# Measured\n\ntext kept\n\n<!-- bench_table: begin -->\nold\n<!-- bench_table: end -->\nend kept\n")
    r = subprocess.run([PY, str(ROOT / "scripts" / "bench_table.py"), str(tmp_path), "-o", str(page)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = page.read_text()
    assert out.startswith("# Measured\n\ntext kept\n") and out.endswith("<!-- bench_table: end -->\nend kept\n")
    assert "old" not in out
    assert "| `allreduce_vs_mpi.py`, n = 2 | nccl-lab (Ring/LL to 8 B, Ring/Simple above) | 5.00 | 2.33 |" in out
    assert "| `latency.py`, n = 2 | nccl-lab LL128 | 40.0 |  |" in out
    assert "8 B (µs)" in out and "2 MiB (GB/s)" in out and "MPICH 5.0.2" in out and "(goal <= 3x: met)" in out
    assert re.search(r"Measured \d{4}-\d\d-\d\d \d\d:\d\d UTC with `./lab bench`; on .+, \d+ cores", out), out
    # a benchmark whose printed header changed is an error, not a wrong table
    (tmp_path / "latency-n2.txt").write_text("#       size        LL     Simple       MPI\n  8 1 2 3\n")
    r = subprocess.run([PY, str(ROOT / "scripts" / "bench_table.py"), str(tmp_path), "-o", "-"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "column header" in r.stderr, r.stderr


def test_lab_bench_writes_measured_md():
    lab = (ROOT / "lab").read_text()
    bench = lab[lab.index("\n  bench)"):]
    bench = bench[:bench.index("\n  *)")]
    for piece in ("allreduce_vs_mpi.py", "--json", "latency.py", "net_vs_shm.py", "scripts/bench_table.py",
                  "docs/measured.md"):
        assert piece in bench, piece
    text = (ROOT / "docs" / "measured.md").read_text()
    assert text.count("<!-- bench_table: begin -->") == 1 and text.count("<!-- bench_table: end -->") == 1
