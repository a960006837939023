"""nccl-lab: NCCL's collectives, reimplemented in Python for reading, running and measuring.

    import collectives
    with collectives.Communicator() as comm:          # under mpirun or collectives.launch.spawn
        out = comm.all_reduce(x, op="sum")

Mirrors ``ncclGetUniqueId`` / ``ncclCommInitRank`` / ``ncclAllReduce`` ... / ``ncclCommDestroy``.
"""
from .bootstrap import UniqueId, get_unique_id
from .comm import Communicator
from .device.common import CollectiveError
from .device.reduce_copy import DTYPES, OPS

__all__ = ["Communicator", "CollectiveError", "UniqueId", "get_unique_id", "DTYPES", "OPS"]
