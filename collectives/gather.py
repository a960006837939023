"""``python -m collectives.gather``: nccl-tests' ``gather_perf`` (``src/gather.cu``): ``ncclGather`` to root ``-r``,
count per rank aligned down to 16 bytes; busbw = algbw * (n-1)/n. In place: the send buffer is the rank's block of
the receive buffer. A non-root rank's receive buffer must keep its bytes.

The same command line and table as ``collectives.ring`` (``collectives/perf/``), on the CPU device.  Under
``mpirun -n N`` each process is one rank; without mpirun it starts ``-g N`` ranks itself (default 8),
``--nodes K`` emulated nodes talking over NET.  Deliberate difference: ``-r`` names one root (nccl-tests' ``-r -1``,
every root, is not there).
"""
import sys

from .perf.main import main

if __name__ == "__main__":
    sys.exit(main("collectives.gather", coll="gather"))
