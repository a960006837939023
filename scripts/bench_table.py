"""Write docs/measured.md's table from one ``./lab bench`` run.

    python scripts/bench_table.py DIR [-o docs/measured.md] [--command "./lab bench"]

DIR holds what ``./lab bench`` leaves there:

* ``allreduce_vs_mpi-n<N>.json`` (the benchmark's ``--json`` series: ours and MPI's points) and
  ``allreduce_vs_mpi-n<N>.txt`` (its printed table, for each size's algorithm/protocol and the goal lines);
  ``allreduce_vs_gloo-<K>x<M>-n<N>.json`` and ``.txt`` alike (ours and Gloo's across K emulated nodes of M ranks,
  and, at K x 1, a third and a fourth series: a ring's bytes alone over loopback TCP and a bare ring AllReduce
  over the same sockets, ``benchmarks/tcp_floor.py``);
* ``tuning_check-n<N>.txt`` and ``tuning_check-<K>x<M>-n<N>.txt`` (across K emulated nodes of M ranks): only
  their goal lines (the cost model's pick against each forced pair);
* ``latency-n<N>.txt`` and ``net_vs_shm-n<N>.txt``: ``benchmarks/latency.py`` and ``benchmarks/net_vs_shm.py``
  have no ``--json``, so their printed tables are read (the layout of their header lines is checked: a change
  there is an error here, not a wrong table).

The table goes between the ``<!-- bench_table: begin -->`` and ``<!-- bench_table: end -->`` lines of the output
file, whose other lines are kept; ``-o -`` prints the table alone.  One row per measured series, one column per
size: microseconds per AllReduce up to 64 KiB, nccl-tests' busbw in GB/s above.  Under the table: the date of the
run (the newest input file), the machine (``/proc/cpuinfo``'s model name and ``nproc``), MPI, the commit, and the
goal lines the benchmarks print.
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import re
import subprocess
import sys

BEGIN, END = "<!-- bench_table: begin -->", "<!-- bench_table: end -->"
BUSBW_FROM = 64 << 10  # sizes above this are given as busbw (GB/s), the others as time (us)


class BenchTableError(Exception):
    pass


def size_name(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def fmt(v: float) -> str:
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def rank_count(path: str) -> int:
    m = re.search(r"-n(\d+)\.(json|txt)$", path)
    if not m:
        raise BenchTableError(f"{path}: the file name gives no rank count (want NAME-n<N>.json or .txt)")
    return int(m.group(1))


def table_lines(path: str) -> tuple[list[str], list[list[str]]]:
    """A benchmark's printed output: its '#' lines, and its rows (the lines that start with a size)."""
    comments, rows = [], []
    with open(path) as f:
        for line in f:
            s = line.strip()
            if s.startswith("#"):
                comments.append(s)
            elif s and s.split()[0].isdigit():
                rows.append(s.split())
    return comments, rows


def header(comments: list[str], want: list[str], path: str) -> None:
    got = next((c[1:].split() for c in comments if c[1:].split()[:1] == ["size"]), None)
    if got != want:
        raise BenchTableError(f"{path}: the column header is {got}, bench_table.py reads {want}: "
                              f"the benchmark's output changed, update scripts/bench_table.py")


def mpi_name(comments: list[str]) -> str | None:
    for c in comments:
        m = re.search(r"(MPICH|Open MPI|Intel\(R\) MPI)[^;)]*?(\d+(\.\d+)+)", c)
        if m:
            return f"{m.group(1)} {m.group(2)}"
    return None


def goals(comments: list[str]) -> list[str]:
    return [c.lstrip("# ").strip() for c in comments if "goal" in c]


def busbw(size: int, time_us: float, n: int) -> float:
    return size / (time_us * 1e-6) / 1e9 * (2 * (n - 1) / n) if time_us > 0 else 0.0


def proto_ranges(rows: list[list[str]]) -> str:
    """'Ring/LL to 32 KiB, Ring/Simple above' from the algo/proto column of allreduce_vs_mpi's table."""
    runs: list[tuple[str, int]] = []
    for r in rows:
        size, ap = int(r[0]), r[1]
        if runs and runs[-1][0] == ap:
            runs[-1] = (ap, size)
        else:
            runs.append((ap, size))
    if len(runs) == 1:
        return runs[0][0]
    parts = [f"{ap} to {size_name(last)}" for ap, last in runs[:-1]]
    return ", ".join(parts) + f", {runs[-1][0]} above"


PEERS = {  # side-by-side benchmark -> its peer's column name in the printed header, its series' label
    "allreduce_vs_mpi": ("mpi", "MPI `Allreduce`"),
    "allreduce_vs_gloo": ("gloo", "Gloo `all_reduce`"),
}
# columns after the ratio, and the row labels of the --json series past the first two (allreduce_vs_gloo's floor
# and bare ring)
EXTRA = {"allreduce_vs_gloo": (["tcp", "us", "tcp", "busbw", "bare", "us", "bare", "busbw"],
                              ["a ring's bytes alone over loopback TCP", "a bare ring AllReduce over loopback TCP"]),
         # the FIFO floor's two columns and core_probe.py's (the machine's state): columns, not series
         "allreduce_vs_mpi": (["fifo", "us", "fifo", "busbw", "xcore", "GB/s"], [])}


def bench_label(name: str, path: str) -> str:
    """The table's benchmark cell for ``NAME[-<K>x<M>]-n<N>.json`` or ``.txt``: the script, n, and the emulated
    nodes when the file name gives them."""
    shape = re.search(rf"{name}-(\d+)x(\d+)-n\d+\.(?:json|txt)$", path)
    return f"`{name}.py`, n = {rank_count(path)}" + (f", {shape.group(1)} × {shape.group(2)} nodes" if shape else "")


def side_by_side(dirname: str, name: str, series: list, notes: list, mpis: set, files: list) -> None:
    """``NAME[-<shape>]-n<N>.json`` (ours and the peer's points) and the ``.txt`` beside it (each size's
    algorithm/protocol and the goal lines) of ``allreduce_vs_mpi.py`` or ``allreduce_vs_gloo.py``."""
    peer, peer_label = PEERS[name]
    for path in sorted(glob.glob(os.path.join(dirname, f"{name}-*n*.json")), key=lambda p: (rank_count(p), p)):
        files.append(path)
        columns, labels = EXTRA.get(name, ([], []))
        with open(path) as f:
            lab, other, *extra = json.load(f)
        if len(extra) > len(labels):
            raise BenchTableError(f"{path}: {2 + len(extra)} series, bench_table.py reads at most {2 + len(labels)}")
        bench = bench_label(name, path)
        txt = path[:-5] + ".txt"
        protos = None
        if os.path.exists(txt):
            files.append(txt)
            comments, rows = table_lines(txt)
            header(comments, ["size", "algo/proto", "lab", "us", "lab", "busbw", peer, "us", peer, "busbw",
                              f"lab/{peer}", *columns], txt)
            protos = proto_ranges(rows)
            mpis.update(filter(None, [mpi_name(comments)]))
            notes += [f"{bench}: {g}" for g in goals(comments)]
        for label, one in zip([f"nccl-lab ({protos})" if protos else "nccl-lab", peer_label, *labels],
                              [lab, other, *extra]):
            series.append((bench, label, {p["size"]: (p["time_us"], p["busbw"]) for p in one["points"]}))


def read(dirname: str) -> dict:
    series, notes, mpis, files = [], [], set(), []
    for name in PEERS:
        side_by_side(dirname, name, series, notes, mpis, files)
    for path in sorted(glob.glob(os.path.join(dirname, "latency-n*.txt")), key=rank_count):
        n = rank_count(path)
        files.append(path)
        comments, rows = table_lines(path)
        header(comments, ["size", "LL", "LL128", "Simple", "MPI", "LL/MPI"], path)
        mpis.update(filter(None, [mpi_name(comments)]))
        for i, label in enumerate(("nccl-lab LL", "nccl-lab LL128", "nccl-lab Simple", "MPI `Allreduce`")):
            pts = {int(r[0]): float(r[1 + i]) for r in rows}
            series.append((f"`latency.py`, n = {n}", label, {s: (t, busbw(s, t, n)) for s, t in pts.items()}))
        notes += [f"`latency.py`, n = {n}: {g}" for g in goals(comments)]
    for path in sorted(glob.glob(os.path.join(dirname, "net_vs_shm-n*.txt")), key=rank_count):
        n = rank_count(path)
        files.append(path)
        comments, rows = table_lines(path)
        header(comments, ["size", "SHM", "us", "SHM", "busbw", "NET", "us", "NET", "busbw", "MPI", "us", "MPI",
                          "busbw", "NET/SHM"], path)
        mpis.update(filter(None, [mpi_name(comments)]))
        labels = (f"nccl-lab SHM, 1 node × {n}", f"nccl-lab NET/Socket, 2 nodes × {n // 2}", "MPI `Allreduce`")
        for i, label in enumerate(labels):
            pts = {int(r[0]): (float(r[1 + 2 * i]), float(r[2 + 2 * i])) for r in rows}
            series.append((f"`net_vs_shm.py`, n = {n}", label, pts))
        notes += [f"`net_vs_shm.py`, n = {n}: {g}" for g in goals(comments)]
    for path in sorted(glob.glob(os.path.join(dirname, "tuning_check-*n*.txt")), key=lambda p: (rank_count(p), p)):
        files.append(path)  # its goal lines only: its times per forced pair are in the file, not in the table
        notes += [f"{bench_label('tuning_check', path)}: {g}" for g in goals(table_lines(path)[0])]
    if not series:
        raise BenchTableError(f"{dirname}: no benchmark output (allreduce_vs_mpi-n*.json, "
                              f"allreduce_vs_gloo-*-n*.json, latency-n*.txt, net_vs_shm-n*.txt); ./lab bench "
                              f"writes them")
    return {"series": series, "notes": notes, "mpi": sorted(mpis), "files": files}


def machine() -> str:
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        nproc = subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        nproc = str(len(os.sched_getaffinity(0)))
    return f"{model or 'unknown CPU'}, {nproc} cores (`nproc`)"


def commit() -> str | None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + (" with uncommitted changes" if dirty else "")


def render(data: dict, command: str) -> str:
    sizes = sorted({s for _, _, pts in data["series"] for s in pts})
    head = ["benchmark", "series"] + [f"{size_name(s)} ({'GB/s' if s > BUSBW_FROM else 'µs'})" for s in sizes]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for bench, label, pts in data["series"]:
        cells = [fmt(pts[s][1] if s > BUSBW_FROM else pts[s][0]) if s in pts else "" for s in sizes]
        out.append("| " + " | ".join([bench, label] + cells) + " |")
    when = max(os.path.getmtime(p) for p in data["files"])
    stamp = datetime.datetime.fromtimestamp(when, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    facts = [f"Measured {stamp} with `{command}`", f"on {machine()}"]
    if data["mpi"]:
        facts.append("MPI: " + ", ".join(data["mpi"]))
    c = commit()
    if c:
        facts.append(f"commit {c}")
    out += ["", "; ".join(facts) + "."]
    if data["notes"]:
        out += ["", "The goals the benchmarks check (issue 27), in this run:", ""]
        out += [f"* {n}" for n in data["notes"]]
    return "\n".join(out) + "\n"


def write(path: str, table: str) -> None:
    with open(path) as f:
        text = f.read()
    if BEGIN not in text or END not in text or text.index(BEGIN) > text.index(END):
        raise BenchTableError(f"{path}: no '{BEGIN}' ... '{END}' lines to put the table between")
    before, rest = text.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(before + BEGIN + "\n" + table + END + after)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", help="the folder ./lab bench wrote its benchmarks' output into")
    p.add_argument("-o", "--out", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                       "docs", "measured.md"),
                   help="the markdown file whose table to rewrite ('-': print the table) (default: docs/measured.md)")
    p.add_argument("--command", default="./lab bench", help="the command named under the table (default: ./lab bench)")
    a = p.parse_args(argv)
    try:
        table = render(read(a.dir), a.command)
        if a.out == "-":
            sys.stdout.write(table)
        else:
            write(a.out, table)
            print(f"bench_table.py: wrote the table of {a.dir} into {a.out}")
    except (BenchTableError, OSError, ValueError, KeyError, IndexError) as e:
        print(f"bench_table.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
