"""``--threads``: the runner's ranks as threads of one process on one GPU device (nccl-tests' ``-g N`` in one
process, NCCL ``src/transport/p2p.cc``'s ``via P2P/direct pointer``), the way to run several ranks on one GPU.

``ThreadsRunner`` is ``perf.Runner`` over ``collectives/device/cuda/threads.py``'s ``ThreadComm``: the same sizes, the same
table and JSON, the same bitwise check against ``collectives.perf.reference`` (fresh inputs, outputs poisoned with 0xA5).
Each size is prepared once and timed by relaunching it, so the time is the kernels' (every rank's stream on
``cuda``; one launch of all ranks in the simulator).  The algorithm and protocol are the cost model's choice (or
``NCCL_ALGO``/``NCCL_PROTO``), planned by the process path's own ``enqueue.plan_coll`` and described to the
reference by its ``comm.reference_config``; ``schedule`` plans a call whose algorithm and protocol are given.
Deliberate difference: out-of-place only; the in-place columns read N/A (``ThreadComm`` owns its buffers).
"""
from __future__ import annotations

import os
import struct

import numpy as np

from collectives import enqueue
from collectives.comm import reference_config
from collectives.graph.cost_model import CostModel
from collectives.graph.presets import cpu_lab
from collectives.device.backend import gpu_protocols

from .runner import Runner, count_wrong, random_input


def tuning_of(tc) -> enqueue.Tuning:
    """The ranks of ``tc`` as the scheduler sees them: one node, its channels and buffer sizes."""
    return enqueue.default_tuning(tc.n, tc.nch, tc.buff)


def schedule(tc, func: str, inputs: list, proto: str = "Simple", algo: str = "Ring") -> enqueue.Plan:
    """The plan of ``func`` over each rank's ``inputs`` on ``tc`` with the given protocol and algorithm (NCCL's
    count: ReduceScatter's is the per-rank output)."""
    count = int(np.prod(inputs[0].shape))
    count = count // tc.n if func == "ReduceScatter" else count
    return enqueue.schedule_coll(tuning_of(tc), func, count, np.dtype(inputs[0].dtype).itemsize, algo, proto)


def config_of(tc, plan: enqueue.Plan) -> dict:
    """What ``collectives.perf.reference`` needs to reproduce ``plan`` on ``tc``."""
    return reference_config(plan, tc.rings, tc.trees, tc.buff)


class _Bootstrap:
    """One process holds every rank: an allgather is this process's value alone (``Bootstrap``'s typed calls)."""

    @staticmethod
    def allgather_struct(fmt: str, *values) -> list[tuple]:
        return [struct.unpack(fmt, struct.pack(fmt, *values))]

    @staticmethod
    def allgather_array(arr: np.ndarray) -> list[np.ndarray]:
        return [np.array(arr)]

    @staticmethod
    def allgather(mine: bytes, max_size: int) -> list[bytes]:
        if len(mine) > max_size:
            raise ValueError(f"allgather of {len(mine)} bytes, more than its max_size {max_size}")
        return [bytes(mine)]


class ThreadsComm:
    """What ``perf.Runner`` asks of a communicator, answered for the ranks of one ``ThreadComm``."""
    in_one_process = True

    def __init__(self, tc):
        self.tc, self.rank, self.nranks, self.nnodes, self.nchannels = tc, 0, tc.n, 1, tc.nch
        self.bootstrap, self.node_of_rank, self.device = _Bootstrap(), [0] * tc.n, tc.dev
        self.peer_info = [{"rank": r, "pid": os.getpid(), "host": os.uname().nodename} for r in range(tc.n)]
        proto = gpu_protocols(tc.dev.name, os.environ.get("NCCL_PROTO", ""))
        self.cost_model = CostModel(cpu_lab(tc.n, 1, 1, tc.nch), proto, os.environ.get("NCCL_ALGO", ""))

    def barrier(self) -> None:
        pass

    def reference_config(self, func: str, count: int, dtype) -> dict:
        return config_of(self.tc, self.plan(func, count, dtype))

    def plan(self, func: str, count: int, dtype) -> enqueue.Plan:
        return enqueue.plan_coll(tuning_of(self.tc), self.cost_model.choose, func, count, np.dtype(dtype).itemsize)


class ThreadsRunner(Runner):
    def _inputs(self, size: int, seed: int | None) -> tuple[int, list]:
        param, nsend, _ = self.counts(size)
        n = self.comm.nranks
        if seed is None:
            return param, [np.ones(nsend, self.dtype) for _ in range(n)]
        return param, [random_input(np.random.default_rng([seed, q]), nsend, self.dtype) for q in range(n)]

    def _prepare(self, param: int, xs: list):
        plan = self.comm.plan(self.func, param, self.dtype)
        return plan, self.comm.tc.prepare(self.func, xs, plan, self.op, self.args.root)

    def time_one(self, size: int, in_place: bool) -> float | None:
        if in_place:
            return None
        param, xs = self._inputs(size, None)
        _, launch = self._prepare(param, xs)
        return self.timed(launch)

    def check_one(self, size: int, in_place: bool, seed: int) -> int | None:
        if in_place:
            return None
        param, xs = self._inputs(size, seed)
        _, launch = self._prepare(param, xs)
        launch()
        outs, kw = launch.outputs(), self.comm.reference_config(self.func, param, self.dtype)
        wants = [self.coll.reference(xs, r, self.op, self.args.root, **kw) for r in range(self.comm.nranks)]
        return sum(count_wrong(got, want) for got, want in zip(outs, wants) if want is not None)


def run_threads(args, nranks: int) -> int:
    """The sweep with ``nranks`` ranks as threads of this process on ``args.device``; 1 if any element was wrong."""
    from collectives.device.backend import get_device
    dev = get_device(args.device)  # before numba.cuda is imported: the simulator is decided there
    from collectives.device.cuda.threads import ThreadComm
    nch = int(os.environ.get("NCCL_MAX_NCHANNELS", "0") or 0) or (1 if dev.name == "cudasim" else 16)
    tc = ThreadComm(nranks, nch, dev)
    runner = ThreadsRunner(ThreadsComm(tc), args)
    records = runner.run()
    return 1 if any(r["wrong"] for r in records) else 0
