"""nccl-lab: NCCL's collectives, reimplemented in Python for reading, running and measuring.

    import collectives
    with collectives.Communicator() as comm:          # under mpirun or collectives.job.spawn
        out = comm.all_reduce(x, op="sum")

Mirrors ``ncclGetUniqueId`` / ``ncclCommInitRank`` / ``ncclAllReduce`` ... / ``ncclCommDestroy``, and takes the
forms of NCCL's own Python binding, nccl4py (``import collectives as nccl`` in place of ``import nccl.core as
nccl``): ``get_unique_id()``, ``Communicator.init(nranks=, rank=, unique_id=)``, ``allreduce(sendbuf, recvbuf,
nccl.SUM)``, ``destroy()``; point-to-point ``send(buf, peer)`` / ``recv(buf, peer)``, grouped with ``with
collectives.group():`` or ``group_start()`` / ``group_end()`` (``ncclGroupStart`` / ``ncclGroupEnd``); ``all_to_all``,
``gather`` and ``scatter`` over them; ``Communicator.split(color, key)`` (``ncclCommSplit``).

The package's folders mirror NCCL's ``src/``: ``misc/`` and ``include/`` (``src/misc``, ``src/include``), ``device/``
and ``graph/``, the core at the root; ``perf/`` is the nccl-tests runner and ``tools/`` the other command lines.
The public names are imported on first use (PEP 562), so that a module of ``misc/`` or ``include/``, which the
transports import, or a launcher that needs only ``job``, does not import the communicator with them.
"""

__all__ = ["Communicator", "CollectiveError", "UniqueId", "get_unique_id", "DTYPES", "OPS", "SUM", "PROD", "MAX",
           "MIN", "AVG", "group", "group_start", "group_end", "GroupSimInfo"]


def __getattr__(name: str):
    if name in ("SUM", "PROD", "MAX", "MIN", "AVG"):
        from . import api as module
    elif name in ("UniqueId", "get_unique_id"):
        from . import bootstrap as module
    elif name in ("group", "group_start", "group_end", "GroupSimInfo"):
        from . import groups as module
    elif name == "Communicator":
        from . import comm as module
    elif name == "CollectiveError":
        from .device import common as module
    elif name in ("DTYPES", "OPS"):
        from .device import reduce_copy as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(module, name)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
