"""One kernel plan for a group's collectives and point-to-point operations (NCCL ``src/group.cc``: ``groupLaunch``
→ ``src/enqueue.cc``: ``ncclLaunchPrepare`` with ``ncclPrepareTasks``, ``scheduleCollTasksToPlan`` then
``scheduleP2pTasksToPlan`` into the same plan, ``ncclLaunchKernel``).

Inside a group a collective is only queued (``collTaskAppend``).  At the group's end the queued collectives are
prepared together (``enqueue.prepare_colls``: size-sorted, binned by function, op and type, aggregated within 4x
for one algorithm choice) and laid over the channels one after another (``enqueue.schedule_colls``), then the
p2p works (``p2p.P2p.prepare``).  Each channel runs its collectives' parts, then its p2p parts, in that order
(``device.common.run_in_order``); all channels in one ``Kernel.run``; the proxy gets every op first.
Where we differ on purpose: a plan never fills up (NCCL starts another plan when the work FIFO budget is
spent), the LL compiled path is not used for grouped collectives, several Broadcasts with different roots are
scheduled as collectives (NCCL 2.30 turns them into its allgatherv path), the status page publishes the
plan's first collective (with the group's summed count) for the peers' signature checks, and the tuner plugin is
told ``regBuff`` = 0 (NCCL looks up the aggregated task's buffers; a group here never uses registered buffers).
"""
from __future__ import annotations

import collections
import dataclasses

import numpy as np

from tracing.events import now

from . import enqueue, p2p
from .device import launch as device_launch
from .device.common import run_in_order
from .device.reduce_copy import dtype_name, reduce_copy
from .task import IN_PLACE_MATTERS, Launch, in_place, new_task


def enqueue_coll(comm, func: str, send: np.ndarray, recv: np.ndarray, count: int, op: str, root: int) -> None:
    """``collTaskAppend``: resolve the call now (bad arguments raise before anything is queued), queue it."""
    task = new_task(comm, func, count, send.dtype, op, root)
    placed = in_place(func, comm.rank, send, recv)
    comm.group_colls.append(Launch(func, send, recv, count, op, root, task, placed, None))  # the plan decides how


def prepare(comm, colls: list[Launch]) -> tuple[list[Launch], list[enqueue.Plan], float | None]:
    """``ncclPrepareTasks`` + ``scheduleCollTasksToPlan``: the plan's collectives in its order, their plans, and the
    cost model's estimated time (``ncclSimInfo_t.estimatedTime``)."""
    tasks = [(c.func, c.count, c.send.itemsize, c.task.op, dtype_name(c.send.dtype)) for c in colls]
    order, specs, estimated = enqueue.prepare_colls(comm.tuning, comm.cost_model.choose, tasks)
    return [colls[i] for i in order], enqueue.schedule_colls(comm.tuning, specs), estimated


def simulate(comm) -> float | None:
    """``ncclGroupSimulateEnd`` for this communicator: prepare its queued collectives without running them, and
    drop the queue (its p2p operations too: NCCL plans nothing for them, and moves nothing)."""
    colls, comm.group_colls = [c for c in comm.group_colls if c.count], []
    comm._p2p.clear()
    if not colls:
        return None
    if comm.nranks == 1:  # updateCollCostTable: one rank costs nothing
        return 0.0
    return prepare(comm, colls)[2]


def launch(comm) -> None:
    """``groupLaunch`` for one communicator: its collectives and p2p works as one plan, one kernel run, one trace
    record (``plan``: its collectives' opCounts and its p2p works)."""
    queued, comm.group_colls = comm.group_colls, []
    colls = [c for c in queued if c.count]  # a count-0 call still takes its opCount, as alone
    seq_of = {id(c): comm.op_count + i for i, c in enumerate(queued)}
    try:
        if comm.nranks == 1:  # ncclLaunchOneRank for each, then the self-sends
            for c in colls:
                reduce_copy(c.task.redop, [c.send[:len(c.recv)]], [c.recv], pre_op=True, post_op=True)
            comm._p2p.launch(comm._p2p_kernel, None)
        elif not colls:
            _run(comm, comm._p2p_kernel, [], [], seq_of)
        else:
            ordered, plans, _ = prepare(comm, colls)
            first = colls[0].task
            comm._kernel.reset(comm.op_count, f"{first.func} in a group of {len(queued)}")
            # the peers compare it: a group of several publishes its first call with the group's summed count, so
            # that a peer making the same calls one by one (another plan, other channel parts) is a mismatch
            sig = (first.signature[0], sum(c.count for c in colls), *first.signature[2:]) if len(colls) > 1 \
                else first.signature
            comm.health.publish(comm.op_count, sig, np.array((0, *sig), np.int64))
            _run(comm, comm._kernel, ordered, plans, seq_of)
    finally:
        comm.op_count += len(queued)


def _run(comm, kernel, ordered: list[Launch], plans: list[enqueue.Plan], seq_of: dict) -> None:
    """Post every proxy op, run every channel's works in the plan's order, wait for the network to take the
    sends."""
    tracer, conns = comm.tracer, comm.conns
    works = comm._p2p.prepare(conns)
    if not works and not ordered:
        return  # only count-0 calls: no plan
    if works:  # every failure line names the plan's p2p ops: peers, bytes, rounds
        kernel.func = f"{kernel.func} [{p2p.describe_works(works)}]"
    by_channel: dict[int, list] = collections.defaultdict(list)
    proxy_ops = []
    for c, plan in zip(ordered, plans):
        send, recv = c.send, c.recv
        if c.func in IN_PLACE_MATTERS:  # NCCL retypes these as int8: they move bytes
            send, recv = send.view(np.uint8), recv.view(np.uint8)
        placed = c.placed
        if conns is not None and conns.proxied:
            counts = enqueue.proxy_steps(plan, comm.channels, comm.nranks, c.root, plan.chunk_steps)
            proxy_ops += conns.save_ops(counts, plan.proto, plan.slice_steps, plan.chunk_steps, tracer, seq_of[id(c)])
        for w in plan.works:
            by_channel[w.channel].append(
                lambda plan=dataclasses.replace(plan, works=(w,)), c=c, send=send, recv=recv, placed=placed:
                device_launch.channel_works(kernel, plan, comm.channels, comm.nranks, send, recv, c.task.redop,
                                            c.root, placed, plan.chunk_steps, plan.slice_steps))
    proxy_ops += comm._p2p.post(conns, works, kernel)
    for ch, makers in comm._p2p.channel_works(kernel, works).items():
        by_channel[ch] += makers  # a channel's p2p works after its collectives
    t0 = now() if tracer is not None else 0
    kernel.run([run_in_order(seq) for _, seq in sorted(by_channel.items())])
    if proxy_ops:
        kernel.run([conns.wait_sent(kernel, proxy_ops)])
    if tracer is not None:
        t1 = now()
        tracer.add_plan([(seq_of[id(c)], c.func, p.algo, p.proto, c.count,
                          dtype_name(c.send.dtype) if c.func not in IN_PLACE_MATTERS else "int8", c.task.redop.name,
                          c.root, p.nchannels, t0, t1) for c, p in zip(ordered, plans)], len(works), t0, t1)
