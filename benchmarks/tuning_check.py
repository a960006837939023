"""The cost model's pick against every forced algorithm and protocol, side by side in one run: issue 27's tuning test.

    mpirun -n 4 python benchmarks/tuning_check.py [-b 8] [-e 16M] [-f 8] [--nodes K] [-R 1]

One communicator plans as the cost model does (``ncclTopoTuneModel`` then ``getAlgoInfo``'s choice); one more per
forced pair, ``NCCL_ALGO`` x ``NCCL_PROTO`` in their grammar (``Communicator(algorithms=..., protocols=...)``):
Ring and Tree with each of LL, LL128 and Simple.  A forced pair whose plan is not what was forced (the algorithm is
not available at that size or rank count) is left out of that size, shown as ``-``.  Per size, ``--rounds`` rounds
alternate all of them (medians; mean over ranks of the average per call) and each one's call is checked bitwise
against NCCL's order once.  Rank 0 prints the times and, per size, the fastest forced pair and the pick's time
over it, the pick's time being that of the forced pair equal to it (the ``pick`` column, the unforced
communicator, shows how far two runs of one plan differ on this machine).  Where that exceeds 1.2 (a forced pair
more than 20% faster than the pick), the pick's twin and that pair are timed again, the two alone, for as many
rounds: the sweep's fastest of up to six pairs is the least of up to six noisy times, biased low on this machine,
and an independent second timing of just the two has no such bias.  Only when the pair is again more than 20% faster
does the line name the size, the pick and the faster pair, NOT met; otherwise a line gives both timings and the
size is not counted.  The last line gives the goal over all sizes.

``--nodes K`` runs the ranks as K emulated nodes (``NCCL_HOSTID`` per block of ranks, as ``allreduce_vs_gloo.py``):
every communicator then crosses NET/Socket, where the preset's NET row and the tuner plugin's registered rule decide.
``-R 1`` (nccl-tests' flag) registers the input and output with every communicator (``comm.register``): the pick is
planned as a registered call (``getCollInfo``'s ``regBuff``), and every forced Ring/Simple call moves its NET steps
straight between the user's buffers.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from mpi4py import MPI

import collectives
from collectives.job import node_hostid
from collectives.perf.args import sizes
from checks import lab_wrong, verdict
from timing import add_side_by_side_args, iters_for, timed_rounds

FORCED = [(algo, proto) for algo in ("Ring", "Tree") for proto in ("LL", "LL128", "Simple")]
SLACK = 1.2  # the pick may be at most this much slower than the fastest forced pair


def needs_again(pick: str, best: str | None, ratio: float) -> bool:
    """Whether the sweep found a forced pair more than ``SLACK`` faster than the pick: the size is timed again."""
    return best is not None and best != pick and ratio > SLACK


def judge(nbytes: int, pick: str, best: str, sweep: tuple[float, float],
          again: tuple[float, float]) -> tuple[bool, str]:
    """A size the sweep flagged, given (pick, pair) seconds per call in the sweep and timed again, the two alone:
    flagged only when the pair is more than ``SLACK`` faster both times; the line gives both timings."""
    r1, r2 = sweep[0] / sweep[1], again[0] / again[1]
    second = f"timed again, the two alone: {again[0] * 1e6:.1f} against {again[1] * 1e6:.1f} us, {r2:.2f}x"
    if needs_again(pick, best, r1) and r2 > SLACK:
        return True, (f"# goal tuning at {nbytes} B: the pick {pick} takes {sweep[0] * 1e6:.1f} us, forced {best} "
                      f"{sweep[1] * 1e6:.1f} us is {r1:.2f}x faster; {second} -> NOT met")
    return False, (f"# tuning at {nbytes} B: forced {best} {sweep[1] * 1e6:.1f} us was {r1:.2f}x faster than the "
                   f"pick {pick} {sweep[0] * 1e6:.1f} us in the sweep; {second}: not counted")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_side_by_side_args(p, "16M", 8, 100)
    p.add_argument("--nodes", type=int, default=1, help="emulated nodes (NCCL_HOSTID per block of ranks)")
    p.add_argument("-R", "--local_register", type=int, choices=(0, 1), default=0,
                   help="1: register the buffers with every communicator (ncclCommRegister), as nccl-tests' -R 1")
    a = p.parse_args()
    world = MPI.COMM_WORLD
    if a.nodes < 1 or world.size % a.nodes:
        raise SystemExit(f"tuning_check: --nodes {a.nodes} does not divide {world.size} ranks")
    os.environ["NCCL_HOSTID"] = node_hostid(world.rank, world.size, a.nodes)
    reg = bool(a.local_register)

    def communicator(**kw) -> collectives.Communicator:
        uid = world.bcast(collectives.get_unique_id().to_bytes() if world.rank == 0 else None)
        return collectives.Communicator(uid, world.size, world.rank, **kw)
    model = communicator()
    forced = {f"{al}/{pr}": communicator(algorithms=al, protocols=pr) for al, pr in FORCED}
    if world.rank == 0:
        shape = f" as {a.nodes} x {world.size // a.nodes} emulated nodes" if a.nodes > 1 else ""
        bufs = "registered (-R 1)" if reg else "not registered"
        print(f"# AllReduce float32 sum, n={world.size}{shape}, buffers {bufs}, us per call: the cost model's pick "
              f"against each forced NCCL_ALGO/NCCL_PROTO ('-': the plan is not the forced pair there)")
        print(f"# {'size':>10} {'pick':>12} {'pick us':>9} " + " ".join(f"{k:>11}" for k in forced)
              + f" {'fastest':>12} {'pick/fastest':>12}")
    wrong, flagged, noted, checked = 0, [], [], 0
    for size in sizes(a):
        x = np.random.default_rng(world.rank).uniform(-1, 1, max(1, size // 4)).astype(np.float32)
        out = np.empty_like(x)
        handles = [(c, c.register(b)) for c in [model, *forced.values()] for b in (x, out)] if reg else []

        def pair(c: collectives.Communicator) -> str:  # as the call will plan it: registered if that took effect
            p = c.plan("AllReduce", x.size, x.dtype, c.registered(x, out))
            return f"{p.algo}/{p.proto}"
        pick = pair(model)
        live = {k: c for k, c in forced.items() if pair(c) == k}
        calls = {"pick": lambda: model.all_reduce(x, out=out)}
        calls.update({k: (lambda c=c: c.all_reduce(x, out=out)) for k, c in live.items()})
        iters = iters_for(size, 100, a.iters)
        t = timed_rounds(calls, iters, world, a.rounds, warmup=a.warmup_iters)
        best = min(live, key=t.get) if live else None
        # the pick is judged by its forced twin (the same pair, timed like the others) where there is one: the
        # pick against its twin is this machine's noise, not a tuning miss
        twin = pick if pick in live else "pick"
        ratio = t[twin] / t[best] if best else 1.0
        checked += 1
        # rank 0 names the pair to time again, for all (the second timing is collective, and MPI need not give every
        # rank the same last bit of the times); before deregistering, so that it runs the same plans
        rival = world.bcast(best if needs_again(pick, best, ratio) else None)
        if rival is not None:
            again = timed_rounds({twin: calls[twin], rival: calls[rival]}, iters, world, a.rounds)
            hit, line = judge(x.nbytes, pick, rival, (t[twin], t[rival]), (again[twin], again[rival]))
            (flagged if hit else noted).append(line)
        for c, h in handles:
            c.deregister(h)
        wrong += sum(lab_wrong(c, world, x.nbytes, seed=x.nbytes, register=reg) for c in [model, *live.values()])
        if world.rank == 0:
            cells = " ".join(f"{t[k] * 1e6:>11.1f}" if k in live else f"{'-':>11}" for k in forced)
            print(f"  {x.nbytes:>10} {pick:>12} {t['pick'] * 1e6:>9.1f} {cells} {best or '-':>12} {ratio:>12.2f}",
                  flush=True)
    for c in [model, *forced.values()]:
        c.destroy()
    if world.rank == 0:
        print(f"# check: the pick and every forced pair bitwise against NCCL's order: {wrong} wrong")
        print("\n".join(noted + flagged))
        print(f"# goal tuning: no forced NCCL_ALGO/NCCL_PROTO more than {SLACK - 1:.0%} faster than the pick: "
              f"{len(flagged)} of {checked} sizes flagged -> {verdict(not flagged)}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
