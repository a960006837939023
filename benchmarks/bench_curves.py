"""``./lab bench``'s picture: busbw against size for nccl-lab, MPICH and Gloo, one panel per rank count.

    python benchmarks/bench_curves.py DIR [-o DIR/curves.png]

DIR is the folder ``./lab bench`` writes (``allreduce_vs_mpi-n<N>.json``, ``allreduce_vs_gloo-<K>x<M>-n<N>.json``:
the benchmarks' ``--json`` series); ``visualize.curves.plot_panels`` draws it.  Prints the panels and their series.
"""
from __future__ import annotations

import argparse
import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from visualize import curves  # noqa: E402

PATTERNS = ("allreduce_vs_mpi-n*.json", "allreduce_vs_gloo-*-n*.json")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", help="the folder ./lab bench wrote its --json series into")
    p.add_argument("-o", "--out", help="the PNG to write (default: DIR/curves.png)")
    a = p.parse_args(argv)
    inputs = sorted(f for pat in PATTERNS for f in glob.glob(os.path.join(a.dir, pat)))
    if not inputs:
        print(f"bench_curves.py: {a.dir}: no {' or '.join(PATTERNS)}; ./lab bench writes them", file=sys.stderr)
        return 2
    out = a.out or os.path.join(a.dir, "curves.png")
    try:
        drawn = curves.plot_panels(inputs, out)
    except (ValueError, OSError) as e:
        print(f"bench_curves.py: {e}", file=sys.stderr)
        return 2
    for panel, lines in drawn.items():
        print(f"{panel}: " + "; ".join(lines))
    print(f"bench_curves.py: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
