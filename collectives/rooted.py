"""Gather and Scatter as NCCL 2.30 has them natively (``src/collectives.cc``: ``ncclGather``, ``ncclScatter``;
``src/enqueue.cc``: the ``ncclFuncGather`` / ``ncclFuncScatter`` branches of ``ncclEnqueueCheck``'s task append):
not a ring algorithm but a group of sends and receives around the root.

* Gather: every rank sends its ``count`` elements to the root; the root receives rank r's into ``recvbuff + r *
  count``, itself included.  In place: ``sendbuff == recvbuff + root * count`` on the root (the send to itself then
  moves nothing).  A non-root rank's ``recvbuff`` is never touched.
* Scatter: the root sends ``sendbuff + r * count`` to rank r, itself included; every rank receives ``count``
  elements from the root.  In place: ``recvbuff == sendbuff + root * count`` on the root.
* ``count == 0`` is discarded (after the argument checks); one rank copies (``ncclLaunchOneRank``).

Both forms, as the other calls (``collectives/api.py``):

* ours: ``gather(x, root=0, out=None)`` returns the gathered array on the root (``x``'s concatenated along the
  first axis), and on the others ``out`` untouched or, without one, zeros (as ``reduce``); ``scatter(x, root=0,
  out=None)`` takes an ``x`` of ``nranks * count`` elements on every rank (only the root's is read, as
  ``broadcast``'s buffer) and returns this rank's share;
* nccl4py's (``bindings/nccl4py/nccl/core/communicator.py``): ``gather(sendbuf, recvbuf, root=None)`` (``recvbuf``
  ignored off the root, may be ``None``; no root: an AllGather, as nccl4py's) and ``scatter(sendbuf, recvbuf,
  root)`` (count from ``recvbuf``; ``sendbuf`` ignored off the root, may be ``None``; on the root ``sendbuf.size
  // nranks`` must equal ``recvbuf.size`` and be at least 1, as nccl4py checks).

Deliberate difference: CPU device only (the lab's sends and receives are), and no buffer registration.
"""
from __future__ import annotations

import numpy as np

from . import groups
from .api import Collectives, buffers, check_overlap, check_send, gathered_shape, is_array, scattered_shape


def check_recv(name: str, out, device=None) -> np.ndarray:
    """A receive buffer checked on its own (nccl4py's scatter on a non-root rank has no send buffer to compare
    it with): an array of a supported dtype, C-contiguous and writable."""
    out = check_send(name, out, device)
    if not getattr(out.flags, "writeable", True):
        raise ValueError(f"{name}: the receive buffer must be a writable, C-contiguous array")
    return out


def rooted_args(name: str, rest: tuple, nccl4py: bool, out, root):
    """The positional arguments after the send buffer, in either form: nccl4py's ``(recvbuf[, root])`` or ours
    ``(root)``; returns (out, root), each given at most once."""
    if len(rest) > 2 or (rest and not nccl4py and len(rest) > 1):
        raise TypeError(f"{name}: too many positional arguments")
    if nccl4py:
        if out is not None:
            raise TypeError(f"{name}: the receive buffer is given twice (positionally and as out=)")
        out, rest = rest[0], rest[1:]
    if rest:
        if root is not None:
            raise TypeError(f"{name}: root given twice")
        root = rest[0]
    return out, root


class GatherScatter(Collectives):
    """``ncclGather`` and ``ncclScatter`` over the communicator's ``send`` / ``recv`` (``p2pTaskAppend``)."""

    def gather(self, send: np.ndarray, *rest, root: int | None = None,
               out: np.ndarray | None = None) -> np.ndarray | None:
        """Every rank's ``send`` to ``root``, rank r's at block r of the root's result (see the module)."""
        n, rank = self.nranks, self.rank
        nccl4py = bool(rest) and (is_array(rest[0]) or rest[0] is None)
        out, root = rooted_args("gather", rest, nccl4py, out, root)
        if nccl4py and root is None:  # nccl4py: no root is an AllGather
            return self.all_gather(send, out)
        root = 0 if root is None else root
        self._check_root(root)
        send = check_send("gather", send, self.device)
        shape = gathered_shape(send.shape, n)
        if rank == root:
            flat, recv, result = buffers("gather", send, out, send.size * n, shape, device=self.device)
            check_overlap("gather", "Gather", rank, flat, recv)
        else:  # NCCL never touches a non-root rank's recvbuff
            flat, recv = send.reshape(-1), None
            result = out if out is not None or nccl4py else buffers("gather", send, None, send.size * n, shape,
                                                                     zero=True, device=self.device)[2]
        self._check()
        count = flat.size
        if count == 0:
            return result  # NCCL discards an empty collective
        if n == 1:  # ncclLaunchOneRank
            recv[...] = flat
            return result
        with groups.group():  # joins the caller's group if one is open, as NCCL's tasks do
            self.send(flat, root)
            if rank == root:
                for r in range(n):
                    self.recv(recv[r * count:(r + 1) * count], r)
        return result

    def scatter(self, send: np.ndarray | None, *rest, root: int | None = None,
                out: np.ndarray | None = None) -> np.ndarray:
        """Block r of the root's ``send`` to rank r (see the module)."""
        n, rank = self.nranks, self.rank
        nccl4py = bool(rest) and is_array(rest[0])
        out, root = rooted_args("scatter", rest, nccl4py, out, root)
        if nccl4py and root is None:
            raise TypeError("scatter: root is required (nccl4py's scatter(sendbuf, recvbuf, root))")
        root = 0 if root is None else root
        self._check_root(root)
        if nccl4py:
            recv = check_recv("scatter", out, self.device)
            count, result = recv.size, recv
            flat = None
            if rank == root:
                send = check_send("scatter", send, self.device)
                if send.dtype != recv.dtype:
                    raise TypeError(f"scatter: receive buffer dtype {recv.dtype} differs from send buffer dtype "
                                    f"{send.dtype}")
                if send.size // n < 1:
                    raise ValueError(f"scatter: the send buffer must have at least {n} elements (nranks), got "
                                     f"{send.size}")
                if send.size // n != count:
                    raise ValueError(f"scatter: the receive buffer must have exactly {send.size // n} elements "
                                     f"(sendcount / nranks), got {count}")
                flat = send.reshape(-1)
        else:
            send = check_send("scatter", send, self.device)
            if send.size % n:
                raise ValueError(f"scatter: send size {send.size} is not a multiple of nranks {n}")
            count = send.size // n
            flat, recv, result = buffers("scatter", send, out, count, scattered_shape(send.shape, count, n),
                                         device=self.device)
        recv = recv.reshape(-1)
        if rank == root:
            check_overlap("scatter", "Scatter", rank, flat, recv)
        self._check()
        if count == 0:
            return result  # NCCL discards an empty collective
        if n == 1:  # ncclLaunchOneRank
            recv[...] = flat[:count]
            return result
        with groups.group():
            if rank == root:
                for r in range(n):
                    self.send(flat[r * count:(r + 1) * count], r)
            self.recv(recv, root)
        return result
