"""Ring against Tree AllReduce in one run, per size, reported like nccl-tests (busbw = algbw * 2(n-1)/n).

    python benchmarks/ring_vs_tree.py [-g 4] [--nodes 2] [-b 8] [-e 64M] [-f 4] [--proto Simple]

Without mpirun it starts ``-g`` ranks as ``--nodes`` emulated nodes (per-rank ``NCCL_HOSTID``, so inter-node
peers use the NET transport and its proxy thread); under mpirun each process is one rank.  In the same processes
it opens a communicator with ``NCCL_ALGO=Ring``, then one with ``Tree`` (both with the protocol given, or the
cost model's choice), and alternates the two per size on the same float32 buffers.  Both results are checked
against the NCCL-order reference of their algorithm.  The last column is what the cost model (CPU preset) would
pick at that size.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

import collectives
from collectives import reference
from collectives.launch import launched, spawn
from collectives.perf import parse_size


def timed(comm, x, out, iters: int) -> float:
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        comm.all_reduce(x, out=out)
    dt = (time.perf_counter() - t0) / iters
    return max(comm.bootstrap.allgather_obj(dt))  # the slowest rank, as nccl-tests reports


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
    if not launched():
        return spawn(a.nranks, [__file__, *sys.argv[1:]], nodes=a.nodes)
    sizes = []
    s = a.b
    while s <= a.e:
        sizes.append(s)
        s *= a.f
    ring = collectives.Communicator(algorithms="Ring", protocols=a.proto)
    os.environ.pop("NCCL_COMM_ID", None)  # the launcher's fixed root address is taken: rank 0 opens a new root
    uid = ring.bootstrap.allgather_obj(collectives.get_unique_id().to_bytes() if ring.rank == 0 else None)[0]
    tree = collectives.Communicator(uid, ring.nranks, ring.rank, algorithms="Tree", protocols=a.proto)
    n = ring.nranks
    rng = np.random.default_rng([7, ring.rank])
    xs = ring.bootstrap.allgather_obj(rng.uniform(-1, 1, a.e // 4).astype(np.float32))
    from collectives.graph.cost_model import CostModel
    model = CostModel(ring.machine, a.proto or "", "")
    if ring.rank == 0:
        print(f"# AllReduce float32 sum, {n} ranks on {ring.nnodes} nodes, nchannels {ring.nchannels}, proto "
              f"{a.proto or 'auto'}: Ring vs Tree, same processes, alternating per size")
        print(f"# {'size':>10} {'ring us':>10} {'ring busbw':>10} {'tree us':>10} {'tree busbw':>10} "
              f"{'ring/tree':>9}  protos       model picks")
    for size in sizes:
        x = xs[ring.rank][:size // 4]
        out = np.empty_like(x)
        iters = int(max(3, min(100, (32 << 20) // max(size, 1))))
        for c in (ring, tree):
            check(c, xs, size)
            c.all_reduce(x, out=out)
        t_ring = timed(ring, x, out, iters)
        t_tree = timed(tree, x, out, iters)
        if ring.rank == 0:
            factor = 2 * (n - 1) / n
            br, bt = size / t_ring / 1e9 * factor, size / t_tree / 1e9 * factor
            protos = "/".join(c.plan("AllReduce", x.size, x.dtype).proto for c in (ring, tree))
            pick = "/".join(model.choose("AllReduce", size)[:2])
            print(f"  {size:>10} {t_ring * 1e6:>10.1f} {br:>10.3f} {t_tree * 1e6:>10.1f} {bt:>10.3f} "
                  f"{t_ring / t_tree:>9.2f}  {protos:<12} {pick}", flush=True)
    for c in (tree, ring):
        c.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
