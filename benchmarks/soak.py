"""Soak: many random collectives under mpirun, every result checked bitwise, with the caller busy in between.

    python benchmarks/soak.py [-g 4] [--count 1000] [--seconds S] [--seed N] [--max-bytes 8M]

Runs itself under ``mpirun -n G`` when it is not under one.  Every ``--per-comm`` collectives all ranks destroy
their communicator and open a new one with a random configuration: emulated node split (``NCCL_HOSTID``: 1, 2
or G nodes, so NET and its proxy thread carry the inter-node links), ``NCCL_PROTO`` (Simple, LL, LL128 or the
cost model's choice), ``NCCL_ALGO`` (Ring, Tree for AllReduce, or the model's choice) and search channel count
(1 or 2, doubled by Postset).  Each collective draws its function, size (0 B to ``--max-bytes``, log-uniform),
type, op, root and placement; inputs are fresh random numbers (every rank derives every rank's input from the
shared seed, so no data moves to check), outputs are poisoned, and the result is compared bitwise with
``collectives.perf.reference``.  Between two collectives the rank does MPI calls (one of them mpi4py's lowercase
``allreduce``, which keeps the GIL while it waits) and pure-Python work.  A hang ends the job through
NCCLLAB_TIMEOUT and MPI_Abort; the last line reports collectives, wrong results and hangs.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

import numpy as np

import collectives
from collectives.perf.colls import COLLECTIVES
from collectives.device.reduce_copy import DTYPES
from collectives.job import node_hostid, under_mpirun
from collectives.perf.args import parse_size
from collectives.perf.runner import random_input

OPS = ["sum", "prod", "min", "max", "avg"]
PROTOS = ["Simple", "LL", "LL128", ""]
ALGOS = ["Ring", "allreduce:Tree", ""]


def inputs(seed: int, n: int, count: int, dtype: np.dtype) -> list[np.ndarray]:
    return [random_input(np.random.default_rng([seed, q]), count, dtype, 2.0) for q in range(n)]


def poisoned(count: int, dtype: np.dtype) -> np.ndarray:
    return np.frombuffer(b"\xff" * (count * dtype.itemsize), dtype).copy()


def one_collective(comm, rng: np.random.Generator, seed: int, max_bytes: int) -> tuple[str, bool]:
    """Draw one collective, run it, compare with the reference: (description, equal)."""
    n, r = comm.nranks, comm.rank
    coll = COLLECTIVES[str(rng.choice(sorted(COLLECTIVES)))]
    dtype = DTYPES[str(rng.choice(sorted(DTYPES)))]
    op, root, in_place = str(rng.choice(OPS)), int(rng.integers(n)), bool(rng.integers(2))
    nbytes = 0 if rng.random() < 0.05 else int(2 ** rng.uniform(0, np.log2(max_bytes)))
    count = nbytes // dtype.itemsize // (n if coll.per_rank else 1)
    nsend, nrecv = (count * n if coll.name == "ReduceScatter" else count), (count * n if coll.name == "AllGather"
                                                                           else count)
    kw = comm.reference_config(coll.name, count, dtype)
    what = f"{coll.name} count={count} {dtype} op={op} root={root} in_place={in_place} {kw['algo']}/{kw['proto']}"
    xs = inputs(seed, n, nsend, dtype)
    buf = poisoned(max(nsend, nrecv), dtype)
    if in_place:
        send, out = coll.in_place(buf, r, count)
        send[...] = xs[r]
    else:
        send, out = xs[r], buf[:nrecv]
    got = coll.call(comm, send, out, op, root)
    want = coll.reference(xs, r, op, root, **kw)
    if want is None:  # a non-root rank of Reduce: NCCL defines nothing there
        return what, True
    u = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[dtype.itemsize]
    return what, bool(np.array_equal(np.asarray(got).view(u), np.asarray(want).view(u)))


def busy(world, rng: np.random.Generator, mpi) -> None:
    """What a training script does between collectives: MPI calls and Python work."""
    kind = int(rng.integers(4))
    if kind == 0:
        world.allreduce(1, op=mpi.SUM)  # keeps the GIL while it waits
    elif kind == 1:
        world.Barrier()
    elif kind == 2:
        buf = np.ones(64, np.float64)
        world.Allreduce(mpi.IN_PLACE, buf)
    end = time.perf_counter() + float(rng.uniform(0, 0.001))
    while time.perf_counter() < end:
        pass


def new_comm(world, rng: np.random.Generator, nodes_choices: list[int], protos: list[str], algos: list[str]):
    nodes = int(rng.choice(nodes_choices))
    if nodes > 1:
        os.environ["NCCL_HOSTID"] = node_hostid(world.rank, world.size, nodes)
    else:
        os.environ.pop("NCCL_HOSTID", None)
    proto, algo, nch = str(rng.choice(protos)), str(rng.choice(algos)), int(rng.integers(1, 3))
    uid = world.bcast(collectives.get_unique_id().to_bytes() if world.rank == 0 else None)
    comm = collectives.Communicator(uid, world.size, world.rank, search_channels=nch, protocols=proto, algorithms=algo)
    return comm, f"nodes={nodes} proto={proto or 'auto'} algo={algo or 'auto'} channels={comm.nchannels}"


def out_of_time(world, t0: float, seconds: float, mpi) -> bool:
    """Whether to stop, decided by every rank together.  Each rank's clock starts at a different moment: deciding
    alone, one rank would leave after collective N while another entered collective N + 1 and waited for it (the
    "rare soak hang" of the first version of this script)."""
    return bool(world.allreduce(int(time.monotonic() - t0 > seconds), op=mpi.MAX))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-g", "--nranks", type=int, default=4, help="ranks to start under mpirun (default 4)")
    p.add_argument("--count", type=int, default=1000, help="collectives to run (default 1000)")
    p.add_argument("--seconds", type=float, default=0, help="stop after this long instead (0: no limit)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: fresh)")
    p.add_argument("--max-bytes", type=parse_size, default=parse_size("8M"), help="largest message (default 8M)")
    p.add_argument("--per-comm", type=int, default=25, help="collectives per communicator (default 25)")
    p.add_argument("--clock-skew", type=float, default=0.0,
                   help="start rank r's clock r x this many seconds late (checks that the ranks stop together)")
    p.add_argument("--nodes", type=int, nargs="*", help="node splits to draw from (default: 1, 2 and G)")
    p.add_argument("--protos", nargs="*", default=PROTOS, help="NCCL_PROTO values to draw from ('' = auto)")
    p.add_argument("--algos", nargs="*", default=ALGOS, help="NCCL_ALGO values to draw from ('' = auto)")
    a = p.parse_args()
    if not under_mpirun():
        mpirun = shutil.which("mpirun") or sys.exit("soak.py: mpirun not found (pip install mpich)")
        os.execv(mpirun, [mpirun, "-n", str(a.nranks), sys.executable, __file__, *sys.argv[1:]])
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    seed = world.bcast(a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "little"))
    time.sleep(a.clock_skew * world.rank)
    rng = np.random.default_rng(seed)  # the same draws on every rank
    nodes_choices = a.nodes or sorted({1, 2, world.size} - {0})
    t0, done, wrong, comms = time.monotonic(), 0, 0, 0
    comm = None
    while done < a.count and not (a.seconds and out_of_time(world, t0, a.seconds, MPI)):
        if done % a.per_comm == 0:
            if comm is not None:
                comm.destroy()
            comm, config = new_comm(world, rng, nodes_choices, a.protos, a.algos)
            comms += 1
        try:
            what, ok = one_collective(comm, rng, seed * 1_000_003 + done, a.max_bytes)
        except collectives.CollectiveError:  # say what was running, then let the job end (MPI_Abort)
            print(f"rank {world.rank}: collective {done} of seed {seed} failed [{config}]", flush=True)
            raise
        if not ok:
            wrong += 1
            print(f"rank {world.rank}: WRONG {what} [{config}]", flush=True)
        busy(world, rng, MPI)
        done += 1
    if comm is not None:
        comm.destroy()
    wrong = world.allreduce(wrong, op=MPI.SUM)
    if world.rank == 0:
        print(f"soak: {done} collectives on {world.size} ranks, {comms} communicators, seed {seed}, "
              f"{time.monotonic() - t0:.0f} s: {wrong} wrong, 0 hangs", flush=True)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
