"""The side-by-side benchmarks' timers (``allreduce_vs_mpi.py``, ``latency.py``, ``net_vs_shm.py``): each call
timed on every rank after a barrier, several calls side by side in alternating rounds, medians reported.  The
benchmarks run as scripts, so ``import timing`` finds this file beside them."""
from __future__ import annotations

import time

import numpy as np


def timed_across(fn, iters: int, world) -> float:
    """Seconds per call of ``fn``, the mean over the ranks of ``world`` (an mpi4py communicator) of each rank's
    average over ``iters`` calls, after a barrier: what the side-by-side benchmarks report."""
    world.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return world.allreduce((time.perf_counter() - t0) / iters) / world.size


def timed_rounds(calls: dict, iters: int, world, rounds: int = 3, warmup: int = 0) -> dict:
    """Seconds per call of each of ``calls`` {name: fn}, side by side: each called ``warmup`` times untimed, then
    ``rounds`` rounds, each timing every call with ``timed_across`` (the order reversed every other round), then
    each one's median round.  This VM's bandwidth swings by 2x within seconds; alternating and taking medians
    keeps a burst from deciding a ratio."""
    for fn in calls.values():
        for _ in range(warmup):
            fn()
    times: dict = {name: [] for name in calls}
    for r in range(rounds):
        for name in (list(calls) if r % 2 == 0 else list(calls)[::-1]):
            times[name].append(timed_across(calls[name], iters, world))
    return {name: float(np.median(t)) for name, t in times.items()}
