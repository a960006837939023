"""Ring against Tree AllReduce, with MPI's Allreduce beside them, in one run, per size, reported like nccl-tests
(busbw = algbw * 2(n-1)/n).

    python benchmarks/ring_vs_tree.py [-g 4] [--nodes 2] [-b 8] [-e 64M] [-f 4] [--proto Simple]

Runs under ``mpirun -n G`` (it starts mpirun itself when it is not under one).  The ranks are split into ``--nodes``
emulated nodes (per-rank ``NCCL_HOSTID``, so inter-node peers use the NET transport and its proxy thread).  In the
same processes it opens a communicator with ``NCCL_ALGO=Ring`` and one with ``Tree`` (both with the protocol given,
or the cost model's choice) and alternates them and ``MPI_Allreduce`` (mpi4py) per size on the same float32
buffers.  MPI knows nothing of the emulated nodes: it is this machine's baseline.  Both of our results are checked
bitwise against the NCCL-order reference of their algorithm.  The last column is what the cost model (CPU preset)
would pick at that size.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

import numpy as np

import collectives
from collectives.perf import reference
from collectives.job import under_mpirun
from collectives.perf.args import parse_size


def timed(fn, iters: int, world) -> float:
    world.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return world.allreduce((time.perf_counter() - t0) / iters, op=_max())  # the slowest rank, as nccl-tests


def _max():
    from mpi4py import MPI
    return MPI.MAX


def check(comm, xs: list, size: int) -> None:
    x = xs[comm.rank][:size // 4]
    got = comm.all_reduce(x)
    want = reference.all_reduce([v[:size // 4] for v in xs], **comm.reference_config("AllReduce", x.size, x.dtype))
    if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
        raise AssertionError(f"rank {comm.rank}: {comm.plan('AllReduce', x.size, x.dtype).algo} result at "
                             f"{size} B differs from the reference")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("-g", "--nranks", type=int, default=4)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("-b", type=parse_size, default=8)
    p.add_argument("-e", type=parse_size, default=parse_size("64M"))
    p.add_argument("-f", type=int, default=4)
    p.add_argument("--proto", default=None, help="NCCL_PROTO for both (default: the cost model's choice)")
    a = p.parse_args()
    if not under_mpirun():
        mpirun = shutil.which("mpirun") or sys.exit("ring_vs_tree.py: mpirun not found (pip install mpich)")
        os.execv(mpirun, [mpirun, "-n", str(a.nranks), sys.executable, __file__, *sys.argv[1:]])
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    if a.nodes > 1:  # as collectives.job.spawn does: contiguous blocks of ranks per emulated node
        os.environ["NCCL_HOSTID"] = f"nccllab-node{world.rank * a.nodes // world.size}"
    sizes = []
    s = a.b
    while s <= a.e:
        sizes.append(s)
        s *= a.f
    ring = collectives.Communicator(algorithms="Ring", protocols=a.proto)
    uid = world.bcast(collectives.get_unique_id().to_bytes() if world.rank == 0 else None)
    tree = collectives.Communicator(uid, world.size, world.rank, algorithms="Tree", protocols=a.proto)
    n = ring.nranks
    rng = np.random.default_rng([7, ring.rank])
    xs = ring.bootstrap.allgather_array(rng.uniform(-1, 1, a.e // 4).astype(np.float32))
    from collectives.graph.cost_model import CostModel
    model = CostModel(ring.machine, a.proto or "", "")
    if ring.rank == 0:
        print(f"# AllReduce float32 sum, {n} ranks on {ring.nnodes} nodes, nchannels {ring.nchannels}, proto "
              f"{a.proto or 'auto'}: Ring vs Tree vs MPI ({MPI.Get_library_version().split()[0]}), same "
              f"processes, alternating per size")
        print(f"# {'size':>10} {'ring us':>10} {'ring busbw':>10} {'tree us':>10} {'tree busbw':>10} "
              f"{'mpi us':>10} {'mpi busbw':>10} {'ring/tree':>9}  protos       model picks")
    for size in sizes:
        x = xs[ring.rank][:size // 4]
        out = np.empty_like(x)
        iters = int(max(3, min(100, (32 << 20) // max(size, 1))))
        mout = np.empty_like(x)
        for c in (ring, tree):
            check(c, xs, size)
            c.all_reduce(x, out=out)
        world.Allreduce(x, mout)
        t_ring = timed(lambda: ring.all_reduce(x, out=out), iters, world)
        t_tree = timed(lambda: tree.all_reduce(x, out=out), iters, world)
        t_mpi = timed(lambda: world.Allreduce(x, mout), iters, world)
        if ring.rank == 0:
            bw = lambda t: size / t / 1e9 * 2 * (n - 1) / n  # noqa: E731
            protos = "/".join(c.plan("AllReduce", x.size, x.dtype).proto for c in (ring, tree))
            pick = "/".join(model.choose("AllReduce", size)[:2])
            print(f"  {size:>10} {t_ring * 1e6:>10.1f} {bw(t_ring):>10.3f} {t_tree * 1e6:>10.1f} {bw(t_tree):>10.3f} "
                  f"{t_mpi * 1e6:>10.1f} {bw(t_mpi):>10.3f} {t_ring / t_tree:>9.2f}  {protos:<12} {pick}", flush=True)
    for c in (tree, ring):
        c.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
