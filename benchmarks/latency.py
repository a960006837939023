"""AllReduce latency by protocol: LL vs LL128 vs Simple vs MPI's ``Allreduce`` (mpi4py), side by side in one run.

    mpirun -n 2 python benchmarks/latency.py [-b 8] [-e 1M] [-f 4]

One communicator per protocol (``Communicator(protocols=...)``, NCCL_PROTO's grammar), same float32 buffers,
in ``--rounds`` alternating rounds per size.  Each figure is the median round's mean over ranks of the average
time per call, in microseconds.  Each protocol's call is checked bitwise against NCCL's order once per size.
Rank 0 ends with issue 27's protocol-order goal, one line per size up to ``ORDER_MAX``: forced by ``NCCL_PROTO``'s
grammar, LL must be fastest, then LL128, then Simple (met or NOT met).  Beside it, ``wire_floor.py`` measures in the
same run what one hop of an 8-byte message costs in each protocol's layout with nothing else around it; a NOT met
line says when that floor already puts LL128 behind Simple on this machine.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
from mpi4py import MPI

import collectives
from collectives.perf.args import parse_size
import wire_floor
from checks import lab_wrong, verdict
from timing import timed_rounds

PROTOS = ("LL", "LL128", "Simple")
ORDER_MAX = 1 << 10  # "the smallest sizes" of issue 27's order goal: where a message is a few lines of each protocol


def order_goal(size: int, times: dict, floor: dict) -> str:
    """LL < LL128 < Simple in time at ``size``: issue 27's protocol order; when not met and the wire floor
    (``wire_floor.hop_times``) has LL128's hop slower than Simple's, the line says so."""
    ok = times["LL"] < times["LL128"] < times["Simple"]
    line = (f"# goal protocol order at {size} B: LL {times['LL']:.1f} < LL128 {times['LL128']:.1f} < Simple "
            f"{times['Simple']:.1f} us -> {verdict(ok)}")
    if not ok and floor["LL128"] > floor["Simple"]:
        line += (f" (floor: a hop of LL128's 2048-byte wire slice costs {floor['LL128']:.2f} us against Simple's "
                 f"data and tail {floor['Simple']:.2f} us on this machine)")
    return line



def main() -> int:
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
    size, wrong, order = a.b, 0, {}
    while size <= a.e:
        x = np.random.default_rng(world.rank).uniform(-1, 1, max(1, size // 4)).astype(np.float32)
        out = np.empty_like(x)
        iters = max(5, a.n * 8 // max(8, size // 1024))
        calls = {proto: (lambda c=c: c.all_reduce(x, out=out)) for proto, c in comms.items()}
        calls["MPI"] = lambda: world.Allreduce(x, out)
        times = {name: t * 1e6 for name, t in timed_rounds(calls, iters, world, a.rounds, warmup=3).items()}
        wrong += sum(lab_wrong(c, world, x.nbytes, seed=x.nbytes) for c in comms.values())
        if x.nbytes <= ORDER_MAX:
            order[x.nbytes] = times
        if world.rank == 0:
            print(f"  {x.nbytes:>10} " + " ".join(f"{times[k]:>9.1f}" for k in calls) +
                  f"   {times['LL'] / times['MPI']:>6.1f}", flush=True)
        size *= a.f
    for c in comms.values():
        c.destroy()
    floor = wire_floor.hop_times(world)
    if world.rank == 0:
        print(f"# check: every protocol bitwise against NCCL's order: {wrong} wrong")
        print("# wire floor (wire_floor.py: one hop of an 8-byte message, numba ping-pong through shared memory): "
              + ", ".join(f"{p} {floor[p]:.2f} us" for p in PROTOS))
        print("\n".join(order_goal(size, times, floor) for size, times in order.items()))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
