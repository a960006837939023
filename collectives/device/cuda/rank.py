"""One rank of a communicator on a GPU device, in its own process (NCCL ``src/enqueue.cc``: ``ncclLaunchKernel``;
``src/device/common.h``: ``ncclKernelMain``; the connections are ``transports/p2p.py``'s).  The communicator hands it
each call's task (``collectives/task.py``: the plan ``enqueue.schedule_coll`` made, its chunk and slice steps); this
module schedules nothing itself.

The communicator builds this when ``--device``/``NCCLLAB_DEVICE`` is ``cuda`` or ``cudasim``.  At init it numbers
the node's connections (``layout.connection_tables``: every rank derives the same numbering from the rings and
trees), which sizes the P2P pool; after the transports have connected it takes its views of that pool.  A
collective is the communicator's own plan (the cost model's algorithm and protocol, ``schedule_coll``'s channels
and chunks) launched as this rank's persistent kernel: one block per channel.  The kernel works in the caller's
buffers; a wait that runs past ``NCCLLAB_TIMEOUT`` writes the pool's abort record, which every rank's kernel
watches, so all ranks stop and raise the same one-line error.
LL128 runs when ``NCCL_PROTO`` names it (the cost model keeps it off otherwise, as NCCL's default rule does on
the lab's CPU topology); its FIFO rows are allocated only then.  The block size is NCCL's (``block_threads``:
``topoGetAlgoInfo``'s nWarps, which the plan carries); before the first launch on a GPU, ``occupancy.check_launch`` refuses in one line
a kernel whose blocks cannot all be resident at once.
Deliberate difference: one node only (the kernels have no NET proxy).
"""
from __future__ import annotations

import numpy as np

from collectives.include.device import NCCL_MAX_NTHREADS, WARP_SIZE
from collectives.misc.param import env_int

from ..backend import Device, DeviceError
from ..common import CollectiveError


def block_threads(plan) -> int:
    """The block size NCCL launches ``plan`` with: ``topoGetAlgoInfo``'s nWarps (``Plan.n_warps``) x 32, at most
    NCCL_MAX_NTHREADS."""
    return min(NCCL_MAX_NTHREADS, plan.n_warps * WARP_SIZE)


class GpuRank:
    @classmethod
    def for_comm(cls, comm) -> "GpuRank | None":
        """This rank's GPU side, made once the communicator has its channels; None on the CPU or alone."""
        if comm.device.name == "cpu" or comm.nranks == 1:
            return None
        comm.device.select(comm.local_rank)  # before any allocation: the pool, the tables, the staging
        buff = dict(comm.buff_sizes)
        if not any(row.get("LL128") is True for row in comm.cost_model.proto_enable.values()):
            buff["LL128"] = 0  # no LL128 FIFO rows: NCCL_PROTO does not name LL128, so nothing will run it
        return cls(comm.device, comm.rank, comm.nranks, comm.rings, comm.trees, comm.nchannels, buff)

    def __init__(self, device: Device, rank: int, nranks: int, rings: list, trees: list, nchannels: int,
                 buff_sizes: dict):
        # numba.cuda is imported only now that the device is chosen: the simulator is decided at its first import
        from .layout import connection_tables, launch_memory, pool_layout
        self.dev, self.rank, self.n, self.nch = device, rank, nranks, nchannels
        tables = connection_tables(rings, trees, nranks, nchannels)
        self.layout = pool_layout(len(tables.ids), buff_sizes)
        self.nthreads = env_int("NCCLLAB_SIM_THREADS", 4) if device.name == "cudasim" else None
        # this rank's staging and barriers (LL128: a warp per simulated thread, else NCCL's 20 warps of 640)
        self.mem = launch_memory(device, tables, 1, nchannels, buff_sizes, self.nthreads or 20)
        self.pool: dict | None = None
        self.checked: set = set()  # the kernels whose residency was checked (once each)

    def bind(self, pool, channels: list) -> None:
        """The pool the P2P transport opened; every connection must be P2P (the kernels have no other)."""
        for ch in channels:
            for conn in [*ch.send_to.values(), *ch.recv_from.values()]:
                if not conn.transport.startswith("P2P"):
                    raise DeviceError(f"rank {self.rank}: --device {self.dev.name} connects ranks through P2P only, "
                                     f"but channel {ch.id} reaches rank {conn.peer} via {conn.transport} (ranks on "
                                     f"several nodes, or NCCL_P2P_DISABLE=1): run those on --device cpu")
        if pool is None:
            raise DeviceError(f"rank {self.rank}: --device {self.dev.name} has no P2P pool (one rank alone?)")
        self.pool = self.layout.views(pool)

    def run(self, task, send, recv, op_count: int) -> None:
        """Launch ``task`` on this rank; ``send``/``recv`` are its buffers (numpy in the simulator, device arrays
        on a GPU)."""
        from .call import abort_line, kernel_args, make_call
        plan, func, d, p = task.plan, task.func, self.dev, self.pool
        call = make_call(func, send.dtype, task.op, self.n, task.root, plan, (task.chunk_steps, task.slice_steps),
                         self.nthreads or block_threads(plan), rank_lo=self.rank)
        staged = d.name == "cuda" and isinstance(recv, np.ndarray)  # numpy on a GPU: copy in, run, copy back
        if staged:  # pragma: no cover - needs a GPU
            # staged as the kernel's element type: cupy has no bfloat16 (its bits go up as uint16)
            recv_host = recv
            send, recv = (d.to_device(staged_view(x, call.kdt)) for x in (send, recv))
        inp, out = (self._buffer(x, call.kdt) for x in (send, recv))
        self.mem.bars[:] = 0
        args = [d.to_device(call.prm), *kernel_args(call, self.mem, p, inp, out, d.to_device)]
        if d.name == "cudasim":
            call.kernel[1, call.nch * call.nthreads](*args)
        else:  # pragma: no cover - needs a GPU
            from numba import cuda
            from .occupancy import check_launch
            d.cp.cuda.get_current_stream().synchronize()  # the copies and resets above, once for all arguments
            args = [cuda.as_cuda_array(a, sync=False) for a in args]
            key = (id(call.kernel), call.nch, call.nthreads)
            if key not in self.checked:  # every block of this rank's kernel resident at once (other processes'
                # kernels time-slice with it, without MPS: they need not fit beside it)
                check_launch(call.kernel, args, call.nch, call.nthreads, f"rank {self.rank}")
                self.checked.add(key)
            call.kernel[call.nch, call.nthreads](*args)
            d.synchronize()
            if staged:
                staged_view(recv_host, call.kdt)[...] = d.to_host(recv)
        abort = np.asarray(d.to_host(p["abort"]))
        if abort[0]:
            raise CollectiveError(abort_line(func, op_count, abort))

    def _buffer(self, arr, kdt):
        """A user buffer as the kernel's ``[1, elements]`` row, in place (no copy)."""
        if isinstance(arr, np.ndarray):
            return self.dev.wrap(arr.reshape(-1).view(kdt).reshape(1, -1))
        return self.dev.to_device(arr).reshape(-1).view(kdt).reshape(1, -1)  # pragma: no cover - needs a GPU


def staged_view(host: np.ndarray, kdt) -> np.ndarray:
    """A host buffer as the kernel's flat row of ``kdt`` (bfloat16 as its uint16 bits, bytes for AllGather and
    Broadcast), without a copy: what goes up to the GPU and what comes back into."""
    return host.reshape(-1).view(kdt)
