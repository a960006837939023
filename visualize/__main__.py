"""``python -m visualize KIND INPUT... -o OUT``.

    curves   INPUT... -o plot.png            runner --json, nccl-tests text, MPI/model series
    topology TRACE_DIR -o topo               rings per channel, ranks by node, transports (a)
    trees    TRACE_DIR -o trees              the two trees of each channel (b)
    flow     TRACE_DIR -o flow [--seq S --channel C]   chunk flow of one collective (c)
    log      NCCL_LOG -o prefix              rings and trees from a real NCCL INFO log (d)
    sweep    -g N -b 8 -e 64M -o DIR         runs ours and MPI side by side under mpirun, then plots
Diagrams are written as OUT.dot, OUT.png and OUT.svg.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

from . import curves, diagrams


def _trace(directory: str):
    from tracing import export
    return export.load(directory)


def _trees_from_meta(meta: dict):
    """Every channel's tree as the communicator built it (channel c + n: tree 1 of ring c)."""
    if "trees" in meta:
        return [{int(r): (up, list(down)) for r, (up, down) in t.items()} for t in meta["trees"]]
    from collectives.graph.trees import channel_trees  # traces written before the trees were recorded
    tl = channel_trees(meta["rings"], meta["node_of_rank"])
    return [{r: (node.up, list(node.down)) for r, node in t.items()} for t in tl]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m visualize", description=__doc__.split("\n")[0])
    p.add_argument("kind", choices=["curves", "topology", "trees", "flow", "log", "sweep"])
    p.add_argument("inputs", nargs="*")
    p.add_argument("-o", "--out", required=True)
    p.add_argument("--title", default="")
    p.add_argument("--seq", type=int, default=0)
    p.add_argument("--channel", type=int, default=0)
    p.add_argument("-g", "--nranks", type=int, default=2)
    p.add_argument("-b", default="8")
    p.add_argument("-e", default="64M")
    a = p.parse_args(argv)
    if a.kind == "curves":
        try:
            print(curves.plot(a.inputs, a.out, a.title))
        except (ValueError, OSError) as exc:  # bad input: one line, no traceback
            print(f"visualize curves: {exc}", file=sys.stderr)
            return 2
    elif a.kind in ("topology", "trees", "flow"):
        meta, events = _trace(a.inputs[0])
        if a.kind == "topology":
            src = diagrams.topology(meta["nranks"], meta["node_of_rank"], meta["rings"], meta["transports"],
                                    meta["hosts"], a.title)
        elif a.kind == "trees":
            src = diagrams.trees(_trees_from_meta(meta), meta["nranks"], a.title)
        else:
            ring = meta["rings"][a.channel % len(meta["rings"])]
            src = diagrams.chunk_flow(events, a.seq, a.channel, ring, a.title)
        print("\n".join(diagrams.render(src, a.out)))
    elif a.kind == "log":
        from tracing import nccl_log
        log = nccl_log.parse(open(a.inputs[0]).read())
        n = log.nranks or max((max(r) for r in log.rings.values()), default=0) + 1
        node_of = _nodes_from_log(log, n)
        rings = [log.rings[c] for c in sorted(log.rings)]
        name = os.path.basename(a.inputs[0])
        out = diagrams.render(diagrams.topology(n, node_of, rings, log.transports, None, a.title or f"rings from {name}"),
                              a.out + "-rings")
        if log.trees:
            shown = [log.trees[c] for c in sorted(log.trees)][:8]
            out += diagrams.render(diagrams.trees(shown, n, a.title or f"trees from {name} (first {len(shown)} "
                                                  f"of {len(log.trees)} channels)"), a.out + "-trees")
        print("\n".join(out))
    else:
        os.makedirs(a.out, exist_ok=True)
        bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                             "allreduce_vs_mpi.py")
        mpirun = os.path.join(os.path.dirname(sys.executable), "mpirun")
        subprocess.run([mpirun, "-n", str(a.nranks), sys.executable, bench, "-b", a.b, "-e", a.e, "-f", "2",
                        "--json", os.path.join(a.out, "bench.json")], check=True)
        print(curves.plot([os.path.join(a.out, "bench.json")], os.path.join(a.out, "curve.png"), a.title))
    return 0


def _nodes_from_log(log, n: int) -> list[int]:
    """Node of each rank: consecutive blocks of localRanks (NCCL numbers ranks node by node in these logs)."""
    per_node = max(log.local_ranks.values(), default=n // max(1, log.nnodes or 1)) or n
    return [r // per_node for r in range(n)]


if __name__ == "__main__":
    sys.exit(main())
