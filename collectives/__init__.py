"""nccl-lab: NCCL's collectives, reimplemented in Python for reading, running and measuring.

    import collectives
    with collectives.Communicator() as comm:          # under mpirun or collectives.launch.spawn
        out = comm.all_reduce(x, op="sum")

Mirrors ``ncclGetUniqueId`` / ``ncclCommInitRank`` / ``ncclAllReduce`` ... / ``ncclCommDestroy``, and takes the
forms of NCCL's own Python binding, nccl4py (``import collectives as nccl`` in place of ``import nccl.core as
nccl``): ``get_unique_id()``, ``Communicator.init(nranks=, rank=, unique_id=)``, ``allreduce(sendbuf, recvbuf,
nccl.SUM)``, ``destroy()``.  No point-to-point (send/recv), all-to-all, groups or split yet.
"""
from .api import AVG, MAX, MIN, PROD, SUM
from .bootstrap import UniqueId, get_unique_id
from .comm import Communicator
from .device.common import CollectiveError
from .device.reduce_copy import DTYPES, OPS

__all__ = ["Communicator", "CollectiveError", "UniqueId", "get_unique_id", "DTYPES", "OPS", "SUM", "PROD", "MAX",
           "MIN", "AVG"]
