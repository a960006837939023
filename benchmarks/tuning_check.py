"""The cost model's pick against every forced algorithm and protocol, side by side in one run: issue 27's tuning test.

    mpirun -n 4 python benchmarks/tuning_check.py [-b 8] [-e 16M] [-f 8]

One communicator plans as the cost model does (``ncclTopoTuneModel`` then ``getAlgoInfo``'s choice); one more per
forced pair, ``NCCL_ALGO`` x ``NCCL_PROTO`` in their grammar (``Communicator(algorithms=..., protocols=...)``):
Ring and Tree with each of LL, LL128 and Simple.  A forced pair whose plan is not what was forced (the algorithm is
not available at that size or rank count) is left out of that size, shown as ``-``.  Per size, ``--rounds`` rounds
alternate all of them (medians; mean over ranks of the average per call) and each one's call is checked bitwise
against NCCL's order once.  Rank 0 prints the times and, per size, the fastest forced pair and the pick's time
over it, the pick's time being that of the forced pair equal to it (the ``pick`` column, the unforced
communicator, shows how far two runs of one plan differ on this machine); where that exceeds 1.2 (a forced pair more than 20% faster than the pick) the line names the size, the
pick and the faster pair, NOT met, and the last line gives the goal over all sizes.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
from mpi4py import MPI

import collectives
from collectives.perf.args import sizes
from checks import lab_wrong, verdict
from timing import add_side_by_side_args, iters_for, timed_rounds

FORCED = [(algo, proto) for algo in ("Ring", "Tree") for proto in ("LL", "LL128", "Simple")]
SLACK = 1.2  # the pick may be at most this much slower than the fastest forced pair


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_side_by_side_args(p, "16M", 8, 100)
    a = p.parse_args()
    world = MPI.COMM_WORLD
    model = collectives.Communicator()
    forced = {f"{al}/{pr}": collectives.Communicator(algorithms=al, protocols=pr) for al, pr in FORCED}
    if world.rank == 0:
        print(f"# AllReduce float32 sum, n={world.size}, us per call: the cost model's pick against each forced "
              f"NCCL_ALGO/NCCL_PROTO ('-': the plan is not the forced pair there)")
        print(f"# {'size':>10} {'pick':>12} {'pick us':>9} " + " ".join(f"{k:>11}" for k in forced)
              + f" {'fastest':>12} {'pick/fastest':>12}")
    wrong, flagged, checked = 0, [], 0
    for size in sizes(a):
        x = np.random.default_rng(world.rank).uniform(-1, 1, max(1, size // 4)).astype(np.float32)
        out = np.empty_like(x)
        plan = model.plan("AllReduce", x.size, x.dtype)
        pick = f"{plan.algo}/{plan.proto}"
        live = {k: c for k, c in forced.items()
                if "/".join((c.plan("AllReduce", x.size, x.dtype).algo, c.plan("AllReduce", x.size, x.dtype).proto))
                == k}
        calls = {"pick": lambda: model.all_reduce(x, out=out)}
        calls.update({k: (lambda c=c: c.all_reduce(x, out=out)) for k, c in live.items()})
        t = timed_rounds(calls, iters_for(size, 100, a.iters), world, a.rounds, warmup=a.warmup_iters)
        wrong += sum(lab_wrong(c, world, x.nbytes, seed=x.nbytes) for c in [model, *live.values()])
        best = min(live, key=t.get) if live else None
        # the pick is judged by its forced twin (the same pair, timed like the others) where there is one: the
        # pick against its twin is this machine's noise, not a tuning miss
        mine = t[pick] if pick in live else t["pick"]
        ratio = mine / t[best] if best else 1.0
        checked += 1
        if best != pick and ratio > SLACK:
            flagged.append(f"# goal tuning at {x.nbytes} B: the pick {pick} takes {mine * 1e6:.1f} us, forced "
                           f"{best} {t[best] * 1e6:.1f} us is {ratio:.2f}x faster -> NOT met")
        if world.rank == 0:
            cells = " ".join(f"{t[k] * 1e6:>11.1f}" if k in live else f"{'-':>11}" for k in forced)
            print(f"  {x.nbytes:>10} {pick:>12} {t['pick'] * 1e6:>9.1f} {cells} {best or '-':>12} {ratio:>12.2f}",
                  flush=True)
    for c in [model, *forced.values()]:
        c.destroy()
    if world.rank == 0:
        print(f"# check: the pick and every forced pair bitwise against NCCL's order: {wrong} wrong")
        print("\n".join(flagged))
        print(f"# goal tuning: no forced NCCL_ALGO/NCCL_PROTO more than {SLACK - 1:.0%} faster than the pick: "
              f"{len(flagged)} of {checked} sizes flagged -> {verdict(not flagged)}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
