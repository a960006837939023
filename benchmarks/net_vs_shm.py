"""NET (2 emulated nodes x 2 ranks) against SHM (1 node x 4 ranks), side by side in one run, with MPI beside them.

    mpirun -n 4 python benchmarks/net_vs_shm.py [-b 8] [-e 128M] [-f 8]

Every rank opens two communicators over the same 4 processes: one with every rank on one node (SHM between all of
them), one with ``NCCL_HOSTID`` split in two (NET and its proxy thread between the nodes, SHM inside each), and
times AllReduce float32 sum on both and on ``MPI_Allreduce``, in ``--rounds`` alternating rounds per size
(medians).  Rank 0 prints the times, nccl-tests' busbw, and the two ratios issue 17 set as goals: NET's busbw at
16 MiB and above against SHM's (50% asked), and NET's 8-byte latency against SHM's (3x asked).  Issue 27 retired
them (loopback TCP copies every byte twice, SHM once) for NET against Gloo (``allreduce_vs_gloo.py``); they are
printed as figures.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import collectives  # noqa: E402
from collectives.job import node_hostid, under_mpirun  # noqa: E402
from collectives.perf.args import parse_size  # noqa: E402
from timing import timed_rounds  # noqa: E402



def communicator(world, nodes: int):
    if nodes > 1:
        os.environ["NCCL_HOSTID"] = node_hostid(world.rank, world.size, nodes)
    else:
        os.environ.pop("NCCL_HOSTID", None)
    uid = world.bcast(collectives.get_unique_id().to_bytes() if world.rank == 0 else None)
    return collectives.Communicator(uid, world.size, world.rank)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-b", type=parse_size, default=8)
    p.add_argument("-e", type=parse_size, default=parse_size("128M"))
    p.add_argument("-f", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds per size; medians are reported")
    p.add_argument("-g", type=int, default=4, help="ranks when started without mpirun (default 4)")
    a = p.parse_args()
    if not under_mpirun():
        mpirun = shutil.which("mpirun") or sys.exit("net_vs_shm.py: mpirun not found (pip install mpich)")
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
        os.execv(mpirun, [mpirun, "-n", str(a.g), sys.executable, os.path.abspath(__file__), *sys.argv[1:]])
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    n = world.size
    comms = {"SHM": communicator(world, 1), "NET": communicator(world, 2)}
    factor = 2 * (n - 1) / n
    rows = []
    if world.rank == 0:
        via = sorted({t for ch in comms["NET"].describe()["connections"] for t in ch.values()})
        print(f"# AllReduce float32 sum, {n} ranks: SHM = 1 node x {n}, NET = 2 emulated nodes x {n // 2} "
              f"(rank 0's connections: {', '.join(via)}); MPI = {MPI.Get_library_version().splitlines()[0].strip()}")
        print(f"# {'size':>10} {'SHM us':>9} {'SHM busbw':>9} {'NET us':>9} {'NET busbw':>9} {'MPI us':>9} "
              f"{'MPI busbw':>9} {'NET/SHM':>8}")
    size = a.b
    while size <= a.e:
        x = np.random.default_rng(world.rank).uniform(-1, 1, max(1, size // 4)).astype(np.float32)
        out = np.empty_like(x)
        iters = int(max(3, min(500, (32 << 20) // max(size, 1))))
        calls = {k: (lambda c=c: c.all_reduce(x, out=out)) for k, c in comms.items()}
        calls["MPI"] = lambda: world.Allreduce(x, out)
        t = timed_rounds(calls, iters, world, a.rounds, warmup=2)
        bw = {k: x.nbytes / v / 1e9 * factor for k, v in t.items()}
        rows.append((x.nbytes, t, bw))
        if world.rank == 0:
            print(f"  {x.nbytes:>10} " + " ".join(f"{t[k] * 1e6:>9.1f} {bw[k]:>9.2f}" for k in ("SHM", "NET", "MPI"))
                  + f" {bw['NET'] / bw['SHM']:>8.2f}", flush=True)
        size *= a.f
    for c in comms.values():
        c.destroy()
    if world.rank == 0:
        small = [r for r in rows if r[0] <= 8]
        big = [r for r in rows if r[0] >= 16 << 20]
        if small:
            ratio = small[0][1]["NET"] / small[0][1]["SHM"]
            print(f"# ratio: NET 8 B latency {ratio:.2f}x SHM's (issue 17 asked for 3x; issue 27 sets NET "
                  f"against Gloo instead)")
        if big:
            worst = min(r[2]["NET"] / r[2]["SHM"] for r in big)
            print(f"# ratio: NET busbw at >= 16 MiB: lowest {worst:.0%} of SHM's (issue 17 asked for 50%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
