"""Rank programs for the multi-process tests: ``workers.py NAME [args]``, one process per rank."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
import os
import signal
import sys
import time

import numpy as np

import collectives
from collectives.perf import reference
from collectives.perf.colls import BY_CLI
from collectives.perf.runner import random_input
from collectives.device.reduce_copy import DTYPES

BIG_PRIME = 1_000_003


def rank0(comm, value: int) -> int:
    """Rank 0's integer on every rank (a seed), over the bootstrap's typed allgather."""
    return comm.bootstrap.allgather_struct("<Q", value)[0][0]


def hostids(comm) -> list[str]:
    """Every rank's NCCL_HOSTID (which ranks share an emulated node)."""
    mine = os.environ.get("NCCL_HOSTID", "").encode()
    return [raw.decode() for raw in comm.bootstrap.allgather(mine, 256)]


def inputs_for(seed: int, n: int, count: int, dtype) -> list[np.ndarray]:
    return [random_input(np.random.default_rng([seed, q, count]), count, dtype, 2.0) for q in range(n)]


def bits(a: np.ndarray) -> np.ndarray:
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def same(got, want, what: str) -> None:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or not np.array_equal(bits(got), bits(want)):
        bad = np.flatnonzero(bits(got) != bits(want)) if got.shape == want.shape else []
        raise AssertionError(f"{what}: {len(bad)} elements differ, first at {bad[:5]}: got {got.ravel()[bad[:3]]} "
                             f"want {want.ravel()[bad[:3]]}")


def poisoned(count: int, dt) -> np.ndarray:
    """An output buffer of ``count`` elements whose every byte is 0xFF (NaN for floats, -1 or max for integers)."""
    return np.frombuffer(b"\xff" * (count * np.dtype(dt).itemsize), dt).copy()


def check_all(comm, seed: int, dtype: str, count: int, colls: list[str], op: str = "sum") -> None:
    """Every collective in ``colls`` (runner names), out-of-place and in-place, poisoned outputs, bitwise vs the
    reference; roots vary with the seed."""
    n, r = comm.nranks, comm.rank
    dt = DTYPES[dtype]
    for name in colls:
        coll = BY_CLI[name]
        kw = independent_config(comm, coll.name, count, dt)
        root = (seed + count + (coll.name == "Reduce")) % n
        for in_place in (False, True):
            tag = f"{name} {dtype} count={count} n={n} ch={comm.nchannels} rings={comm.rings} in_place={in_place}"
            nsend = count * n if coll.name == "ReduceScatter" else count
            nrecv = count * n if coll.name == "AllGather" else count
            xs = inputs_for(seed, n, nsend, dt)
            buf = poisoned(max(nsend, nrecv), dt)
            if in_place:
                send, out = coll.in_place(buf, r, count)
                if not (coll.name == "Broadcast" and r != root):  # a non-root's Broadcast buffer stays poisoned
                    send[...] = xs[r]
            else:
                send, out = xs[r].copy(), buf[:nrecv]
            got = coll.call(comm, send, out, op, root)
            want = coll.reference(xs, r, op, root, **kw)
            if want is not None:
                same(got, want, tag)
            seed += 1


ALL = ["allreduce", "reducescatter", "allgather", "broadcast", "reduce"]


def independent_config(comm, func: str, count: int, dt, registered: bool = False) -> dict:
    """The reference's configuration, from the environment and NCCL's rules as ``reference`` writes them again:
    channels, rings, thread count (so the channel shrink) and a forced protocol or algorithm.  Only the cost
    model's automatic choice (for buffers ``registered`` or not: the tuner plugin is told), with the channel count a
    tuner plugin asks, and the trees are taken from the communicator (tested on their own elsewhere)."""
    if not hasattr(comm, "_test_hosts"):  # every rank's NCCL_HOSTID: which ranks share a node
        comm._test_hosts = hostids(comm)
    given = getattr(comm, "_test_rings", None)
    search = getattr(comm, "_test_search_channels", None) or max(1, len(given or []))
    own = reference.config_from_env(comm.nranks, search, given, comm._test_hosts)
    chosen = comm.reference_config(func, count, dt, registered)
    for key in ("proto", "algo"):
        if own[key] is not None and (key == "proto" or func == "AllReduce"):
            assert chosen[key] == own[key], (func, count, key, chosen[key], own[key])
    proto = own["proto"] or chosen["proto"]
    config = {"rings": own["rings"], "nchannels": own["nchannels"], "search_channels": own["search_channels"],
              "proto": proto, "algo": (own["algo"] if func == "AllReduce" else None) or chosen["algo"],
              "trees": chosen["trees"], "buffsize": own["buff_sizes"][proto]}
    if "max_channels" in chosen:
        config["max_channels"] = chosen["max_channels"]
    return config


@dataclass
class Case:
    """What the ``bitwise`` worker checks: a communicator with ``channels`` search channels (and ``rings`` if
    given), then every count x type x op of every collective in ``colls``.  Travels as one JSON argument."""
    counts: list
    dtypes: list
    colls: list = field(default_factory=lambda: list(ALL))
    ops: list = field(default_factory=lambda: ["sum"])
    channels: int = 1
    rings: list | None = None
    proto: str = "LL"  # compiled_paths: the protocol whose compiled kernel is checked
    mixed: bool = False  # compiled_paths: the first pass runs compiled on even ranks only, readable on odd ones

    def arg(self) -> str:
        return json.dumps(asdict(self))


def bitwise(args: list[str]) -> None:
    """bitwise CASE (a ``Case`` as JSON)"""
    case = Case(**json.loads(args[0]))
    seed = int.from_bytes(os.urandom(4), "little")
    with collectives.Communicator(rings=case.rings, search_channels=case.channels) as comm:
        comm._test_rings, comm._test_search_channels = case.rings, case.channels  # what the test asked for
        seed = rank0(comm, seed)  # fresh inputs each run, the same on every rank
        for count in case.counts:
            for dtype in case.dtypes:
                for op in case.ops:
                    check_all(comm, seed, dtype, count, case.colls, op)
                    seed += 101
    print(f"rank {comm.rank} ok", flush=True)


def mismatch(args: list[str]) -> None:
    """Rank 1 calls with another count (or dtype): every rank must fail with a clear message."""
    kind = args[0]
    with collectives.Communicator() as comm:
        count, dtype = 4096, np.float32
        if comm.rank == 1:
            if kind == "count":
                count = 4000
            elif kind == "dtype":
                dtype = np.int32
        x = np.ones(count, dtype)
        op = "max" if (kind == "op" and comm.rank == 1) else "sum"
        comm.all_reduce(x, op=op)
    print("unexpected success", flush=True)


def sigkill(args: list[str]) -> None:
    """Rank VICTIM kills itself with SIGKILL in the middle of a stream of large allreduces."""
    victim = int(args[0])
    with collectives.Communicator() as comm:
        x = np.ones(4 << 20, np.float32)
        for i in range(1000):
            if comm.rank == victim and i == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            comm.all_reduce(x)
    print("unexpected success", flush=True)


def stuck(args: list[str]) -> None:
    """Rank 1 never enters the collective (until well past the others' deadline)."""
    with collectives.Communicator() as comm:
        if comm.rank == 1:
            time.sleep(float(args[0]))
            sys.exit(0)
        comm.all_reduce(np.ones(1000, np.float32))
    print("unexpected success", flush=True)


def mpi_compare(args: list[str]) -> None:
    """Under mpirun: integer types and every op, compared exactly with mpi4py in the same run."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    seed = world.bcast(int.from_bytes(os.urandom(4), "little"))
    mpi_op = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}
    with collectives.Communicator() as comm:
        assert comm.rank == world.rank and comm.nranks == world.size
        n, r = comm.nranks, comm.rank
        for dtype in ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float64"]:
            dt = DTYPES[dtype]
            for count in [1, 7, 1023, 65537]:
                x = inputs_for(seed, n, count, dt)[r]
                for op in ["sum", "prod", "min", "max"]:
                    want = np.empty_like(x)
                    world.Allreduce(x, want, op=mpi_op[op])
                    got = comm.all_reduce(x, op=op)
                    if dt.kind in "iu":
                        same(got, want, f"AllReduce {dtype} {op} count={count} vs MPI")
                    rs_in = inputs_for(seed + 1, n, count * n, dt)[r]
                    want_rs = np.empty(count, dt)
                    world.Reduce_scatter_block(rs_in, want_rs, op=mpi_op[op])
                    if dt.kind in "iu":
                        same(comm.reduce_scatter(rs_in, op=op), want_rs, f"ReduceScatter {dtype} {op} vs MPI")
                    want_r = np.empty_like(x)
                    world.Reduce(x, want_r, op=mpi_op[op], root=n - 1)
                    got_r = comm.reduce(x, root=n - 1, op=op)
                    if r == n - 1 and dt.kind in "iu":
                        same(got_r, want_r, f"Reduce {dtype} {op} vs MPI")
                want_ag = np.empty(count * n, dt)
                world.Allgather(x, want_ag)
                same(comm.all_gather(x), want_ag, f"AllGather {dtype} vs MPI")
                b = x.copy()
                world.Bcast(b, root=1 % n)
                same(comm.broadcast(x.copy(), root=1 % n), b, f"Broadcast {dtype} vs MPI")
                # integer Avg: NCCL's SumPostDiv (no MPI equivalent): compare with MPI's sum, then truncate
                if dt.kind in "iu":
                    s = np.empty_like(x)
                    world.Allreduce(x, s, op=MPI.SUM)
                    q = s // dt.type(n)  # C's division truncates toward zero, numpy's floors
                    if dt.kind == "i":
                        q[(s < 0) & (s % dt.type(n) != 0)] += dt.type(1)
                    got = comm.all_reduce(x, op="avg")
                    same(got, q, f"AllReduce {dtype} avg vs MPI's sum / {n}")
                    exact = reference.all_reduce(inputs_for(seed, n, count, dt), "avg", rings=comm.rings)
                    same(got, exact, f"AllReduce {dtype} avg")
            seed += 7
    print(f"rank {r} ok", flush=True)


def traced_allreduce(args: list[str]) -> None:
    """One AllReduce of COUNT float32 on CHANNELS channels (the test reads the trace afterwards)."""
    nch, count = int(args[0]), int(args[1])
    with collectives.Communicator(search_channels=nch) as comm:
        x = np.ones(count, np.float32)
        assert np.array_equal(comm.all_reduce(x), np.full_like(x, comm.nranks))


def _nccl_cpu_choice(func: str, nbytes: int, n: int, nodes: int, search: int, protos: set | None,
                     ranks_per_core: float = 1.0) -> tuple:
    """(algo, proto) by NCCL's ncclTopoTuneModel / ncclTopoGetAlgoTime / topoGetAlgoInfo, written again here for
    the lab's CPU machine (1 ring of 6 GB/s per search channel, path PHB, compute capability 0 so LL128 only when
    NCCL_PROTO names it, AMD x86; measured constants: base latency LL 25.9, LL128 30.3, Simple 23.3 us, 3 us per
    step inside a node, but Ring/LL and Ring/Simple, which run compiled, 2.5 and 3.0 us and 1 us per step (Ring/LL128
    keeps 30.3 and 3); across nodes, per step, Tree
    LL/LL128 600, Simple 360, Ring LL/LL128 1155, Simple 860 us).  NCCL's default tables restated: llMaxBws, perChMaxTreeBws, perChMaxRing/TreeLL128Bws.  Only the
    tree correction factors are taken from the cost model (a table of NCCL constants, tested on its own).  The lab's
    tuner plugin, written again: with more ranks than cores on one node, an AllReduce of 512 B to 512 KiB (128 KiB
    from 4 ranks a core) takes Tree/Simple, and across nodes of several ranks (buffers unregistered here) an
    AllReduce of 2 MiB or more takes Ring/Simple, when NCCL_PROTO allows Simple (its cost set to 0, as NCCL's
    example tuner does)."""
    from collectives.graph.cost_model import TREE_CORRECTION
    simple = protos is None or "Simple" in protos
    tree_to = 128 << 10 if ranks_per_core >= 4 else 512 << 10
    if ranks_per_core > 1 and nodes == 1 and func == "AllReduce" and 512 <= nbytes <= tree_to and simple:
        return ("Tree", "Simple")
    if 1 < nodes < n and func == "AllReduce" and nbytes >= 2 << 20 and simple:
        return ("Ring", "Simple")
    f = np.float32
    nsteps = {"AllReduce": 2 * (n - 1), "AllGather": n - 1, "ReduceScatter": n - 1}.get(func, n)
    i2 = min(nodes - 1, 2)
    ll_max = (39.0, 39.0, 20.4)[i2] if nodes == 1 else (87.7, 22.5, 19.0)[i2]
    tree_max, ll128_max = (26.5, 18.5, 10.0)[i2], 20.0
    best, best_t = None, float("inf")
    for algo in ("Tree", "Ring"):
        if algo == "Tree" and func != "AllReduce":
            continue
        for p, proto in enumerate(("LL", "LL128", "Simple")):
            if (protos is None and proto == "LL128") or (protos is not None and proto not in protos):
                continue
            hw_of = lambda a, p=proto: 1.0 if (a, p) in (("Ring", "LL"), ("Ring", "Simple")) else 3.0  # noqa: E731
            net_of = lambda a, p=proto: {"Tree": 360.0 if p == "Simple" else 600.0,  # noqa: E731
                                         "Ring": 860.0 if p == "Simple" else 1155.0}[a]
            base = {("Ring", "LL"): 2.5, ("Ring", "Simple"): 3.0}.get((algo, proto)) or \
                {"LL": 25.9, "LL128": 30.3, "Simple": 23.3}[proto]
            hw = hw_of(algo)
            bw = search * 6.0
            if algo == "Ring" and proto == "LL":
                bw = min(ll_max, bw * .5)
            if algo == "Ring" and proto == "LL128":
                bw = min(bw * .92, search * ll128_max)
            if algo == "Tree":
                bw = min(bw * .92, search * tree_max)
                if proto == "LL":
                    bw = min(bw / 3.8, ll_max)
                if proto == "LL128":
                    bw = min(bw * (7 / 9 if nodes == 1 else 120 / 128), search * ll128_max)
            bw = f(f(bw) * f(n / nsteps if algo == "Ring" else .5))
            lat = base
            if algo == "Ring" and func in ("Reduce", "Broadcast"):
                lat += net_of("Ring") if nodes > 1 else hw
            elif algo == "Ring":
                intra = max(hw, (2.0 * (3 if proto == "Simple" else 1)) if nodes > 1 else 0.0)
                inter_steps = 0 if nodes == 1 else (2 * (nodes - 1) if func == "AllReduce" else nodes - 1)
                inter = net_of("Tree" if n // nodes == 1 else "Ring")  # NCCL: one rank a node -> the tree's row
                lat += (nsteps - inter_steps) * intra + inter_steps * inter
            else:
                lat += 2 * ((n // nodes - 1) * hw + (nodes.bit_length() - 1) * net_of("Tree"))
            log_size = (nbytes >> 6).bit_length() - 1
            if algo == "Tree" and 0 <= log_size < 23:
                bw = f(bw * f(TREE_CORRECTION[p][log_size]))
            if algo == "Ring" and proto == "Simple" and nodes > 1 and func == "AllReduce" and \
                    nbytes // (2 * search * n) >= 64:
                lat *= 1.9
            t = float(f(f(lat) + f(f(nbytes) / f(1000 * bw))))
            if t < best_t:
                best, best_t = (algo, proto), t
    return best


def _cpu_tuner_channels(func: str, nbytes: int, n: int, nodes: int, protos: set | None, ranks_per_core: float) -> int:
    """The lab's tuner plugin's nChannels, written again: across nodes of several ranks (buffers unregistered
    here), with more ranks than cores, an AllReduce its ring rule sets to Ring/Simple (2 MiB or more) runs on one
    channel below 64 MiB; else 0 (NCCL's own count)."""
    simple = protos is None or "Simple" in protos
    return int(ranks_per_core > 1 and 1 < nodes < n and func == "AllReduce" and 2 << 20 <= nbytes < 64 << 20 and simple)


def auto_choice(args: list[str]) -> None:
    """The communicator's automatic (algo, proto) equals what NCCL's rules give on the lab's CPU machine, and so
    does the channel count the lab's tuner plugin asks."""
    text = os.environ.get("NCCL_PROTO", "")
    protos = {p for p in ("LL", "LL128", "Simple") if p.lower() in text.lower().split(",")} if text else None
    with collectives.Communicator() as comm:
        nodes = len(set(hostids(comm)))
        ranks_per_core = comm.nranks / len(os.sched_getaffinity(0))  # every rank of the test runs here
        chosen = set()
        for func, mult in (("AllReduce", 1), ("AllGather", comm.nranks), ("ReduceScatter", comm.nranks),
                           ("Broadcast", 1), ("Reduce", 1)):
            for count in [1, 7, 100, 4096, 65536, 1 << 20, 1 << 22, 1 << 24]:
                plan = comm.plan(func, count, np.float32)
                want = _nccl_cpu_choice(func, 4 * count * mult, comm.nranks, nodes, 1, protos, ranks_per_core)
                assert (plan.algo, plan.proto) == want, (func, count, plan.algo, plan.proto, want)
                tuned = _cpu_tuner_channels(func, 4 * count * mult, comm.nranks, nodes, protos, ranks_per_core)
                assert plan.tuner_channels == tuned and (not tuned or plan.nchannels == 1), \
                    (func, count, plan.tuner_channels, plan.nchannels, tuned)
                chosen.add(plan.proto)
        x = np.ones(1 << 16, np.float32)
        assert np.array_equal(comm.all_reduce(x), np.full_like(x, comm.nranks))
    print(f"rank {comm.rank} ok {sorted(chosen)}", flush=True)


def nan_minmax(args: list[str]) -> None:
    """nan_minmax PROTOS(json): max and min of float32/float64/float16/bfloat16 inputs with NaNs (some elements
    NaN on one rank, some on all) and signed zeros, each protocol, bitwise against the reference (NaN dropped, two
    NaNs canonical, a +0/-0 tie keeps the first operand)."""
    for proto in json.loads(args[0]):
        with collectives.Communicator(protocols=proto) as comm:
            n, r = comm.nranks, comm.rank
            for dtype in ("float32", "float64", "float16", "bfloat16"):
                dt = DTYPES[dtype]
                for count in (5, 1000, 70001):
                    xs = inputs_for(count, n, count, dt)
                    for q in range(n):
                        xs[q][q::n + 1] = np.nan   # NaN on one rank only
                        xs[q][n::n + 2] = np.nan   # NaN on every rank
                        xs[q][1::n + 3] = -0.0 if q % 2 else 0.0  # +0 against -0: the first operand stays
                    for op in ("max", "min"):
                        kw = independent_config(comm, "AllReduce", count, dt)
                        assert kw["proto"] == proto
                        same(comm.all_reduce(xs[r].copy(), op=op), reference.all_reduce(xs, op, **kw),
                             f"AllReduce {op} {dtype} {proto} count={count}")
                        kw = independent_config(comm, "Reduce", count, dt)
                        got = comm.reduce(xs[r].copy(), root=1, op=op)
                        if r == 1:
                            same(got, reference.reduce(xs, 1, op, **kw), f"Reduce {op} {dtype} {proto}")
    print(f"rank {r} ok", flush=True)


def tree_bitwise(args: list[str]) -> None:
    """tree_bitwise PROTOS(json) COUNTS(json) DTYPES(json) OPS(json): with NCCL_ALGO=Tree in the environment, one
    communicator per protocol; every AllReduce must run as Tree and match the tree reference bitwise."""
    protos, counts, dtypes, ops = (json.loads(a) for a in args[:4])
    seed = int.from_bytes(os.urandom(4), "little")
    for proto in protos:
        with collectives.Communicator(protocols=proto) as comm:
            seed = rank0(comm, seed)
            for count in counts:
                for dtype in dtypes:
                    if count:
                        plan = comm.plan("AllReduce", count, DTYPES[dtype])
                        assert (plan.algo, plan.proto) == ("Tree", proto), (plan.algo, plan.proto)
                    for op in ops:
                        check_all(comm, seed, dtype, count, ["allreduce"], op)
                        seed += 101
    print(f"rank {comm.rank} ok", flush=True)


def api_forms(args: list[str]) -> None:
    """nccl4py's forms next to ours on real ranks: results equal, Reduce leaves a non-root buffer untouched."""
    with collectives.Communicator() as comm:
        n, r = comm.nranks, comm.rank
        x = np.full((2, 3), r + 1, np.float32)
        y = np.empty_like(x)
        comm.allreduce(x, y, collectives.SUM)
        same(y, comm.all_reduce(x, op="sum"), "allreduce forms")
        assert y.shape == (2, 3) and float(y[0, 0]) == n * (n + 1) / 2
        out = np.full((2, 3), -7, np.float32)
        got = comm.reduce(x, out, collectives.MAX, 1)
        if r == 1:
            assert float(got[0, 0]) == n
        else:
            assert np.all(out == -7), "a non-root rank's receive buffer must stay as it was"
        b = np.empty_like(x)
        comm.broadcast(x, b, 2)
        assert np.all(b == 3)
        g = np.empty((n * 2, 3), np.float32)
        comm.allgather(x, g)
        assert [float(v) for v in g[::2, 0]] == [q + 1 for q in range(n)]
        rs = np.empty((1, 3), np.float32)
        comm.reduce_scatter(np.ones((n, 3), np.float32), rs, collectives.SUM)
        assert np.all(rs == n)
    print(f"rank {r} ok", flush=True)


def repeated_buffers(args: list[str]) -> None:
    """The same two arrays call after call, as a training loop passes them (``api.all_reduce`` checks them once and
    keeps the prepared launch): fresh inputs each call, bitwise NCCL's order; an op given or changed applies; in
    place too; inside a group the call waits for ``group_end``; after ``destroy`` it raises."""
    comm = collectives.Communicator()
    n, r = comm.nranks, comm.rank
    seed = rank0(comm, int.from_bytes(os.urandom(4), "little"))
    ref = BY_CLI["allreduce"].reference
    for count in (1, 7, 1001, 70001):  # LL at the small counts, Simple at the last (the cost model's choice)
        kw = independent_config(comm, "AllReduce", count, np.float32)
        x, out = np.empty(count, np.float32), poisoned(count, np.float32)
        for i, op in enumerate((None, None, None, "max", "max", "sum", None, "prod", "min")):
            xs = inputs_for(seed + i, n, count, np.float32)
            x[...], out[...] = xs[r], poisoned(count, np.float32)
            got = comm.all_reduce(x, out=out) if op is None else comm.all_reduce(x, out=out, op=op)
            assert got is out
            same(out, ref(xs, r, op or "sum", 0, **kw), f"rank {r}: repeat {i} count={count} op={op}")
        for i in range(3):  # in place: the send buffer is the receive buffer
            xs = inputs_for(seed + 50 + i, n, count, np.float32)
            x[...] = xs[r]
            comm.all_reduce(x, out=x)
            same(x, ref(xs, r, "sum", 0, **kw), f"rank {r}: in-place repeat {i} count={count}")
        comm.all_reduce(x, out=out)  # these two arrays again, so that the grouped call below is a repeat
        xs = inputs_for(seed + 99, n, count, np.float32)
        x[...], out[...] = xs[r], poisoned(count, np.float32)
        collectives.group_start()
        comm.all_reduce(x, out=out)
        assert np.array_equal(bits(out), bits(poisoned(count, np.float32))), \
            f"rank {r}: a repeated call inside a group ran before group_end"
        collectives.group_end()
        same(out, ref(xs, r, "sum", 0, **kw), f"rank {r}: grouped repeat count={count}")
        seed += 1000
    comm.destroy()
    try:
        comm.all_reduce(x, out=out)
    except RuntimeError as exc:
        assert "destroyed" in str(exc), exc
    else:
        raise AssertionError(f"rank {r}: a repeated call after destroy() ran")
    print(f"rank {r} ok", flush=True)


def edge_inputs(seed: int, n: int, count: int, dt) -> list[np.ndarray]:
    """Random inputs with the values where two implementations of an op part ways: NaN, +-0 and +-inf for
    floats, the full range for integers (overflow wraps).  The NaN is x86's default NaN (what inf - inf gives,
    0xFFC00000 for float32), so every NaN in play has the same bits: which operand's payload a NaN + NaN keeps
    depends on the compiler's operand order (numpy's loops and numba's alike), and NCCL's GPUs canonicalise it."""
    rng = np.random.default_rng([seed, count])
    if dt.kind == "f":
        xs = [rng.standard_normal(count).astype(dt) for _ in range(n)]
        specials = np.array([-np.nan, 0.0, -0.0, np.inf, -np.inf], dt)
        for x in xs:
            mask = rng.random(count) < 0.2
            x[mask] = rng.choice(specials, int(mask.sum()))
        return xs
    info = np.iinfo(dt)
    return [rng.integers(info.min, info.max, count, dtype=dt, endpoint=True) for _ in range(n)]


def compiled_paths(args: list[str]) -> None:
    """compiled_paths CASE: every collective, type, op and count of CASE over CASE's protocol (LL, LL128 or Simple),
    once compiled (``device/compiled``) and once through the readable primitives (NCCLLAB_LL_COMPILED=0 or
    NCCLLAB_SIMPLE_COMPILED=0); both must give the same bits, and the compiled run must have run compiled (rings,
    and Tree/Simple AllReduce: NCCL_ALGO=Tree in the environment makes every AllReduce a tree)."""
    from collectives.device import compiled as compiled_ring
    case = Case(**json.loads(args[0]))
    results = []
    for mode in ("1", "0"):
        os.environ[compiled_ring.SWITCHES[case.proto]] = mode
        got = []
        with collectives.Communicator(search_channels=case.channels, protocols=case.proto) as comm:
            if case.mixed and mode == "1":  # the two paths share FIFOs, head, tail and step counters
                os.environ[compiled_ring.SWITCHES[case.proto]] = "1" if comm.rank % 2 == 0 else "0"
            compiled_here = os.environ[compiled_ring.SWITCHES[case.proto]] == "1"
            seed = rank0(comm, int.from_bytes(os.urandom(4), "little") if mode == "1" else 0)
            seed = results[0][0] if results else seed
            n, r = comm.nranks, comm.rank
            for name in case.colls:
                coll = BY_CLI[name]
                for dtype in case.dtypes:
                    dt = DTYPES[dtype]
                    for op in case.ops if coll.reduces else ["sum"]:
                        for count in case.counts:
                            nsend = count * n if coll.name == "ReduceScatter" else count
                            nrecv = count * n if coll.name == "AllGather" else count
                            xs = edge_inputs(seed + count, n, nsend, dt)
                            for in_place in (False, True):
                                buf = poisoned(max(nsend, nrecv), dt)
                                send, out = coll.in_place(buf, r, count) if in_place else (xs[r].copy(), buf[:nrecv])
                                if in_place:
                                    send[...] = xs[r]
                                root = (count + 1) % n
                                if r == 0 and count == case.counts[0]:  # the others wait long enough to sleep
                                    time.sleep(0.02)
                                res = coll.call(comm, send, out, op, root)
                                ran = any(c is not None for k, t in comm._tasks.items() for c in t.compiled.values()
                                          if k[:3] == (coll.name, count, dt))
                                algo = comm.plan(coll.name, count, dt).algo  # rings, and Tree/Simple
                                expect = (compiled_here and count > 0 and dtype not in ("float16", "bfloat16")
                                          and (op != "avg" or coll.name in ("AllGather", "Broadcast"))
                                          and (algo == "Ring" or (algo == "Tree" and case.proto == "Simple")))
                                assert ran == expect, f"rank {r}: {coll.name} {dtype} {op} {count}: compiled {ran}"
                                got.append((f"{coll.name} {dtype} {op} count={count} in_place={in_place}",
                                            bits(np.asarray(res)).copy()))
                                stale = [(ch.id, c.peer) for ch in comm.channels for c in
                                         [*ch.recv_from.values()] if c.tail_sleep[0]] + \
                                        [(ch.id, c.peer) for ch in comm.channels for c in
                                         [*ch.send_to.values()] if c.head_sleep[0]]
                                assert not stale, f"rank {r}: sleep marks left set after a call: {stale}"
        results.append((seed, got))
    for (what, a), (_, b) in zip(results[0][1], results[1][1]):
        if not np.array_equal(a, b):
            bad = np.flatnonzero(a != b)
            raise AssertionError(f"rank {r}: {what}: compiled and readable {case.proto} differ at {len(bad)} elements, "
                                 f"first {bad[:4]}: {a[bad[:2]]} vs {b[bad[:2]]}")
    fan = max((len([d for d in ch.tree.down if d != -1]) for ch in comm.channels if ch.tree is not None), default=0)
    print(f"rank {r} ok {len(results[0][1])} calls, tree fan {fan}", flush=True)


def buff_sizes(args: list[str]) -> None:
    """Print this rank's node count and the FIFO sizes its communicator chose (``computeBuffSizes``)."""
    with collectives.Communicator() as comm:
        sys.stdout.write(f"rank {comm.rank} nodes {comm.nnodes} {json.dumps(comm.buff_sizes, sort_keys=True)}\n")
        sys.stdout.flush()


def oversubscription(args: list[str]) -> None:
    """Pinned to ``args[0]`` cores: print this rank's node size and whether the communicator counts itself
    oversubscribed (it must count every rank of the machine, emulated nodes included)."""
    cores = int(args[0])
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cores])
    with collectives.Communicator() as comm:
        sys.stdout.write(f"rank {comm.rank} node {len(comm.local_ranks)} cores {len(os.sched_getaffinity(0))} "
                         f"oversubscribed {comm.oversubscribed}\n")  # one write: ranks share the pipe
        sys.stdout.flush()


if __name__ == "__main__":
    # NCCL_SHM_DISABLE=1 on one emulated node only (the test names it), set before any communicator exists.
    node = os.environ.get("NCCLLAB_TEST_SHM_DISABLE_NODE")
    if node is not None and os.environ.get("NCCL_HOSTID") == f"nccllab-node{node}":
        os.environ["NCCL_SHM_DISABLE"] = "1"
    globals()[sys.argv[1]](sys.argv[2:])

