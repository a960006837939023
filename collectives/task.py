"""One call, resolved once (NCCL ``struct ncclTaskColl`` and what ``ncclEnqueueCheck`` → ``ncclPrepareTasks`` →
``scheduleCollTasksToPlan`` derive from it: the reduction op, the algorithm, protocol and channel split, the chunk
and slice steps, the proxy's op counts).

A communicator keeps its tasks by (function, count, type, op, root), so a repeated call, the usual case in a
training loop or a benchmark, rebuilds nothing: it looks its task up, stamps the opCount and runs.  The compiled
ring form (``device/compiled``: Ring/LL, Ring/LL128 and Ring/Simple) is kept per task as well, by in-place-ness
(AllGather and Broadcast move their own block differently in place).  Deliberate difference: NCCL rebuilds its plan for every call; its host code costs
microseconds in C, ours would cost tens in Python.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from collectives.misc.futex import address

from . import enqueue
from .device import launch
from .device.reduce_copy import DTYPE_CODES, OPS, RedOp, dtype_name, parse_op
from .status import FUNC_CODES

IN_PLACE_MATTERS = ("AllGather", "Broadcast")  # their ring algorithms take in_place


@dataclass
class Task:
    func: str
    count: int
    op: str
    root: int
    redop: RedOp
    dtype_code: int
    signature: tuple            # what the status page publishes: (function, count, datatype, op, root)
    sig: np.ndarray             # [opCount + 1, *signature], the compiled path's copy
    plan: enqueue.Plan | None   # None: nothing to schedule (count 0, or one rank)
    chunk_steps: int = 0
    slice_steps: int = 0
    counts: list = field(default_factory=list)     # ncclProxySaveOp's (connector, steps), when proxied
    compiled: dict = field(default_factory=dict)   # in_place -> compiled.Compiled or None


def new_task(comm, func: str, count: int, dtype: np.dtype, op: str, root: int, registered: bool = False) -> Task:
    """Resolve a call on ``comm``: checks the op (a bad one raises here, before anything is published);
    ``registered``: both its buffers are registered (the plan's tuner is told)."""
    name = parse_op(op)
    code = DTYPE_CODES[dtype_name(dtype)]
    signature = (FUNC_CODES[func], count, code, OPS[name], root)
    plan = comm.plan(func, count, dtype, registered) if count and comm.nranks > 1 else None
    task = Task(func, count, name, root, RedOp(name, np.dtype(dtype), comm.nranks), code, signature,
                np.array((0, *signature), np.int64), plan)
    if plan is not None:
        task.chunk_steps, task.slice_steps = plan.chunk_steps, plan.slice_steps
        if comm.conns is not None and comm.conns.proxied:
            task.counts = enqueue.proxy_steps(plan, comm.channels, comm.nranks, root, task.chunk_steps)
    return task


class Launch(NamedTuple):
    """One call resolved from its arguments (``Communicator._prepare``): the buffers, the task, whether it is in
    place, its compiled form (None: the readable primitives) and whether that is all it runs; valid for as long as
    the same buffers are passed again.  Inside a group it is ``ncclTaskColl`` as ``collTaskAppend`` queues it
    (``group_plan.enqueue_coll``), without a compiled form: the group's plan decides how it runs."""
    func: str
    send: np.ndarray
    recv: np.ndarray
    count: int
    op: str
    root: int
    task: Task
    placed: bool
    compiled: object
    direct: bool = False  # compiled, nothing traced, logged or proxied: ``_start`` runs the kernel alone


def in_place(func: str, rank: int, send: np.ndarray, recv: np.ndarray) -> bool:
    """Whether the call is in place, where that changes the algorithm (``IN_PLACE_MATTERS``; the others are run
    the same either way): AllGather sends its own block of the output, Broadcast sends from the output itself."""
    if func not in IN_PLACE_MATTERS:
        return False
    return address(send) == address(recv) + (rank * send.nbytes if func == "AllGather" else 0)


def compiled_form(task: Task, cache, placed: bool, send: np.ndarray, tracing: bool):
    """The task's compiled form for this placement (from the communicator's ``compiled.Cache``), or None
    when the readable primitives run it (``compiled.eligible``) or there is no cache (a GPU device)."""
    if task.plan is None or cache is None:
        return None
    if placed not in task.compiled:
        dtype = np.dtype(np.uint8) if task.func in IN_PLACE_MATTERS else send.dtype  # they move bytes
        task.compiled[placed] = cache.get(task.plan, launch.RING[task.func][0], task.root, placed, dtype, task.op,
                                          tracing)
    return task.compiled[placed]
