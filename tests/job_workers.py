"""Rank programs for whole-job tests (``tests/test_mpirun.py``, ``tests/test_faults.py``):
``mpirun -n N python tests/job_workers.py NAME [args]``, or through ``collectives.job.spawn``.

Under mpirun each rank sets its emulated node from its MPI rank (``NCCL_HOSTID``, contiguous blocks, as
``collectives.job.spawn`` does) before the communicator reads it, so inter-node peers use the NET transport
and its proxy thread.  The last argument of every program is a job token that only marks the command line, so
that a test can find any process of the job left behind.
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time

import numpy as np

import collectives
from collectives.device.common import CollectiveError

if "PMI_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ:
    from mpi4py import MPI
    WORLD = MPI.COMM_WORLD


def announce_mpi_segments() -> None:
    """Print the MPI library's shared-memory files this rank maps, so that a test can check they are gone."""
    with open("/proc/self/maps") as f:
        names = {os.path.basename(ln.split()[-1]) for ln in f if "/dev/shm/mpich_shm" in ln}
    for name in names:
        print(f"JOBSHM {name}", flush=True)


def set_node(nodes: int) -> None:
    """Under mpirun: this rank's emulated node (spawn sets NCCL_HOSTID itself)."""
    if nodes > 1 and "NCCLLAB_RANK" not in os.environ:
        os.environ["NCCL_HOSTID"] = f"nccllab-node{WORLD.rank * nodes // WORLD.size}"


def busy_python(seconds: float) -> None:
    """Pure-Python work: holds the GIL except at the interpreter's switch points."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def net_progress(iters: str, count: str, _token: str = "") -> None:
    """Collectives across 2 emulated nodes with the caller busy between them: a GIL-holding MPI call (mpi4py's
    lowercase ``allreduce`` keeps the GIL while it waits), an MPI barrier, and pure-Python work.  NCCL's proxy
    progresses whatever the user's thread does next; so must ours."""
    set_node(2)
    from collectives.perf import reference

    comm = collectives.Communicator(protocols="Simple", algorithms="Ring")
    x = np.random.default_rng([3, comm.rank]).uniform(-1, 1, int(count)).astype(np.float32)
    xs = comm.bootstrap.allgather_array(x)
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


def _net_send_socket(comm) -> socket.socket:
    """The control socket of this rank's first NET send connection (test-only reach into the plugin)."""
    nc = next(c.proxy_conn for ch in comm.channels for c in ch.send_to.values() if c.proxy_conn is not None)
    return nc.comm.ctrl


def _inject(comm, kind: str) -> None:
    """Do the fault on this rank, now (called from a timer thread while a collective runs, or between two)."""
    print(f"INJECT {kind} {time.monotonic():.6f}", flush=True)
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif kind == "close_socket":
        _net_send_socket(comm).shutdown(socket.SHUT_RDWR)
    elif kind == "corrupt_header":
        _net_send_socket(comm).send(b"\xff\xff\xff\x7f")  # a size of 2 GiB - 1, beyond NCCL_MAX_NET_SIZE


def fault(kind: str, nodes: str, _token: str = "") -> None:
    """A stream of 1 MiB Ring AllReduces on which the last rank (a NET peer of rank 0 with 2 nodes) does ``kind`` at a
    random collective: sigkill / sigstop / close_socket mid-collective, corrupt_header / mismatch /
    skip_destroy before one.  ``shm_full`` and ``port_taken`` need nothing here: the test prepares the machine.
    Every rank prints ``DETECTED <time>`` when its collective fails."""
    set_node(int(nodes))
    if "PMI_RANK" in os.environ:
        announce_mpi_segments()
    comm = collectives.Communicator(algorithms="Ring")  # the ring's NET connection is the one the faults hit
    print(f"JOBSHM nccllab-{comm.tag}-\nJOBRANK {comm.rank} {os.getpid()}", flush=True)
    victim = comm.nranks - 1
    rng = np.random.default_rng()
    at = int(rng.integers(2, 6))
    x = np.ones(1 << 18, np.float32)
    try:
        for i in range(200):
            count = x.size
            if comm.rank == victim and i == at:
                if kind in ("sigkill", "sigstop", "close_socket"):
                    threading.Timer(float(rng.uniform(0, 0.004)), _inject, (comm, kind)).start()
                elif kind == "corrupt_header":
                    _inject(comm, kind)
                elif kind == "mismatch":
                    print(f"INJECT {kind} {time.monotonic():.6f}", flush=True)
                    count -= 1
                elif kind == "skip_destroy":
                    print(f"INJECT {kind} {time.monotonic():.6f}", flush=True)
                    comm.destroy()
                    return
            comm.all_reduce(x[:count])
    except CollectiveError:
        print(f"DETECTED {time.monotonic():.6f}", flush=True)
        raise
    comm.destroy()
    print("unexpected success", flush=True)


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
