"""Our point-to-point against MPI's (mpi4py), side by side in one run, reported like nccl-tests' ``sendrecv_perf``
and ``alltoall_perf``.

    mpirun -n 4 python benchmarks/p2p_vs_mpi.py [-b 8] [-e 64M] [-f 8] [-n 0] [-w 2] [--rounds 3]

SendRecv: each rank sends its buffer to rank + 1 and receives rank - 1's in one group (nccl-tests' ``sendrecv.cu``),
against ``MPI_Sendrecv`` on the same buffers; busbw = algbw (factor 1).  AlltoAll: ``all_to_all`` of a buffer of
``size`` bytes (size / n to each peer) against ``MPI_Alltoall``; busbw = algbw * (n - 1) / n.  float32, out of
place.  Per size the sides alternate in ``--rounds`` rounds (``timing.timed_rounds``), each reporting its median.
"""
from __future__ import annotations

import argparse

import numpy as np
from mpi4py import MPI

import collectives
from collectives.perf.args import sizes
from timing import add_side_by_side_args, iters_for, timed_rounds


def main() -> None:
    p = argparse.ArgumentParser()
    add_side_by_side_args(p, "64M", 8, 100)
    a = p.parse_args()
    world = MPI.COMM_WORLD
    n = world.size
    with collectives.Communicator() as comm:
        r = comm.rank
        nxt, prv = (r + 1) % n, (r - 1) % n
        if r == 0:
            print(f"# SendRecv and AlltoAll, float32, n={n}: nccl-lab vs MPI "
                  f"({MPI.Get_library_version().splitlines()[0].strip()})")
            print(f"# {'test':>8} {'size':>10} {'lab us':>10} {'lab busbw':>10} {'mpi us':>10} {'mpi busbw':>10} "
                  f"{'lab/mpi':>8}")
        for test, factor in (("SendRecv", 1.0), ("AlltoAll", (n - 1) / n)):
            for size in sizes(a):
                count = max(size // 4 // n * n, n) if test == "AlltoAll" else max(size // 4, 1)
                x = np.random.default_rng([r, size]).uniform(-1, 1, count).astype(np.float32)
                out, mout = np.empty_like(x), np.empty_like(x)

                def lab_sendrecv() -> None:
                    with collectives.group():
                        comm.send(x, nxt)
                        comm.recv(out, prv)

                calls = ({"lab": lab_sendrecv, "mpi": lambda: world.Sendrecv(x, nxt, 0, mout, prv, 0)}
                         if test == "SendRecv" else
                         {"lab": lambda: comm.all_to_all(x, out=out), "mpi": lambda: world.Alltoall(x, mout)})
                iters = iters_for(size, 100, a.iters)
                t = timed_rounds(calls, iters, world, a.rounds, warmup=a.warmup_iters)
                if r == 0:
                    nbytes = count * 4
                    bl, bm = nbytes / t["lab"] / 1e9 * factor, nbytes / t["mpi"] / 1e9 * factor
                    print(f"  {test:>8} {nbytes:>10} {t['lab'] * 1e6:>10.1f} {bl:>10.2f} {t['mpi'] * 1e6:>10.1f} "
                          f"{bm:>10.2f} {bl / bm if bm else 0:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
