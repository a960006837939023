"""The nccl-tests runner (nccl-tests ``src/common.cu``: ``BenchTime``, ``writeResultHeader``,
``writeBenchmarkLine*``; bandwidths from ``src/*.cu``: ``*GetBw``), shared by ``python -m collectives.ring`` & co.

Per size: out-of-place then in-place; ``-w`` warm-up calls, ``-n`` timed calls, time averaged over ranks (``-a 1``).
With ``-c 1`` each placement is then run once more on fresh random inputs with the output poisoned, and every
element is compared bitwise with ``collectives.reference`` (NCCL's summation order): ``#wrong`` counts the
mismatches over all ranks.  ``--json FILE`` writes the same rows as records.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Sequence

import numpy as np

from collectives.misc.param import check_env

from .colls import BY_CLI
from .comm import Communicator
from .device.reduce_copy import DTYPES, parse_dtype, parse_op
from .device.backend import DEVICES, DeviceError
from .gpu_rank import check_gpu_args, gpu_protocols
from .graph.cost_model import CostModel
from .graph.presets import cpu_lab
from .job import emulated_node, job_size, launched, memory_available, spawn
from .peers import buffer_sizes

NCCL_TESTS_TYPE = {"int8": "int8", "uint8": "uint8", "int32": "int32", "uint32": "uint32", "int64": "int64",
                   "uint64": "uint64", "float16": "half", "float32": "float", "float64": "double",
                   "bfloat16": "bfloat16"}


def parse_size(text: str) -> int:
    """nccl-tests' size syntax: 8, 1K, 64M, 1G (powers of 1024)."""
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (8, 1K, 64M, 1G)") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-b", "--minbytes", type=_size_arg, default=parse_size("32M"),
                   help="smallest message, nccl-tests' syntax (8, 1K, 64M, 1G)")
    p.add_argument("-e", "--maxbytes", type=_size_arg, default=parse_size("32M"), help="largest message")
    p.add_argument("-i", "--stepbytes", type=_size_arg, default=parse_size("1M"), help="size step when -f is 1")
    p.add_argument("-f", "--stepfactor", type=int, default=1, help="multiply the size by this each row (1: add -i)")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per size and placement")
    p.add_argument("-w", "--warmup_iters", type=int, default=1, help="untimed iterations before them")
    p.add_argument("-c", "--check", type=int, default=1,
                   help="1: run each size once more on fresh inputs and compare bitwise with the reference; 0: no")
    p.add_argument("-d", "--datatype", default="float",
                   help="int8 uint8 int32 uint32 int64 uint64 half/float16 bfloat16 float/float32 double/float64")
    p.add_argument("-o", "--op", default="sum", help="sum, prod, min, max or avg")
    p.add_argument("-r", "--root", type=int, default=0, help="root rank of broadcast and reduce")
    p.add_argument("--coll", choices=sorted(BY_CLI), default="allreduce", help="the collective to run")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON records ('-': to stdout, and the "
                                                  "table to stderr)")
    p.add_argument("--topo", metavar="XML", help="one node's topology: run with the rings, tree chains, tree "
                   "pattern and channel count NCCL's search finds on it (python -m collectives.tools.topology)")
    p.add_argument("--sm", type=int, help="with --topo: compute capability of GPUs the file leaves bare")
    p.add_argument("--nvlinks", type=int, help="with --topo: NVLinks per GPU when the file has none")
    p.add_argument("--device", choices=DEVICES, default=os.environ.get("NCCLLAB_DEVICE", "").strip().lower() or "cpu",
                   help="where the ranks' buffers and kernels live: cpu (numpy over shared memory), cuda (cupy "
                        "memory, numba-cuda kernels) or cudasim (numba's CUDA simulator); NCCLLAB_DEVICE")
    p.add_argument("-t", "--threads", action="store_true",
                   help="run the -g ranks as threads of this process (GPU devices: several ranks on one GPU, "
                        "connected by P2P/direct pointer, as nccl-tests' -g N in one process)")


def sizes(args) -> list[int]:
    out, s = [], args.minbytes
    while s <= args.maxbytes:
        out.append(s)
        s = s * args.stepfactor if args.stepfactor > 1 else s + args.stepbytes
        if args.stepfactor <= 1 and args.stepbytes <= 0:
            break
    return out


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


def float_str(value: float, width: int) -> str:
    """nccl-tests' ``getFloatStr``: 2 decimals, then fewer, then an exponent, to fit ``width``."""
    for prec in (2, 1, 0):
        s = f"{value:.{prec}f}"
        if len(s) <= width:
            return s.rjust(width)
    return f"{value:.0e}".rjust(width)


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
    def __init__(self, comm: Communicator, args):
        self.comm, self.args = comm, args
        self.coll = BY_CLI[args.coll]
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

    def time_one(self, size: int, in_place: bool) -> float:
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
        result = self._call(send, out)
        kw = comm.reference_config(self.func, param, self.dtype)
        expect = self.coll.reference(inputs, r, self.op, self.args.root, **kw)
        if expect is None:
            return 0
        return count_wrong(result, expect)

    def run(self, out=None) -> list[dict]:
        """The table goes to stdout, or to stderr when ``--json -`` takes stdout for the records."""
        comm, args, n = self.comm, self.args, self.comm.nranks
        out = out or (sys.stderr if args.json == "-" else sys.stdout)
        if comm.rank == 0:
            self._header(out)
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
                if args.check:
                    wrong = sum(w for (w,) in comm.bootstrap.allgather_struct("<q", self.check_one(size, in_place,
                                                                                                 seed + size)))
                    total_wrong += wrong
                algbw = (param * self.dtype.itemsize * (n if self.coll.per_rank else 1)
                         / 1e9 / t) if t > 0 else 0.0
                busbw = algbw * self.coll.bus_factor(n)
                busbws.append(busbw)
                cells.append((t * 1e6, algbw, busbw, wrong))
                plan = comm.plan(self.func, param, self.dtype)
                self.records.append({
                    "size": nbytes, "count": param, "dtype": self.dtype_name, "op": self.op,
                    "coll": self.func, "algo": plan.algo, "proto": plan.proto, "nranks": n,
                    "nchannels": plan.nchannels, "placement": "in-place" if in_place else "out-of-place",
                    "time_us": t * 1e6, "algbw": algbw, "busbw": busbw, "wrong": wrong})
            if comm.rank == 0:
                self._row(out, nbytes, param, cells)
        if comm.rank == 0:
            print(f"# Out of bounds values : {total_wrong} {'OK' if total_wrong == 0 else 'FAILED'}", file=out)
            avg = sum(busbws) / len(busbws) if busbws else 0.0
            print(f"# Avg bus bandwidth    : {avg:g} ", file=out)
            print("#", file=out, flush=True)
            if args.json:
                text = json.dumps(self.records, indent=1)
                if args.json == "-":
                    print(text, file=sys.stdout, flush=True)
                else:
                    with open(args.json, "w") as f:
                        f.write(text + "\n")
        return self.records

    def _header(self, out) -> None:
        comm, a = self.comm, self.args
        # ranks this command started (nccl-tests' -g); all of them in this process with --threads
        ngpus = comm.nranks if getattr(comm, "in_one_process", False) else int(os.environ.get("NCCLLAB_NRANKS", "1"))
        print(f"# nccl-lab {self.func} test (nccl-tests format): nThread 1 nGpus {ngpus} minBytes {a.minbytes} "
              f"maxBytes {a.maxbytes} step: {a.stepfactor}({'factor' if a.stepfactor > 1 else 'bytes'}) "
              f"warmup iters: {a.warmup_iters} iters: {a.iters} validation: {a.check}", file=out)
        print("#", file=out)
        sizes_ = sizes(self.args)
        plans = [comm.plan(self.func, self.counts(s)[0], self.dtype) for s in sizes_]
        algos = sorted({p.algo for p in plans} or {"-"}, reverse=True)
        protos = sorted({p.proto for p in plans} or {"-"})
        print(f"# Using devices  (nranks {comm.nranks}, nnodes {comm.nnodes}, nchannels {comm.nchannels}, algo "
              f"{'/'.join(algos)}, proto {'/'.join(protos)}: NCCL's cost model per size, see --json)", file=out)
        node = comm.node_of_rank
        for info in comm.peer_info:  # the device is the rank's index on its node, as the log's r[dev]
            r = info["rank"]
            dev = [q for q in range(comm.nranks) if node[q] == node[r]].index(r)
            print(f"#  Rank {r:2d} Group  0 Pid {info['pid']:6d} on {info['host']:>10} device {dev:2d} "
                  f"[{comm.device.name}] "
                  f"node {node[r]}", file=out)
        print("#", file=out)
        print(f"# {'':>60}out-of-place                       in-place          ", file=out)
        print(f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}  {'time':>7}  {'algbw':>6}  "
              f"{'busbw':>6}  {'#wrong':>6}  {'time':>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6}", file=out)
        print(f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}  {'(us)':>7}  {'(GB/s)':>6}  "
              f"{'(GB/s)':>6}  {'':>6}  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6}", file=out, flush=True)

    def _row(self, out, nbytes: int, count: int, cells) -> None:
        root = self.args.root if self.coll.rooted else -1
        op = self.op if self.coll.reduces else "none"
        line = f"{nbytes:12d}  {count:12d}  {NCCL_TESTS_TYPE[self.dtype_name]:>8}  {op:>6}  {root:6d}"
        for cell in cells:
            if cell is None:
                line += f"  {'N/A':>7}  {'N/A':>6}  {'N/A':>6}  {'N/A':>6}"
                continue
            t, algbw, busbw, wrong = cell
            line += f"  {float_str(t, 7)}  {float_str(algbw, 6)}  {float_str(busbw, 6)}  "
            line += f"{'N/A' if wrong is None else wrong:>6}"
        print(line, file=out, flush=True)


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in every flag's help, and the entry point's docstring as written."""


def build_parser(module: str) -> argparse.ArgumentParser:
    doc = getattr(sys.modules.get("__main__"), "__doc__", None) or __doc__  # the entry point's own docstring
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.strip(),
                                formatter_class=_Formatter)
    add_arguments(p)
    p.add_argument("-g", "--ngpus", "--nranks", "-np", dest="nranks", type=int, default=None,
                   help="ranks to start when not under mpirun (nccl-tests' -g: GPUs driven by this command); "
                        "under mpirun it must equal mpirun's -n [default: 8, or mpirun's -n]")
    p.add_argument("--nodes", type=int, default=1,
                   help="emulated nodes: the ranks are split into this many contiguous blocks, each with its own "
                        "NCCL_HOSTID, so they talk over NET between nodes (also under mpirun)")
    if module.endswith(".tree"):
        p.add_argument("--from-log", metavar="LOG", help="instead of running: rebuild the trees of a real NCCL INFO "
                                                         "log with our construction and diff them (no ranks start)")
    return p


def check_args(args, nranks: int) -> str | None:
    """What can be checked before any rank starts: one line saying what is wrong and what would be valid."""
    if nranks < 1:
        return f"-g {nranks}: the number of ranks must be at least 1"
    problem = check_env()  # NCCLLAB_TIMEOUT=0 and the like: one line here, not a traceback from every rank
    if problem:
        return problem
    try:
        buffer_sizes()  # NCCL_BUFFSIZE=1 and the like, as every rank's communicator would read them
    except ValueError as exc:
        return str(exc)
    if not 1 <= args.nodes <= nranks:
        return f"--nodes {args.nodes}: must be between 1 and the number of ranks ({nranks})"
    problem = check_gpu_args(args.device, args.threads, args.nodes, job_size() is not None)
    if problem:
        return problem
    if args.minbytes < 0 or args.maxbytes < 0:
        return "-b and -e must not be negative"
    if args.minbytes > args.maxbytes:
        return f"-b {args.minbytes} is larger than -e {args.maxbytes}: nothing to run"
    if args.iters < 1:
        return f"-n {args.iters}: the number of timed iterations must be at least 1"
    if args.warmup_iters < 0:
        return f"-w {args.warmup_iters}: warm-up iterations must not be negative"
    if args.stepfactor < 1 and args.stepbytes <= 0:
        return "-f below 2 needs a positive -i step"
    try:
        parse_dtype(args.datatype)
        parse_op(args.op)
        proto = os.environ.get("NCCL_PROTO", "")
        if args.device != "cpu":
            proto = gpu_protocols(args.device, proto)
        model = CostModel(cpu_lab(nranks, args.nodes), proto,
                          os.environ.get("NCCL_ALGO", ""))
        if nranks > 1:  # a setting that leaves this collective nothing to run fails here, not on every rank
            model.choose(BY_CLI[args.coll].name, max(1, args.maxbytes))
    except (ValueError, DeviceError) as exc:  # DeviceError: a device this machine lacks
        return str(exc)
    if args.coll in ("broadcast", "reduce") and not 0 <= args.root < nranks:
        return f"-r {args.root}: the root must be a rank, 0 to {nranks - 1}"
    if args.json and args.json != "-":
        folder = os.path.dirname(os.path.abspath(args.json))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            return f"--json {args.json}: cannot write there ({folder} is not a writable folder)"
    # per rank: send, receive and check buffers, and the reference's inputs and sums: about 6 x the largest message
    need, have = 6 * args.maxbytes * nranks, memory_available()
    if have and need > have:
        return (f"-e {args.maxbytes} needs about {need / 2**30:.1f} GiB for {nranks} ranks on this machine, "
                f"{have / 2**30:.1f} GiB are available: lower -e")
    return None


def main(module: str, argv: Sequence[str] | None = None) -> int:
    """Entry point shared by ``collectives.ring`` & co.: check the arguments, spawn ranks when not launched (or
    take mpirun's), then run the sweep."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(module).parse_args(argv)
    if args.topo:  # the searched rings, chains and pattern go to every rank through the environment
        from .graph.topo_feed import apply_topology
        try:
            apply_topology(args, argv, None if launched() else lambda line: print(line, file=sys.stderr))
        except ValueError as e:   # TopoError is a ValueError
            return _usage(module, str(e))
    size = job_size()
    if size is not None and args.nranks is not None and args.nranks != size:
        return _usage(module, f"-g {args.nranks} but this job has {size} ranks (mpirun -n {size}): drop -g or "
                              f"make them equal")
    nranks = size or (8 if args.nranks is None else args.nranks)
    problem = check_args(args, nranks)
    if problem:
        return _usage(module, problem)
    os.environ["NCCLLAB_DEVICE"] = args.device  # the ranks' communicators (and their children) take it
    if args.threads:
        from .perf_threads import run_threads  # noqa: PLC0415 (it builds on Runner, below)
        return run_threads(args, nranks)
    if not launched():
        return spawn(nranks, ["-m", module, *argv], nodes=args.nodes)
    emulated_node(args.nodes)
    with Communicator() as comm:
        runner = Runner(comm, args)
        records = runner.run()
    wrong = sum(r["wrong"] or 0 for r in records)
    return 1 if wrong else 0


def _usage(module: str, problem: str) -> int:
    """One line, from one process (under mpirun only rank 0 speaks; the others agree silently)."""
    if os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")) == "0":
        print(f"python -m {module}: {problem}", file=sys.stderr)
    return 2
