"""NCCL-order reference model: what NCCL 2.30's ring collectives return, bit for bit, in plain numpy.

It takes every rank's input, the ring of each channel, the channel count and the protocol, and rebuilds from
NCCL's ``src/enqueue.cc``, ``src/graph/tuning.cc`` and ``src/device/all_reduce.h`` (written independently of ``enqueue.py`` and ``device/``, which it checks): the
thread count of ``ncclTopoTuneModel``, the channel shrinking of ``topoGetAlgoInfo``, the CBD split of
``scheduleCollTasksToPlan``, the chunk of ``calcCollChunking``, the last-loop chunk of ``runRing``, and the
summation order.  ``config_from_env`` derives channels, rings and a forced protocol from the environment alone, so
that a wrong choice in the communicator is caught rather than copied:

* Ring AllReduce chunk owned by ring position c: ``((x[c+1] + x[c+2]) + ... + x[c+n-1]) + x[c]``;
* Tree AllReduce (``runTreeSplit`` in ``src/device/all_reduce.h``), every element of channel c: ``S(root)`` of that channel's tree, where
  ``S(v) = ((x[v] + S(down0)) + S(down1)) + S(down2)``; the chunking does not change the order;
* ReduceScatter block of rank r and Reduce to root r: the same walk, starting after r and ending with r;
* Avg: floats pre-multiply each input by ``1/n`` in the element type; integers divide the sum, truncating;
* Min/Max of floats: a NaN operand is dropped, two NaNs give the canonical NaN (``fmaxf``, ``__hmax``).
"""
from __future__ import annotations

import os
from typing import Sequence

import ml_dtypes
import numpy as np

_STEP_BYTES = {"Simple": 1 << 22, "LL": 1 << 19, "LL128": 4915200}  # NCCL's default FIFO sizes (8 steps each)
_BUFF_VARS = {"Simple": "NCCL_BUFFSIZE", "LL": "NCCL_LL_BUFFSIZE", "LL128": "NCCL_LL128_BUFFSIZE"}
CPU_NODE_SIMPLE = 1 << 19  # the lab's Simple FIFO when every CPU rank is on one node (docs/protocols.md)
CPU_NET_SIMPLE = 1 << 25   # and when CPU ranks span several nodes
_GRAIN = {"Simple": 512, "LL": 16, "LL128": 1920}


def _gpu_minmax(pick_larger: bool):
    """NCCL's float min/max (``fmaxf``/``fminf``, ``fmax``/``fmin``, ``__hmax``/``__hmin``): a NaN loses to a
    number; two NaNs give the type's canonical NaN (sign 0, every exponent and mantissa bit set); max(+0, -0) = +0
    and min(+0, -0) = -0 in either order.  Integers: a plain comparison."""
    def fn(a, b):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype.kind in "iu":
            return np.maximum(a, b) if pick_larger else np.minimum(a, b)
        wide_a, wide_b = a.astype(np.float64), b.astype(np.float64)
        a_nan, b_nan = np.isnan(wide_a), np.isnan(wide_b)
        better = wide_a >= wide_b if pick_larger else wide_a <= wide_b
        out = np.where(b_nan | (~a_nan & better), a, b).astype(a.dtype)
        zeros = (wide_a == 0) & (wide_b == 0)  # +0 against -0: by sign, in either order (max +0, min -0)
        if zeros.any():
            out[zeros] = (a[zeros] + b[zeros]) if pick_larger else -(-a[zeros] - b[zeros])
        both = a_nan & b_nan
        if both.any():
            ubits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
            out.view(ubits)[both] = ubits((1 << (8 * a.dtype.itemsize - 1)) - 1)
        return out
    return fn


_FN = {"sum": np.add, "prod": np.multiply, "max": _gpu_minmax(True), "min": _gpu_minmax(False), "avg": np.add}


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


# What the lab's CPU "topology search" finds: one ring channel of 6 GB/s (stated in the README); NCCL's PCI_BW.
CPU_RING_BW, PCI_BW = 6.0, 12.0


def _threads_from_env(name: str, lo: int, hi: int, default: int) -> int:
    """NCCL's rule for NCCL_NTHREADS / NCCL_LL128_NTHREADS: unset or <= 0 gives the default, a value that is not a
    multiple of a warp (32) gives the maximum, then clamp into [lo, hi]."""
    raw = os.environ.get(name, "").strip()
    value = int(raw, 8 if raw.startswith("0") and raw[1:].isdigit() else 0) if raw else -2
    if value <= 0:
        return default
    if value % 32:
        return hi
    return min(hi, max(lo, value))


def ring_simple_threads(search_channels: int, ring_bw: float = CPU_RING_BW) -> int:
    """Ring/Simple's thread count: 256 when the ring (bandwidth x search channels) is no faster than PCI_BW, else
    512, unless NCCL_NTHREADS says otherwise."""
    slow = float(np.float32(ring_bw) * np.float32(search_channels)) <= PCI_BW
    return _threads_from_env("NCCL_NTHREADS", 64, 512, 256 if slow else 512)


def _threads(proto: str, algo: str, search_channels: int | None) -> int:
    if proto == "LL128":
        return _threads_from_env("NCCL_LL128_NTHREADS", 160, 640, 640)
    if proto == "Simple" and algo == "Ring" and search_channels is not None:
        return ring_simple_threads(search_channels)
    return _threads_from_env("NCCL_NTHREADS", 64, 512, 512)


def config_from_env(nranks: int, search_channels: int = 1, rings: list[list[int]] | None = None,
                    hosts: list | None = None) -> dict:
    """What a test can know without asking the communicator: the channel count (search channels, doubled, then
    NCCL_MAX_NCHANNELS clamps to 1..64 and NCCL_MIN_NCHANNELS copies), the ring of each channel (given, or
    each host's ranks in order, host after host, ``hosts`` being every rank's NCCL_HOSTID), and
    the protocol or algorithm when NCCL_PROTO / NCCL_ALGO name exactly one (else the cost model chooses), and each
    protocol's FIFO size (its variable, else NCCL's default, but Simple's is the lab's CPU default:
    ``CPU_NODE_SIMPLE`` when every rank is on one node, ``CPU_NET_SIMPLE`` when they span several)."""
    def env_count(*names, default):
        for name in names:
            raw = os.environ.get(name, "").strip()
            if raw and int(raw, 0) != -2:
                return int(raw, 0)
        return default
    doubled = 2 * search_channels if 2 * search_channels <= 64 else search_channels
    nch = min(doubled, max(1, min(64, env_count("NCCL_MAX_NCHANNELS", "NCCL_MAX_NRINGS", default=64))))
    nch = max(nch, min(64, env_count("NCCL_MIN_NCHANNELS", "NCCL_MIN_NRINGS", default=0)))
    if not rings:
        first_seen = {h: i for i, h in reversed(list(enumerate(hosts or [None] * nranks)))}
        rings = [sorted(range(nranks), key=lambda r: (first_seen[(hosts or [None] * nranks)[r]], r))]
    copies = [rings[c % len(rings)] for c in range(min(doubled, nch))]
    copies += [copies[c % len(copies)] for c in range(len(copies), nch)]
    single = lambda var, names: next((n for n in names if os.environ.get(var, "").lower() == n.lower()), None)  # noqa
    one_node = len(set(hosts or [None])) == 1
    sizes = {}
    for proto, var in _BUFF_VARS.items():
        raw = os.environ.get(var, "").strip()
        default = _STEP_BYTES[proto] if proto != "Simple" else CPU_NODE_SIMPLE if one_node else CPU_NET_SIMPLE
        sizes[proto] = int(raw, 0) if raw and int(raw, 0) != -2 else default
    return {"nchannels": nch, "rings": [list(r) for r in copies], "search_channels": search_channels,
            "buff_sizes": sizes,
            "proto": single("NCCL_PROTO", ("LL", "LL128", "Simple")), "algo": single("NCCL_ALGO", ("Ring", "Tree"))}


def channel_parts(func: str, count: int, elt: int, nranks: int, nchannels: int, proto: str = "Simple",
                  buffsize: int | None = None, algo: str = "Ring", nnodes: int = 1, threads: int | None = None,
                  search_channels: int | None = None, nccl_version: tuple = (2, 30),
                  max_channels: int = 0) -> list[tuple[int, int, int]]:
    """[(start, length, chunkCount)] per channel, in elements of size ``elt``.  ``threads``: the protocol's thread
    count, else derived (``search_channels`` given: NCCL's rule for this ring; not given: the maxima).
    ``max_channels``: a tuner plugin's nChannels, which ``ncclGetAlgoInfo`` puts in place of the shrunk count.
    ``nccl_version`` before 2.29: 2.28's split (``MinTrafficPerChannel`` 16 KiB, and the traffic per channel is
    ``max(16 KiB, traffic / nChannels)`` without the 16-byte rounding); the rest is checked equal in both."""
    if count == 0:
        return []
    per_byte = {"AllReduce": 2, "AllGather": nranks, "ReduceScatter": nranks}.get(func, 1)
    moved = count * elt * (nranks if func in ("AllGather", "ReduceScatter") else 1)
    nthreads = threads or _threads(proto, algo, search_channels)
    threshold = {"Simple": 64, "LL128": 8, "LL": 8 * nranks if algo == "Ring" else 8}[proto]
    usable = min(max_channels, nchannels) if max_channels else nchannels
    while not max_channels and usable > 1 and moved < usable * nthreads * threshold:
        usable -= 1
    if proto == "LL":
        per_byte *= 4
    if tuple(nccl_version) < (2, 29):
        budget = max(16384, max(16384, count * elt * per_byte) // usable)
        cell = _ceil(_ceil(16384, per_byte), 16) * 16
    else:
        budget = _ceil(max(32768, count * elt * per_byte) // usable, 16) * 16
        cell = _ceil(_ceil(32768, per_byte), 16) * 16
    per_cell = cell // elt
    ncells = _ceil(count * elt, cell)
    cells_each = min(ncells, _ceil(budget, cell * per_byte))
    first = ncells if nchannels == 1 else cells_each
    rest = ncells - first
    mids, last = divmod(rest, cells_each)
    if 1 + mids + (last > 0) > nchannels:
        mids = nchannels - 2
        cells_each = rest // (mids + 1)
        last = cells_each + rest % (mids + 1)
    if last == 0 and mids:
        last, mids = cells_each, mids - 1
    sizes = [first * per_cell] + [cells_each * per_cell] * mids + ([last * per_cell] if last else [])
    sizes[-1] -= ncells * per_cell - count
    raw = os.environ.get(_BUFF_VARS[proto], "").strip()
    step = (buffsize or (int(raw, 0) if raw else _STEP_BYTES[proto])) // 8
    if proto == "Simple":
        ring_func = algo == "Ring" and func in ("AllReduce", "AllGather", "ReduceScatter")
        chunk_bytes = step * (4 if ring_func else 1)
    else:
        chunk_bytes = step // 2 if proto == "LL" else step // 16 * 15
    out, start = [], 0
    for size in sizes:
        cb = chunk_bytes
        if algo == "Tree" and proto == "LL128":  # halve while the part is short of nsteps-worth of chunks
            ppn = np.float32(nranks) / np.float32(nnodes)
            nsteps = np.float32(1 + int(np.log2(nnodes)) + 0.1 * float(ppn))
            for floor_bytes, factor in ((131072, 64), (32768, 16)):
                while np.float32(size * elt // cb) < np.float32(nsteps * np.float32(factor)) / ppn and cb > floor_bytes:
                    cb //= 2
        out.append((start, size, cb // _GRAIN[proto] * (_GRAIN[proto] // elt)))
        start += size
    return out


def _positions(ring: Sequence[int]) -> list[int]:
    """Ranks by ring index (index 0 = rank 0, following the ring)."""
    i0 = list(ring).index(0)
    return [ring[(i0 + k) % len(ring)] for k in range(len(ring))]


def _premul(x: np.ndarray, op: str, n: int) -> np.ndarray:
    if op == "avg" and (x.dtype.kind == "f" or x.dtype == ml_dtypes.bfloat16):
        s = np.array(1.0 / n if x.dtype == np.float64 else np.float32(1.0 / n)).astype(x.dtype)
        return x * s
    return x


def _postdiv(x: np.ndarray, op: str, n: int) -> np.ndarray:
    """Integer Avg: sum // n, truncating toward zero."""
    if op != "avg" or x.dtype.kind not in "iu":
        return x
    if x.dtype.kind == "u":
        return x // x.dtype.type(n)
    if x.dtype.itemsize < 8:
        wide = x.astype(np.int64)
        return (np.sign(wide) * (np.abs(wide) // n)).astype(x.dtype)
    mag = np.array([abs(int(v)) // n for v in x.tolist()], dtype=object)  # exact for INT64_MIN too
    return np.array([-int(m) if v < 0 else int(m) for v, m in zip(x.tolist(), mag)], dtype=np.int64)


def _walk(inputs, ranks_in_order: list[int], sl: slice, op: str, n: int) -> np.ndarray:
    """Fold inputs along ``ranks_in_order``: the first rank starts, the last is added last; then post-op."""
    fn = _FN[op]
    acc = _premul(np.asarray(inputs[ranks_in_order[0]][sl]), op, n)
    for r in ranks_in_order[1:]:
        acc = fn(acc, _premul(np.asarray(inputs[r][sl]), op, n))
    return _postdiv(acc, op, n)


def _tree_sum(inputs, tree: dict, v: int, sl: slice, op: str, n: int) -> np.ndarray:
    """S(v): v's own input first, then each child's subtree sum in ``down[]`` order."""
    acc = _premul(np.asarray(inputs[v][sl]), op, n)
    for d in tree[v][1]:
        acc = _FN[op](acc, _tree_sum(inputs, tree, d, sl, op, n))
    return acc


def all_reduce(inputs: Sequence[np.ndarray], op: str = "sum", rings: list[list[int]] | None = None,
               nchannels: int = 1, proto: str = "Simple", buffsize: int | None = None, algo: str = "Ring",
               trees: list[dict] | None = None, search_channels: int | None = None,
               nccl_version: tuple = (2, 30), max_channels: int = 0) -> np.ndarray:
    """``trees`` (Tree only): per channel ``{rank: (up, [down...])}``; ``search_channels``, ``nccl_version``,
    ``max_channels``: see ``channel_parts``."""
    n = len(inputs)
    x0 = np.asarray(inputs[0])
    out = np.empty_like(x0)
    if n == 1:
        return _postdiv(_premul(x0.copy(), op, 1), op, 1)
    if algo == "Tree":
        for c, (start, length, _) in enumerate(channel_parts("AllReduce", x0.size, x0.itemsize, n, nchannels,
                                                            proto, buffsize, "Tree",
                                                            search_channels=search_channels,
                                                            nccl_version=nccl_version, max_channels=max_channels)):
            tree = {int(r): v for r, v in trees[c].items()}
            root = next(r for r, (up, _) in tree.items() if up == -1)
            sl = slice(start, start + length)
            out[sl] = _postdiv(_tree_sum(inputs, tree, root, sl, op, n), op, n)
        return out
    rings = rings or [list(range(n))]
    for c, (start, length, chunk) in enumerate(channel_parts("AllReduce", x0.size, x0.itemsize, n, nchannels,
                                                            proto, buffsize, search_channels=search_channels,
                                                            nccl_version=nccl_version, max_channels=max_channels)):
        pos = _positions(rings[c % len(rings)])
        loop = n * chunk
        for lo in range(0, length, loop):
            rem = length - lo
            cc = chunk if rem >= loop else _ceil(_ceil(rem, n), 16 // x0.itemsize) * (16 // x0.itemsize)
            for owner in range(n):
                a, b = owner * cc, min((owner + 1) * cc, rem)
                if a >= b:
                    continue
                order = [pos[(owner + k) % n] for k in range(1, n)] + [pos[owner]]
                sl = slice(start + lo + a, start + lo + b)
                out[sl] = _walk(inputs, order, sl, op, n)
    return out


def _along_ring_ending_at(ring: Sequence[int], last: int) -> list[int]:
    i = list(ring).index(last)
    n = len(ring)
    return [ring[(i + k) % n] for k in range(1, n)] + [last]


def reduce_scatter(inputs: Sequence[np.ndarray], rank: int, op: str = "sum",
                   rings: list[list[int]] | None = None, nchannels: int = 1, proto: str = "Simple",
                   buffsize: int | None = None, algo: str = "Ring", trees=None,
                   search_channels: int | None = None) -> np.ndarray:
    n = len(inputs)
    x0 = np.asarray(inputs[0])
    count = x0.size // n
    rings = rings or [list(range(n))]
    out = np.empty(count, x0.dtype)
    if n == 1:
        return _postdiv(_premul(x0[:count].copy(), op, 1), op, 1)
    for c, (start, length, _) in enumerate(channel_parts("ReduceScatter", count, x0.itemsize, n, nchannels,
                                                        proto, buffsize, search_channels=search_channels)):
        order = _along_ring_ending_at(rings[c % len(rings)], rank)
        sl = slice(rank * count + start, rank * count + start + length)
        out[start:start + length] = _walk(inputs, order, sl, op, n)
    return out


def reduce(inputs: Sequence[np.ndarray], root: int, op: str = "sum", rings: list[list[int]] | None = None,
           nchannels: int = 1, proto: str = "Simple", buffsize: int | None = None, algo: str = "Ring",
           trees=None, search_channels: int | None = None) -> np.ndarray:
    n = len(inputs)
    x0 = np.asarray(inputs[0])
    if n == 1:
        return _postdiv(_premul(x0.copy(), op, 1), op, 1)
    rings = rings or [list(range(n))]
    out = np.empty_like(x0)
    for c, (start, length, _) in enumerate(channel_parts("Reduce", x0.size, x0.itemsize, n, nchannels, proto,
                                                        buffsize, search_channels=search_channels)):
        sl = slice(start, start + length)
        out[sl] = _walk(inputs, _along_ring_ending_at(rings[c % len(rings)], root), sl, op, n)
    return out


def all_gather(inputs: Sequence[np.ndarray]) -> np.ndarray:
    """No arithmetic: block r of the output is rank r's input, whatever the rings and channels."""
    return np.concatenate([np.asarray(x) for x in inputs])


def broadcast(inputs: Sequence[np.ndarray], root: int) -> np.ndarray:
    return np.asarray(inputs[root]).copy()


# Point-to-point (nccl-tests ``src/sendrecv.cu``, ``alltoall.cu``, ``gather.cu``, ``scatter.cu``: their
# ``*InitData`` expectations): no arithmetic, only which rank's bytes land where.

def sendrecv(inputs: Sequence[np.ndarray], rank: int) -> np.ndarray:
    """Each rank sends to rank + 1 and receives from rank - 1: it holds rank - 1's input."""
    return np.asarray(inputs[(rank - 1) % len(inputs)]).copy()


def alltoall(inputs: Sequence[np.ndarray], rank: int) -> np.ndarray:
    """Block q of the output is block ``rank`` of rank q's input."""
    n = len(inputs)
    count = len(np.asarray(inputs[0])) // n
    return np.concatenate([np.asarray(x)[rank * count:(rank + 1) * count] for x in inputs])


def gather(inputs: Sequence[np.ndarray], rank: int, root: int) -> np.ndarray | None:
    """The root holds every rank's input in rank order; elsewhere the receive buffer is not touched (None: the
    runner then checks it kept its bytes)."""
    return np.concatenate([np.asarray(x) for x in inputs]) if rank == root else None


def scatter(inputs: Sequence[np.ndarray], rank: int, root: int) -> np.ndarray:
    """Rank r holds block r of the root's input."""
    x = np.asarray(inputs[root])
    count = len(x) // len(inputs)
    return x[rank * count:(rank + 1) * count].copy()
