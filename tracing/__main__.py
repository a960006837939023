"""``python -m tracing perfetto|csv|json|merge|hang DIR [-o OUT]``: convert a run's trace or diagnose a hang;
``python -m tracing explain LOG [-o DIR] [--topo XML [--sm SM]]``: explain a real NCCL INFO log (with ``--topo``,
also run NCCL's multi-node topology search for the log's nodes and compare it with the log).

Layering: the ``tracing`` package imports nothing of ours, so that traces and logs can be read anywhere.  This
file is a command line, the top of the stack like every entry point, and ``explain`` needs what sits above
``tracing`` (``collectives.graph.replay`` to check the trees, ``visualize`` to draw them).  So that one command
imports ``visualize.explain`` when it runs, and nothing in ``tracing``'s modules does (a test checks it).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from . import export, hang

WHAT = {"perfetto": "Chrome/Perfetto trace-event JSON (open in ui.perfetto.dev); default DIR/trace.perfetto.json",
        "csv": "one row per chunk movement: seq, channel, from, to, prim, reduce|copy, loop, chunk, slot, step, "
               "bytes, times; default DIR/chunks.csv",
        "json": "the same movements as JSON; default DIR/chunks.json",
        "merge": "every rank's events in one JSONL file, by time; default DIR/merged.jsonl",
        "hang": "merge hang-rank*.json reports and name the rank that caused the hang (stdout)",
        "explain": "a real NCCL INFO log: version, ranks, nodes, rings, trees checked by replay, transports, TUNING, "
                   "anything unusual, plus its diagrams, into DIR (default ./NAME-explained/)"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tracing", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="commands:\n" + "\n".join(f"  {k:9} {v}" for k, v in WHAT.items()))
    p.add_argument("what", choices=list(WHAT), metavar="COMMAND", help="one of: " + ", ".join(WHAT))
    p.add_argument("dir", metavar="DIR|LOG", help="the NCCLLAB_TRACE (or hang report) directory; for explain, "
                                                  "the NCCL log")
    p.add_argument("-o", "--out", help="output file (explain: folder); default as listed below")
    p.add_argument("--topo", metavar="XML", help="explain: a node's topology XML; run the multi-node search for the "
                                                 "log's nodes and GPUs per node and compare its rings and trees")
    p.add_argument("--sm", type=int, help="explain --topo: the GPUs' compute capability where the XML does not give "
                                          "it (NCCL's INFO lines do not print it), e.g. 90")
    a = p.parse_args(argv)
    try:
        return _run(a)
    except (OSError, ValueError) as exc:
        msg = f"{exc.filename}: {exc.strerror}" if isinstance(exc, OSError) and exc.filename else str(exc)
        print(f"python -m tracing {a.what}: {msg}", file=sys.stderr)
        return 2


def _run(a) -> int:
    if a.what == "explain":
        from visualize.explain import explain  # the one command that reaches above tracing (docstring)
        print("\n".join(explain(a.dir, a.out, a.topo, a.sm)))
        return 0
    if a.topo or a.sm is not None:
        raise ValueError("--topo and --sm are explain's options")
    if a.what == "hang":
        verdict = hang.diagnose(a.dir)
        print(verdict["reason"])
        for line in verdict["waits"]:
            print("  " + line)
        return 0 if verdict["culprit"] is not None else 1
    default = {"perfetto": "trace.perfetto.json", "csv": "chunks.csv", "json": "chunks.json", "merge": "merged.jsonl"}
    out = a.out or os.path.join(a.dir, default[a.what])
    if a.what == "merge":
        export.load(a.dir)  # fails before the output exists
        export.merge(a.dir, out)
    elif a.what == "csv":
        export.write_csv(export.movements(a.dir), out)
    else:
        doc = export.perfetto(a.dir) if a.what == "perfetto" else export.movements(a.dir)
        with open(out, "w") as f:  # opened only once there is something to write
            json.dump(doc, f)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
