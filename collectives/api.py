"""The public calls' arguments (NCCL ``src/collectives.cc``: ``ncclAllReduce`` & co., whose ``ncclEnqueueCheck``
checks buffers and counts), in the two forms users bring:

* ours, keyword style: ``all_reduce(x, op="sum", out=None)``, ``reduce(x, root=0, op="sum", out=None)``,
  ``broadcast(buf, root=0, out=None)``, returning the result with the input's shape;
* nccl4py's (``bindings/nccl4py/nccl/core/communicator.py``), buffers first: ``allreduce(sendbuf, recvbuf, op)``,
  ``allgather(sendbuf, recvbuf)``, ``reduce_scatter(sendbuf, recvbuf, op)``, ``broadcast(sendbuf, recvbuf, root)``,
  ``reduce(sendbuf, recvbuf, op, root=None)`` (no root: an AllReduce, as nccl4py's), with ``SUM`` ... ``AVG``.

The second positional argument tells the forms apart: an array is nccl4py's receive buffer.

Buffers are numpy arrays; on ``--device cuda`` also any CUDA array (``__cuda_array_interface__``: cupy, numba,
torch; or DLPack), taken without a copy as the device layer's array (cupy).  The simulator's memory is host memory:
numpy there.

Buffers that share bytes are refused (``check_overlap``), except the exact in-place form of each collective.  NCCL
leaves a partial overlap undefined, and it is silently wrong: a receive buffer shifted by one element from the send
buffer is overwritten before the ring has read it.  The lab never returns a wrong result, so it refuses.
"""
from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from collectives.misc.futex import address

from . import groups
from .device.reduce_copy import dtype_name

SUM, PROD, MAX, MIN, AVG = "sum", "prod", "max", "min", "avg"  # nccl4py's names for ncclRedOp_t


DLPACK_ON_GPU = (2, 3, 13)  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged


def on_gpu(x) -> bool:
    """An array in CUDA memory: the CUDA array interface, or DLPack naming a CUDA device."""
    try:
        if hasattr(x, "__cuda_array_interface__"):
            return True
        return hasattr(x, "__dlpack_device__") and x.__dlpack_device__()[0] in DLPACK_ON_GPU
    except Exception:  # e.g. torch refuses the interface for a tensor that requires grad: not usable as is
        return False


def is_array(x) -> bool:
    """A buffer: numpy, or an array in CUDA memory."""
    return isinstance(x, np.ndarray) or on_gpu(x)


def buffer_first(name: str, rest: tuple, out, value, default):
    """``(recvbuf, value)`` positionally (nccl4py) or ``(value,)`` with ``out=`` (ours) -> (out, value)."""
    rest = list(rest)
    if rest and is_array(rest[0]) or (rest and rest[0] is None and len(rest) > 1):
        if out is not None:
            raise TypeError(f"{name}: the receive buffer is given twice (positionally and as out=)")
        out = rest.pop(0)
    if len(rest) > 1:
        raise TypeError(f"{name}: too many positional arguments")
    if rest:
        if value is not None:
            raise TypeError(f"{name}: {rest[0]!r} given twice")
        value = rest[0]
    return out, default if value is None else value


def on_device(name: str, arr, device):
    """A GPU array as the device layer's array (no copy), or numpy as it is."""
    if isinstance(arr, np.ndarray) or not is_array(arr):
        return arr
    if device is None or not device.is_gpu:
        where = device.name if device is not None else "cpu"
        raise TypeError(f"{name}: a {type(arr).__name__} lives on a GPU, and this communicator runs on --device "
                        f"{where}: pass numpy, or use --device cuda")
    arr = device.to_device(arr)
    if arr.device.id != device.cp.cuda.runtime.getDevice():  # as NCCL's pointer check: this rank's GPU only
        raise ValueError(f"{name}: the buffer is on GPU {arr.device.id}, this rank runs on GPU "
                         f"{device.cp.cuda.runtime.getDevice()}")
    return arr


def check_send(name: str, send, device=None):
    send = on_device(name, send, device)
    if not is_array(send):
        raise TypeError(f"{name}: expected a numpy array, got {type(send).__name__}"
                        + (" (use np.asarray(...) with a dtype)" if isinstance(send, (list, tuple)) else ""))
    dtype_name(send.dtype)  # raises for unsupported types, naming the valid ones
    if not send.flags.c_contiguous:
        raise ValueError(f"{name}: the send buffer must be C-contiguous (np.ascontiguousarray)")
    return send


def buffers(name: str, send, out, out_count: int, out_shape: tuple, zero: bool = False, device=None
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(flat send, flat receive of ``out_count`` elements, what the call returns), for a send buffer that passed
    ``check_send``.  Without ``out`` the result is a new array of ``out_shape`` (zeroed when ``zero``: a non-root
    rank's Reduce output, never written), where the send buffer lives."""
    if out is None:
        host = isinstance(send, np.ndarray)
        out = (np.zeros if zero else np.empty)(out_shape, dtype=send.dtype) if host else \
            (device.zeros if zero else device.empty)(out_shape, send.dtype)
    out = on_device(name, out, device)
    if not is_array(out) or not out.flags.c_contiguous or not getattr(out.flags, "writeable", True):
        raise ValueError(f"{name}: the receive buffer must be a writable, C-contiguous array")
    if isinstance(out, np.ndarray) != isinstance(send, np.ndarray):
        raise TypeError(f"{name}: the send and receive buffers must both be on the host or both on the GPU")
    if out.dtype != send.dtype:
        raise TypeError(f"{name}: receive buffer dtype {out.dtype} differs from send buffer dtype {send.dtype}")
    if out.size < out_count:
        raise ValueError(f"{name}: the receive buffer has {out.size} elements, needs {out_count}")
    return send.reshape(-1), out.reshape(-1)[:out_count], out


@numba.njit(cache=True)
def _host_starts(send, recv):
    """Where two host arrays' data start: 0.4 us where ``address`` twice costs 4 (a dict per
    ``__array_interface__``), which was a third of an 8-byte AllReduce's host time."""
    return send.ctypes.data, recv.ctypes.data


_NUMBA_TYPES = {np.dtype(t) for t in (np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64, np.float32,
                                      np.float64)}  # what numba takes as array elements (not float16, bfloat16)


def extents(send, recv) -> tuple[tuple[int, int], tuple[int, int]]:
    """``extent`` of both buffers of a call, the fast way for host arrays numba can type."""
    if send.__class__ is np.ndarray and recv.__class__ is np.ndarray and send.dtype in _NUMBA_TYPES \
            and send.dtype == recv.dtype and send.ndim == 1 and recv.ndim == 1:
        s0, r0 = _host_starts(send, recv)
        return (s0, s0 + send.nbytes), (r0, r0 + recv.nbytes)
    return extent(send), extent(recv)


def extent(arr) -> tuple[int, int]:
    """The bytes a C-contiguous buffer spans, [start, end): host memory, or device memory for a CUDA array (its
    device pointer; two device ranges are compared only with each other, never with host ones)."""
    start = address(arr)
    return start, start + arr.nbytes


def check_overlap(name: str, func: str, rank: int, send, recv) -> None:
    """Refuse a send and a receive buffer (the flat views the kernel reads and writes) that share bytes, unless the
    call is exactly in place as NCCL defines it for ``func``: AllGather's (and the root's Gather's) send buffer is
    this rank's block of the receive buffer (``recv + rank * count``); ReduceScatter's (and the root's Scatter's)
    receive buffer is this rank's block of the send buffer (``send + rank * recvcount``); the others' receive buffer is the send buffer itself.  Checked on every
    rank before anything is enqueued, so the refusal is the same everywhere and the communicator stays usable."""
    (s0, s1), (r0, r1) = extents(send, recv)
    if s0 >= r1 or r0 >= s1 or s0 == s1 or r0 == r1:
        return  # disjoint (or nothing to move)
    if func in ("AllGather", "Gather"):  # Gather: checked on the root alone, so rank is the root
        exact = s0 == r0 + rank * send.nbytes
        rule = f"the send buffer is this rank's block of the receive buffer (recvbuff + {rank} * count)"
    elif func == "AlltoAll":
        exact, rule = False, "AlltoAll has no in-place form"
    elif func in ("ReduceScatter", "Scatter"):
        exact = r0 == s0 + rank * recv.nbytes
        rule = f"the receive buffer is this rank's block of the send buffer (sendbuff + {rank} * recvcount)"
    else:
        exact = s0 == r0 and s1 == r1
        rule = "the receive buffer is the send buffer"
    if not exact:
        raise ValueError(f"{name}: the send buffer [{s0:#x}, {s1:#x}) and the receive buffer [{r0:#x}, {r1:#x}) "
                         f"overlap, and the call is not in place ({rule}): use disjoint buffers or exactly that")


def gathered_shape(shape: tuple, nranks: int) -> tuple:
    """AllGather's result: the ranks' inputs concatenated along the first axis."""
    return (nranks * shape[0], *shape[1:]) if shape else (nranks,)


def scattered_shape(shape: tuple, count: int, nranks: int) -> tuple:
    """ReduceScatter's result: one rank's share of the first axis when it divides, else flat."""
    return (shape[0] // nranks, *shape[1:]) if shape and shape[0] % nranks == 0 else (count,)


class Checked(NamedTuple):
    """An all_reduce's arguments as given (``op`` may be None), what the call returns, and its prepared launch
    (``task.Launch``: the flat buffers, the task, the compiled form)."""
    send: np.ndarray
    out: np.ndarray
    shape: tuple
    dtype: np.dtype
    op: str | None
    result: np.ndarray
    launch: object


class Collectives:
    """The public calls of a communicator (``ncclAllReduce``, ``ncclAllGather``, ``ncclReduceScatter``,
    ``ncclBroadcast``, ``ncclReduce``), in both forms; each checks its buffers and hands a flat send and receive
    buffer to the communicator's ``_launch`` (``ncclEnqueueCheck``)."""
    nranks: int
    rank: int
    device = None  # the device layer (``collectives/device/backend.py``); set by the communicator

    @classmethod
    def init(cls, nranks: int, rank: int, unique_id, config=None):
        """nccl4py's ``Communicator.init(nranks=, rank=, unique_id=)`` (``ncclCommInitRank``)."""
        return cls(unique_id, nranks, rank)

    _checked = None  # the last all_reduce's checked buffers (a ``Checked``)

    def all_reduce(self, send: np.ndarray, *rest, op: str | None = None, out: np.ndarray | None = None) -> np.ndarray:
        last = self._checked
        if last is not None and last.send is send and last.out is out and not rest and send.shape == last.shape \
                and send.dtype is last.dtype and op == last.op and out.flags.writeable:  # the same arrays: checked
            self._relaunch(last.launch)
            return last.result
        given_out, given_op = out, op
        out, op = buffer_first("all_reduce", rest, out, op, "sum")
        send = check_send("all_reduce", send, self.device)
        flat, recv, result = buffers("all_reduce", send, out, send.size, send.shape, device=self.device)
        check_overlap("all_reduce", "AllReduce", self.rank, flat, recv)
        launch = self._launch("AllReduce", flat, recv, flat.size, op, -1)
        if launch is not None and not rest and given_out is not None and isinstance(send, np.ndarray):
            # A training loop or a benchmark passes the same two arrays every call.  An array object's data and
            # size cannot move while we hold it (numpy refuses to resize a referenced array), so the checks and
            # the prepared launch (task, placement, compiled form) hold for the same objects, shape, dtype and op;
            # writability is looked at again.  NCCL checks pointers only with NCCL_CHECK_POINTERS=1.  Saves about
            # half of an 8-byte AllReduce's host time here.
            self._checked = Checked(send, given_out, send.shape, send.dtype, given_op, result, launch)
        return result

    def all_gather(self, send: np.ndarray, *rest, out: np.ndarray | None = None) -> np.ndarray:
        out, _ = buffer_first("all_gather", rest, out, None, None)
        send = check_send("all_gather", send, self.device)
        shape = gathered_shape(send.shape, self.nranks)
        flat, recv, result = buffers("all_gather", send, out, send.size * self.nranks, shape, device=self.device)
        check_overlap("all_gather", "AllGather", self.rank, flat, recv)
        self._launch("AllGather", flat, recv, flat.size, "sum", -1)
        return result

    def reduce_scatter(self, send: np.ndarray, *rest, op: str | None = None,
                       out: np.ndarray | None = None) -> np.ndarray:
        out, op = buffer_first("reduce_scatter", rest, out, op, "sum")
        send = check_send("reduce_scatter", send, self.device)
        if send.size % self.nranks:
            raise ValueError(f"reduce_scatter: send size {send.size} is not a multiple of nranks {self.nranks}")
        count = send.size // self.nranks
        shape = scattered_shape(send.shape, count, self.nranks)
        flat, recv, result = buffers("reduce_scatter", send, out, count, shape, device=self.device)
        check_overlap("reduce_scatter", "ReduceScatter", self.rank, flat, recv)
        self._launch("ReduceScatter", flat, recv, count, op, -1)
        return result

    def broadcast(self, buf: np.ndarray, *rest, root: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
        out, root = buffer_first("broadcast", rest, out, root, 0)
        self._check_root(root)
        buf = check_send("broadcast", buf, self.device)
        flat, recv, result = buffers("broadcast", buf, buf if out is None else out, buf.size, buf.shape,
                                     device=self.device)
        check_overlap("broadcast", "Broadcast", self.rank, flat, recv)
        self._launch("Broadcast", flat, recv, flat.size, "sum", root)
        return result

    def reduce(self, send: np.ndarray, *rest, root: int | None = None, op: str | None = None,
               out: np.ndarray | None = None) -> np.ndarray:
        """``reduce(x, root=0, op="sum")``, or nccl4py's ``reduce(sendbuf, recvbuf, op, root=None)`` where no root
        means AllReduce.  A non-root rank's receive buffer is left as it was, as NCCL leaves it."""
        if rest and is_array(rest[0]):  # nccl4py: (recvbuf, op[, root])
            if len(rest) > 3:
                raise TypeError("reduce: too many positional arguments")
            out, op, root = rest[0], rest[1] if len(rest) > 1 else op, rest[2] if len(rest) > 2 else root
            if root is None:
                return self.all_reduce(send, out, op or "sum")
        elif rest:  # ours: (root[, op])
            if len(rest) > 2:
                raise TypeError("reduce: too many positional arguments")
            root, op = rest[0], rest[1] if len(rest) > 1 else op
        root, op = 0 if root is None else root, op or "sum"
        self._check_root(root)
        send = check_send("reduce", send, self.device)
        flat, recv, result = buffers("reduce", send, out, send.size, send.shape, zero=self.rank != root,
                                     device=self.device)
        check_overlap("reduce", "Reduce", self.rank, flat, recv)
        self._launch("Reduce", flat, recv, flat.size, op, root)
        return result

    def all_to_all(self, send: np.ndarray, *rest, out: np.ndarray | None = None) -> np.ndarray:
        """``ncclAlltoAll``: block q of this rank's ``send`` (``send.size / nranks`` elements) goes to rank q, and
        block q of the result comes from rank q.  As NCCL enqueues it: a send and a recv per rank, self included,
        in one group (joining the caller's group if one is open); one rank copies."""
        out, _ = buffer_first("all_to_all", rest, out, None, None)
        send = check_send("all_to_all", send, self.device)
        if send.size % self.nranks:
            raise ValueError(f"all_to_all: send size {send.size} is not a multiple of nranks {self.nranks}")
        flat, recv, result = buffers("all_to_all", send, out, send.size, send.shape, device=self.device)
        check_overlap("all_to_all", "AlltoAll", self.rank, flat, recv)
        count = flat.size // self.nranks
        if count == 0:
            return result  # NCCL discards an empty collective
        if self.nranks == 1:  # ncclLaunchOneRank
            self._check()
            recv[...] = flat
            return result
        with groups.group():
            for r in range(self.nranks):
                self.send(flat[r * count:(r + 1) * count], r)
                self.recv(recv[r * count:(r + 1) * count], r)
        return result

    def send(self, buf: np.ndarray, peer: int) -> None:
        """``ncclSend`` (nccl4py's ``send(sendbuf, peer)``): the bytes of ``buf`` to ``peer``, whose ``recv`` of as
        many bytes matches it.  Inside a group it is queued until the group ends; outside, it returns once sent."""
        self._enqueue_p2p(True, p2p_bytes("send", buf, self.nranks, peer, writeable=False), peer)

    def recv(self, buf: np.ndarray, peer: int) -> None:
        """``ncclRecv`` (nccl4py's ``recv(recvbuf, peer)``): ``buf`` receives the bytes ``peer`` sends."""
        self._enqueue_p2p(False, p2p_bytes("recv", buf, self.nranks, peer, writeable=True), peer)

    allreduce, allgather, alltoall = all_reduce, all_gather, all_to_all  # nccl4py's names


def p2p_bytes(name: str, buf, nranks: int, peer: int, writeable: bool) -> np.ndarray:
    """A send's or receive's buffer as its bytes (NCCL moves p2p data as int8): a contiguous numpy array, and
    a peer of the communicator."""
    if not isinstance(peer, (int, np.integer)) or not 0 <= peer < nranks:
        raise ValueError(f"{name}: peer {peer} out of range for nranks {nranks}")
    if not isinstance(buf, np.ndarray):
        raise TypeError(f"{name}: the buffer must be a numpy array, not {type(buf).__name__}")
    if not buf.flags.c_contiguous:
        raise ValueError(f"{name}: the buffer must be contiguous (NCCL takes a pointer and a count)")
    if writeable and not buf.flags.writeable:
        raise ValueError(f"{name}: the receive buffer is read-only")
    return buf.reshape(-1).view(np.uint8)
