"""``python -m collectives.tools.launcher -g N [--nodes K] script.py args...``: run a script as N local ranks, as
``mpirun -n N`` would (``collectives.job.spawn``); in it, ``collectives.Communicator()`` finds its rank in the
environment.  With ``--nodes K`` the ranks are split into K emulated nodes (one ``NCCL_HOSTID`` per contiguous
block), which talk over NET.  Ctrl-C stops every rank with one line and exit status 130.
"""
from __future__ import annotations

import argparse
import os
import sys

from collectives.job import spawn
from collectives.preload import preload

PROG = "python -m collectives.tools.launcher"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description="run a script as N local ranks, as mpirun would; in it, "
                                "``collectives.Communicator()`` finds its rank in the environment.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("-g", "--nranks", "-n", dest="nranks", type=int, default=2, help="ranks to start")
    p.add_argument("--nodes", type=int, default=1, help="emulated nodes (per-rank NCCL_HOSTID): NET between them")
    p.add_argument("script", help="the Python script every rank runs")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    a = p.parse_args(argv)
    if a.nranks < 1 or not 1 <= a.nodes <= a.nranks:
        print(f"{PROG}: need -g >= 1 and 1 <= --nodes <= -g (got -g {a.nranks} --nodes {a.nodes})", file=sys.stderr)
        return 2
    if not os.path.isfile(a.script):
        print(f"{PROG}: {a.script}: no such file", file=sys.stderr)
        return 2
    return spawn(a.nranks, [a.script, *a.args], nodes=a.nodes, preload=preload)


if __name__ == "__main__":
    sys.exit(main())
