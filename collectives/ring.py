"""``python -m collectives.ring``: NCCL's ring collectives across real processes, reported like nccl-tests.

Under ``mpirun -n N`` each process is one rank; without mpirun it starts ``-g N`` ranks itself (default 8).
Flags as nccl-tests: ``-b -e -f -n -w -c -d -o -r``, plus ``--coll`` and ``--json``.
"""
import sys

from .perf.main import main

if __name__ == "__main__":
    sys.exit(main("collectives.ring"))
