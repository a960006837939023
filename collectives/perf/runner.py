"""The nccl-tests runner (nccl-tests ``src/common.cu``: ``BenchTime``, its timing loop and its check; bandwidths from
``src/*.cu``: ``*GetBw``), shared by ``python -m collectives.ring`` & co.

Per size: out-of-place then in-place; ``-w`` warm-up calls, ``-n`` timed calls, time averaged over ranks (``-a 1``).
With ``-c 1`` each placement is then run once more on fresh random inputs with the output poisoned, and every
element is compared bitwise with ``collectives.perf.reference`` (NCCL's summation order): ``#wrong`` counts the
mismatches over all ranks.  ``--json FILE`` writes the same rows as records.  The table is ``table.py``'s.
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from collectives.device.reduce_copy import DTYPES, parse_dtype, parse_op

from . import table
from .args import sizes
from .colls import RUNS


class _Rolled:
    """Rank q's check input: a shared random vector rotated by q*stride; slices are cheap and lazy."""

    def __init__(self, base: np.ndarray, shift: int):
        self.base, self.shift = base, shift % max(1, base.size)

    def __getitem__(self, sl: slice) -> np.ndarray:
        start, stop, _ = sl.indices(self.base.size)
        length = max(0, stop - start)
        a = (start + self.shift) % max(1, self.base.size)
        if a + length <= self.base.size:
            return self.base[a:a + length]
        return np.concatenate([self.base[a:], self.base[:a + length - self.base.size]])

    def __array__(self, dtype=None, copy=None):
        return self[0:self.base.size]


def random_input(rng: np.random.Generator, count: int, dtype, scale: float = 1.0) -> np.ndarray:
    """Fresh inputs: integers over the type's whole range, floats uniform in [-scale, scale]."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=count, dtype=dtype, endpoint=True)
    return rng.uniform(-scale, scale, count).astype(dtype)


def count_wrong(got, want) -> int:
    """Elements whose bytes differ (a NaN is right only with the very bits NCCL's order gives)."""
    w = np.dtype(got.dtype).itemsize
    return int(np.count_nonzero((np.ascontiguousarray(got).view(np.uint8).reshape(-1, w)
                                 != np.ascontiguousarray(want).view(np.uint8).reshape(-1, w)).any(axis=1)))


def _poison(buf: np.ndarray) -> None:
    buf.view(np.uint8)[...] = 0xFF  # NaN for floats, -1 / max for integers


class Runner:
    """nccl-tests' sweep on one communicator: a ``Communicator``, or the threads mode's (``threads.ThreadsComm``),
    which answers the same few calls (``plan``, ``reference_config``, ``barrier``, ``bootstrap``)."""

    def __init__(self, comm, args):
        self.comm, self.args = comm, args
        self.coll = RUNS[args.coll]
        self.func = self.coll.name
        self.dtype_name = parse_dtype(args.datatype)
        self.dtype = DTYPES[self.dtype_name]
        self.op = parse_op(args.op)
        self.records: list[dict] = []

    def counts(self, size: int) -> tuple[int, int, int]:
        """(param count, send count, recv count) as nccl-tests' ``*GetCollByteCount``."""
        return self.coll.counts(size, self.dtype.itemsize, self.comm.nranks)

    def _call(self, send, out):
        return self.coll.call(self.comm, send, out, self.op, self.args.root)

    def _buffers(self, size: int, in_place: bool):
        param, nsend, nrecv = self.counts(size)
        out = np.zeros(max(nsend, nrecv), self.dtype)
        if not in_place:
            return np.zeros(nsend, self.dtype), out[:nrecv]
        # nccl-tests' layout: AllGather sends from this rank's block of the result, ReduceScatter receives into
        # this rank's block of its input (at offset 0 on every rank, it overlapped without being in place)
        return self.coll.in_place(out, self.comm.rank, param)

    def time_one(self, size: int, in_place: bool) -> float | None:
        if in_place and not self.coll.in_place_runs:
            return None  # AlltoAll: NCCL has no in-place form, and ours refuses the call
        send, out = self._buffers(size, in_place)
        return self.timed(lambda: self._call(send, out))

    def timed(self, call) -> float:
        """nccl-tests' loop: ``-w`` warm-up calls, a barrier, ``-n`` timed calls; seconds per call, the mean over
        the ranks."""
        for _ in range(self.args.warmup_iters):
            call()
        self.comm.barrier()
        t0 = time.perf_counter()
        for _ in range(self.args.iters):
            call()
        dt = (time.perf_counter() - t0) / max(1, self.args.iters)
        return float(np.mean(self.comm.bootstrap.allgather_struct("<d", dt)))

    def check_one(self, size: int, in_place: bool, seed: int) -> int:
        """Run once on fresh inputs with a poisoned output; count elements that differ from the reference."""
        comm, n, r = self.comm, self.comm.nranks, self.comm.rank
        param, nsend, nrecv = self.counts(size)
        base = random_input(np.random.default_rng(seed), nsend, self.dtype)
        stride = 7919
        inputs = [_Rolled(base, q * stride) for q in range(n)]
        send, out = self._buffers(size, in_place)
        _poison(out)
        send[...] = np.asarray(inputs[r])
        before = out.copy()  # what a buffer the call must not touch keeps (nccl-tests: expected = recvbuff)
        result = self._call(send, out)
        kw = {} if self.coll.p2p else comm.reference_config(self.func, param, self.dtype)
        expect = self.coll.reference(inputs, r, self.op, self.args.root, **kw)
        if expect is None:  # a non-root rank: Reduce defines nothing there, Gather leaves the buffer as it was
            return count_wrong(out, before) if self.coll.p2p else 0
        return count_wrong(result, expect)

    def run(self, out=None) -> list[dict]:
        """The table goes to stdout, or to stderr when ``--json -`` takes stdout for the records."""
        comm, args, n = self.comm, self.args, self.comm.nranks
        out = out or (sys.stderr if args.json == "-" else sys.stdout)
        if comm.rank == 0:  # sends and receives have no cost-model plan: algo and proto "-"
            table.header(out, comm, args, self.func, () if self.coll.p2p else
                         (comm.plan(self.func, self.counts(s)[0], self.dtype) for s in sizes(args)))
        total_wrong, busbws = 0, []
        seed = comm.bootstrap.allgather_struct("<I", int.from_bytes(os.urandom(4), "little"))[0][0]  # rank 0's
        for size in sizes(args):
            param, nsend, nrecv = self.counts(size)
            nbytes = max(nsend, nrecv) * self.dtype.itemsize
            cells = []
            for in_place in (False, True):
                t = self.time_one(size, in_place)
                if t is None:  # a placement this runner does not run (--threads: in place)
                    cells.append(None)
                    continue
                wrong = None
                if args.check and (self.coll.in_place_checked or not in_place):  # else N/A, as nccl-tests
                    wrong = sum(w for (w,) in comm.bootstrap.allgather_struct("<q", self.check_one(size, in_place,
                                                                                                 seed + size)))
                    total_wrong += wrong
                algbw = (param * self.dtype.itemsize * (n if self.coll.per_rank else 1)
                         / 1e9 / t) if t > 0 else 0.0
                busbw = algbw * self.coll.bus_factor(n)
                busbws.append(busbw)
                cells.append((t * 1e6, algbw, busbw, wrong))
                plan = None if self.coll.p2p else comm.plan(self.func, param, self.dtype)
                self.records.append({
                    "size": nbytes, "count": param, "dtype": self.dtype_name, "op": self.op,
                    "coll": self.func, "algo": plan and plan.algo, "proto": plan and plan.proto, "nranks": n,
                    "nchannels": plan and plan.nchannels, "placement": "in-place" if in_place else "out-of-place",
                    "time_us": t * 1e6, "algbw": algbw, "busbw": busbw, "wrong": wrong})
            if comm.rank == 0:
                table.row(out, nbytes, param, self.dtype_name, self.op if self.coll.reduces else "none",
                          args.root if self.coll.rooted else -1, cells)
        if comm.rank == 0:
            table.footer(out, total_wrong, busbws)
            if args.json:
                text = json.dumps(self.records, indent=1)
                if args.json == "-":
                    print(text, file=sys.stdout, flush=True)
                else:
                    with open(args.json, "w") as f:
                        f.write(text + "\n")
        return self.records
