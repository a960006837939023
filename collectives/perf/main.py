"""The runner's ``main`` (nccl-tests' ``main`` in ``src/common.cu``), shared by ``python -m collectives.ring``,
``python -m collectives.tree`` and the point-to-point tests (``collectives.sendrecv``, ``alltoall``, ``gather``,
``scatter``): check the arguments, start the ranks when no launcher did (``-g N``, default 8),
or, as one rank of a job, run the sweep on a communicator; ``--threads`` runs every rank in this process.
"""
from __future__ import annotations

import os
import sys
from typing import Sequence

from collectives.comm import Communicator
from collectives.job import emulated_node, job_size, launched, spawn
from collectives.preload import preload

from .args import build_parser, check_args
from .runner import Runner
from .threads_runner import run_threads


def main(module: str, argv: Sequence[str] | None = None, coll: str = "allreduce") -> int:
    """Entry point shared by ``collectives.ring`` & co.: check the arguments, spawn ranks when not launched (or
    take mpirun's), then run the sweep.  ``coll``: the entry point's default ``--coll`` (``collectives.gather``:
    gather)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(module, coll).parse_args(argv)
    size = job_size()
    if args.topo:  # every rank loads it as NCCL_TOPO_FILE and searches its own node
        from collectives.graph.topo_feed import apply_topology
        try:
            apply_topology(args, argv, None if launched() else lambda line: print(line, file=sys.stderr), size)
        except ValueError as e:   # TopoError is a ValueError
            return _usage(module, str(e))
    if size is not None and args.nranks is not None and args.nranks != size:
        return _usage(module, f"-g {args.nranks} but this job has {size} ranks (mpirun -n {size}): drop -g or "
                              f"make them equal")
    nranks = size or (8 if args.nranks is None else args.nranks)
    problem = check_args(args, nranks)
    if problem:
        return _usage(module, problem)
    os.environ["NCCLLAB_DEVICE"] = args.device  # the ranks' communicators (and their children) take it
    if args.threads:
        return run_threads(args, nranks)
    if not launched():
        return spawn(nranks, ["-m", module, *argv], nodes=args.nodes, preload=preload)
    emulated_node(args.nodes)
    with Communicator() as comm:
        runner = Runner(comm, args)
        records = runner.run()
    wrong = sum(r["wrong"] or 0 for r in records)
    return 1 if wrong else 0


def _usage(module: str, problem: str) -> int:
    """One line, from one process (under mpirun only rank 0 speaks; the others agree silently)."""
    if os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")) == "0":
        print(f"python -m {module}: {problem}", file=sys.stderr)
    return 2
