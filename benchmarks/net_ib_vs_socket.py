"""NET/IB (on whichever verbs the machine has) against NET/Socket, side by side in one run: 2 emulated nodes x 2.

    python benchmarks/net_ib_vs_socket.py [-b 1M] [-e 256M] [-f 4] [-o DIR]

Every rank opens two communicators, one per plugin (``NCCL_NET=IB`` then ``NCCL_NET=Socket``), and times
AllReduce float32 on both, interleaved per size; then the 8-byte latency; then the IB plugin's counters summed
over ranks.  Rank 0 prints a table, writes curve series and plots them (``visualize.curves``).
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
from collectives.launch import launched, spawn  # noqa: E402
from collectives.perf import parse_size  # noqa: E402


def timed(comm, x, iters: int) -> float:
    comm.all_reduce(x)  # warm-up
    comm.bootstrap.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        comm.all_reduce(x)
    return comm.bootstrap.allgather_obj(time.perf_counter() - t0)[0] / iters


def counters(comm) -> dict:
    out = {"sends": 0, "recvs": 0, "cts": 0, "data_wrs": 0, "imm_wrs": 0, "qps": 0, "unaligned": 0}
    for nc in comm.net_connections:
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
    uid = None
    if ib.rank == 0:  # a second communicator: a fresh unique id from rank 0, passed on through the first
        from collectives.bootstrap import get_unique_id
        comm_id = os.environ.pop("NCCL_COMM_ID")
        uid = get_unique_id().to_bytes()
        os.environ["NCCL_COMM_ID"] = comm_id
    uid = ib.bootstrap.allgather_obj(uid)[0]
    sock = collectives.Communicator(uid, ib.nranks, ib.rank)
    n = ib.nranks
    rows = []
    size = a.b
    while size <= a.e:
        x = np.ones(size // 4, np.float32)
        iters = max(2, min(20, (64 << 20) // size))
        t = {name: timed(c, x, iters) for name, c in (("IB", ib), ("Socket", sock))}
        rows.append({"size": size, **{k: 2 * (n - 1) / n * size / v / 1e9 for k, v in t.items()},
                     **{f"{k}_algbw": size / v / 1e9 for k, v in t.items()}})
        if ib.rank == 0:
            print(f"{size:>12} B  busbw GB/s  IB {rows[-1]['IB']:.3f}  Socket {rows[-1]['Socket']:.3f}", flush=True)
        size *= a.f
    tiny = np.ones(2, np.float32)
    lat = {name: timed(c, tiny, 200) * 1e6 for name, c in (("IB", ib), ("Socket", sock))}
    cnt = ib.bootstrap.allgather_obj(counters(ib))
    total = {k: sum(c[k] for c in cnt) for k in cnt[0] if k != "qps"}
    provider = ib.net_plugin.provider
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
    p.add_argument("-o", default="net_ib_vs_socket")
    a = p.parse_args()
    if launched():
        rank_main(a)
        return 0
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    rc = spawn(4, [os.path.abspath(__file__), *sys.argv[1:]], nodes=2)
    if rc == 0:
        from visualize import curves
        print(curves.plot([os.path.join(a.o, "net_ib.json"), os.path.join(a.o, "net_socket.json")],
                          os.path.join(a.o, "busbw.png"), "AllReduce busbw: NET/IB vs NET/Socket (2 nodes x 2)"))
    return rc


if __name__ == "__main__":
    sys.exit(main())
