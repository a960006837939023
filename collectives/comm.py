"""The communicator (NCCL ``src/init.cc``: ``ncclCommInitRank`` → ``initTransportsRank``, ``ncclTopoPostset``;
``src/collectives.cc``; ``src/enqueue.cc``: ``ncclEnqueueCheck``).

Init: bootstrap ring, allgather of peer info (host hash, pid, ...), the search's channel count and one ring per
channel (``setupChannel``), the Postset doubling (channel c + n: ring c with tree 1), then
``ncclTransportRingConnect`` (recv from ``ring.prev``, send to ``ring.next``) and ``ncclTransportTreeConnect``
(both directions with ``up`` and ``down[]``), through ``transports.connections``.
A collective: check the arguments, publish its signature, choose algorithm and protocol (the cost model), split it
across channels (``enqueue.schedule_coll``), and run each channel's algorithm (``device/*.run_ring``,
``all_reduce.run_tree_split``) over the protocol's primitives in one kernel; on a GPU device (``--device``) that
kernel is the rank's persistent GPU kernel (``device/cuda/rank.py``), connected by P2P.
"""
from __future__ import annotations

import os

import numpy as np

from collectives.include.protocols import buffer_sizes
from collectives.misc.futex import address
from collectives.misc.shm_segment import ShmError
from collectives.misc.sockets import BootstrapError
from tracing import debug
from tracing.events import from_env as tracer_from_env
from tracing.events import now
from transports.base import CommInfo
from transports.connections import Connections, connect_rings, connect_trees
from transports.p2p import pool_of
from transports.verbs import emulate_nics

from . import enqueue
from .bootstrap import Bootstrap, UniqueId
from .channels import init_channels, log_channels
from .device import compiled as compiled_ring, launch
from .device.backend import device_and_protocols
from .device.common import CollectiveError, Kernel
from .device.cuda.rank import GpuRank
from .device.reduce_copy import OPS, dtype_name, reduce_copy
from .graph import tuning
from .graph.cost_model import CostModel
from .graph.cpu_tuner import tuner_plugin
from .graph.presets import cpu_lab
from .graph.init_rank import init_rank
from .graph.trees import tree_table
from .health import Health
from .job import install_fatal_hook, rank_env
from . import group_plan, groups, register
from .p2p import P2p, P2pChecks
from .rooted import GatherScatter
from .split import SplitBootstrap, child_magic, split_info
from .graph.p2p_schedule import P2pChannels, p2p_channels, p2p_schedule
from .peers import exchange
from .task import IN_PLACE_MATTERS, Launch, Task, compiled_form, in_place, new_task


DESTROYED = "communicator was destroyed"  # what any call after destroy() raises (RuntimeError)


def reference_config(plan: enqueue.Plan, rings: list, trees: list, buff_sizes: dict,
                     search_channels: int | None = None) -> dict:
    """What ``collectives.perf.reference`` needs to reproduce a call planned as ``plan`` on these rings and trees;
    ``search_channels``: the search's channel count, from which the reference applies NCCL's thread rule.  The
    process path (``Communicator``) and the GPU threads mode (``perf/threads_runner.py``) both describe calls with it."""
    config = {"rings": rings, "nchannels": len(rings), "proto": plan.proto, "algo": plan.algo,
              "buffsize": buff_sizes[plan.proto], "trees": tree_table(trees)}
    if search_channels is not None:
        config["search_channels"] = search_channels
    if plan.tuner_channels:  # a tuner plugin's channel count (AllReduce only): the reference splits the same way
        config["max_channels"] = plan.tuner_channels
    return config


class Communicator(GatherScatter):
    """``ncclComm``: ``Communicator(unique_id, nranks, rank)``, or ``Communicator()`` to read the launcher's
    (or mpirun's) environment.  A context manager: leaving the block calls ``destroy``."""

    def __init__(self, unique_id: UniqueId | bytes | None = None, nranks: int | None = None,
                 rank: int | None = None, *, rings: list[list[int]] | None = None,
                 search_channels: int | None = None, protocols: str | None = None, algorithms: str | None = None,
                 device: str | None = None, _bootstrap: Bootstrap | None = None):
        install_fatal_hook()  # an uncaught error ends the whole job (MPI_Abort under mpirun)
        if unique_id is None:
            unique_id, nranks, rank = rank_env()
        if isinstance(unique_id, (bytes, bytearray)):
            unique_id = UniqueId.from_bytes(bytes(unique_id))
        if nranks is None or rank is None:
            raise ValueError("Communicator needs unique_id, nranks and rank (or a launcher environment)")
        self.rank, self.nranks = rank, nranks
        self.op_count = 0
        self._kernel: Kernel | None = None
        self._error: str | None = None
        self._destroyed = False
        self._split_count = 0  # NCCL's childCount: part of each child's hash
        # a split's child brings the bootstrap its parent's ring built (split.SplitBootstrap)
        self.bootstrap = _bootstrap if _bootstrap is not None else Bootstrap(unique_id, rank, nranks)
        self.health: Health | None = None      # status pages, checks while waiting, hang reports
        self.conns: Connections | None = None  # the transports' state: segments, net plugin, proxy
        self._registry = register.Registry(rank)  # ncclCommRegister's buffers (comm->regCache)
        try:
            self._init_transports(unique_id, rings, search_channels, protocols, algorithms, device)
        except BaseException as exc:
            self._free_connections()
            self.bootstrap.close()
            if isinstance(exc, ShmError):
                raise ShmError(f"rank {rank}: {exc}") from None
            raise

    # ------------------------------------------------------------------ init
    def _init_transports(self, uid: UniqueId, rings, search_channels, protocols, algorithms, device) -> None:
        proto_text = protocols if protocols is not None else os.environ.get("NCCL_PROTO", "")
        algo_text = algorithms if algorithms is not None else os.environ.get("NCCL_ALGO", "")
        self.device, proto_text = device_and_protocols(device, proto_text)  # a GPU device: device/cuda/rank.py's kernels
        tuning.protocol_table(proto_text)  # a bad NCCL_PROTO / NCCL_ALGO fails at init, on every rank
        tuning.algorithm_table(algo_text)
        # every rank must read the same NCCL_*BUFFSIZE (checked in the exchange); the defaults follow the nodes
        peers = exchange(self.bootstrap, self.rank, self.nranks, uid.magic, buffer_sizes(), rings, search_channels,
                         proto_text, algo_text, self.device.name)
        self.peer_info, self.tag, self.node_of_rank, self.nnodes = peers.info, peers.tag, peers.node_of_rank, \
            peers.nnodes
        self.buff_sizes = buffer_sizes(cpu_nodes=self.nnodes if self.device.name == "cpu" else 0)
        self.local_ranks = peers.local_ranks
        self.local_rank = self.local_ranks.index(self.rank)
        self.ranks_per_core = peers.same_machine / len(os.sched_getaffinity(0))  # emulated nodes share the cores
        self.oversubscribed = self.ranks_per_core > 1
        self._plans: dict[tuple, enqueue.Plan] = {}
        debug.set_device(self.local_rank)
        # initTransportsRank's topology job: load, search, Preset, AllGather3, Postset (explicit rings: rank 0's)
        topo = init_rank(self.bootstrap, self.rank, self.nranks, self.node_of_rank, peers.search_channels,
                         self.peer_info[0]["rings"])
        self.search_channels = topo.search_channels
        self.channels, self.trees, self.channel_origin = init_channels(topo.channels, self.rank)
        self.nchannels = len(self.channels)
        self.machine = cpu_lab(self.nranks, self.nnodes, self.search_channels, self.nchannels,
                               ranks_per_core=self.ranks_per_core, tuner=tuner_plugin())
        self.max_threads = tuning.max_threads(self.machine.ring.bw_intra, self.machine.ring.n_channels)
        self.tuning = enqueue.default_tuning(self.nranks, self.nchannels, self.buff_sizes, nnodes=self.nnodes,
                                             max_threads=self.max_threads)
        self.cost_model = CostModel(self.machine, proto_text, algo_text)
        self.p2p: P2pChannels = p2p_channels(self.nchannels, self.node_of_rank, self.buff_sizes["Simple"])
        self._p2p_schedule = p2p_schedule(self.rank, self.node_of_rank)
        debug.info("INIT", f"P2P Chunksize set to {self.p2p.chunk_size}")
        debug.info("GRAPH", f"ncclP2pSchedule: group size used is {self.p2p.group_size}")
        if self.rank == 0:
            if self.machine.tuner is not None:
                debug.info("INIT|TUNING", self.machine.tuner.describe())
            for line in self.cost_model.tuning_lines(self.max_threads):
                debug.info("TUNING", line)
        debug.info("INIT", f"{self.nchannels} coll channels, {self.nchannels} collnet channels, 0 nvls channels, "
                           f"{self.p2p.n_channels} p2p channels, {self.p2p.n_channels_per_peer} p2p channels per peer")
        debug.info("INIT", f"comm {hex(id(self))} rank {self.rank} nRanks {self.nranks} nNodes {self.nnodes} "
                           f"localRanks {len(self.local_ranks)} localRank {self.local_rank} MNNVL 0")
        log_channels(self.rank, topo.channels)
        self.health = Health(self.rank, self.nranks, self.tag, self.peer_info, self.bootstrap, self.local_ranks,
                             lambda: self.conns.error() if self.conns is not None else None,
                             lambda: self.conns.describe() if self.conns is not None else [])
        self._gpu = GpuRank.for_comm(self)
        if self.nranks > 1:
            node = self.node_of_rank
            dev = lambda r: [q for q in range(self.nranks) if node[q] == node[r]].index(r)  # noqa: E731
            emulate_nics(topo.nics)  # the software verbs provider's devices are this emulated node's NICs
            self.conns = Connections(CommInfo(self.tag, self.rank, self.buff_sizes, dev, self.device,
                                              self._gpu.layout.nbytes if self._gpu else 0, topo.net_dev),
                                     self.bootstrap, self.peer_info)
            connect_rings(self.conns, self.channels)
            if self.cost_model.algo_usable("AllReduce", "Tree"):
                connect_trees(self.conns, self.channels)
            if self._gpu:
                self._gpu.bind(pool_of(self.conns.states), self.channels)
        self.tracer = tracer_from_env(self.rank, self.describe())
        h = self.health
        self._kernel = Kernel(self.rank, 0, "", h.check, lambda peer: h.check_peer_op(peer, self.op_count),
                              self.oversubscribed, h.suspects, h.warn)
        self._kernel.ranks_per_core = self.ranks_per_core
        if self.conns is not None and self.conns.proxied:  # a blocked kernel moves its NET bytes itself
            self._kernel.poll, self._kernel.net_wait = self.conns.poll, self.conns.wait
        self._kernel.tracer = self.tracer
        # point-to-point: its own kernel, whose waits check the peers' health but not their signatures
        self._p2p = P2p(self.rank, self.nranks, self.p2p, self._p2p_schedule, self.buff_sizes)
        if self.conns is not None:
            self.conns.peer_check = h.check_peer
        self._p2p_kernel = Kernel(self.rank, 0, "SendRecv", P2pChecks(h), lambda peer: None, self.oversubscribed,
                                  h.suspects, h.warn)
        self._p2p_kernel.tracer = self.tracer
        self._compiled = None if self._gpu else compiled_ring.Cache(self.channels, self.nranks, h.pages, h.mine,
                                                                    self.rank)
        self._tasks: dict[tuple, Task] = {}
        self.group_colls: list = []  # collectives queued in an open group (task.Launch, queued by group_plan)
        self._log_coll, self._log_tuning = debug.enabled("INFO", "COLL"), debug.enabled("INFO", "TUNING")
        self._trace_coll = debug.enabled("TRACE", "COLL")  # NCCL reads NCCL_DEBUG once; asking per call cost 0.5 us
        debug.info("INIT", f"ncclCommInitRank comm {hex(id(self))} rank {self.rank} nranks {self.nranks} "
                           f"cudaDev {self.local_rank} "
                           f"nvmlDev {self.local_rank} busId 0 commId {hex(uid.magic)} - Init COMPLETE")

    def describe(self) -> dict:
        """The communicator as the trace and the diagrams see it: ranks, nodes, rings and transports."""
        return {"nranks": self.nranks, "nnodes": self.nnodes, "nchannels": self.nchannels, "tag": self.tag,
                "node_of_rank": self.node_of_rank,
                "hosts": [p["host"] for p in self.peer_info], "pids": [p["pid"] for p in self.peer_info],
                "rings": self.rings, "buff_sizes": self.buff_sizes,
                "trees": self.tree_table(),
                "transports": [ch.send.transport if ch.send else None for ch in self.channels],
                "connections": [{p: c.transport for p, c in ch.send_to.items()} for ch in self.channels],
                "channel_origin": self.channel_origin,
                "net": bool(self.conns and self.conns.proxied)}

    def _free_connections(self, failed: bool = False) -> None:
        """``commFree``: give everything back at once, in the order that lets each piece go.  First what holds
        numpy views of shared memory (an mmap cannot close while a view of it exists): the tasks' compiled forms,
        the LL cache, the kernel's last waits, the GPU rank's pool, the channels' connectors.  Then the
        transports' ``free``: segments unmapped, plugin comms and sockets closed, the proxy thread joined; the
        proxy first finishes its last ops, so their events are in the trace (after a failure it never would: then
        at once, so that the rank exits and its peers learn it).  Then the status pages.  Dropping these also
        breaks the cycles between the communicator and its parts, so nothing waits for the cycle collector."""
        self._tasks = {}
        if getattr(self, "_compiled", None) is not None:
            self._compiled.free()
        for k in (self._kernel, getattr(self, "_p2p_kernel", None)):
            if k is not None:
                k.free()
        if getattr(self, "_p2p", None) is not None:
            self._p2p.clear()
            self._p2p.conns.clear()
        self._compiled = self._kernel = self._p2p_kernel = self._gpu = None
        self._checked = None  # api.all_reduce's last buffers: let the user's arrays go
        for ch in getattr(self, "channels", ()):
            ch.send = ch.recv = None
            ch.send_to.clear()
            ch.recv_from.clear()
        try:
            if self.conns is not None:
                self.conns.free(drain=not failed and self._error is None)
        finally:
            self.conns = None
            self._registry.free()  # after the proxy's last ops: the plugin's comms took their handles with them
            if self.health is not None:
                self.health.close()

    def _flush_trace(self) -> None:
        if getattr(self, "tracer", None) is not None:
            self.tracer.flush()

    # ------------------------------------------------------------------ collectives
    def _check(self) -> None:
        if self._destroyed:
            raise RuntimeError(DESTROYED)
        if self._error:
            raise CollectiveError(f"communicator is in error state after: {self._error}")

    def _launch(self, func: str, send: np.ndarray, recv: np.ndarray, count: int, op: str, root: int
                ) -> Launch | None:
        """``ncclEnqueueCheck`` + ``ncclLaunchKernel`` for one collective.  Returns its prepared ``Launch`` (None
        inside a group) for a caller that repeats the call on the same buffers (``_relaunch``)."""
        self._check()
        if groups.depth():
            return self._enqueue_grouped(func, send, recv, count, op, root)
        launch = self._prepare(func, send, recv, count, op, root)
        self._start(launch)
        return launch

    def _relaunch(self, launch: Launch) -> None:
        """``launch`` again, on the same buffers (``api.all_reduce``'s repeated arrays): only what can change
        between two calls is looked at again, the communicator's state and an open group."""
        self._check()
        if groups.depth():
            return self._enqueue_grouped(launch.func, launch.send, launch.recv, launch.count, launch.op, launch.root)
        self._start(launch)

    def _enqueue_grouped(self, func: str, send: np.ndarray, recv: np.ndarray, count: int, op: str, root: int) -> None:
        """Inside a group: queued for the group's one plan (``group_plan.py``)."""
        if self._gpu is not None:
            raise NotImplementedError(f"{func} inside a group on --device {self.device.name}: only the CPU "
                                      f"device plans groups")
        group_plan.enqueue_coll(self, func, send, recv, count, op, root)
        groups.enqueue(self)

    def _prepare(self, func: str, send: np.ndarray, recv: np.ndarray, count: int, op: str, root: int) -> Launch:
        """What a call resolves to from its arguments alone: its ``Task`` (built on first use, kept by function,
        count, type, op, root and whether its buffers are registered), whether it is in place, and its compiled
        form."""
        # ncclGetAlgoInfo asks for regBuff only when a tuner plugin is loaded; a call on registered buffers gets a
        # Task of its own (for most functions the same plan: only the tuner's rule can tell them apart)
        registered = self.machine.tuner is not None and self.registered(send, recv)
        key = (func, count, send.dtype, op, root, registered)
        task = self._tasks.get(key)
        if task is None:
            if len(self._tasks) > 4096:  # many distinct calls: start again rather than grow without bound
                self._tasks.clear()
            task = self._tasks[key] = new_task(self, func, count, send.dtype, op, root, registered)
        placed = in_place(func, self.rank, send, recv)
        compiled = compiled_form(task, self._compiled, placed, send, self.tracer is not None)
        # Compiled on the CPU with nothing traced, logged or proxied around it: the call is the kernel alone.
        direct = compiled is not None and self._gpu is None and self.tracer is None and not task.counts \
            and not (self.rank == 0 and self._log_tuning) and not self._trace_coll and func not in IN_PLACE_MATTERS
        return Launch(func, send, recv, count, op, root, task, placed, compiled, direct)

    def _start(self, launch: Launch) -> None:
        """Publish the call's signature, then run it; a failure puts the communicator in error."""
        task, send, recv, compiled = launch.task, launch.send, launch.recv, launch.compiled
        self.health.publish(self.op_count, task.signature, task.sig, python=compiled is None)
        if self._log_coll:
            debug.info("COLL", f"{task.func}: opCount {self.op_count:x} sendbuff {hex(address(send))} recvbuff "
                               f"{hex(address(recv))} count {task.count} datatype {task.dtype_code} op "
                               f"{OPS[task.op]} root {task.root} comm {hex(id(self))} [nranks={self.nranks}] "
                               f"stream 0x0")
        try:
            if task.count == 0:
                return  # NCCL returns before enqueueing anything
            if self.nranks == 1:  # ncclLaunchOneRank: a local reduce-copy applying the pre- and post-op
                reduce_copy(task.redop, [send[:len(recv)]], [recv], pre_op=True, post_op=True)
                return
            if launch.direct and not self._registry.regs:  # what _run and run_plan do for it, and nothing else
                kernel = self._kernel
                kernel.reset(self.op_count, task.func)
                compiled.net_reg(False)
                compiled_ring.run(kernel, compiled, send, recv, task.sig)
            else:
                self._run(task, send, recv, compiled, launch.placed)
        except CollectiveError as exc:
            self._error = str(exc)
            self._flush_trace()
            self.health.fail(exc, self._kernel, self.tracer)
            raise
        finally:
            self.op_count += 1

    # ------------------------------------------------------------------ registration
    def register(self, buf: np.ndarray) -> register.Registration | None:
        """``ncclCommRegister``: a handle for ``buf`` (None with NCCL_LOCAL_REGISTER=0).  A Ring/Simple
        AllReduce whose send and receive buffers are both registered moves its NET steps straight between the user
        buffers and the network (``register.py``)."""
        self._check()
        self._checked = None  # a repeated call prepares again: registration may change its plan (the tuner)
        return self._registry.register(id(self), buf)

    def deregister(self, handle: register.Registration | None) -> None:
        """``ncclCommDeregister``."""
        self._check()
        self._checked = None
        self._registry.deregister(handle)

    def registered(self, send: np.ndarray, recv: np.ndarray) -> bool:
        """``ncclGetAlgoInfo``'s ``regBuff``: both buffers lie in this communicator's registrations (False when
        nothing registered: ``NCCL_LOCAL_REGISTER=0`` returns no handle).  What the tuner plugin is told, and so
        what ``plan`` and ``reference_config`` need to describe such a call."""
        return bool(self._registry.regs) and self._registry.pair(send, recv) is not None

    # ------------------------------------------------------------------ point-to-point
    def _enqueue_p2p(self, is_send: bool, buff: np.ndarray, peer: int) -> None:
        """``ncclEnqueueCheck`` of a send or recv: queue it, and launch at once outside a group."""
        self._check()
        if self._gpu is not None:
            raise NotImplementedError(f"send/recv on --device {self.device.name}: only the CPU device has them")
        self._p2p.append(is_send, buff, peer)
        groups.enqueue(self)

    def group_launch(self) -> None:
        """``groupLaunch`` for this communicator: connect, plan and run its queued collectives, sends and receives
        as one plan (``group_plan.launch``); a failure puts the communicator in error, as a collective's does."""
        if not self._p2p.pending and not self.group_colls:
            return
        self._check()
        kernel = self._kernel if any(c.count for c in self.group_colls) else self._p2p_kernel
        kernel.reset(self.op_count, "SendRecv")
        try:
            group_plan.launch(self)
        except (CollectiveError, BootstrapError) as exc:
            err = exc if isinstance(exc, CollectiveError) else CollectiveError(str(exc))
            self._error = str(err)
            self._flush_trace()
            self.health.fail(err, kernel, self.tracer)
            if err is not exc:
                raise err from None
            raise

    def group_abandon(self) -> None:
        """The group was left by an exception: drop what it queued."""
        self._p2p.clear()
        self.group_colls = []

    def group_simulate(self) -> float | None:
        """``ncclGroupSimulateEnd`` for this communicator (``group_plan.simulate``)."""
        self._check()
        return group_plan.simulate(self)

    def _run(self, task: Task, send, recv, compiled, placed: bool) -> None:
        plan, func, tracer = task.plan, task.func, self.tracer
        if self.rank == 0 and self._log_tuning:  # scheduleCollTasksToPlan, every call
            debug.info("TUNING", f"{func}: {task.count * send.itemsize} Bytes -> Algo {plan.algo} proto "
                                 f"{plan.proto} channel{{Lo..Hi}}={{0..{plan.nchannels - 1}}}")
        if self._trace_coll:
            debug.trace("COLL", f"Collective {func} count={task.count} channel{{Lo..Hi}}={{0..{plan.nchannels - 1}}} "
                                f"parts={[w.part_count for w in plan.works]} chunkCount={plan.works[0].chunk_count}")
        if self._gpu is not None:  # this rank's persistent kernel on the GPU device
            return self._gpu.run(task, send, recv, self.op_count)
        if func in IN_PLACE_MATTERS:  # NCCL retypes these as int8: they move bytes
            send, recv = send.view(np.uint8), recv.view(np.uint8)
        net_reg = None
        if self._registry.regs:  # registered buffers: Ring/Simple AllReduce over NET uses them (register.py)
            regs = self._registry.ring_net(task, send, recv)
            if regs is not None:
                net_reg = register.ring_algos(self._registry, regs, plan, self.channels, self.nranks, send, recv,
                                              task.slice_steps, task.chunk_steps)
        kernel = self._kernel
        kernel.reset(self.op_count, func)
        t0 = now() if tracer is not None else 0
        launch.run_plan(kernel, task, self.channels, self.nranks, send, recv, compiled, self.conns, self.health,
                        placed, net_reg)
        if tracer is not None:
            t1 = now()
            tracer.add_plan([(self.op_count, func, plan.algo, plan.proto, task.count,
                              dtype_name(send.dtype) if func not in IN_PLACE_MATTERS else "int8", task.redop.name,
                              task.root, plan.nchannels, t0, t1)], 0, t0, t1)

    def plan(self, func: str, count: int, dtype, registered: bool = False) -> enqueue.Plan:
        """How ``func`` of ``count`` elements would run: protocol, channels, parts, chunks (no data moves);
        ``registered``: its send and receive buffers are both registered (``comm.register``), which a tuner
        plugin is told."""
        key = (func, count, np.dtype(dtype).itemsize, registered)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) > 4096:
                self._plans.clear()
            plan = self._plans[key] = enqueue.plan_coll(self.tuning, self.cost_model.choose, func, count, key[2],
                                                        registered)
        return plan

    def reference_config(self, func: str, count: int, dtype, registered: bool = False) -> dict:
        """What ``collectives.perf.reference`` needs to reproduce this call (the protocol depends on its size,
        and, through the tuner plugin, on whether its buffers are registered)."""
        return reference_config(self.plan(func, count, dtype, registered), self.rings, self.trees, self.buff_sizes,
                                self.machine.ring.n_channels)

    def tree_table(self) -> list[dict]:
        """Every channel's tree as plain data: ``[{rank: (up, [down...])}]`` (trace metadata, reference model)."""
        return tree_table(self.trees)

    def p2p_schedule(self) -> list[tuple[int, int]]:
        """``comm->p2pSchedule``: this rank's (send rank, recv rank) of each point-to-point round."""
        return list(self._p2p_schedule)

    @property
    def rings(self) -> list[list[int]]:
        """The ring of each channel, as given or derived (rank order by default)."""
        return [list(ch.ring.order) for ch in self.channels]

    def split(self, color: int | None = None, key: int = 0) -> "Communicator | None":
        """``ncclCommSplit`` (nccl4py's ``Communicator.split(color, key)``): every rank of this communicator calls
        it; the ranks of one ``color`` become a new communicator, ranked by ``key`` then by rank here.  ``color``
        None (``NCCL_SPLIT_NOCOLOR``) takes part and gets None (nccl4py: a null communicator).  The child is a full
        communicator (its own bootstrap ring, built through this one's as ``bootstrapSplit`` does, its own channels
        and connections) on this one's device and environment; rings,
        protocols or algorithms given to this one's constructor are not passed on.  This one stays usable."""
        self._check()
        if groups.depth():
            raise RuntimeError("split inside a group: not supported here (NCCL's needs a nonblocking communicator)")
        info = split_info(self.bootstrap, color, key)
        count, self._split_count = self._split_count, self._split_count + 1
        if info is None:
            return None
        ranks, child_rank = info
        boot = SplitBootstrap(self.bootstrap, ranks, child_rank, child_magic(self.bootstrap.uid.magic, count, color))
        return type(self)(boot.uid, len(ranks), child_rank, device=self.device.name, _bootstrap=boot)

    def _check_root(self, root: int) -> None:
        if not isinstance(root, (int, np.integer)) or not 0 <= root < self.nranks:
            raise ValueError(f"root {root} out of range for nranks {self.nranks}")

    def barrier(self) -> None:
        """Every rank waits for the others (``bootstrapBarrier``); refused once destroyed: the ring is closed."""
        if self._destroyed:
            raise RuntimeError(DESTROYED)
        self.bootstrap.barrier()

    def destroy(self) -> None:
        """``ncclCommDestroy``.  Ends with a bootstrap barrier so that a peer's error reaches every rank."""
        if self._destroyed:
            return
        self._destroyed = True
        self.health.destroyed(self.op_count)  # a peer still waiting for us learns it now
        try:
            if self._error is None and self.nranks > 1:
                try:
                    self.bootstrap.barrier()
                except BootstrapError:
                    aborted = self.health.peer_aborted()  # the peer that left the barrier says why
                    if aborted:
                        raise CollectiveError(f"rank {self.rank}: rank {aborted[0]} aborted: {aborted[1]}") from None
                    raise
                aborted = self.health.peer_aborted()
                if aborted:
                    raise CollectiveError(f"rank {self.rank}: rank {aborted[0]} aborted: {aborted[1]}")
        finally:
            self._free_connections()
            self._flush_trace()
            self.bootstrap.close()
            self._log_destroyed("Destroy")

    def _log_destroyed(self, how: str) -> None:
        """``commFree``'s last INFO line."""
        debug.info("DESTROY", f"comm {hex(id(self))} rank {self.rank} nranks {self.nranks} cudaDev "
                              f"{self.local_rank} busId 0 - {how} COMPLETE")

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.destroy()
        elif not self._destroyed:
            self._destroyed = True
            self.health.destroyed(self.op_count)
            self._free_connections(failed=True)
            self.bootstrap.close()
            self._log_destroyed("Abort")

