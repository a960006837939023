"""The side-by-side benchmarks' correctness checks, one call per size beside the timed ones: the lab's AllReduce
bitwise against ``collectives.perf.reference`` (NCCL's summation order, the config from ``comm.reference_config``,
as ``collectives.perf.runner.Runner.check_one`` does), a peer's (Gloo's) only for closeness, its order being its own.
The benchmarks run as scripts, so ``import checks`` finds this file beside them."""
from __future__ import annotations

import numpy as np

from collectives.perf import reference
from collectives.perf.runner import _poison, _Rolled, count_wrong, random_input

CHECK_MAX = 16 << 20  # above this the reference (every rank's input in each process) costs more than the sweep
STRIDE = 7919         # rank q's input is the shared random vector rotated by q * STRIDE, as the runner's


def inputs_for(size: int, nranks: int, seed: int) -> list:
    """Every rank's fresh float32 input of ``size`` bytes (at least one element), cheap to slice."""
    base = random_input(np.random.default_rng(seed), max(1, size // 4), np.float32)
    return [_Rolled(base, q * STRIDE) for q in range(nranks)]


def lab_wrong(comm, world, size: int, seed: int) -> int:
    """Elements, over all ranks, where one AllReduce sum of ``comm`` (fresh inputs, poisoned output) differs in
    its bytes from the NCCL-order reference; 0 is right."""
    inputs = inputs_for(size, comm.nranks, seed)
    x = np.asarray(inputs[comm.rank]).copy()  # _Rolled may hand back a view of the shared vector
    out = np.empty_like(x)
    _poison(out)
    comm.all_reduce(x, out=out)
    want = reference.all_reduce(inputs, "sum", **comm.reference_config("AllReduce", x.size, x.dtype))
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
