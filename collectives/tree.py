"""``python -m collectives.tree``: NCCL's double-binary-tree AllReduce across real processes, like nccl-tests.

The same command line and output as ``collectives.ring``, with ``NCCL_ALGO=Tree`` unless the environment sets
``NCCL_ALGO`` (NCCL's grammar, e.g. ``Tree,Ring`` lets the cost model pick per size).  Under ``mpirun -n N`` each
process is one rank; without mpirun it starts ``-g N`` ranks itself, ``--nodes K`` of them per emulated node.

``python -m collectives.tree --from-log nccl.log`` instead rebuilds the trees of a real NCCL INFO log with our
construction and diffs them against the log's own (``collectives.graph.replay``): no ranks are started.
"""
import os
import sys

from .perf.main import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--from-log" in argv:
        from .graph.replay import main as replay_main
        i = argv.index("--from-log")
        if i + 1 >= len(argv):
            sys.exit("python -m collectives.tree: --from-log needs an NCCL INFO log file")
        if not os.path.isfile(argv[i + 1]):
            sys.exit(f"python -m collectives.tree: --from-log {argv[i + 1]}: no such file")
        sys.exit(replay_main([argv[i + 1], *argv[:i], *argv[i + 2:]]))
    os.environ.setdefault("NCCL_ALGO", "Tree")
    sys.exit(main("collectives.tree"))
