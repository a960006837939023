"""Groups of operations (NCCL ``src/group.cc``: ``ncclGroupStart``, ``ncclGroupEnd`` → ``ncclGroupEndInternal`` →
``groupLaunch``; the per-thread ``ncclGroupDepth`` and list of communicators with pending work).

Between ``group_start()`` and ``group_end()`` (or inside ``with group():``) sends and receives are only queued on
their communicator; the outermost ``group_end`` launches every queued communicator: it connects the peers met
for the first time, then runs each communicator's p2p works in one kernel.  Outside a group, an operation is a
group of its own (``ncclEnqueueCheck`` wraps it in a group start and end), so it returns once its peer's matching
operation has run.
Where we differ on purpose: groups hold only point-to-point operations (a collective inside a group raises), and
the communicators of one group are launched one after another, which is enough when each process has one.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator

_state = threading.local()  # NCCL's thread_local ncclGroupDepth and ncclGroupCommHead


def _pending() -> list:
    if not hasattr(_state, "comms"):
        _state.depth, _state.comms = 0, []
    return _state.comms


def depth() -> int:
    """``ncclGroupDepth``: how many group starts are open on this thread."""
    _pending()
    return _state.depth


def group_start() -> None:
    """``ncclGroupStart``: open a group (groups nest; only the outermost end launches)."""
    _pending()
    _state.depth += 1


def group_end() -> None:
    """``ncclGroupEnd``: close a group; the outermost one launches every communicator that queued work
    (``groupLaunch``), and forgets them even if one fails (``groupCleanup``)."""
    comms = _pending()
    if _state.depth == 0:
        raise RuntimeError("group_end() without a matching group_start()")  # ncclInvalidUsage
    _state.depth -= 1
    if _state.depth:
        return
    _state.comms = []
    first = None
    for comm in comms:
        try:
            comm.group_launch()
        except BaseException as exc:  # noqa: BLE001 - every communicator's queue is dealt with, then raise
            first = first or exc
    if first is not None:
        raise first


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
