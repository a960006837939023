"""The side-by-side benchmarks' correctness checks, one call per size beside the timed ones: the lab's AllReduce
bitwise against ``collectives.perf.reference`` (NCCL's summation order, the config from ``comm.reference_config``,
as ``collectives.perf.runner.Runner.check_one`` does), a peer's (Gloo's) only for closeness, its order being its own;
and the goal lines they end with.
The benchmarks run as scripts, so ``import checks`` finds this file beside them."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collectives.perf import reference
from collectives.perf.runner import _poison, _Rolled, count_wrong, random_input

CHECK_MAX = 16 << 20  # above this the reference (every rank's input in each process) costs more than the sweep
STRIDE = 7919         # rank q's input is the shared random vector rotated by q * STRIDE, as the runner's


def inputs_for(size: int, nranks: int, seed: int) -> list:
    """Every rank's fresh float32 input of ``size`` bytes (at least one element), cheap to slice."""
    base = random_input(np.random.default_rng(seed), max(1, size // 4), np.float32)
    return [_Rolled(base, q * STRIDE) for q in range(nranks)]


def lab_wrong(comm, world, size: int, seed: int, register: bool = False) -> int:
    """Elements, over all ranks, where one AllReduce sum of ``comm`` (fresh inputs, poisoned output; both buffers
    registered with ``register``, nccl-tests' -R 1) differs in its bytes from the NCCL-order reference; 0 is
    right."""
    inputs = inputs_for(size, comm.nranks, seed)
    x = np.asarray(inputs[comm.rank]).copy()  # _Rolled may hand back a view of the shared vector
    out = np.empty_like(x)
    _poison(out)
    handles = [comm.register(x), comm.register(out)] if register else []
    registered = comm.registered(x, out)  # what took effect (none with NCCL_LOCAL_REGISTER=0): the plan follows it
    comm.all_reduce(x, out=out)
    for h in handles:
        comm.deregister(h)
    want = reference.all_reduce(inputs, "sum", **comm.reference_config("AllReduce", x.size, x.dtype, registered))
    return world.allreduce(count_wrong(out, want))


def close_wrong(got: np.ndarray, inputs: list) -> int:
    """Elements of a peer's float32 sum farther from the float64 sum of ``inputs`` than float32 rounding over
    ``len(inputs)`` additions allows."""
    exact = np.sum([np.asarray(x, dtype=np.float64) for x in inputs], axis=0)
    tol = len(inputs) * np.finfo(np.float32).eps * np.sum([np.abs(np.asarray(x, np.float64)) for x in inputs],
                                                          axis=0)
    return int(np.count_nonzero(~(np.abs(got.astype(np.float64) - exact) <= tol)))


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def lowest_ratio(lab: list, peer: list, lo: int, hi: int) -> tuple[dict, dict, float] | None:
    """The measured pair (``{"size", "busbw", ...}`` dicts, the same sizes on both sides) from ``lo`` to ``hi``
    bytes with the lowest lab/peer busbw, and that ratio (a peer busbw of 0 counts as 0; the first size on a tie);
    None when no size was measured there.  What a goal line names, and what a note on it looks at."""
    pts = [(a, b, a["busbw"] / b["busbw"] if b["busbw"] else 0.0) for a, b in zip(lab, peer) if lo <= a["size"] <= hi]
    return min(pts, key=lambda p: p[2]) if pts else None


def floor_note(floor: list, peer: list, lo: int, hi: int, want: float, what: str, peer_name: str,
               kind: str = "floor", verb: str = "reach") -> str:
    """What a goal NOT met adds when a floor measured beside it (``{"size", "busbw"}`` points, the peer's sizes)
    stays under the ratio asked somewhere from ``lo`` to ``hi`` bytes: the size where the floor's ratio to the peer is
    lowest, and that ratio; '' where the floor clears the ratio everywhere (or was not measured there).  ``kind``
    names the measurement in the note (a reference that is no strict floor says so), ``verb`` agrees with ``what``."""
    peer_at = {p["size"]: p["busbw"] for p in peer}
    under = [(f["size"], f["busbw"] / peer_at[f["size"]]) for f in floor
             if lo <= f["size"] <= hi and peer_at.get(f["size"]) and f["busbw"] / peer_at[f["size"]] < want]
    if not under:
        return ""
    size, ratio = min(under, key=lambda u: u[1])
    return f" ({kind}: at {size} B {what} {verb} {ratio:.2f}x {peer_name}'s busbw, under the {want:.1f}x asked)"


@dataclass
class Goal:
    """One band's busbw goal as measured: its line, the ratio asked, the band's bytes, and the band's lowest point
    (``lowest_ratio``'s triple; None when no size was measured there)."""
    line: str
    want: float
    lo: int
    hi: int
    low: tuple[dict, dict, float] | None

    @property
    def missed(self) -> bool:
        """NOT met at a measured size: what the benchmarks' notes explain (a band not measured is NOT met too, and
        its line says so, with nothing to explain)."""
        return self.low is not None and self.low[2] < self.want


def busbw_goals(who: str, lab: list, peer: list, bands: list[tuple[str, float, int, int]]) -> list[Goal]:
    """One goal per band (label, least lab/peer busbw ratio, smallest size, largest size) over the measured points,
    its line naming the lowest ratio and its size (``lowest_ratio``); a band with no measured size is NOT met,
    marked as not measured."""
    goals = []
    for label, want, lo, hi in bands:
        low = lowest_ratio(lab, peer, lo, hi)
        if low is not None:
            size, worst = low[0]["size"], low[2]
            line = (f"# goal {who}: busbw >= {want:.1f}x at {label}: lowest {worst:.2f}x at {size} B "
                    f"-> {verdict(worst >= want)}")
        else:  # a quick sweep (-e below the band): said, so that no goal goes missing from the run's lines
            line = f"# goal {who}: busbw >= {want:.1f}x at {label}: no size measured there -> NOT met (not measured)"
        goals.append(Goal(line, want, lo, hi, low))
    return goals
