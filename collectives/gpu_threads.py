"""N ranks as threads of one process on one device, connected by direct pointers (nccl-tests' ``-g N`` in one
process; NCCL ``src/transport/p2p.cc``'s ``via P2P/direct pointer``: within one process a rank simply uses its
peer's device pointers).

``ThreadComm`` owns the connection memory of every channel's ring and tree edges, as NCCL's P2P write mode lays
it out: the FIFOs (Simple: ``NCCL_STEPS`` slots of ``NCCL_BUFFSIZE / 8``; LL: 16-byte lines) and the tail live
with the receiver, the head with the sender; each is one row of a pool, so a rank's kernel reaches its peer's
row directly.  A ring and a tree share the connector of the same (channel, sender, receiver), as in NCCL.
``run`` schedules the collective with ``enqueue.schedule_coll`` (the CPU path's split into channels and chunks)
and launches the kernel: on ``cuda`` one host thread per rank, each launching on its own stream; on ``cudasim``
one launch holding every rank (numba's simulator runs a single launch at a time; see ``kernel.py``).
The transport that selects P2P and prints NCCL's ``via P2P/...`` lines is the later ``transports/p2p.py``.
"""
from __future__ import annotations

import threading

import numpy as np

from . import enqueue
from collectives.device.common import CollectiveError
from collectives.graph.rings import ring_orders
from collectives.graph.trees import channel_trees
from misc.param import env_int, timeout_s

from collectives.device.backend import Device, get_device
from collectives.device.cuda import kernel as K
from collectives.device.cuda.layout import connection_tables, launch_memory, pool_layout
from collectives.device.cuda.call import abort_line, check, kernel_args, kernel_dtype, make_call
from transports import p2p


class ThreadComm:
    def __init__(self, nranks: int, nchannels: int = 1, device: Device | str | None = None,
                 rings: list[list[int]] | None = None, node_of: list[int] | None = None,
                 nthreads: int | None = None):
        """``node_of``: each rank's emulated node, which shapes the trees (one node: a chain)."""
        self.dev = device if isinstance(device, Device) else get_device(device)
        if not self.dev.name.startswith("cuda"):
            raise ValueError("ThreadComm runs kernels: device cuda or cudasim")
        self.n, self.nch = nranks, nchannels
        self.nthreads = nthreads or (env_int("NCCLLAB_SIM_THREADS", 4) if self.dev.name == "cudasim" else None)
        self.op_count = 0
        self.buff = {"Simple": env_int("NCCL_BUFFSIZE", 1 << 22), "LL": env_int("NCCL_LL_BUFFSIZE", 1 << 19),
                     "LL128": env_int("NCCL_LL128_BUFFSIZE", 4915200)}
        self.rings = ring_orders(nranks, nchannels, rings, node_of)
        self.trees = channel_trees(self.rings, node_of or [0] * nranks)[:nchannels]
        self._connect()

    # --- connection memory (NCCL: p2pSendSetup / p2pRecvSetup allocate it, the peers exchange pointers) ---
    def _connect(self) -> None:
        t = connection_tables(self.rings, self.trees, self.n, self.nch)
        self.conn_ids = t.ids
        self.mem = launch_memory(self.dev, t, self.n, self.nch, self.buff)
        layout = pool_layout(len(t.ids), self.buff)
        self.pool = layout.views(self.dev.zeros(layout.nbytes, np.uint8))  # one process: peers' rows by pointer
        for (c, src, dst) in t.ids:  # in channel order
            p2p.log_connection(c, src, src, dst, dst, "direct pointer")

    # --- one collective ---
    def run(self, func: str, inputs: list, op: str = "sum", root: int = 0, proto: str = "Simple",
            algo: str = "Ring", absent: tuple = ()) -> list[np.ndarray]:
        """Every rank's output (host numpy).  ``inputs``: each rank's send buffer (numpy, or device arrays on
        ``cuda``).  ``absent``: ranks whose kernel returns at once (the deadline test's peer that never posts)."""
        launch = self.prepare(func, inputs, op, root, proto, algo, absent)
        launch()
        return launch.outputs()

    def prepare(self, func: str, inputs: list, op: str = "sum", root: int = 0, proto: str = "Simple",
                algo: str = "Ring", absent: tuple = ()) -> "Launch":
        """Device buffers (outputs poisoned with 0xA5) and the launch arguments of one collective; calling the
        result runs it (again: the timing loop of scripts/gpu_check.py)."""
        check(func, proto, algo)
        n, d = self.n, self.dev
        host = [np.asarray(d.to_host(x)) for x in inputs]
        dtype, count = host[0].dtype, host[0].size
        out_count = {"AllGather": count * n, "ReduceScatter": count // n}.get(func, count)
        sched_count = count // n if func == "ReduceScatter" else count
        kdt = kernel_dtype(func, dtype)
        inp = d.to_device(np.stack([x.reshape(-1).view(np.uint8) for x in host]).view(kdt))
        out = d.to_device(np.full((n, out_count * dtype.itemsize), 0xA5, np.uint8).view(kdt))
        launch = Launch(self, func, dtype, out)
        if sched_count == 0:
            return launch
        t = enqueue.default_tuning(n, self.nch, self.buff)
        plan = enqueue.schedule_coll(t, func, sched_count, dtype.itemsize, algo, proto)
        call = make_call(func, dtype, op, n, root, plan, enqueue.chunk_slice_steps(plan), self.nthreads, 0, absent)
        launch.kernel, launch.prm, launch.nch, launch.nthreads = call.kernel, call.prm, call.nch, call.nthreads
        launch.args = kernel_args(call, self.mem, self.pool, inp, out, d.to_device)
        return launch

    def _launch_threads(self, launch: "Launch") -> None:  # pragma: no cover - needs a GPU
        """One host thread per rank, each launching its rank's kernel on its own stream (made once per prepared
        collective, so a timing loop measures the kernels, not the setup)."""
        from numba import cuda
        d = self.dev
        if launch.per_rank is None:
            local = {3, 4, 7, 8, 12}  # inputs, outputs, staging (2 views), barriers: row 0 is the rank's own
            launch.per_rank = []
            for r in range(self.n):
                stream = d.stream()
                p = launch.prm.copy()
                p[K.RANK_LO] = r
                args = [x[r:r + 1] if i in local else x for i, x in enumerate(launch.args)]
                args = [cuda.as_cuda_array(x, sync=False) for x in [d.to_device(p), *args]]
                launch.per_rank.append((stream, cuda.external_stream(stream.raw.ptr), args))
            d.synchronize()  # the parameter copies above, before any rank's stream uses them
        errors = []
        gpu = d.cp.cuda.runtime.getDevice()  # a new thread has no current device: give it this one

        def one(r: int) -> None:
            stream, nstream, args = launch.per_rank[r]
            try:
                d.cp.cuda.Device(gpu).use()
                cuda.select_device(gpu)
                launch.kernel[launch.nch, launch.nthreads, nstream](*args)
                stream.synchronize()
            except Exception as exc:  # reported after every thread has joined
                errors.append(f"rank {r}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")

        threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in range(self.n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout_s() + 30)
            if th.is_alive():
                raise CollectiveError("a rank's kernel did not return after its deadline (the card may be hung)")
        if errors:
            raise CollectiveError(errors[0])


class Launch:
    """One prepared collective: ``launch()`` runs it on every rank; ``outputs()`` copies the results back."""

    def __init__(self, comm: ThreadComm, func: str, dtype, out):
        self.comm, self.func, self.dtype, self.out = comm, func, dtype, out
        self.kernel = None
        self.per_rank = None  # cuda: each rank's stream and kernel arguments, made at the first launch

    def __call__(self) -> None:
        c = self.comm
        c.op_count += 1
        if self.kernel is None:  # count 0: nothing to do, as in NCCL
            return
        c.pool["abort"][:] = 0
        c.mem.bars[:] = 0
        c.dev.synchronize()  # the resets ran on the default stream; the ranks' streams do not wait for it
        if c.dev.name == "cudasim":
            self.kernel[1, c.n * self.nch * self.nthreads](c.dev.to_device(self.prm), *self.args)
        else:  # pragma: no cover - needs a GPU
            c._launch_threads(self)
        abort = np.asarray(c.dev.to_host(c.pool["abort"]))
        if abort[0]:
            raise CollectiveError(abort_line(self.func, c.op_count - 1, abort))

    def outputs(self) -> list[np.ndarray]:
        outs = np.asarray(self.comm.dev.to_host(self.out))
        return [outs[r].view(self.dtype) for r in range(self.comm.n)]
