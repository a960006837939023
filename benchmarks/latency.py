"""AllReduce latency by protocol: LL vs LL128 vs Simple vs MPI's ``Allreduce`` (mpi4py), side by side in one run.

    mpirun -n 2 python benchmarks/latency.py [-b 8] [-e 1M] [-f 4]

One communicator per protocol (``Communicator(protocols=...)``, NCCL_PROTO's grammar), same float32 buffers,
in ``--rounds`` alternating rounds per size.  Each figure is the median round's mean over ranks of the average
time per call, in microseconds.
"""
from __future__ import annotations

import argparse

import numpy as np
from mpi4py import MPI

import collectives
from collectives.perf.args import parse_size
from timing import timed_rounds

PROTOS = ("LL", "LL128", "Simple")



def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("-b", type=parse_size, default=8)
    p.add_argument("-e", type=parse_size, default=parse_size("1M"))
    p.add_argument("-f", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds per size; medians are reported")
    p.add_argument("-n", type=int, default=200, help="calls per measurement at 8 B (fewer for large sizes)")
    a = p.parse_args()
    world = MPI.COMM_WORLD
    comms = {proto: collectives.Communicator(protocols=proto) for proto in PROTOS}
    if world.rank == 0:
        print(f"# AllReduce float32 sum latency (us), n={world.size}, mean over ranks; MPI = "
              f"{MPI.Get_library_version().splitlines()[0].strip()}")
        print(f"# {'size':>10} " + " ".join(f"{x:>9}" for x in (*PROTOS, "MPI")) + "   LL/MPI")
    size = a.b
    while size <= a.e:
        x = np.random.default_rng(world.rank).uniform(-1, 1, max(1, size // 4)).astype(np.float32)
        out = np.empty_like(x)
        iters = max(5, a.n * 8 // max(8, size // 1024))
        calls = {proto: (lambda c=c: c.all_reduce(x, out=out)) for proto, c in comms.items()}
        calls["MPI"] = lambda: world.Allreduce(x, out)
        times = {name: t * 1e6 for name, t in timed_rounds(calls, iters, world, a.rounds, warmup=3).items()}
        if world.rank == 0:
            print(f"  {x.nbytes:>10} " + " ".join(f"{times[k]:>9.1f}" for k in calls) +
                  f"   {times['LL'] / times['MPI']:>6.1f}", flush=True)
        size *= a.f
    for c in comms.values():
        c.destroy()


if __name__ == "__main__":
    main()
