"""NET/IB (on whichever verbs the machine has) against NET/Socket, side by side in one run: 2 emulated nodes x 2.

    python benchmarks/net_ib_vs_socket.py [-g 4] [-b 1M] [-e 256M] [-f 4] [-n 20] [-o DIR]

Every rank opens two communicators, one per plugin (``NCCL_NET=IB`` then ``NCCL_NET=Socket``), and times
AllReduce float32 on both, interleaved per size (time the mean over ranks, algbw and busbw as nccl-tests'
``all_reduce_perf``: busbw = algbw * 2(n-1)/n); then the 8-byte latency; then the IB plugin's counters summed
over ranks.  Rank 0 prints a table, writes curve series and plots them (``visualize.curves``).  The ``-g`` ranks
(default 4) are split into 2 emulated nodes, so every link between them is NET.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import collectives  # noqa: E402
from collectives.bootstrap import UNIQUE_ID_BYTES, get_unique_id  # noqa: E402
from collectives.job import launched, spawn  # noqa: E402
from collectives.preload import preload  # noqa: E402
from collectives.perf.args import parse_size  # noqa: E402
from transports.net import NetState  # noqa: E402

COUNTERS = ("sends", "recvs", "cts", "data_wrs", "imm_wrs", "qps", "unaligned")


def timed(comm, x, iters: int) -> float:
    comm.all_reduce(x)  # warm-up
    comm.bootstrap.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        comm.all_reduce(x)
    return float(np.mean(comm.bootstrap.allgather_struct("<d", time.perf_counter() - t0))) / iters


def net_state(comm) -> NetState:
    """The communicator's NET transport state (``transports.connections``: one state per transport)."""
    return next(s for s in comm.conns.states.values() if isinstance(s, NetState))


def counters(comm) -> dict:
    out = dict.fromkeys(COUNTERS, 0)
    for nc in net_state(comm).connections:
        c = nc.comm
        st = c.stats
        if c.is_send:
            out["sends"] += st["requests"]
            out["data_wrs"] += st["data_wrs"]
            out["imm_wrs"] += st["imm_wrs"]
            out["qps"] = c.nqps_per_request()
            per = c.nqps_per_request()
            out["unaligned"] += sum(1 for i, n in enumerate(st["chunks"]) if (i + 1) % per and n % 128)
        else:
            out["recvs"] += st["requests"]
            out["cts"] += st["cts"]
    return out


def rank_main(a) -> None:
    os.environ["NCCL_NET"] = "IB"
    ib = collectives.Communicator()
    os.environ["NCCL_NET"] = "Socket"
    uid = b""
    if ib.rank == 0:  # a second communicator: a fresh unique id from rank 0, passed on through the first
        comm_id = os.environ.pop("NCCL_COMM_ID", None)  # (a fixed root address would make the same id again)
        uid = get_unique_id().to_bytes()
        if comm_id is not None:
            os.environ["NCCL_COMM_ID"] = comm_id
    uid = ib.bootstrap.allgather(uid, UNIQUE_ID_BYTES)[0]
    sock = collectives.Communicator(uid, ib.nranks, ib.rank)
    n = ib.nranks
    rows = []
    if ib.rank == 0:
        print(f"# AllReduce float32 sum, {n} ranks on 2 emulated nodes: NET/IB ({net_state(ib).plugin.provider} "
              f"verbs) vs NET/Socket, same processes, alternating per size")
        print(f"# {'size':>10} {'IB us':>10} {'IB algbw':>9} {'IB busbw':>9} {'Sock us':>10} {'Sock algbw':>10} "
              f"{'Sock busbw':>10} {'IB/Sock':>8}")
    size = a.b
    while size <= a.e:
        x = np.ones(max(1, size // 4), np.float32)
        iters = a.n or max(2, min(20, (64 << 20) // max(size, 1)))
        t = {name: timed(c, x, iters) for name, c in (("IB", ib), ("Socket", sock))}
        rows.append({"size": x.nbytes, **{k: 2 * (n - 1) / n * x.nbytes / v / 1e9 for k, v in t.items()},
                     **{f"{k}_algbw": x.nbytes / v / 1e9 for k, v in t.items()}})
        if ib.rank == 0:
            r = rows[-1]
            print(f"  {x.nbytes:>10} {t['IB'] * 1e6:>10.1f} {r['IB_algbw']:>9.3f} {r['IB']:>9.3f} "
                  f"{t['Socket'] * 1e6:>10.1f} {r['Socket_algbw']:>10.3f} {r['Socket']:>10.3f} "
                  f"{r['IB'] / r['Socket']:>8.2f}", flush=True)
        size *= a.f
    tiny = np.ones(2, np.float32)
    lat = {name: timed(c, tiny, a.n or 200) * 1e6 for name, c in (("IB", ib), ("Socket", sock))}
    mine = counters(ib)
    cnt = [dict(zip(COUNTERS, row)) for row in ib.bootstrap.allgather_struct("<7q", *(mine[k] for k in COUNTERS))]
    total = {k: sum(c[k] for c in cnt) for k in COUNTERS if k != "qps"}
    provider = net_state(ib).plugin.provider
    if ib.rank == 0:
        print(f"8 B AllReduce latency: IB {lat['IB']:.0f} us, Socket {lat['Socket']:.0f} us")
        print(f"IB counters (provider {provider}, {cnt[0]['qps'] or '?'} QP(s) per request): {total}")
        os.makedirs(a.o, exist_ok=True)
        for name in ("IB", "Socket"):
            label = f"NET/{name}" + (f" ({provider} verbs)" if name == "IB" else "") + f", {n} ranks on 2 nodes"
            with open(os.path.join(a.o, f"net_{name.lower()}.json"), "w") as f:
                json.dump({"label": label, "points": [{"size": r["size"], "busbw": r[name], "algbw": r[f"{name}_algbw"]}
                                                     for r in rows]}, f)
        with open(os.path.join(a.o, "summary.json"), "w") as f:
            json.dump({"rows": rows, "latency_us": lat, "counters": total, "provider": provider}, f, indent=1)
    ib.destroy()
    sock.destroy()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("-b", type=parse_size, default=parse_size("1M"))
    p.add_argument("-e", type=parse_size, default=parse_size("256M"))
    p.add_argument("-f", type=int, default=4)
    p.add_argument("-n", type=int, default=0, help="timed calls per size (default: 20, fewer above 4 MiB; 200 for "
                                                   "the 8-byte latency)")
    p.add_argument("-g", type=int, default=4, help="ranks, split into 2 emulated nodes (default 4)")
    p.add_argument("-o", default="net_ib_vs_socket")
    a = p.parse_args()
    if launched():
        rank_main(a)
        return 0
    if a.g < 2:
        sys.exit(f"net_ib_vs_socket.py: -g {a.g}: 2 emulated nodes need at least 2 ranks")
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    rc = spawn(a.g, [os.path.abspath(__file__), *sys.argv[1:]], nodes=2, preload=preload)
    if rc == 0:
        from visualize import curves
        print(curves.plot([os.path.join(a.o, "net_ib.json"), os.path.join(a.o, "net_socket.json")],
                          os.path.join(a.o, "busbw.png"), f"AllReduce busbw: NET/IB vs NET/Socket (2 nodes, "
                                                          f"{a.g} ranks)"))
    return rc


if __name__ == "__main__":
    sys.exit(main())
