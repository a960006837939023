"""From one collective call to per-channel work (NCCL ``src/enqueue.cc``).

* ``topo_get_algo_info`` (``topoGetAlgoInfo``): shrink the channel and thread counts for small sizes.
* ``calc_coll_chunking`` (``calcCollChunking``): the chunk size of a (function, algorithm, protocol).
* ``schedule_colls`` (``scheduleCollTasksToPlan`` + ``ncclCollCbdPart``): the continuous-byte-distribution split
  of each task's element space into contiguous parts, one per channel, each with its own chunk count, the tasks of
  a plan laid one after another over the channels; ``schedule_coll``: one task alone.
* ``prepare_colls`` (``ncclPrepareTasks``): a group's collectives sorted, binned and aggregated for their
  algorithm choice.
AllGather and Broadcast are counted in bytes (NCCL retypes them as int8 in ``collTaskAppend``).
* ``plan_coll``: the cost model's algorithm and protocol for the call's size, then ``schedule_coll`` (what
  ``ncclPrepareTasks`` does per task); the communicator and the GPU threads mode both plan through it.
* ``ring_calls`` / ``tree_calls`` (``ncclProxySaveOp``): the steps each NET connection moves in one collective.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from collectives.include.bitops import div_up, u32fp_encode
from collectives.include.device import NCCL_MAX_NTHREADS, NCCL_STEPS, WARP_SIZE
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
    tuner_channels: int = 0  # a tuner plugin's nChannels, which replaced topoGetAlgoInfo's (0: none asked)

    @property
    def nchannels(self) -> int:
        return len(self.works)


@dataclass(frozen=True)
class CollSpec:
    """What ``ncclPrepareTasks`` fixes for one ``ncclTaskColl`` before it is scheduled: the call, its algorithm
    and protocol, and ``topoGetAlgoInfo``'s nMaxChannels (or the tuner plugin's ``tuner_channels``, when it asked
    some) and nWarps, of its aggregate in a group."""
    func: str
    count: int
    elt_size: int
    algo: str
    proto: str
    n_max_channels: int
    n_warps: int
    tuner_channels: int = 0


def algo_info_spec(t: Tuning, func: str, count: int, elt_size: int, algo: str, proto: str, nbytes: int,
                   tuner_channels: int = 0) -> CollSpec:
    """The end of ``ncclGetAlgoInfo``: ``topoGetAlgoInfo``'s nMaxChannels and nWarps for ``nbytes``, then a tuner
    plugin's ``nChannels``, when it asked one, in place of that nMaxChannels."""
    n_max_ch, n_warps = topo_get_algo_info(t, algo, proto, nbytes)
    return CollSpec(func, count, elt_size, algo, proto, tuner_channels or n_max_ch, n_warps, tuner_channels)


def schedule_coll(t: Tuning, func: str, count: int, elt_size: int, algo: str = "Ring",
                  proto: str = "Simple", tuner_channels: int = 0) -> Plan:
    """One collective, alone in its plan (channelId 0, no traffic yet on any channel)."""
    nbytes = elt_size * max_send_recv_count(func, t.nranks, count)  # the same bytes once retyped as int8
    return schedule_colls(t, [algo_info_spec(t, func, count, elt_size, algo, proto, nbytes, tuner_channels)])[0]


def schedule_colls(t: Tuning, specs: list[CollSpec]) -> list[Plan]:
    """``scheduleCollTasksToPlan``: the tasks of one plan, in order, over the communicator's channels.  First the
    plan's traffic (each task at least ``MinTrafficPerChannel``) and channel count (the tasks' nMaxChannels
    summed, at most the communicator's) give the traffic per channel; then each task is cut into cells and laid
    from the channel and the traffic where the task before it stopped (``ncclCollCbdPart``'s lo / mid / hi
    counts).  Where we differ on purpose: no work budget (a plan never overflows here), no CollNet or NVLS kinds."""
    comm_channels, n = t.nchannels, t.nranks
    specs = [s if s.func not in ("AllGather", "Broadcast") else  # NCCL retypes them as int8 (collTaskAppend)
             replace(s, count=s.count * s.elt_size, elt_size=1) for s in specs]

    def tpb(s: CollSpec) -> int:
        return traffic_per_byte(s.func, n) * (4 if PROTOCOLS[s.proto] is LL else 1)

    live = [s for s in specs if s.count]
    plan_traffic = sum(max(MIN_TRAFFIC_PER_CHANNEL, s.count * s.elt_size * tpb(s)) for s in live)
    plan_channels = min(sum(s.n_max_channels for s in live), comm_channels)
    traffic_per_channel = div_up(plan_traffic // plan_channels, 16) * 16 if live else 0
    channel_id, current = 0, 0
    plans = []
    for s in specs:
        steps = PROTOCOLS[s.proto].chunk_slice_steps(s.algo, CHUNKSTEPS[s.func], SLICESTEPS[s.func])
        if s.count == 0:  # NCCL never enqueues it
            plans.append(Plan(s.func, s.algo, s.proto, s.elt_size, 0, s.n_max_channels, (), s.n_warps, *steps,
                              s.tuner_channels))
            continue
        parts, channel_id, current = _cbd_parts(s.count, s.elt_size, tpb(s), traffic_per_channel, channel_id,
                                                current, comm_channels)
        grain = PROTOCOLS[s.proto].grain
        elts_per_grain = grain // s.elt_size
        global_bytes = s.elt_size * max_send_recv_count(s.func, n, 1)  # per element, not traffic (no x2)
        works, offset = [], 0
        for c, part in parts:  # each part its own chunk: calcCollChunking(nChannels=1, its bytes)
            chunk_count = calc_coll_chunking(t, s.func, s.algo, s.proto, global_bytes * part) // grain * elts_per_grain
            works.append(ChannelWork(c, offset, part, chunk_count, s.count))
            offset += part
        plans.append(Plan(s.func, s.algo, s.proto, s.elt_size, s.count, s.n_max_channels, tuple(works), s.n_warps,
                          *steps, s.tuner_channels))
    return plans


def _cbd_parts(count: int, elt_size: int, tpb: int, traffic_per_channel: int, channel_id: int, current: int,
               comm_channels: int) -> tuple[list[tuple[int, int]], int, int]:
    """One task's (channel, count) parts from ``channel_id`` with ``current`` traffic on it already, and where
    the next task starts (``scheduleCollTasksToPlan``'s cellsLo / nMidChannels / cellsHi, then its update of
    channelId and currentTraffic)."""
    cell_size = div_up(div_up(MIN_TRAFFIC_PER_CHANNEL, tpb), 16) * 16
    elts_per_cell = cell_size // elt_size
    cells = div_up(count * elt_size, cell_size)
    traffic_per_elt, traffic_per_cell = elt_size * tpb, cell_size * tpb
    cells_per_channel = min(cells, div_up(traffic_per_channel, traffic_per_cell))
    if channel_id + 1 == comm_channels:  # the last channel takes everything
        cells_lo = cells
    else:
        cells_lo = min(cells, div_up(traffic_per_channel - current, traffic_per_cell))
    n_mid = (cells - cells_lo) // cells_per_channel
    cells_hi = (cells - cells_lo) % cells_per_channel
    used = (cells_lo != 0) + n_mid + (cells_hi != 0)
    if comm_channels < channel_id + used:  # overflowed the available channels
        n_mid = comm_channels - channel_id - 2
        cells_per_channel = (cells - cells_lo) // (n_mid + 1)
        cells_hi = cells_per_channel + (cells - cells_lo) % (n_mid + 1)
    if cells_hi == 0 and n_mid != 0:
        cells_hi, n_mid = cells_per_channel, n_mid - 1
    if cells_lo == 0:  # the current channel is full: the next one becomes the lowest
        channel_id += 1
        if n_mid == 0:
            cells_lo, cells_hi = cells_hi, 0
        else:
            cells_lo, n_mid = cells_per_channel, n_mid - 1
    count_mid = cells_per_channel * elts_per_cell if n_mid else 0
    count_lo, count_hi = cells_lo * elts_per_cell, cells_hi * elts_per_cell
    excess = cells * elts_per_cell - count
    if count_hi:
        count_hi -= excess
    else:
        count_lo -= excess
    counts = [count_lo] + [count_mid] * n_mid + ([count_hi] if cells_hi else [])
    parts = [(channel_id + i, c) for i, c in enumerate(counts)]
    if count_hi:
        channel_id, current = channel_id + len(counts) - 1, cells_hi * elts_per_cell * traffic_per_elt
    elif n_mid:
        channel_id, current = channel_id + len(counts), 0
    else:
        current += cells_lo * elts_per_cell * traffic_per_elt
    if current >= traffic_per_channel and channel_id + 1 != comm_channels:
        channel_id, current = channel_id + 1, 0
    return parts, channel_id, current


def plan_coll(t: Tuning, choose, func: str, count: int, elt_size: int, reg_buff: bool = False) -> Plan:
    """``func`` of ``count`` elements planned as ``ncclPrepareTasks`` does: ``choose`` (the cost model's
    ``CostModel.choose``: bytes -> algorithm, protocol, predicted time, a tuner's channel count) picks for
    ``ncclFuncMaxSendRecvCount``'s bytes, told ``reg_buff`` (``ncclGetAlgoInfo``'s ``regBuff`` for a tuner plugin: both
    buffers registered), then ``schedule_coll`` splits the call into channels and chunks."""
    nbytes = elt_size * max_send_recv_count(func, t.nranks, count)
    algo, proto, predicted, tuner_channels = choose(func, nbytes, 1, reg_buff)
    if debug.enabled("TRACE", "COLL"):  # topoGetAlgoInfo prints the ids
        debug.trace("COLL", f"{nbytes} Bytes -> Algo {ALGOS.index(algo)} proto {PROTOCOLS[proto].id} "
                            f"time {predicted:f}")
    return schedule_coll(t, func, count, elt_size, algo, proto, tuner_channels)


SORTER_UNIT_LOG2, SORTER_MAX_LOG2, SORTER_BITS_PER_POW2 = 10, 30, 2  # struct ncclTaskCollSorter
SORTER_BINS = 1 + (SORTER_MAX_LOG2 - SORTER_UNIT_LOG2) * (1 << SORTER_BITS_PER_POW2)


def prepare_colls(t: Tuning, choose, tasks: list[tuple]) -> tuple[list[int], list[CollSpec], float | None]:
    """``ncclPrepareTasks`` for a group's collectives, ``tasks`` as (func, count, elt_size, op, dtype) in call order.
    ``collTaskAppend`` puts each in the size sorter by its traffic (``ncclTaskCollSorterInsert``: bins of a quarter
    power of two, largest first, the last inserted first within a bin); the sorted tasks are binned by (function, op,
    type), each bin walked smallest first; tasks within 4x of a run's first are aggregated and one ``ncclGetAlgoInfo``
    (``choose``: bytes, numPipeOps -> algorithm, protocol, time, a tuner's channel count) is made for their summed
    count, numPipeOps being the group's tasks per channel.  Returns the plan's order (indices into ``tasks``), the
    specs in that order, and the time of the last choice (``ncclSimInfo_t.estimatedTime``; None: no
    collective).  Count-0 tasks never reach the planner (``ncclEnqueueCheck`` returns first)."""
    n = t.nranks
    live = [i for i, task in enumerate(tasks) if task[1]]

    def traffic(i: int) -> int:
        func, count, elt = tasks[i][:3]
        return count * elt * traffic_per_byte(func, n)

    def sorter_bin(size: int) -> int:
        return SORTER_BINS - 1 - u32fp_encode(min(1 << SORTER_MAX_LOG2, size) >> SORTER_UNIT_LOG2,
                                              SORTER_BITS_PER_POW2)

    ordered = sorted(live, key=lambda i: (sorter_bin(traffic(i)), -i))
    bins: dict[tuple, list[int]] = {}
    for i in ordered:  # a LIFO per (fn, op, ty), in order of first appearance
        func, _, elt, op, dtype = tasks[i]
        bins.setdefault((func, op, dtype), []).insert(0, i)
    pipe_ops = div_up(len(live), t.nchannels)
    order, specs, estimated = [], [], None
    for run in bins.values():
        k = 0
        while k < len(run):
            end = k + 1
            while end < len(run) and traffic(run[end]) < 4 * traffic(run[k]):
                end += 1
            func, _, elt = tasks[run[k]][:3]
            count = sum(tasks[i][1] for i in run[k:end])
            nbytes = elt * max_send_recv_count(func, n, count)
            algo, proto, estimated, tuner_channels = choose(func, nbytes, pipe_ops)
            agg = algo_info_spec(t, func, count, elt, algo, proto, nbytes, tuner_channels)
            for i in run[k:end]:
                order.append(i)
                specs.append(replace(agg, count=tasks[i][1]))
            k = end
    return order, specs, estimated


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
