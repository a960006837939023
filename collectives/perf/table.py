"""nccl-tests' table (``src/common.cu``: ``writeResultHeader``, ``writeBenchmarkLinePreamble``,
``writeBenchmarkLineBody``, the ``Out of bounds values`` and ``Avg bus bandwidth`` footer; ``getFloatStr``), as
``all_reduce_perf`` & co. print it, plus our ``Using devices`` line naming the cost model's choices."""
from __future__ import annotations

import os
from typing import Iterable

NCCL_TESTS_TYPE = {"int8": "int8", "uint8": "uint8", "int32": "int32", "uint32": "uint32", "int64": "int64",
                   "uint64": "uint64", "float16": "half", "float32": "float", "float64": "double",
                   "bfloat16": "bfloat16"}


def float_str(value: float, width: int) -> str:
    """nccl-tests' ``getFloatStr``: 2 decimals, then fewer, then an exponent, to fit ``width``."""
    for prec in (2, 1, 0):
        s = f"{value:.{prec}f}"
        if len(s) <= width:
            return s.rjust(width)
    return f"{value:.0e}".rjust(width)


def header(out, comm, a, func: str, plans: Iterable) -> None:
    """The parameters, the devices (each rank's pid, host, device index on its node and node) and the column
    titles.  ``plans``: each size's plan, taken once the first lines are written (a plan may log)."""
    # ranks this command started (nccl-tests' -g); all of them in this process with --threads
    ngpus = comm.nranks if getattr(comm, "in_one_process", False) else int(os.environ.get("NCCLLAB_NRANKS", "1"))
    print(f"# nccl-lab {func} test (nccl-tests format): nThread 1 nGpus {ngpus} minBytes {a.minbytes} "
          f"maxBytes {a.maxbytes} step: {a.stepfactor}({'factor' if a.stepfactor > 1 else 'bytes'}) "
          f"warmup iters: {a.warmup_iters} iters: {a.iters} validation: {a.check}", file=out)
    print("#", file=out)
    plans = list(plans)
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


def row(out, nbytes: int, count: int, dtype_name: str, op: str, root: int, cells) -> None:
    """One size: its preamble, then per placement (time, algbw, busbw, #wrong) or N/A (``cells``: tuples or None;
    a None #wrong is N/A too)."""
    line = f"{nbytes:12d}  {count:12d}  {NCCL_TESTS_TYPE[dtype_name]:>8}  {op:>6}  {root:6d}"
    for cell in cells:
        if cell is None:
            line += f"  {'N/A':>7}  {'N/A':>6}  {'N/A':>6}  {'N/A':>6}"
            continue
        t, algbw, busbw, wrong = cell
        line += f"  {float_str(t, 7)}  {float_str(algbw, 6)}  {float_str(busbw, 6)}  "
        line += f"{'N/A' if wrong is None else wrong:>6}"
    print(line, file=out, flush=True)


def footer(out, total_wrong: int, busbws: list) -> None:
    print(f"# Out of bounds values : {total_wrong} {'OK' if total_wrong == 0 else 'FAILED'}", file=out)
    avg = sum(busbws) / len(busbws) if busbws else 0.0
    print(f"# Avg bus bandwidth    : {avg:g} ", file=out)
    print("#", file=out, flush=True)
