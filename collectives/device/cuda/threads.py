"""N ranks as threads of one process on one device, connected by direct pointers (nccl-tests' ``-g N`` in one
process; NCCL ``src/transport/p2p.cc``'s ``via P2P/direct pointer``: within one process a rank simply uses its
peer's device pointers).

``ThreadComm`` owns the connection memory of every channel's ring and tree edges, as NCCL's P2P write mode lays
it out: the FIFOs (Simple: ``NCCL_STEPS`` slots of ``NCCL_BUFFSIZE / 8``; LL: 16-byte lines) and the tail live
with the receiver, the head with the sender; each is one row of a pool, so a rank's kernel reaches its peer's
row directly.  A ring and a tree share the connector of the same (channel, sender, receiver), as in NCCL.
``run`` launches a collective the caller planned (``enqueue.Plan``: the communicator's own split into channels and
chunks; ``collectives/perf/threads_runner.py`` plans for the threads mode): on ``cuda`` one host thread per rank, each launching on its own stream; on ``cudasim``
one launch holding every rank (numba's simulator runs a single launch at a time; see ``kernel.py``).
On ``cuda``, before anything runs: n streams need ``CUDA_DEVICE_MAX_CONNECTIONS`` >= n, and the n x channels
blocks of a launch must all be resident (``device/cuda/occupancy.py``); either is refused in one line.
The kernel modules are imported once the device is chosen (numba decides at its first import whether it is the
simulator), so ``ThreadComm(2, 1, "cudasim")`` works in a process that never set ``NUMBA_ENABLE_CUDASIM``.
The transport that selects P2P and prints NCCL's ``via P2P/...`` lines is the later ``transports/p2p.py``.
Point-to-point: ``collectives/p2p_threads.py``'s ``run_p2p`` (and ``all_to_all``, ``gather``, ``scatter`` on it)
launches every rank's group of sends and receives as one SendRecv kernel (``sendrecv.py``) on this ThreadComm, over
connIndex-1 connectors made at each pair's first use (``p2p_conns.py``).
"""
from __future__ import annotations

import threading

import numpy as np

from collectives.include.protocols import buffer_sizes

from ..common import CollectiveError
from collectives.graph.rings import ring_orders
from collectives.graph.trees import channel_trees
from collectives.misc.param import env_int, timeout_s
from collectives.graph.p2p_schedule import p2p_channels, p2p_schedule

from ..backend import Device, get_device
from .rank import block_threads
from transports import p2p


class ThreadComm:
    def __init__(self, nranks: int, nchannels: int = 1, device: Device | str | None = None,
                 rings: list[list[int]] | None = None, node_of: list[int] | None = None,
                 nthreads: int | None = None):
        """``node_of``: each rank's emulated node, which shapes the trees (one node: a chain)."""
        self.dev = device if isinstance(device, Device) else get_device(device)
        if not self.dev.name.startswith("cuda"):
            raise ValueError("ThreadComm runs kernels: device cuda or cudasim")
        from collectives.device.cuda import occupancy  # the device is chosen: numba.cuda may load now
        if self.dev.name == "cuda":
            refused = occupancy.connections(nranks)
            if refused:
                raise CollectiveError(refused)
        self.n, self.nch = nranks, nchannels
        self.nthreads = nthreads or (env_int("NCCLLAB_SIM_THREADS", 4) if self.dev.name == "cudasim" else None)
        self.op_count = 0
        self.buff = buffer_sizes()
        self.rings = ring_orders(nranks, nchannels, rings, node_of)
        self.node_of = node_of or [0] * nranks
        self.trees = channel_trees(self.rings, self.node_of)[:nchannels]
        self._connect()
        # point-to-point (init.cc's p2pSchedule and p2p channels, as the communicator computes them); the
        # connIndex-1 connectors come at each pair's first use (run_p2p)
        self.p2p_channels = p2p_channels(nchannels, self.node_of, self.buff["Simple"])
        self.p2p_schedules = [p2p_schedule(r, self.node_of) for r in range(nranks)]
        self.p2p = None
        self._p2p_mem = None

    # --- connection memory (NCCL: p2pSendSetup / p2pRecvSetup allocate it, the peers exchange pointers) ---
    def _connect(self) -> None:
        from collectives.device.cuda.layout import connection_tables, launch_memory, pool_layout
        t = connection_tables(self.rings, self.trees, self.n, self.nch)
        self.conn_ids = t.ids
        self.mem = launch_memory(self.dev, t, self.n, self.nch, self.buff, self.nthreads or 20)
        layout = pool_layout(len(t.ids), self.buff)
        self.pool = layout.views(self.dev.zeros(layout.nbytes, np.uint8))  # one process: peers' rows by pointer
        for (c, src, dst) in t.ids:  # in channel order
            p2p.log_connection(c, src, src, dst, dst, "direct pointer")

    # --- one collective ---
    def run(self, func: str, inputs: list, plan, op: str = "sum", root: int = 0,
            absent: tuple = ()) -> list[np.ndarray]:
        """Every rank's output (host numpy).  ``inputs``: each rank's send buffer (numpy, or device arrays on
        ``cuda``); ``plan``: the call's ``enqueue.Plan`` on these ranks.  ``absent``: ranks whose kernel returns at
        once (the deadline test's peer that never posts)."""
        launch = self.prepare(func, inputs, plan, op, root, absent)
        launch()
        return launch.outputs()

    def prepare(self, func: str, inputs: list, plan, op: str = "sum", root: int = 0,
                absent: tuple = ()) -> "Launch":
        """Device buffers (outputs poisoned with 0xA5) and the launch arguments of one collective; calling the
        result runs it (again: the timing loop of scripts/gpu_check.py)."""
        from collectives.device.cuda.call import check, kernel_args, kernel_dtype, make_call
        check(func, plan.proto, plan.algo)
        n, d = self.n, self.dev
        on_device = d.is_gpu and all(isinstance(x, d.cp.ndarray) for x in inputs)
        host = None if on_device else [np.asarray(d.to_host(x)) for x in inputs]
        dtype = np.dtype(inputs[0].dtype) if on_device else host[0].dtype
        count = int(np.prod(inputs[0].shape)) if on_device else host[0].size
        out_count = {"AllGather": count * n, "ReduceScatter": count // n}.get(func, count)
        kdt = kernel_dtype(func, dtype)
        if on_device:  # pragma: no cover - needs a GPU
            # cupy inputs are stacked on the device: a 1 GiB sweep point must not go through the host
            inp = d.cp.stack([x.reshape(-1).view(d.cp.uint8) for x in inputs]).view(kdt)
        else:
            inp = d.to_device(np.stack([x.reshape(-1).view(np.uint8) for x in host]).view(kdt))
        if d.is_gpu:  # pragma: no cover - needs a GPU
            out = d.cp.full((n, out_count * dtype.itemsize), 0xA5, d.cp.uint8).view(kdt)  # poisoned on the device
        else:
            out = d.to_device(np.full((n, out_count * dtype.itemsize), 0xA5, np.uint8).view(kdt))
        launch = Launch(self, func, dtype, out)
        if plan.count == 0:
            return launch
        call = make_call(func, dtype, op, n, root, plan, (plan.chunk_steps, plan.slice_steps),
                         self.nthreads or block_threads(plan), 0, absent)
        launch.kernel, launch.prm, launch.nch, launch.nthreads = call.kernel, call.prm, call.nch, call.nthreads
        launch.args = kernel_args(call, self.mem, self.pool, inp, out, d.to_device)
        return launch

    # point-to-point: ``collectives/p2p_threads.py`` (``run_p2p``, ``all_to_all``, ``gather``, ``scatter``) plans a
    # group with the communicator layer's rules and launches it on this ThreadComm's memory
    def p2p_memory(self, nchannels: int):
        """The LL staging and barriers of a SendRecv launch (every rank, ``nchannels`` p2p channels), made once."""
        if self._p2p_mem is None:
            from collectives.device.cuda.layout import staging
            self._p2p_mem = staging(self.dev, self.n, nchannels, self.buff)
        return self._p2p_mem

    def rank_args(self, launch: "Launch") -> list:  # pragma: no cover - needs a GPU
        """Each rank's stream and kernel arguments (its own rows of the per-rank arrays), made once per prepared
        collective, so that a timing loop measures the kernels, not the setup; the residency check runs here."""
        if launch.per_rank is None:
            from collectives.device.cuda import kernel as K
            from collectives.device.cuda.occupancy import check_launch
            per_rank = per_rank_args(self.dev, self.n, launch.prm, launch.args, K.RANK_LO, K.ARGS, K.PER_RANK_ARGS)
            launch.residency = check_launch(launch.kernel, per_rank[0][2], self.n * launch.nch, launch.nthreads,
                                            f"{self.n} ranks as threads")
            launch.per_rank = per_rank
        return launch.per_rank

    def _launch_threads(self, launch: "Launch", reps: int = 1, events=None) -> None:  # pragma: no cover - needs a GPU
        """One host thread per rank, each launching its rank's kernel ``reps`` times on its own stream (with
        ``events[r][i]``, a pair of CUDA events around launch ``i``, when timing)."""
        self.launch_ranks(launch.kernel, launch.nch, launch.nthreads, self.rank_args(launch), reps, events)

    def launch_ranks(self, kernel, nch: int, nthreads: int, per_rank: list, reps: int = 1,
                     events=None) -> None:  # pragma: no cover - needs a GPU
        """``per_rank[r]``: rank r's (stream, numba stream, kernel arguments)."""
        from numba import cuda
        d = self.dev
        errors = []
        gpu = d.cp.cuda.runtime.getDevice()  # a new thread has no current device: give it this one

        def one(r: int) -> None:
            stream, nstream, args = per_rank[r]
            try:
                d.cp.cuda.Device(gpu).use()
                cuda.select_device(gpu)
                for i in range(reps):
                    if events is not None:
                        events[r][i][0].record(stream.raw)
                    kernel[nch, nthreads, nstream](*args)
                    if events is not None:
                        events[r][i][1].record(stream.raw)
                stream.synchronize()
            except Exception as exc:  # reported after every thread has joined
                errors.append(f"rank {r}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")

        threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in range(self.n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout_s() * reps + 30)
            if th.is_alive():
                raise CollectiveError("a rank's kernel did not return after its deadline (the card may be hung)")
        if errors:
            raise CollectiveError(errors[0])


def per_rank_args(dev, nranks: int, prm, args: list, rank_lo: int, names: tuple,
                  per_rank_names: tuple) -> list:  # pragma: no cover - needs a GPU
    """Each rank's (stream, numba stream, kernel arguments): ``prm`` with ``prm[rank_lo] = r`` and rank r's own
    rows of the arguments ``per_rank_names`` names (``names``: every argument in order, ``prm`` first)."""
    from numba import cuda
    local = {names.index(a) - 1 for a in per_rank_names}  # args omits prm
    out = []
    for r in range(nranks):
        stream = dev.stream()
        p = prm.copy()
        p[rank_lo] = r
        rank_args = [x[r:r + 1] if i in local else x for i, x in enumerate(args)]
        rank_args = [cuda.as_cuda_array(x, sync=False) for x in [dev.to_device(p), *rank_args]]
        out.append((stream, cuda.external_stream(stream.raw.ptr), rank_args))
    dev.synchronize()  # the parameter copies above, before any rank's stream uses them
    return out


class Launch:
    """One prepared collective: ``launch()`` runs it on every rank; ``outputs()`` copies the results back."""

    def __init__(self, comm: ThreadComm, func: str, dtype, out):
        self.comm, self.func, self.dtype, self.out = comm, func, dtype, out
        self.kernel = None
        self.per_rank = None  # cuda: each rank's stream and kernel arguments, made at the first launch
        self.residency: dict = {}  # cuda: what occupancy.check_launch found (registers, blocks per SM, SMs)

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
            from collectives.device.cuda.call import abort_line
            raise CollectiveError(abort_line(self.func, c.op_count - 1, abort))

    def kernel_seconds(self, reps: int) -> float:  # pragma: no cover - needs a GPU
        """The collective's time on the GPU: every rank launches it ``reps`` times back to back, a pair of CUDA
        events around each launch; per launch the shortest of the ranks' kernel durations (the last rank to start
        finds its peers already waiting, so its kernel is the collective's own length, launch skew excluded),
        averaged over the launches."""
        c, cp = self.comm, self.comm.dev.cp
        if self.kernel is None:
            return 0.0
        c.pool["abort"][:] = 0
        c.dev.synchronize()
        events = [[(cp.cuda.Event(), cp.cuda.Event()) for _ in range(reps)] for _ in range(c.n)]
        c.op_count += reps
        c._launch_threads(self, reps, events)
        abort = np.asarray(c.dev.to_host(c.pool["abort"]))
        if abort[0]:
            from collectives.device.cuda.call import abort_line
            raise CollectiveError(abort_line(self.func, c.op_count - 1, abort))
        per_launch = [min(cp.cuda.get_elapsed_time(*events[r][i]) for r in range(c.n)) for i in range(reps)]
        return float(np.mean(per_launch)) / 1e3

    def outputs(self) -> list[np.ndarray]:
        outs = np.asarray(self.comm.dev.to_host(self.out))
        return [outs[r].view(self.dtype) for r in range(self.comm.n)]
