"""Groups of operations (NCCL ``src/group.cc``: ``ncclGroupStart``, ``ncclGroupEnd`` → ``ncclGroupEndInternal`` →
``groupLaunch``; the per-thread ``ncclGroupDepth`` and list of communicators with pending work).

Between ``group_start()`` and ``group_end()`` (or inside ``with group():``) collectives, sends and receives are
only queued on their communicator; the outermost ``group_end`` launches every queued communicator: it connects
the peers met for the first time, then runs each communicator's collectives and p2p works as one plan in one
kernel (``group_plan.py``).  Outside a group, an operation is a group of its own (``ncclEnqueueCheck`` wraps it in
a group start and end), so it returns once its peer's matching operation has run.
``group_end(simulate=True)`` is ``ncclGroupSimulateEnd``: the queued work is planned, not run, and the cost
model's estimated time comes back in a ``GroupSimInfo`` (nccl4py's ``nccl.core.group_end(simulate=True)``).
Where we differ on purpose: the communicators of one group are launched one after another, which is enough
when each process has one.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Iterator

class _State(threading.local):
    """NCCL's thread_local ``ncclGroupDepth`` and ``ncclGroupCommHead``: each thread starts at depth 0 with none
    (the class attribute and ``__init__`` run per thread, so ``depth()`` is one attribute read on every call)."""
    depth = 0

    def __init__(self) -> None:
        self.comms: list = []


_state = _State()


def _pending() -> list:
    return _state.comms


def depth() -> int:
    """``ncclGroupDepth``: how many group starts are open on this thread."""
    return _state.depth


def group_start() -> None:
    """``ncclGroupStart``: open a group (groups nest; only the outermost end launches)."""
    _state.depth += 1


NCCL_UNDEF_FLOAT = -1.0  # ncclSimInfo_t's estimatedTime until a collective is planned


@dataclass(frozen=True)
class GroupSimInfo:
    """``ncclSimInfo_t`` (nccl4py's ``GroupSimInfo``): ``estimated_time`` in microseconds, the cost model's time
    (``ncclTopoGetAlgoTime``) of the last algorithm choice ``ncclPrepareTasks`` made, -1.0 when the group planned
    no collective (p2p operations are not estimated, nor is an inner group's end)."""
    estimated_time: float


def group_end(*, simulate: bool = False) -> GroupSimInfo | None:
    """``ncclGroupEnd``: close a group; the outermost one launches every communicator that queued work
    (``groupLaunch``), and forgets them even if one fails (``groupCleanup``).  ``simulate``:
    ``ncclGroupSimulateEnd``, nothing runs (``groupLaunch`` with a simInfo prepares the tasks, launches none)."""
    comms = _pending()
    if _state.depth == 0:
        raise RuntimeError("group_end() without a matching group_start()")  # ncclInvalidUsage
    _state.depth -= 1
    if _state.depth:
        return GroupSimInfo(NCCL_UNDEF_FLOAT) if simulate else None
    _state.comms = []
    if simulate:
        estimated = NCCL_UNDEF_FLOAT
        for comm in comms:
            t = comm.group_simulate()
            estimated = estimated if t is None else t
        return GroupSimInfo(estimated)
    first = None
    for comm in comms:
        try:
            comm.group_launch()
        except BaseException as exc:  # noqa: BLE001 - every communicator's queue is dealt with, then raise
            first = first or exc
    if first is not None:
        raise first
    return None


@contextlib.contextmanager
def group() -> Iterator[None]:
    """``with group():`` is ``group_start()`` ... ``group_end()``; an exception inside drops the queued work."""
    group_start()
    try:
        yield
    except BaseException:
        _state.depth -= 1
        if _state.depth == 0:
            for comm in _state.comms:
                comm.group_abandon()
            _state.comms = []
        raise
    group_end()


def enqueue(comm) -> None:
    """A communicator queued work: remember it for the group's end (``ncclGroupCommJoin``); outside a group the
    operation is its own group."""
    comms = _pending()
    if comm not in comms:
        comms.append(comm)
    if _state.depth == 0:
        group_start()
        group_end()
