"""The book (docs/README.md and its chapters) and docs/cost_model.md, generated from real runs.

    python scripts/make_docs.py            # run every chapter's commands at the chapters' sizes, rewrite the outputs
                                           # in the chapters and the pictures under docs/book/, docs/curve.png
    python scripts/make_docs.py --fast     # small sizes, into a temporary folder: check, write nothing under docs/
    python scripts/make_docs.py --copy-bw  # the physical bound of chapter 5: this machine's best numpy copy, GB/s

Each chapter declares, next to its commands (``CHAPTERS`` below), the outputs it quotes, the pictures it shows and
the facts its text states as numbers.  A chapter quotes an output between ``<!-- output: NAME -->`` and
``<!-- end -->``: the script replaces what is between them with the command and its real output, so the text is
always what the command printed.  ``<!-- facts -->`` ... ``<!-- end -->`` is replaced by the facts with the
values this run measured.  Both modes check that every command exits as expected, that every quoted output and
picture was produced (pictures under ``PICTURE_MAX`` bytes), and that every fact is true of the output; any
failure is one line per problem on stderr and exit status 1.  The facts of ``--fast`` are structural (channel
counts, thresholds, factors, the model's choices, the culprit): tests check behaviour, not timings.  Facts about
measured times are ratios with a wide margin, checked only by the full run, whose outputs the chapters show; on a
machine loaded by other work LL's waits were seen to take a millisecond at every size.
This is ours; NCCL has no such script.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SHOWN_OUT = "/tmp/book"   # the output folder as the chapters show it (the script uses a fresh one)
PICTURE_MAX = 200_000     # bytes; a picture bigger than this fails the check
FIXTURES = ROOT.parent / "shared" / "fixtures"


@dataclass
class Step:
    """One command as the reader runs it.  ``$OUT`` is the output folder.  ``fast``: the same command at small
    sizes (default: ``cmd``).  ``show``: which part of stdout+stderr the chapter quotes (default: all of it)."""
    name: str
    cmd: str
    fast: str | None = None
    rc: int = 0
    show: Callable[[str], str] | None = None
    only_full: bool = False   # too slow for --fast (its outputs are then not checked in fast mode)
    py: Callable[["Run"], None] | None = None  # instead of a command: make a file from earlier outputs (not quoted)


@dataclass
class Fact:
    """A number the chapter states.  ``check(run)`` returns (holds, the value measured)."""
    claim: str
    check: Callable[["Run"], tuple[bool, str]]
    only_full: bool = False   # reads an output that --fast does not make


@dataclass
class Chapter:
    doc: str                                    # under docs/
    steps: list[Step]
    pictures: dict[str, str] = field(default_factory=dict)  # file under $OUT -> path under docs/
    facts: list[Fact] = field(default_factory=list)


class Run:
    """The outputs of one mode's run: ``text(name)`` is a step's stdout+stderr, ``path(rel)`` a file under $OUT."""

    def __init__(self, out: Path, fast: bool):
        self.out, self.fast, self.outputs = out, fast, {}
        self.done: dict[str, str] = {}   # command -> its output: a command two chapters show runs once

    def text(self, name: str) -> str:
        return self.outputs[name]

    def path(self, rel: str) -> Path:
        return self.out / rel

    def json(self, rel: str):
        return json.loads(self.path(rel).read_text())

    def rows(self, rel: str) -> list[dict]:
        with open(self.path(rel)) as f:
            return list(csv.DictReader(f))


# --- reading outputs -----------------------------------------------------------------------------------------------
def grep(pattern: str, limit: int = 0, dedup: bool = False) -> Callable[[str], str]:
    """The lines matching ``pattern``, each once if ``dedup``, at most ``limit`` of them."""
    def pick(text: str) -> str:
        lines, seen = [], set()
        for line in text.splitlines():
            if re.search(pattern, line) and not (dedup and line in seen):
                seen.add(line)
                lines.append(line)
        return "\n".join(lines[:limit] if limit else lines)
    return pick


def info(text: str) -> list[str]:
    """NCCL INFO messages without their ``host:pid:tid [dev]`` prefix."""
    return [m.group(1) for m in re.finditer(r"NCCL INFO (.*)", text)]


def table(text: str, first: str = "") -> list[list[str]]:
    """The rows of a whitespace table whose first cell is a number (comment lines skipped)."""
    return [line.split() for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#") and line.split()[0].isdigit()]


def number(pattern: str, text: str) -> float:
    m = re.search(pattern, text)
    if not m:
        raise ValueError(f"no match for {pattern!r}")
    return float(m.group(1))


def sent_bytes(run: Run, csv_rel: str, seq: int = 0) -> dict[int, int]:
    """Bytes each rank sent in collective ``seq`` (every channel), from ``python -m tracing csv``."""
    sent: dict[int, int] = {}
    for r in run.rows(csv_rel):
        if int(r["seq"]) == seq:
            sent[int(r["from"])] = sent.get(int(r["from"]), 0) + int(r["bytes"])
    return sent


def channel_ranges(run: Run, csv_rel: str, seq: int = 0, rank: int = 0) -> dict[int, tuple[int, int]]:
    """Per channel, the element offsets rank ``rank`` moved in collective ``seq``: (first, past the last)."""
    got: dict[int, tuple[int, int]] = {}
    for r in run.rows(csv_rel):
        if int(r["seq"]) == seq and int(r["from"]) == rank and int(r["count"]):
            lo, hi = int(r["offset"]), int(r["offset"]) + int(r["count"])
            a, b = got.get(int(r["channel"]), (lo, hi))
            got[int(r["channel"])] = (min(a, lo), max(b, hi))
    return dict(sorted(got.items()))


def table_series(run: Run, step: str, label_cols: dict[str, int], nranks: int, out_rel: str) -> None:
    """Write a latency table's columns as series files for ``python -m visualize curves`` (busbw from the time:
    AllReduce's 2(n-1)/n)."""
    rows = table(run.text(step))
    for label, col in label_cols.items():
        pts = [{"size": int(r[0]), "algbw": int(r[0]) / float(r[col]) / 1e3,
                "busbw": int(r[0]) / float(r[col]) / 1e3 * 2 * (nranks - 1) / nranks} for r in rows]
        (run.out / f"{out_rel}-{label}.json").write_text(json.dumps({"label": label, "points": pts}))


COPY_SIZES = (1 << 20, 2 << 20, 16 << 20)  # in cache, as the lab's best sizes are, and out of it


def copy_bw() -> float:
    """Best of several numpy copies of 1, 2 and 16 MiB, in GB/s: what one core moves through memory here, in cache
    or not (the lab's best busbw comes at 2 MiB, where its buffers still fit in the caches)."""
    import numpy as np
    best = 0.0
    for size in COPY_SIZES:
        a, b = np.ones(size // 4, np.float32), np.empty(size // 4, np.float32)
        for _ in range(20):
            t = time.perf_counter()
            np.copyto(b, a)
            best = max(best, a.nbytes / (time.perf_counter() - t) / 1e9)
    return best


def tune_choices(text: str) -> list[tuple[int, str]]:
    """(size, chosen Algo/Proto) per size of ``python -m collectives.tools.tune``."""
    sizes = [int(r[0]) for r in table(text)]
    picks = re.findall(r"-> (\w+/\w+):", text)
    return list(zip(sizes, picks))


def first_of(choices: list[tuple[int, str]], algo: str) -> int | None:
    return next((s for s, c in choices if c.startswith(algo)), None)


# --- pictures made here from a command's output --------------------------------------------------------------------
WAIT = re.compile(r"rank (\d+) \w+ opCount \d+: channel (\d+) (\w+) step (\d+) slot \d+ waits for (\w+) "
                  r"from rank (\d+)")


def wait_for_graph(run: Run, step: str, out_rel: str) -> None:
    """The wait-for graph of ``python -m tracing hang``'s report: an arrow from each waiting rank to the rank it
    waits for (channel 0's wait), the culprit the report names in red."""
    import graphviz

    from visualize.diagrams import render
    text = run.text(step)
    culprit = int(number(r"rank (\d+) caused the hang", text))
    g = graphviz.Digraph("hang", graph_attr={"rankdir": "LR", "labelloc": "t", "label": (
        f"who waits for whom, from python -m tracing hang\\nred = the rank the report names (rank {culprit}); "
        "arrow: channel 0's wait, waiting rank -> the rank it waits for")},
        node_attr={"shape": "box", "style": "rounded,filled", "fillcolor": "#e0ecf4"})
    ranks = set()
    for r, ch, prim, stp, what, peer in WAIT.findall(text):
        ranks |= {int(r), int(peer)}
        if ch == "0":
            g.edge(f"r{r}", f"r{peer}", label=f"{prim} step {stp}\\nwaits for {what}", fontsize="10")
    for r in sorted(ranks | {culprit}):
        g.node(f"r{r}", f"rank {r}", **({"fillcolor": "#fde0dd", "color": "#d62728"} if r == culprit else {}))
    render(g.source, str(run.path(out_rel)), formats=("png",))


def straight_ring_arrows(run: Run, dot_rel: str) -> tuple[bool, str]:
    """Every chunk arrow of a ring chunk-flow picture, laid out by the real ``dot``, is one straight segment from a
    column to the next one on its right (wrap-arounds: to the right-hand stub, from the left-hand one)."""
    doc = json.loads(subprocess.run(["dot", "-Tjson"], input=run.path(dot_rel).read_text(), capture_output=True,
                                    text=True, check=True, timeout=60).stdout)
    objs = doc["objects"][doc.get("_subgraph_cnt", 0):]
    name = {o["_gvid"]: o["name"] for o in objs}
    x = {o["name"]: float(o["pos"].split(",")[0]) for o in objs if "pos" in o}
    width = {o["name"]: float(o.get("width", 0)) * 72 for o in objs}
    cols = sorted({x[n] for n in x if re.fullmatch(r"h\d+", n)})
    bad, n = [], 0
    for e in doc.get("edges", []):
        if not e.get("id", "").startswith("move:"):
            continue
        n += 1
        t, h = name[e["tail"]], name[e["head"]]
        pts = [tuple(map(float, p.split(","))) for p in e["pos"].replace("e,", "").split()]
        (x0, y0), (x1, y1) = pts[1], pts[-1]
        off = max(abs((x1 - x0) * (py - y0) - (y1 - y0) * (px - x0)) / max(1.0, ((x1 - x0) ** 2 + (y1 - y0) ** 2)
                                                                           ** .5) for px, py in pts[1:])
        ends = [c for c in (x[t], x[h]) if c in cols]
        adjacent = len(ends) < 2 or cols.index(ends[1]) - cols.index(ends[0]) == 1
        if off > 2 or not adjacent or not min(x[t], x[h]) - width[t] <= min(px for px, _ in pts):
            bad.append(f"{t}->{h}")
    return not bad and n > 0, f"{n - len(bad)} of {n} arrows straight between neighbouring columns" + (
        f"; not: {', '.join(bad[:4])}" if bad else "")


def ratio_rows(run: Run, rel: str) -> set[float]:
    return {round(r["busbw"] / r["algbw"], 4) for r in run.json(rel) if r["algbw"]}


def _ll_line() -> tuple[bool, str]:
    from collectives.include import protocols as P
    ll, ll128 = P.LL.step_data_bytes(16), P.LL128.step_data_bytes(128)
    return (ll, ll128) == (8, 120), f"{ll} B of data per 16 B LL line, {ll128} B per 128 B LL128 line"


def _cpu_constants() -> tuple[bool, str]:
    from collectives.graph.presets import CPU_CONSTANTS
    tree, ring = CPU_CONSTANTS.base_latencies[:2]
    step_tree, step_ring = CPU_CONSTANTS.hw_latencies[0][:2]
    return (ring == (2.5, 30.3, 3.0) and tree == (25.9, 30.3, 23.3) and step_ring == (1.0, 3.0, 1.0),
            f"base Tree LL/LL128/Simple {tree[0]}/{tree[1]}/{tree[2]} us, Ring {ring[0]}/{ring[1]}/{ring[2]} us; per "
            f"step inside a node Tree {'/'.join(map(str, step_tree))} us, Ring {'/'.join(map(str, step_ring))} us")


def _picks(run: Run, step: str) -> str:
    ch = tune_choices(run.text(step))
    out, last = [], None
    for size, pick in ch:
        if pick != last:
            out.append(f"{pick} from {size} B")
            last = pick
    return ", ".join(out)


def _switch(run: Run, step: str, frm: str, to: str) -> tuple[int | None, int | None]:
    ch = tune_choices(run.text(step))
    last = max((s for s, c in ch if c == frm), default=None)
    first = min((s for s, c in ch if c == to and (last is None or s > last)), default=None)
    return last, first


def _median_ll_over_simple(run: Run, upto: int) -> float:
    """The median over the sizes up to ``upto`` bytes of latency.py's LL time over its Simple time."""
    q = sorted(float(row[1]) / float(row[3]) for row in table(run.text("latency")) if int(row[0]) <= upto)
    return q[len(q) // 2]


def _median_ll128_over_simple(run: Run, upto: int) -> float:
    q = sorted(float(row[2]) / float(row[3]) for row in table(run.text("latency")) if int(row[0]) <= upto)
    return q[len(q) // 2]


def _median_ring_over_tree(run: Run, upto: int) -> float:
    """The median of ring_vs_tree.py's ring/tree column over the sizes up to ``upto`` bytes."""
    q = sorted(float(row[7]) for row in table(run.text("measured")) if int(row[0]) <= upto)
    return q[len(q) // 2]


def _coll_factor(run: Run, coll: str, want: float) -> tuple[bool, str]:
    got = ratio_rows(run, "ring.json" if coll == "allreduce" else f"{coll}.json")
    return got == {round(want, 4)}, f"{coll}: busbw/algbw = {', '.join(map(str, sorted(got)))}"


def _series_best(run: Run, rel: str, label: str) -> float:
    for s in run.json(rel) if isinstance(run.json(rel), list) else [run.json(rel)]:
        if label in s["label"]:
            return max(p["busbw"] for p in s["points"])
    raise ValueError(f"no series labelled {label!r} in {rel}")


RING_RUN = "NCCLLAB_TRACE=$OUT/ring NCCL_ALGO=Ring NCCL_PROTO=Simple python -m collectives.ring -g 4 -b 256K -e 256K " \
           "-n 1 -w 0 --json $OUT/ring.json"
CHANNELS = "python -m collectives.ring -g 2 -b 1K -e 1K -n 1 -w 0 -c 0"
NET_RUN = "python -m collectives.ring -g 2 --nodes 2 -b 64K -e 64K -n 1 -w 0 -c 0"
H100_LOG = "tests/data/nccl_tests_319_2x8_h100_trees.log"   # a real 2 x 8 H100 log (nccl-tests issue 319)
HANG_ENV = "NCCLLAB_TIMEOUT=2 NCCLLAB_WARN_AFTER=1 NCCLLAB_HANG_STACKS=0"
COLLS = {"allreduce": 2 * 3 / 4, "allgather": 3 / 4, "reducescatter": 3 / 4, "broadcast": 1.0, "reduce": 1.0}


FAST_COLLS = ()   # AllReduce's rows are chapter 1's ring.json; the other collectives' factors only in the full run


def _coll_step(coll: str) -> Step:
    return Step(f"coll-{coll}", f"python -m collectives.ring -g 4 --coll {coll} -b 1M -e 1M -n 1 -w 0 -c 0 "
                f"--json $OUT/{coll}.json", show=grep(r"^\s+\d"), only_full=coll not in FAST_COLLS)


def _chunks_step(rows: str) -> Step:
    """The trace of RING_RUN as chunks.csv, and the rows that ``grep ROWS`` picks (seq,channel,from,...)."""
    return Step("chunks", f"python -m tracing csv $OUT/ring -o $OUT/chunks.csv; head -1 $OUT/chunks.csv; "
                f"grep {rows} $OUT/chunks.csv")


def _flow_step(name: str, channel: int, out: str, title: str) -> Step:
    flag = f" --channel {channel}" if channel else ""
    return Step(name, f"python -m visualize flow $OUT/ring{flag} -o $OUT/{out} --title '{title}'")


CHAPTERS = [
    Chapter("01-ring-allreduce.md", [
        Step("ring", RING_RUN, show=grep(r"^#\s+(size|\(B\))|^\s+\d|nchannels")),
        _chunks_step("'^0,0,0,'"),
        _flow_step("flow", 0, "chunk-flow", "ring AllReduce, 4 ranks, channel 0: who sends which chunk"),
    ], {"chunk-flow.png": "chunk-flow.png"}, [
        Fact("each rank sends 2(n-1)/n = 1.5 times the 256 KiB message (chunks.csv, every channel)",
             lambda r: (set(sent_bytes(r, "chunks.csv").values()) == {int(1.5 * 262144)},
                        f"bytes sent per rank: {sorted(set(sent_bytes(r, 'chunks.csv').values()))}")),
        Fact("busbw / algbw = 2(n-1)/n = 1.5 in every row of the runner",
             lambda r: (ratio_rows(r, "ring.json") == {1.5}, f"{sorted(ratio_rows(r, 'ring.json'))}")),
        Fact("the chunk flow has 2n-1 = 7 rows: 2(n-1) = 6 sends per rank and one last recv",
             lambda r: (len(re.findall(r'axis\d+ \[label="step', r.path("chunk-flow.dot").read_text())) == 7,
                        f"{len(re.findall(r'axis[0-9]+ .label=.step', r.path('chunk-flow.dot').read_text()))} "
                        "rows")),
        Fact("in the picture each arrow goes straight to the ring neighbour's column",
             lambda r: straight_ring_arrows(r, "chunk-flow.dot")),
    ]),
    Chapter("02-channels.md", [
        Step("search", "python -m collectives.tools.topology topologies/dgx1-like.xml --brief",
             show=grep(r"Pattern 4|Channel 0[0-5]/|Channel 1[01]/")),
        Step("max1", f"NCCL_MAX_NCHANNELS=1 NCCL_DEBUG=INFO {CHANNELS}", show=grep(r"coll channels", 1),
             only_full=True),
        Step("min4", f"NCCL_MIN_NCHANNELS=4 NCCL_DEBUG=INFO {CHANNELS}", show=grep(r"coll channels", 1)),
        Step("ring", RING_RUN, show=grep(r"nchannels")),
        _chunks_step("-m 4 '^0,1,0,'"),
        _flow_step("flow1", 1, "channel1-flow", "the same AllReduce, channel 1: the second half of the message"),
    ], {"channel1-flow.png": "book/02-channel1-flow.png"}, [
        Fact("NCCL's search on dgx1-like.xml finds 6 ring channels and ncclTopoPostset doubles them to 12",
             lambda r: ((a := number(r"Pattern 4, .*nChannels (\d+)", r.text("search")),
                         b := number(r"Channel 00/(\d+)", r.text("search"))) == (6, 12), f"{a:.0f} -> {b:.0f}")),
        Fact("this lab's search gives 1 ring channel, doubled to 2 channels",
             lambda r: ((n := {row["nchannels"] for row in r.json("ring.json")}) == {2}, f"nchannels {n}")),
        Fact("NCCL_MAX_NCHANNELS=1 caps them at 1",
             lambda r: ((a := number(r"(\d+) coll channels", r.text("max1"))) == 1, f"{a:.0f}"), only_full=True),
        Fact("NCCL_MIN_NCHANNELS=4 raises them to 4 (copyChannels)",
             lambda r: ((b := number(r"(\d+) coll channels", r.text("min4"))) == 4, f"{b:.0f}")),
        Fact("the 256 KiB message (65536 floats) splits into two halves, one per channel",
             lambda r: ((g := channel_ranges(r, "chunks.csv")) == {0: (0, 32768), 1: (32768, 65536)},
                        "; ".join(f"channel {c}: elements [{a}, {b})" for c, (a, b) in g.items()))),
    ]),
    Chapter("03-protocols.md", [
        Step("latency", "mpirun -n 2 python benchmarks/latency.py -b 8 -e 1M -f 8",
             fast="mpirun -n 2 python benchmarks/latency.py -b 8 -e 4K -f 8 -n 30"),
        Step("series", "", py=lambda r: table_series(r, "latency", {"LL": 1, "LL128": 2, "Simple": 3, "MPI": 4}, 2,
                                                       "lat")),
        Step("plot", "python -m visualize curves $OUT/lat-LL.json $OUT/lat-LL128.json $OUT/lat-Simple.json "
                     "$OUT/lat-MPI.json -o $OUT/protocols.png --title 'AllReduce by protocol, 2 ranks'"),
        Step("cpu", "python -m collectives.tools.tune --preset cpu --gpus 2 -b 8 -e 1M -f 2", show=grep(r"->")),
        Step("h100", "python -m collectives.tools.tune --preset dgx-h100 -b 64K -e 256M -f 4", show=grep(r"->"),
             fast="python -m collectives.tools.tune --preset dgx-h100 -b 64K -e 4M -f 4"),
        Step("pcie", "python -m collectives.tools.tune --preset pcie -b 64K -e 256M -f 4",
             show=grep(r"^#  +size|^#  +\(B\)|^\s+\d")),
    ], {"protocols.png": "book/03-protocols.png"}, [
        Fact("measured, the three compiled protocols cost about the same at small sizes (medians of LL/Simple and "
             "LL128/Simple over 8-512 B between 0.67 and 1.5)",
             lambda r: (0.67 < (q := _median_ll_over_simple(r, 512)) < 1.5
                        and 0.67 < (k := _median_ll128_over_simple(r, 512)) < 1.5,
                        f"median LL/Simple = {q:.2f}, LL128/Simple = {k:.2f}"), only_full=True),
        Fact("in the model, Ring/LL's latency term is below Ring/Simple's",
             lambda r: ((a := number(r"-> Ring/LL: \w+ term dominates \(([\d.]+) us latency", r.text("cpu")))
                        < (b := number(r"-> Ring/Simple: \w+ term dominates \(([\d.]+) us latency", r.text("cpu"))),
                        f"{a} us against {b} us")),
        Fact("an LL line carries 8 B of data and 8 B of flags in 16 B; an LL128 line 120 B of data in 128 B",
             lambda r: _ll_line()),
        Fact("on this machine (2 ranks) the model takes Ring/LL up to 2 KiB and Ring/Simple from 4 KiB",
             lambda r: (_switch(r, "cpu", "Ring/LL", "Ring/Simple") == (2048, 4096), _picks(r, "cpu"))),
        Fact("on a DGX H100 the model takes LL128 for mid sizes (NVLink, cc 90: LL128 enabled)",
             lambda r: ("LL128" in _picks(r, "h100"), _picks(r, "h100"))),
        Fact("on the PCIe box (path SYS, beyond PXB) LL128 is never chosen and has no time",
             lambda r: ("LL128" not in _picks(r, "pcie") and all(row.count("-") == 2 for row in table(r.text("pcie"))),
                        _picks(r, "pcie") + "; both LL128 columns '-' at every size")),
    ]),
    Chapter("04-ring-or-tree.md", [
        Step("one-node", "python -m collectives.tools.tune --preset cpu --gpus 4 -b 8 -e 16M -f 8", show=grep("->")),
        Step("two-nodes", "python -m collectives.tools.tune --preset cpu --gpus 2 --nodes 2 -b 8 -e 16M -f 8",
             show=grep("->")),
        Step("measured", "python benchmarks/ring_vs_tree.py -g 4 --nodes 2 -b 8 -e 16M -f 8",
             fast="python benchmarks/ring_vs_tree.py -g 4 --nodes 2 -b 8 -e 512 -f 8"),
        Step("series", "", py=lambda r: table_series(r, "measured", {"Ring": 1, "Tree": 3, "MPI": 5}, 4, "rvt")),
        Step("plot", "python -m visualize curves $OUT/rvt-Ring.json $OUT/rvt-Tree.json $OUT/rvt-MPI.json "
                     "-o $OUT/ring-vs-tree.png --title 'AllReduce, 4 ranks on 2 emulated nodes: Ring against Tree'"),
    ], {"ring-vs-tree.png": "book/04-ring-vs-tree.png"}, [
        Fact("on one node the model picks Ring at every size",
             lambda r: (all(c.startswith("Ring") for _, c in tune_choices(r.text("one-node"))),
                        _picks(r, "one-node"))),
        Fact("on 2 nodes x 2 the model picks Tree for small sizes and Ring for large ones",
             lambda r: ((t := first_of(tune_choices(r.text("two-nodes")), "Tree")) is not None
                        and tune_choices(r.text("two-nodes"))[-1][1].startswith("Ring"), _picks(r, "two-nodes"))),
        Fact("measured across 2 emulated nodes, Tree beats Ring at small sizes (median ring/tree time over the "
             "sizes up to 32 KiB above 1)",
             lambda r: ((q := _median_ring_over_tree(r, 32768)) > 1, f"median ring/tree = {q:.2f}"), only_full=True),
    ]),
    Chapter("05-busbw.md", [
        Step("coll-allreduce", RING_RUN, show=grep(r"^\s+\d")),
        *[_coll_step(c) for c in COLLS if c != "allreduce"],
        Step("mpi", "mpirun -n 2 python benchmarks/allreduce_vs_mpi.py -b 8 -e 16M -f 4 --json $OUT/bench.json",
             fast="mpirun -n 2 python benchmarks/allreduce_vs_mpi.py -b 8 -e 64K -f 8 --json $OUT/bench.json"),
        Step("model", "python -m collectives.tools.tune --preset cpu --gpus 2 -b 8 -e 16M -f 4 --series "
                      "$OUT/model.json", show=grep(r"^# AllReduce")),
        Step("curve", "python -m visualize curves $OUT/bench.json $OUT/model.json -o $OUT/curve.png "
                      "--title 'AllReduce, 2 ranks on 2 cores: ours, MPI and the model'"),
        Step("bound", "python scripts/make_docs.py --copy-bw"),
    ], {"curve.png": "curve.png"}, [
        *[Fact(f"{c}: busbw = algbw x {f:g} at n = 4", lambda r, c=c, f=f: _coll_factor(r, c, f),
               only_full=c not in (*FAST_COLLS, "allreduce")) for c, f in COLLS.items()],
        Fact("the lab's best busbw stays below one core's copy bandwidth, the physical bound here",
             lambda r: ((b := _series_best(r, "bench.json", "nccl-lab")) < (m := number(r"([\d.]+) GB/s",
                                                                                       r.text("bound"))),
                        f"{b:.2f} GB/s against {m:.1f} GB/s")),
    ]),
    Chapter("06-net-proxy.md", [
        Step("socket", f"NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET {NET_RUN}",
             show=grep(r"NET/Socket|Channel 00/0 : 0\[0\] -> 1\[0\]", dedup=True), only_full=True),
        Step("ib", f"NCCLLAB_TRACE=$OUT/ib NCCL_NET=IB NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET {NET_RUN}",
             show=grep(r"NET/IB : (Using|send comm|recv comm)|NET/IB/0", 6)),
        Step("ibseq", "python -m visualize ibseq $OUT/ib -o $OUT/ib-sequence"),
    ], {"ib-sequence.png": "book/06-ib-sequence.png"}, [
        Fact("between the two emulated nodes the ring goes over the socket plugin by default",
             lambda r: ("via NET/Socket/0" in r.text("socket"), "via NET/Socket/0"), only_full=True),
        Fact("and over NCCL's IB plugin with NCCL_NET=IB",
             lambda r: ("via NET/IB/0" in r.text("ib"), "via NET/IB/0")),
        Fact("each IB send is one WRITE_WITH_IMM, and the receiver wrote one CTS per receive",
             lambda r: ((s := re.findall(r"(\d+) sends, \d+ data WRs \((\d+) WRITE_WITH_IMM", r.text("ib")))
                        and all(a == b for a, b in s)
                        and all(a == b for a, b in re.findall(r"(\d+) receives, (\d+) CTS writes", r.text("ib"))),
                        f"{len(s)} send comms, sends = WRITE_WITH_IMMs in each")),
        Fact("the sequence picture shows the CTS FIFO write and the WRITE_WITH_IMM",
             lambda r: (all(w in (t := r.path("ib-sequence.dot").read_text()) for w in ("CTS", "WRITE_WITH_IMM",
                                                                                       "ncclIbSendFifo")),
                        "CTS, ncclIbSendFifo, WRITE_WITH_IMM in its labels")),
    ]),
    Chapter("07-hangs.md", [
        Step("skip", f"{HANG_ENV} NCCLLAB_HANG_DIR=$OUT/skip mpirun -n 4 python docs/book/hang_demo.py skip", rc=1,
             show=grep(r"WARN|Error|Abort", 8)),
        Step("report", "python -m tracing hang $OUT/skip"),
        Step("picture", "", py=lambda r: wait_for_graph(r, "report", "hang")),
        Step("freeze", f"{HANG_ENV} NCCLLAB_HANG_DIR=$OUT/freeze python -m collectives.tools.launcher -g 4 "
                       "docs/book/hang_demo.py freeze", rc=1, show=grep(r"WARN|Error", 4), only_full=True),
    ], {"hang.png": "book/07-hang.png"}, [
        Fact("after NCCLLAB_WARN_AFTER=1 s a waiting rank warns, naming its wait on rank 3",
             lambda r: (bool(m := re.search(r"NCCL WARN rank \d: AllReduce \(opCount \d+\) has made no progress "
                                            r"for 1 s.*from rank 3", r.text("skip"))), m.group(0)[:60] + " ..."
                        if m else "no such line")),
        Fact("a frozen rank 3 is named in the first WARN: 'rank 3 (pid N) is stopped'",
             lambda r: ("rank 3 (pid" in (w := grep("NCCL WARN", 1)(r.text("freeze"))) and "is stopped" in w,
                        w[-40:]), only_full=True),
        Fact("python -m tracing hang names rank 3, the rank that skipped a call",
             lambda r: ((c := number(r"rank (\d+) caused the hang", r.text("report"))) == 3, f"rank {c:.0f}")),
    ]),
    Chapter("08-reading-a-log.md", [
        Step("lines", f"grep -m 1 'Channel 00/16' {H100_LOG}; grep -m 1 'lccn09.*\\[0\\] NCCL INFO Trees' {H100_LOG}"),
        Step("explain", f"python -m tracing explain {H100_LOG} -o $OUT/explained"),
    ], {"explained/rings.svg": "book/08-rings.svg"}, [
        Fact("the log is 16 ranks on 2 nodes with 16 channels, 8 from the search doubled by Postset",
             lambda r: ("ranks: 16, nodes: 2" in (t := r.text("explain")) and "search channels: 8, 16" in t,
                        "16 ranks, 2 nodes, 8 -> 16 channels")),
        Fact("our trees rebuild every Trees entry of the real log",
             lambda r: ((m := re.search(r"matched (\d+) of (\d+)", r.text("explain"))) is not None
                        and m.group(1) == m.group(2), m.group(0) if m else "no 'matched' line")),
    ]),
    Chapter("cost_model.md", [
        Step("cpu-table", "python -m collectives.tools.tune --preset cpu --gpus 2 -b 8 -e 16M -f 8"),
    ], {}, [
        Fact("the cpu preset's base latencies (tuning.cc's baseLat replaced by measured ones)",
             lambda r: _cpu_constants()),
        Fact("Ring/LL is chosen at 8 B, Ring/Simple at 16 MiB",
             lambda r: ((c := dict(tune_choices(r.text("cpu-table"))))[8] == "Ring/LL"
                        and c[16 << 20] == "Ring/Simple", _picks(r, "cpu-table"))),
    ]),
]


# --- running -------------------------------------------------------------------------------------------------------
def env_for(out: Path) -> dict:
    env = {**os.environ, "OUT": str(out), "NCCL_SOCKET_IFNAME": os.environ.get("NCCL_SOCKET_IFNAME", "lo"),
           "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    for var in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_ALGO", "NCCL_PROTO", "NCCLLAB_TRACE"):
        env.pop(var, None)  # the reader's own settings would change the outputs
    return env


def run_step(step: Step, run: Run, problems: list[str], where: str) -> None:
    cmd = step.fast if run.fast and step.fast else step.cmd
    t0 = time.monotonic()
    if step.py:
        try:
            step.py(run)
        except (KeyError, ValueError, IndexError, OSError, subprocess.CalledProcessError) as exc:
            problems.append(f"{where}: step {step.name}: {type(exc).__name__}: {exc}")
        return
    if cmd in run.done:
        run.outputs[step.name] = run.done[cmd]
        return
    proc = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=env_for(run.out), capture_output=True, text=True,
                          timeout=300)
    text = proc.stdout + proc.stderr
    run.outputs[step.name] = run.done[cmd] = text
    (run.out / f"{step.name}.txt").write_text(f"$ {shown(cmd)}\n{text}")
    if proc.returncode != step.rc:
        problems.append(f"{where}: step {step.name}: exit status {proc.returncode}, expected {step.rc}: "
                        f"{(text.strip().splitlines() or [''])[-1][:200]}")
    if os.environ.get("MAKE_DOCS_VERBOSE"):
        print(f"  {step.name}: {time.monotonic() - t0:.1f} s", file=sys.stderr)


def shown(cmd: str) -> str:
    return cmd.replace("$OUT", SHOWN_OUT)


def block(step: Step, run: Run) -> str:
    cmd = step.fast if run.fast and step.fast else step.cmd
    text = run.outputs[step.name]
    body = (step.show(text) if step.show else text).rstrip("\n")
    body = body.replace(str(run.out), SHOWN_OUT)
    return f"```console\n$ {shown(cmd)}\n{body}\n```"


MARK = re.compile(r"(<!-- (output: ([\w-]+)|facts) -->\n).*?(<!-- end -->)", re.S)


def fill(text: str, blocks: dict[str, str], facts: str, doc: str, problems: list[str], skipped: set) -> str:
    def put(m: re.Match) -> str:
        if m.group(2) == "facts":
            return m.group(1) + facts + "\n" + m.group(4)
        name = m.group(3)
        if name in skipped:
            return m.group(0)
        if name not in blocks:
            problems.append(f"{doc}: quotes output {name!r}, which no step of its chapter makes")
            return m.group(0)
        return m.group(1) + blocks[name] + "\n" + m.group(4)
    return MARK.sub(put, text)


def check_facts(ch: Chapter, run: Run, problems: list[str]) -> str:
    lines = []
    for f in ch.facts:
        if run.fast and f.only_full:
            continue
        try:
            ok, value = f.check(run)
        except (KeyError, ValueError, IndexError, OSError, ZeroDivisionError) as exc:
            ok, value = False, f"could not be read: {type(exc).__name__}: {exc}"
        if not ok:
            problems.append(f"{ch.doc}: fact no longer true: {f.claim} (measured: {value})")
        lines.append(f"* {f.claim}: **{value}**")
    return "\n".join(lines)


def make(fast: bool, out: Path, only: list[str] | None = None) -> list[str]:
    """Run the chapters (``only``: those whose doc name contains one of these), check them, and unless ``fast``
    write them back with their pictures.  Returns the problems found."""
    run, problems = Run(out, fast), []
    chosen = [ch for ch in CHAPTERS if not only or any(o in ch.doc for o in only)]
    if not chosen:
        return [f"--only {' '.join(only)}: no chapter matches (chapters: {', '.join(c.doc for c in CHAPTERS)})"]
    for ch in chosen:
        if not (DOCS / ch.doc).is_file():
            problems.append(f"{ch.doc}: no such chapter under docs/")
            continue
        steps, before = [s for s in ch.steps if not (fast and s.only_full)], len(problems)
        for s in steps:
            run_step(s, run, problems, ch.doc)
        for src, dst in ch.pictures.items():
            p = run.path(src)
            if not p.exists():
                problems.append(f"{ch.doc}: picture {src} was not produced")
            elif p.stat().st_size > PICTURE_MAX:
                problems.append(f"{ch.doc}: picture {src} is {p.stat().st_size} bytes, over {PICTURE_MAX}")
        facts = check_facts(ch, run, problems)
        doc = DOCS / ch.doc
        blocks = {s.name: block(s, run) for s in steps if s.name in run.outputs and not s.py}
        skipped = {s.name for s in ch.steps if s not in steps}
        text = fill(doc.read_text(), blocks, facts, ch.doc, problems, skipped)
        if "<!-- facts -->" not in text and ch.facts:
            problems.append(f"{ch.doc}: states facts but has no <!-- facts --> block")
        for pic in ch.pictures.values():
            if os.path.relpath(DOCS / pic, doc.parent) not in text:
                problems.append(f"{ch.doc}: does not show its picture {pic}")
        (out / ch.doc).parent.mkdir(parents=True, exist_ok=True)
        (out / ch.doc).write_text(text)
        if not fast and len(problems) == before:  # a chapter whose run failed keeps its last good text and pictures
            doc.write_text(text)
            for src, dst in ch.pictures.items():
                shutil.copyfile(run.path(src), DOCS / dst)
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/make_docs.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--fast", action="store_true", help="small sizes into a temporary folder; check, write nothing")
    p.add_argument("--out", help="keep the outputs in this folder (default: a temporary one, removed)")
    p.add_argument("--only", action="append", help="only the chapters whose file name contains this (repeatable)")
    p.add_argument("--copy-bw", action="store_true", help="print this machine's best numpy copy bandwidth, GB/s")
    a = p.parse_args(argv)
    if a.copy_bw:
        print(f"numpy copy of 1, 2 or 16 MiB, best of 20 each: {copy_bw():.1f} GB/s")
        return 0
    out = Path(a.out or tempfile.mkdtemp(prefix="nccllab-book-"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        problems = make(a.fast, out, a.only)
    finally:
        if not a.out:
            shutil.rmtree(out, ignore_errors=True)
    for line in problems:
        print(f"make_docs: {line}", file=sys.stderr)
    print(f"make_docs: {'fast' if a.fast else 'full'} run, {time.monotonic() - t0:.0f} s, "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
