"""What the kernel runs for one collective (NCCL ``src/device/common.h``: ``ncclKernelMain`` → ``RunWorkColl``
specialised by function, algorithm and protocol; the table is ``ncclDevFuncTable``).

``channel_works`` builds, for each channel's work of a plan, the generators the kernel steps: the protocol's
primitives (``PRIMITIVES``, the specialisation of NCCL's ``Primitives`` template on ``ProtoSimple``/``ProtoLL``/
``ProtoLL128``) under the function's algorithm (``RING`` for every function, ``run_tree_split`` or
``run_tree_up_down`` for AllReduce's tree).  With tracing, each primitive call is located (loop, chunk) and each
thread group recorded as a ``channel`` event.
"""
from __future__ import annotations

from typing import Callable, Iterator

from tracing.events import now

from . import all_gather, all_reduce, broadcast, compiled as compiled_ring, reduce, reduce_scatter
from .prims_ll import PrimitivesLL
from .prims_ll128 import PrimitivesLL128
from .prims_simple import PrimitivesSimple

PRIMITIVES = {"Simple": PrimitivesSimple, "LL": PrimitivesLL, "LL128": PrimitivesLL128}

# runRing of each function, called uniformly as (prims, ring, work, nranks, root, in_place), and the trace's map
# from a call's element offsets to (loop, chunk).
RING: dict[str, tuple[Callable, Callable]] = {
    "AllReduce": (lambda p, ring, w, n, root, inp: all_reduce.run_ring(p, ring, w, n),
                  lambda w, n, esize, rank: lambda prim, s, d: all_reduce.locate(w, n, esize, prim, s, d)),
    "ReduceScatter": (lambda p, ring, w, n, root, inp: reduce_scatter.run_ring(p, ring, w, n),
                      lambda w, n, esize, rank: lambda prim, s, d: reduce_scatter.locate(w, n, esize, prim, s, d)),
    "AllGather": (lambda p, ring, w, n, root, inp: all_gather.run_ring(p, ring, w, n, inp),
                  lambda w, n, esize, rank: lambda prim, s, d: all_gather.locate(w, n, esize, prim, s, d, rank)),
    "Broadcast": (lambda p, ring, w, n, root, inp: broadcast.run_ring(p, ring, w, n, root, inp),
                  lambda w, n, esize, rank: lambda prim, s, d: broadcast.locate(w, n, esize, prim, s, d)),
    "Reduce": (lambda p, ring, w, n, root, inp: reduce.run_ring(p, ring, w, n, root),
               lambda w, n, esize, rank: lambda prim, s, d: reduce.locate(w, n, esize, prim, s, d)),
}


def primitives(kernel, proto: str, channel: int, recv, send, sendbuff, recvbuff, redop, chunk_steps: int,
               slice_steps: int, group: int = 0, net_reg: bool = False):
    """NCCL's ``Primitives<T, RedOp, Fan, Direct, Proto>`` constructor: Simple takes its slices per chunk and steps
    per slice (and ``net_reg``, registered buffers: ``NetRegMode`` on its NET peers); LL and LL128 move one step a
    call."""
    if proto == "Simple":
        return PrimitivesSimple(kernel, channel, recv, send, sendbuff, recvbuff, redop, chunk_steps // slice_steps,
                                slice_steps, group, net_reg)
    return PRIMITIVES[proto](kernel, channel, recv, send, sendbuff, recvbuff, redop, group)


def run_plan(kernel, task, channels: list, nranks: int, sendbuff, recvbuff, compiled, conns, health,
             in_place: bool, net_reg: dict | None = None) -> None:
    """``ncclLaunchKernel`` for one task: hand the proxy its ops (``ncclProxySaveOp``: ``task.counts`` is
    [(connector, steps)]), run every channel's work (``compiled``: the task's ``compiled.Compiled`` form instead of the
    primitives), then wait until the proxy has handed this collective's last sends to the network
    (``conns.wait_sent``: a Python proxy cannot send while the caller's next C call keeps the GIL).  ``net_reg``:
    the call uses registered buffers (``register.ring_algos``: each NET connector's step addresses)."""
    plan = task.plan
    proxy_ops = []
    if task.counts:
        proxy_ops = conns.save_ops(task.counts, plan.proto, task.slice_steps, task.chunk_steps, kernel.tracer,
                                   kernel.op_count, net_reg)
    if compiled is not None:
        compiled.net_reg(net_reg is not None)
        compiled_ring.run(kernel, compiled, sendbuff, recvbuff, task.sig)
    else:
        kernel.run(channel_works(kernel, plan, channels, nranks, sendbuff, recvbuff, task.redop, task.root, in_place,
                                 task.chunk_steps, task.slice_steps, net_reg is not None))
    if proxy_ops:
        kernel.run([conns.wait_sent(kernel, proxy_ops)])


def channel_works(kernel, plan, channels: list, nranks: int, sendbuff, recvbuff, redop, root: int, in_place: bool,
                  chunk_steps: int, slice_steps: int, net_reg: bool = False) -> list[Iterator]:
    """Every thread group of every channel of ``plan``, as generators for ``Kernel.run``."""
    works = []
    for w in plan.works:
        ch = channels[w.channel]
        if plan.algo == "Tree":
            works += _tree_works(kernel, ch, w, plan.proto, sendbuff, recvbuff, redop)
            continue
        prims = primitives(kernel, plan.proto, ch.id, ch.recv, ch.send, sendbuff, recvbuff, redop, chunk_steps,
                           slice_steps, net_reg=net_reg)
        run, locate = RING[plan.func]
        if kernel.tracer is not None:
            prims.locate = locate(w, nranks, sendbuff.itemsize, ch.ring.user_ranks[0])
        works.append(_traced_channel(prims.finished(run(prims, ch.ring, w, nranks, root, in_place)), kernel, w))
    return works


def _tree_works(kernel, ch, w, proto: str, sendbuff, recvbuff, redop) -> list:
    """Tree AllReduce on one channel: ``run_tree_split`` (NCCL's default), or with ``NCCLLAB_TREE_UPDOWN=1``
    ``run_tree_up_down``; each thread group is one generator of the kernel.  Tree/Simple is ``ProtoSimple<1, 1>``."""

    def prims(recv_peers, send_peers, group: int):  # NCCL's Primitives constructor over this channel's peers
        recv_conns, send_conns = ch.connectors(recv_peers, send_peers)
        p = primitives(kernel, proto, ch.id, recv_conns, send_conns, sendbuff, recvbuff, redop, 1, 1, group)
        if kernel.tracer is not None:
            p.locate = lambda prim, src, dst: all_reduce.locate_tree(w, prim, src, dst)
        return p

    if all_reduce.tree_up_down():
        groups = [all_reduce.run_tree_up_down(prims, ch.tree, w)]
    else:
        groups = all_reduce.run_tree_split(prims, ch.tree, w)
    return [_traced_channel(g, kernel, w) for g in groups]


def _traced_channel(gen, kernel, work):
    """Run one thread group of a channel; with tracing, record it as a ``channel`` event."""
    tracer = kernel.tracer
    t0 = now() if tracer is not None else 0
    yield from gen
    if tracer is not None:
        tracer.add("channel", kernel.op_count, work.channel, work.part_offset, work.part_count, work.chunk_count,
                   t0, now())

