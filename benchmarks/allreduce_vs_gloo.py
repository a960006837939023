"""Our AllReduce across emulated nodes beside PyTorch's Gloo (``torch.distributed``, CPU tensors over loopback
TCP), in the same processes, alternating rounds, reported like nccl-tests.

    mpirun -n 4 python benchmarks/allreduce_vs_gloo.py --nodes 4 [-b 8] [-e 128M] [-f 8] [-R 1] [--json FILE]

``--nodes K`` splits the ranks into K emulated nodes (``NCCL_HOSTID`` per block of ranks, as
``collectives.job.emulated_node`` does for ``--nodes``): ``--nodes 4`` on 4 ranks is "4 x 1" (every hop crosses
NET/Socket), ``--nodes 2`` is "2 x 2" (SHM inside a node).  Gloo's process group starts from mpirun's rank and
size over a TCP store on 127.0.0.1, at a free port rank 0 picks and broadcasts; ``GLOO_SOCKET_IFNAME`` defaults to
``lo``, and ``OMP_NUM_THREADS`` to 1, as ``torchrun`` sets it when a node runs several processes (torch's OpenMP
workers would otherwise share the cores with the other ranks, and with our side's rounds).  Per size, ``--rounds``
rounds alternate the two; each side reports its median round's mean over ranks.  busbw = algbw * 2(n-1)/n as
nccl-tests.

``-R 1`` (nccl-tests' flag) registers our send and receive buffers (``comm.register``, ``ncclCommRegister``): a
Ring/Simple AllReduce then moves its NET steps straight between them and the sockets (``collectives/register.py``),
as Gloo does with its tensor; ``-R 0`` (the default, as in nccl-tests) goes through the FIFOs.

When every rank is its own node ("4 x 1", every hop of ours crosses TCP as every hop of Gloo's does), two more
sides are timed in the same rounds (``tcp_floor.py``): the floor under both, a ring's bytes alone over loopback
TCP, 2(n-1)/n of the message each way per rank, with no reduction and no protocol; and a bare ring AllReduce over
the same sockets, those bytes plus numpy's addition of each received chunk, one step after another (no FIFO, no
flags, no pipelining).  Where a goal is NOT met and even the floor stays under the ratio asked of Gloo, the goal
line says so with the floor's own ratio; where the floor clears it but the bare ring does not, it says that of the
bare ring (not a floor: a pipelined ring could overlap what it does in turn; but on cores that the ranks share, the
additions' CPU adds to the bytes' whichever way they are ordered).  They are the third and fourth series of
``--json`` and the last four columns of the printed table ('-' in other shapes); the bare ring's sum, in ring order,
is checked for closeness as Gloo's is.

After the table, each side's CPU per rank per call (user and sys, ``getrusage``: every thread of the process, our
proxy's and Gloo's I/O threads included) from the same rounds, and the ranks and cores of this machine; the
``--json`` points carry it too.  Where a goal is NOT met and our side kept its share of the cores busy (at least
80% of the wall time over the ranks per core), the goal line gives both sides' CPU at its lowest-ratio size: how much
each spends per call, which decides the time when the ranks share the cores.

Gloo's ``all_reduce`` works in place: it is timed on a zero-filled buffer (sums of zeros stay zero: no overflow and
no denormals over the timed calls; a float add costs the same for any normal value), ours out of place on random
inputs.  Once per size, up to 16 MiB, ours is checked bitwise against NCCL's summation order (fresh inputs,
poisoned output) and Gloo's for closeness to the exact sum only: Gloo adds in its own order.  Rank 0 prints issue
27's goals: lab/Gloo busbw at least 1.0x at every size and at least 1.2x at 16 MiB and above, met or NOT met.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import collectives  # noqa: E402
from collectives.job import node_hostid  # noqa: E402
from collectives.perf.args import sizes  # noqa: E402
from checks import CHECK_MAX, busbw_goals, close_wrong, floor_note, inputs_for, lab_wrong  # noqa: E402
from tcp_floor import TcpRing  # noqa: E402
from timing import add_side_by_side_args, allreduce_point, iters_for, point_cells, timed_rounds  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gloo_group(world):
    """torch.distributed's Gloo group over these mpirun ranks (the TCP store on rank 0's free port)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default with several processes a node; read at import
    import torch.distributed as dist
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    port = world.bcast(free_port() if world.rank == 0 else None)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=world.rank, world_size=world.size)
    return dist


BANDS = [("every size", 1.0, 0, 1 << 62), (">= 16 MiB", 1.2, 16 << 20, 1 << 62)]


def goals(shape: str, lab: list, gloo: list, floor: list | None = None,
          ranks_per_core: float | None = None, bare: list | None = None) -> list[str]:
    """Issue 27's goals across nodes from the measured points: lab/Gloo busbw >= 1.0x at every size, >= 1.2x at
    16 MiB and above.  ``floor`` (every hop over TCP: the "4 x 1" shape): a goal NOT met says at which size, if
    any, the ring's bytes alone over loopback TCP stay under the ratio asked; where they clear it everywhere,
    the same of ``bare``, the bare ring AllReduce (those bytes and numpy's additions).  ``ranks_per_core`` (the
    ranks this machine runs over its cores; points with ``cpu_user_us``/``cpu_sys_us``): a goal NOT met gives, at
    its lowest-ratio size, each side's CPU per rank per call when ours kept its share of the cores busy
    (``CPU_BOUND``), what each side spends there."""
    lines = []
    for goal in busbw_goals(f"{shape} vs Gloo", lab, gloo, BANDS):
        line, want, lo, hi = goal.line, goal.want, goal.lo, goal.hi
        if goal.missed:
            note = ""
            if floor:
                note = floor_note(floor, gloo, lo, hi, want, "a ring's bytes alone over loopback TCP", "Gloo")
            if not note and bare:
                note = floor_note(bare, gloo, lo, hi, want, "a bare ring AllReduce over loopback TCP (the bytes and "
                                  "numpy's additions, step by step)", "Gloo", "bare ring", "reaches")
            line += note
            if ranks_per_core:
                line += cpu_note(goal.low, ranks_per_core)
        lines.append(line)
    return lines


CPU_BOUND = 0.8  # ours used at least this much of its share of the cores (wall / ranks a core): CPU-bound


def cpu_note(low: tuple[dict, dict, float], ranks_per_core: float) -> str:
    """At a band's lowest-ratio point (``Goal.low``: ours, Gloo's, the ratio; the size its goal line names): each
    side's CPU per rank per call, said when ours was CPU-bound.  Each side's user and sys are medians over the
    rounds taken apart."""
    keys = ("cpu_user_us", "cpu_sys_us", "time_us")
    a, b, _ = low
    if not all(k in p for k in keys for p in (a, b)) or a["time_us"] <= 0:
        return ""
    ours, theirs = (p["cpu_user_us"] + p["cpu_sys_us"] for p in (a, b))
    busy = ours / (a["time_us"] / max(1.0, ranks_per_core))
    if busy < CPU_BOUND:
        return ""
    return (f" (at {a['size']} B each rank's CPU per call, user + sys: ours {_ms(ours)}, Gloo's {_ms(theirs)}; "
            f"ours used {busy:.0%} of its share of the cores, {ranks_per_core:g} "
            f"rank{'s' if ranks_per_core != 1 else ''} a core)")


def _ms(us: float) -> str:
    return f"{us / 1e3:.1f} ms" if us >= 1e3 else f"{us:.0f} us"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_side_by_side_args(p, "128M", 8, 200)
    p.add_argument("--nodes", type=int, default=0, help="emulated nodes (default: one per rank)")
    p.add_argument("--json", help="write both curves as series files for `python -m visualize curves`")
    p.add_argument("-R", "--local_register", type=int, choices=(0, 1), default=0,
                   help="1: register our buffers (ncclCommRegister), as nccl-tests' -R 1")
    a = p.parse_args()
    world = MPI.COMM_WORLD
    n = world.size
    nodes = a.nodes or n
    if nodes < 1 or n % nodes:
        print(f"allreduce_vs_gloo.py: --nodes {nodes} does not divide {n} ranks", file=sys.stderr)
        return 2
    shape = f"{nodes} x {n // nodes}"
    shared = world.Split_type(MPI.COMM_TYPE_SHARED)  # the ranks sharing this machine's cores (every emulated node)
    local = shared.size
    cores = len(set().union(*shared.allgather(os.sched_getaffinity(0))))  # a rank bound to one core sees one
    shared.Free()
    os.environ["NCCL_HOSTID"] = node_hostid(world.rank, n, nodes)
    dist = gloo_group(world)
    import torch
    uid = world.bcast(collectives.get_unique_id().to_bytes() if world.rank == 0 else None)
    ring = TcpRing(world) if nodes == n else None  # the floor under a ring whose every hop crosses TCP
    lab_pts, gloo_pts, floor_pts, bare_pts, wrong = [], [], [], [], {"lab": 0, "Gloo": 0, "bare ring": 0}
    with collectives.Communicator(uid, n, world.rank) as comm:
        if world.rank == 0:
            via = sorted({t for ch in comm.describe()["connections"] for t in ch.values()})
            threads = torch.get_num_threads()
            print(f"# AllReduce float32 sum, n={n} as {shape} emulated nodes (rank 0's connections: {', '.join(via)})"
                  f": nccl-lab (the cost model's algorithm and protocol; buffers "
                  f"{'registered, -R 1' if a.local_register else 'not registered, -R 0'}) vs torch.distributed Gloo "
                  f"(torch {torch.__version__}, {threads} intra-op thread{'s' if threads != 1 else ''}, loopback TCP)")
            print(f"# {'size':>10} {'algo/proto':>12} {'lab us':>10} {'lab busbw':>10} {'gloo us':>10} "
                  f"{'gloo busbw':>10} {'lab/gloo':>8} {'tcp us':>10} {'tcp busbw':>10} {'bare us':>10} "
                  f"{'bare busbw':>10}")
        for size in sizes(a):
            x = np.random.default_rng(world.rank).uniform(-1, 1, max(1, size // 4)).astype(np.float32)
            out = np.empty_like(x)
            zeros = torch.zeros(x.size, dtype=torch.float32)
            handles = [comm.register(x), comm.register(out)] if a.local_register else []
            registered = comm.registered(x, out)  # what took effect (the column below says what the call ran)
            calls = {"lab": lambda: comm.all_reduce(x, out=out), "gloo": lambda: dist.all_reduce(zeros)}
            if ring is not None:
                moved, bare_out = ring.ring_allreduce_bytes(x.nbytes), np.empty_like(x)
                calls["tcp"] = lambda: ring.move(moved)
                calls["bare"] = lambda: ring.allreduce(x, bare_out)
            cpu: dict = {}
            t = timed_rounds(calls, iters_for(size, 200, a.iters), world, a.rounds, warmup=a.warmup_iters, cpu=cpu)
            for h in handles:
                comm.deregister(h)
            if size <= CHECK_MAX:
                wrong["lab"] += lab_wrong(comm, world, size, seed=size, register=bool(a.local_register))
                inputs = inputs_for(size, n, seed=size + 1)
                mine = torch.from_numpy(np.asarray(inputs[world.rank]).copy())  # summed in place
                dist.all_reduce(mine)
                wrong["Gloo"] += world.allreduce(close_wrong(mine.numpy(), inputs))
                if ring is not None:
                    own = np.asarray(inputs[world.rank]).copy()
                    summed = np.full_like(own, np.nan)  # poisoned: every element must be written
                    ring.allreduce(own, summed)
                    wrong["bare ring"] += world.allreduce(close_wrong(summed, inputs))
            if world.rank == 0:
                lab, gloo = allreduce_point(x.nbytes, t["lab"], n), allreduce_point(x.nbytes, t["gloo"], n)
                for point, side in ((lab, "lab"), (gloo, "gloo")):
                    point["cpu_user_us"], point["cpu_sys_us"] = (v * 1e6 for v in cpu[side])
                bl, bg = lab["busbw"], gloo["busbw"]
                plan = comm.plan("AllReduce", x.size, x.dtype, registered)
                floor = bare = None
                if "tcp" in t:
                    floor, bare = allreduce_point(x.nbytes, t["tcp"], n), allreduce_point(x.nbytes, t["bare"], n)
                    floor_pts.append(floor)
                    bare_pts.append(bare)
                tcp = f"{point_cells(floor)} {point_cells(bare)}"
                print(f"  {x.nbytes:>10} {plan.algo + '/' + plan.proto:>12} {t['lab'] * 1e6:>10.1f} {bl:>10.2f} "
                      f"{t['gloo'] * 1e6:>10.1f} {bg:>10.2f} {bl / bg if bg else 0:>8.2f} {tcp}", flush=True)
                lab_pts.append(lab)
                gloo_pts.append(gloo)
    if world.rank == 0:
        print(f"# CPU per rank per call, user + sys over every thread of the process (us; mean over ranks, median "
              f"round): {local} ranks on {cores} cores here")
        print(f"# {'size':>10} {'lab user':>10} {'lab sys':>10} {'gloo user':>10} {'gloo sys':>10}")
        for lab, gloo in zip(lab_pts, gloo_pts):
            print(f"# {lab['size']:>10} {lab['cpu_user_us']:>10.1f} {lab['cpu_sys_us']:>10.1f} "
                  f"{gloo['cpu_user_us']:>10.1f} {gloo['cpu_sys_us']:>10.1f}")
        print(f"# check (sizes up to {CHECK_MAX >> 20} MiB): lab bitwise against NCCL's order: {wrong['lab']} wrong; "
              f"Gloo within float32 rounding of the exact sum (its own order): {wrong['Gloo']} wrong"
              + (f"; the bare ring likewise (ring order): {wrong['bare ring']} wrong" if ring is not None else ""))
        for line in goals(shape, lab_pts, gloo_pts, floor_pts, local / cores, bare_pts):
            print(line)
        if a.json:
            series = [{"label": f"nccl-lab AllReduce n={n}, {shape} nodes, beside Gloo", "points": lab_pts},
                      {"label": f"Gloo all_reduce n={n}, {shape} nodes (torch {torch.__version__})",
                       "points": gloo_pts}]
            if floor_pts:
                series.append({"label": f"a ring's bytes alone over loopback TCP n={n}, {shape} nodes "
                                        f"(tcp_floor.py)", "points": floor_pts})
                series.append({"label": f"a bare ring AllReduce over loopback TCP n={n}, {shape} nodes "
                                        f"(tcp_floor.py)", "points": bare_pts})
            with open(a.json, "w") as f:
                json.dump(series, f, indent=1)
    if ring is not None:
        ring.close()
    dist.destroy_process_group()
    return 1 if any(wrong.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
