"""Rank programs that run under a real ``mpirun`` (``mpirun -n N python tests/mpirun_workers.py NAME [args]``).

Each sets its emulated node from its MPI rank (``NCCL_HOSTID``, contiguous blocks, as ``collectives.launch.spawn``
does) before the communicator reads it, so inter-node peers use the NET transport and its proxy thread.
"""
from __future__ import annotations

import os
import sys
import time

from mpi4py import MPI

WORLD = MPI.COMM_WORLD


def set_node(nodes: int) -> None:
    if nodes > 1:
        os.environ["NCCL_HOSTID"] = f"nccllab-node{WORLD.rank * nodes // WORLD.size}"


def busy_python(seconds: float) -> None:
    """Pure-Python work: holds the GIL except at the interpreter's switch points."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def net_progress(iters: str, count: str) -> None:
    """Collectives across 2 emulated nodes with the caller busy between them: a GIL-holding MPI call (mpi4py's
    lowercase ``allreduce`` keeps the GIL while it waits), an MPI barrier, and pure-Python work.  NCCL's proxy
    progresses whatever the user's thread does next; so must ours."""
    set_node(2)
    import numpy as np

    import collectives
    from collectives import reference

    comm = collectives.Communicator(protocols="Simple", algorithms="Ring")
    x = np.random.default_rng([3, comm.rank]).uniform(-1, 1, int(count)).astype(np.float32)
    xs = comm.bootstrap.allgather_obj(x)
    want = reference.all_reduce(xs, **comm.reference_config("AllReduce", x.size, x.dtype))
    for i in range(int(iters)):
        got = comm.all_reduce(x)
        WORLD.allreduce(i, op=MPI.MAX)  # the stall: the rank that just returned sits here holding the GIL
        if i % 7 == 0:
            busy_python(0.0005)
        if i % 11 == 0:
            WORLD.Barrier()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), "result differs from the reference"
    comm.destroy()
    print(f"rank {WORLD.rank}: {iters} collectives ok", flush=True)


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
