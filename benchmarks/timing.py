"""The side-by-side benchmarks' timers and shared flags (``allreduce_vs_mpi.py``, ``p2p_vs_mpi.py``, ``latency.py``,
``net_vs_shm.py``): each call timed on every rank after a barrier, several calls side by side in alternating
rounds, medians reported.  The benchmarks run as scripts, so ``import timing`` finds this file beside them."""
from __future__ import annotations

import argparse
import resource
import time

import numpy as np

from collectives.perf.args import parse_size


def timed_across(fn, iters: int, world, cpu: list | None = None) -> float:
    """Seconds per call of ``fn``, the mean over the ranks of ``world`` (an mpi4py communicator) of each rank's
    average over ``iters`` calls, after a barrier: what the side-by-side benchmarks report.  With ``cpu``, also
    appends the CPU seconds per call (user, sys), the mean over the ranks of each process's own (``getrusage``:
    every thread, a proxy's or Gloo's I/O threads included; microseconds where ``os.times`` counts 10 ms ticks),
    summed in the same collective as the time; every rank passes ``cpu`` alike."""
    world.Barrier()
    c0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    totals = [time.perf_counter() - t0]
    if cpu is not None:
        c1 = resource.getrusage(resource.RUSAGE_SELF)
        totals += [c1.ru_utime - c0.ru_utime, c1.ru_stime - c0.ru_stime]
    mean = world.allreduce(np.array(totals) / iters) / world.size
    if cpu is not None:
        cpu.append((float(mean[1]), float(mean[2])))
    return float(mean[0])


def timed_rounds(calls: dict, iters: int, world, rounds: int = 3, warmup: int = 0, cpu: dict | None = None) -> dict:
    """Seconds per call of each of ``calls`` {name: fn}, side by side: each called ``warmup`` times untimed, then
    ``rounds`` rounds, each timing every call with ``timed_across`` (the order reversed every other round), then
    each one's median round.  This VM's bandwidth swings by 2x within seconds; alternating and taking medians
    keeps a burst from deciding a ratio.  With ``cpu`` (a dict), ``cpu[name]`` gets each side's CPU seconds per
    call, (user, sys), each the median over the same rounds."""
    for fn in calls.values():
        for _ in range(warmup):
            fn()
    times: dict = {name: [] for name in calls}
    used: dict = {name: [] for name in calls}
    for r in range(rounds):
        for name in (list(calls) if r % 2 == 0 else list(calls)[::-1]):
            times[name].append(timed_across(calls[name], iters, world, used[name] if cpu is not None else None))
    if cpu is not None:
        cpu.update({name: (float(np.median([u for u, _ in c])), float(np.median([s for _, s in c])))
                    for name, c in used.items()})
    return {name: float(np.median(t)) for name, t in times.items()}


def add_side_by_side_args(p: argparse.ArgumentParser, maxbytes: str, stepfactor: int, calls: int) -> None:
    """The flags the side-by-side benchmarks share: nccl-tests' sizes (-b -e -f -i), the timed calls (-n, default
    ``iters_for``'s), the untimed ones (-w) and the alternating rounds."""
    p.add_argument("-b", "--minbytes", type=parse_size, default=8)
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size(maxbytes))
    p.add_argument("-f", "--stepfactor", type=int, default=stepfactor)
    p.add_argument("-i", "--stepbytes", type=parse_size, default=parse_size("1M"), help="size step when -f is 1")
    p.add_argument("-n", "--iters", type=int, default=0,
                   help=f"timed calls per round (default: {calls}, fewer above {(64 << 10) // calls} KiB)")
    p.add_argument("-w", "--warmup_iters", type=int, default=2, help="untimed calls of each side first")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds per size; medians are reported")


def allreduce_point(nbytes: int, seconds: float, nranks: int) -> dict:
    """One measured AllReduce as the ``--json`` series hold it, with nccl-tests' figures: algbw = bytes / time,
    busbw = algbw * 2(n-1)/n, the time in microseconds."""
    algbw = nbytes / seconds / 1e9
    return {"size": nbytes, "algbw": algbw, "busbw": algbw * (2 * (nranks - 1) / nranks), "time_us": seconds * 1e6}


def point_cells(point: dict | None) -> str:
    """A measured side's two columns in the printed tables, its time (us) and busbw, or '-' in both where the side
    was not timed at that size."""
    if point is None:
        return f"{'-':>10} {'-':>10}"
    return f"{point['time_us']:>10.1f} {point['busbw']:>10.2f}"


def iters_for(size: int, calls: int, given: int = 0) -> int:
    """Timed calls per round at ``size`` bytes: ``given`` (-n) if set, else ``calls``, fewer so that a round moves
    about 64 MiB, never under 3."""
    return given or int(max(3, min(calls, (64 << 20) // max(size, 1))))
