"""``python -m collectives.sendrecv``: nccl-tests' ``sendrecv_perf`` (``src/sendrecv.cu``): in one group each rank
sends to rank + 1 and receives from rank - 1 (``ncclSend`` / ``ncclRecv``); busbw = algbw. In place it runs,
unchecked (N/A), as nccl-tests.

The same command line and table as ``collectives.ring`` (``collectives/perf/``), on the CPU device.  Under
``mpirun -n N`` each process is one rank; without mpirun it starts ``-g N`` ranks itself (default 8),
``--nodes K`` emulated nodes talking over NET.  Deliberate difference: ``-r`` names one root (nccl-tests' ``-r -1``,
every root, is not there).
"""
import sys

from .perf.main import main

if __name__ == "__main__":
    sys.exit(main("collectives.sendrecv", coll="sendrecv"))
