"""The runner's command line: nccl-tests' flags (``src/common.cu``: ``-b -e -i -f -n -w -c -d -o -r``, sizes in its
syntax), ours (``--coll``, ``--json``, ``--topo``, ``--device``, ``--threads``, ``-g``, ``--nodes``), the sizes of a
sweep, and every check that can be made before any rank starts (one line saying what is wrong and what would be
valid, never a traceback from every rank).
"""
from __future__ import annotations

import argparse
import os
import sys

from collectives.device.backend import DEVICES, DeviceError, gpu_protocols
from collectives.device.reduce_copy import parse_dtype, parse_op
from collectives.graph.cost_model import CostModel
from collectives.graph.presets import cpu_lab
from collectives.job import job_size, memory_available
from collectives.misc.param import check_env
from collectives.include.protocols import buffer_sizes

from .colls import RUNS


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


def add_arguments(p: argparse.ArgumentParser, coll: str = "allreduce") -> None:
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
    p.add_argument("-r", "--root", type=int, default=0, help="root rank of broadcast, reduce, gather and scatter")
    p.add_argument("--coll", choices=sorted(RUNS), default=coll, help="the collective to run")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON records ('-': to stdout, and the "
                                                  "table to stderr)")
    p.add_argument("--topo", metavar="XML", help="each node's topology (NCCL_TOPO_FILE): every rank searches its "
                   "node as NCCL does, with --nodes K too (python -m collectives.tools.topology XML --nodes K)")
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


def check_gpu_args(device: str, threads: bool, nodes: int, under_mpirun: bool) -> str | None:
    """What a runner can refuse before any rank starts, one line or None (``NCCL_PROTO``: ``gpu_protocols``)."""
    if device == "cpu":
        return "--threads runs the GPU kernels: add --device cuda or --device cudasim" if threads else None
    if nodes > 1:
        return f"--nodes {nodes}: the GPU kernels (--device {device}) connect one node's ranks (P2P), not NET"
    if threads and under_mpirun:
        return "--threads starts every rank in this process: run it without mpirun"
    if device == "cuda":
        import importlib.util
        missing = [m for m in ("cupy", "numba") if importlib.util.find_spec(m) is None]
        if missing:
            return f"--device cuda needs {' and '.join(missing)} (pip install -e .[gpu])"
    return None


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in every flag's help, and the entry point's docstring as written."""


def build_parser(module: str, coll: str = "allreduce") -> argparse.ArgumentParser:
    doc = getattr(sys.modules.get("__main__"), "__doc__", None) or sys.modules[__package__].__doc__
    # the entry point's own docstring (else the runner's)
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.strip(),
                                formatter_class=_Formatter)
    add_arguments(p, coll)
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
        if nranks > 1 and not RUNS[args.coll].p2p:  # a setting that leaves this collective nothing to run fails
            model.choose(RUNS[args.coll].name, max(1, args.maxbytes))  # here, not on every rank
    except (ValueError, DeviceError) as exc:  # DeviceError: a device this machine lacks
        return str(exc)
    if RUNS[args.coll].p2p and (args.device != "cpu" or args.threads):
        return f"--coll {args.coll}: sends and receives run only on the CPU device, in one process per rank"
    if RUNS[args.coll].rooted and not 0 <= args.root < nranks:
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
