"""From one collective call to per-channel work (NCCL ``src/enqueue.cc``).

* ``topo_get_algo_info`` (``topoGetAlgoInfo``): shrink the channel and thread counts for small sizes.
* ``calc_coll_chunking`` (``calcCollChunking``): the chunk size of a (function, algorithm, protocol).
* ``schedule_coll`` (``scheduleCollTasksToPlan`` + ``ncclCollCbdPart``): the continuous-byte-distribution split
  of the element space into one contiguous part per channel, each with its own chunk count.
AllGather and Broadcast are counted in bytes (NCCL retypes them as int8 in ``collTaskAppend``).
* ``plan_coll``: the cost model's algorithm and protocol for the call's size, then ``schedule_coll`` (what
  ``ncclPrepareTasks`` does per task); the communicator and the GPU threads mode both plan through it.
* ``ring_calls`` / ``tree_calls`` (``ncclProxySaveOp``): the steps each NET connection moves in one collective.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collectives.include.bitops import div_up
from collectives.include.device import FUNCS, NCCL_MAX_NTHREADS, NCCL_STEPS, WARP_SIZE
from collectives.include.protocols import LL, LL128, PROTOCOLS, SIMPLE
from tracing import debug

ALGOS = ("Tree", "Ring")
CHUNKSTEPS = {"AllReduce": 4, "AllGather": 4, "ReduceScatter": 4, "Broadcast": 1, "Reduce": 1}
SLICESTEPS = {"AllReduce": 2, "AllGather": 2, "ReduceScatter": 2, "Broadcast": 1, "Reduce": 1}
MIN_TRAFFIC_PER_CHANNEL = 32 << 10


def traffic_per_byte(func: str, nranks: int) -> int:
    """``ncclFuncTrafficPerByte``."""
    return {"AllReduce": 2, "AllGather": nranks, "ReduceScatter": nranks}.get(func, 1)


def max_send_recv_count(func: str, nranks: int, count: int) -> int:
    """``ncclFuncMaxSendRecvCount``: AllGather and ReduceScatter move n blocks."""
    return count * nranks if func in ("AllGather", "ReduceScatter") else count


@dataclass(frozen=True)
class Tuning:
    """What ``ncclTopoTuneModel`` fixes per communicator and this module needs."""
    nranks: int
    nchannels: int
    buff_sizes: dict            # proto -> bytes
    max_threads: dict           # (algo, proto) -> threads
    thread_thresholds: dict     # (algo, proto) -> bytes per thread
    nnodes: int = 1


def default_tuning(nranks: int, nchannels: int, buff_sizes: dict, nthreads: int = 512,
                   ll128_nthreads: int = 640, nnodes: int = 1, max_threads: dict | None = None) -> Tuning:
    """``max_threads``: ``graph.tuning.max_threads`` (NCCL's ``comm->maxThreads``); without it every Ring/Tree row
    gets ``nthreads`` (LL128: ``ll128_nthreads``)."""
    threads, thresholds = {}, {}
    for algo in ALGOS:
        for p in PROTOCOLS.values():
            threads[(algo, p.name)] = ll128_nthreads if p is LL128 else nthreads
            thresholds[(algo, p.name)] = p.threshold(algo, nranks)  # NCCL_*_THREAD_THRESHOLD
    if max_threads:
        threads.update({k: v for k, v in max_threads.items() if k[0] in ALGOS})
    return Tuning(nranks, nchannels, dict(buff_sizes), threads, thresholds, nnodes)


def topo_get_algo_info(t: Tuning, algo: str, proto: str, nbytes: int) -> tuple[int, int]:
    """Returns (nMaxChannels, nWarps) for a collective of ``nbytes`` (``ncclFuncMaxSendRecvCount`` bytes)."""
    nc, nt = t.nchannels, t.max_threads[(algo, proto)]
    thr = t.thread_thresholds[(algo, proto)]
    while nbytes < nc * nt * thr and nc >= 2:
        nc -= 1
    while nbytes < nc * nt * thr and nt % 128 == 0:
        nt //= 2
    if PROTOCOLS[proto] is SIMPLE:
        nt += WARP_SIZE if algo == "Ring" else 4 * WARP_SIZE
    nt = max(nt, 3 * WARP_SIZE)
    if algo == "Tree":
        nt = NCCL_MAX_NTHREADS
    return nc, nt // WARP_SIZE


def calc_coll_chunking(t: Tuning, func: str, algo: str, proto: str, nbytes: int = 0, nchannels: int = 1) -> int:
    """Chunk size in bytes, aligned down to the protocol grain.  Only Ring/Simple has several steps per chunk; Ring
    never shrinks with the size (the device's last loop does), Tree/LL128 halves its chunk for small parts."""
    p = PROTOCOLS[proto]
    chunk_steps, _ = p.chunk_slice_steps(algo, CHUNKSTEPS[func], SLICESTEPS[func])
    chunk = p.step_data_bytes(t.buff_sizes[proto] // NCCL_STEPS * chunk_steps)
    if algo == "Tree" and p is LL128:
        f32 = np.float32                              # NCCL computes these thresholds in float
        ppn = f32(t.nranks) / f32(t.nnodes)
        nsteps = f32(1 + (t.nnodes.bit_length() - 1) + 0.1 * float(ppn))
        while f32(nbytes // (nchannels * chunk)) < f32(nsteps * f32(64)) / ppn and chunk > 131072:
            chunk //= 2
        while f32(nbytes // (nchannels * chunk)) < f32(nsteps * f32(16)) / ppn and chunk > 32768:
            chunk //= 2
    return chunk // p.grain * p.grain


@dataclass(frozen=True)
class ChannelWork:
    """``ncclCollCbdPart`` for one channel: its part of the element space and its chunk count."""
    channel: int
    part_offset: int
    part_count: int
    chunk_count: int
    count: int          # the collective's count (per-rank count for AllGather/ReduceScatter), in elements


@dataclass(frozen=True)
class Plan:
    func: str
    algo: str
    proto: str
    elt_size: int       # 1 for AllGather/Broadcast (bytes)
    count: int          # in elt_size units
    n_max_channels: int
    works: tuple        # ChannelWork per channel used
    n_warps: int = 0    # topoGetAlgoInfo's nWarps: the GPU kernels' block size (a CPU kernel has no use for it)
    chunk_steps: int = 1  # calcCollChunking's chunkSteps and sliceSteps (several only for Ring/Simple)
    slice_steps: int = 1

    @property
    def nchannels(self) -> int:
        return len(self.works)


def schedule_coll(t: Tuning, func: str, count: int, elt_size: int, algo: str = "Ring",
                  proto: str = "Simple") -> Plan:
    """One collective, alone and first in its plan (channelId 0, no traffic yet on any channel)."""
    if func in ("AllGather", "Broadcast"):
        count, elt_size = count * elt_size, 1
    n = t.nranks
    nbytes = elt_size * max_send_recv_count(func, n, count)
    n_max_ch, n_warps = topo_get_algo_info(t, algo, proto, nbytes)
    steps = PROTOCOLS[proto].chunk_slice_steps(algo, CHUNKSTEPS[func], SLICESTEPS[func])
    if count == 0:
        return Plan(func, algo, proto, elt_size, 0, n_max_ch, (), n_warps, *steps)
    tpb = traffic_per_byte(func, n) * (4 if PROTOCOLS[proto] is LL else 1)
    task_traffic = count * elt_size * tpb
    comm_channels = t.nchannels
    nch = min(n_max_ch, comm_channels)
    traffic_per_channel = div_up(max(MIN_TRAFFIC_PER_CHANNEL, task_traffic) // nch, 16) * 16
    cell_size = div_up(div_up(MIN_TRAFFIC_PER_CHANNEL, tpb), 16) * 16
    elts_per_cell = cell_size // elt_size
    cells = div_up(count * elt_size, cell_size)
    traffic_per_cell = cell_size * tpb
    cells_per_channel = min(cells, div_up(traffic_per_channel, traffic_per_cell))
    channel_id = 0
    if channel_id + 1 == comm_channels:
        cells_lo = cells
    else:
        cells_lo = min(cells, div_up(traffic_per_channel, traffic_per_cell))
    n_mid = (cells - cells_lo) // cells_per_channel
    cells_hi = (cells - cells_lo) % cells_per_channel
    used = (cells_lo != 0) + n_mid + (cells_hi != 0)
    if comm_channels < channel_id + used:  # overflowed the available channels
        n_mid = comm_channels - channel_id - 2
        cells_per_channel = (cells - cells_lo) // (n_mid + 1)
        cells_hi = cells_per_channel + (cells - cells_lo) % (n_mid + 1)
    if cells_hi == 0 and n_mid != 0:
        cells_hi, n_mid = cells_per_channel, n_mid - 1
    count_mid = cells_per_channel * elts_per_cell if n_mid else 0
    count_lo, count_hi = cells_lo * elts_per_cell, cells_hi * elts_per_cell
    excess = cells * elts_per_cell - count
    if count_hi:
        count_hi -= excess
    else:
        count_lo -= excess
    grain = PROTOCOLS[proto].grain
    elts_per_grain = grain // elt_size
    global_bytes = elt_size * max_send_recv_count(func, n, 1)  # per element, not traffic (no x2 for AllReduce)
    parts = [count_lo] + [count_mid] * n_mid + ([count_hi] if cells_hi else [])
    works, offset = [], 0
    for c, part in enumerate(parts):  # each part its own chunk: calcCollChunking(nChannels=1, its bytes)
        chunk_count = calc_coll_chunking(t, func, algo, proto, global_bytes * part) // grain * elts_per_grain
        works.append(ChannelWork(channel_id + c, offset, part, chunk_count, count))
        offset += part
    return Plan(func, algo, proto, elt_size, count, n_max_ch, tuple(works), n_warps, *steps)


def plan_coll(t: Tuning, choose, func: str, count: int, elt_size: int) -> Plan:
    """``func`` of ``count`` elements planned as ``ncclPrepareTasks`` does: ``choose`` (the cost model's
    ``CostModel.choose``: bytes -> algorithm, protocol, predicted time) picks for ``ncclFuncMaxSendRecvCount``'s
    bytes, then ``schedule_coll`` splits the call into channels and chunks."""
    nbytes = elt_size * max_send_recv_count(func, t.nranks, count)
    algo, proto, predicted = choose(func, nbytes)
    if debug.enabled("TRACE", "COLL"):  # topoGetAlgoInfo prints the ids
        debug.trace("COLL", f"{nbytes} Bytes -> Algo {ALGOS.index(algo)} proto {PROTOCOLS[proto].id} "
                            f"time {predicted:f}")
    return schedule_coll(t, func, count, elt_size, algo, proto)


def ring_calls(func: str, nranks: int, work: ChannelWork, user_ranks, root: int) -> tuple[int, int]:
    """(send calls, receive calls) one rank makes on one channel: what a proxy op must carry (``ncclProxySaveOp``
    with ``ncclPatternRing``/``RingTwice``/``PipelineFrom``/``PipelineTo``)."""
    if work.part_count == 0:
        return 0, 0
    if func == "AllReduce":
        loops = div_up(work.part_count, nranks * work.chunk_count)
        return 2 * (nranks - 1) * loops, 2 * (nranks - 1) * loops
    loops = div_up(work.part_count, work.chunk_count)
    if func in ("AllGather", "ReduceScatter"):
        return (nranks - 1) * loops, (nranks - 1) * loops
    me, nxt, prev = user_ranks[0], user_ranks[1 % nranks], user_ranks[nranks - 1]
    if func == "Broadcast":
        return (0 if nxt == root else loops), (0 if me == root else loops)
    return (0 if me == root else loops), (0 if prev == root else loops)  # Reduce


def tree_calls(work: ChannelWork, tree) -> tuple[dict, dict]:
    """({peer: steps} to send, {peer: steps} to receive) for Tree AllReduce on one channel (``ncclPatternTreeUpDown``:
    up = recv from each of ``down[]`` and send to ``up``; down = send to each of ``down[]`` and recv from ``up``).
    One step per chunk: nstepsPerLoop = nchunksPerLoop = 1."""
    loops = div_up(work.part_count, work.chunk_count) if work.part_count else 0
    if not loops:
        return {}, {}
    peers = list(tree.down) + ([tree.up] if tree.up != -1 else [])
    return {p: loops for p in peers}, {p: loops for p in peers}


def proxy_steps(plan: Plan, channels: list, nranks: int, root: int, chunk_steps: int) -> list[tuple]:
    """``ncclProxySaveOp``'s counts: for every connector this collective uses on every channel it runs, the steps
    the kernel will move through it (``ring_calls``/``tree_calls`` primitive calls, ``chunk_steps`` each)."""
    counts = []
    for w in plan.works:
        ch = channels[w.channel]
        if plan.algo == "Tree":
            sends, recvs = tree_calls(w, ch.tree)
            counts += [(ch.send_to[p], n * chunk_steps) for p, n in sends.items()]
            counts += [(ch.recv_from[p], n * chunk_steps) for p, n in recvs.items()]
        else:
            sends, recvs = ring_calls(plan.func, nranks, w, ch.ring.user_ranks, root)
            counts += [(ch.send, sends * chunk_steps), (ch.recv, recvs * chunk_steps)]
    return counts
