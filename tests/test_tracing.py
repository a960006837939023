"""The trace against the algorithm (``runRing``'s chunks, ``src/device/all_reduce.h``), its exports, and hang diagnosis."""
import json

import pytest

from collectives.perf import reference
from conftest import run_ranks
from tracing import export, hang

SENDING = ("send", "copy_send", "recv_reduce_send", "recv_reduce_copy_send", "recv_copy_send")


def expected_send_chunks(n: int, k: int) -> list[int]:
    """runRing at ring index k: reduce-scatter sends chunk (k-1-s) mod n, allgather forwards (k-s) mod n."""
    return [(k - 1 - s) % n for s in range(n - 1)] + [(k - s) % n for s in range(n - 1)]


@pytest.mark.parametrize("n,nch,count,proto", [(4, 2, 3 * 4 * 524288 // 2 + 999, "Simple"), (3, 1, 50_000, "LL"),
                                               (3, 2, 400_001, "LL128")])
def test_ring_allreduce_trace_matches_the_algorithm(tmp_path, n, nch, count, proto):
    run_ranks(n, "traced_allreduce", str(nch), str(count),
              env={"NCCLLAB_TRACE": str(tmp_path), "NCCL_PROTO": proto, "NCCL_ALGO": "Ring"})
    meta, events = export.load(str(tmp_path))
    rings = meta["rings"]
    assert meta["nchannels"] == 2 * nch  # ncclTopoPostset doubles the search's channels
    parts = reference.channel_parts("AllReduce", count, 4, n, meta["nchannels"], proto, meta["buff_sizes"][proto])
    prims = [e for e in events if e["kind"] == "prim" and e["seq"] == 0]
    steps = [e for e in events if e["kind"] == "step" and e["seq"] == 0]
    for rank in range(n):
        for c, (start, length, chunk) in enumerate(parts):
            ring = rings[c % len(rings)]
            k = (ring.index(rank) - ring.index(0)) % n
            mine = [e for e in prims if e["rank"] == rank and e["channel"] == c]
            loops = sorted({e["loop"] for e in mine})
            assert len(loops) == -(-length // (n * chunk))
            sent_bytes = 0
            for loop in loops:
                sends = [e for e in mine if e["loop"] == loop and e["prim"] in SENDING]
                assert len(sends) == 2 * (n - 1), (rank, c, loop)
                assert [e["chunk"] for e in sends] == expected_send_chunks(n, k), (rank, c, loop)
                assert all(e["send_peer"] == ring[(ring.index(rank) + 1) % n] for e in sends)
                rem = length - loop * n * chunk
                cc = chunk if rem >= n * chunk else -(-(-(-rem // n)) // 4) * 4
                sizes = [max(0, min(cc, rem - j * cc)) for j in range(n)]
                sent_bytes += 4 * sum(sizes[j] for j in expected_send_chunks(n, k))
            traced = sum(e["bytes"] for e in steps if e["rank"] == rank and e["channel"] == c and e["send_peer"] >= 0)
            assert traced == sent_bytes, (rank, c, traced, sent_bytes)


def test_perfetto_json_has_a_process_per_rank_and_a_track_per_channel(tmp_path):
    run_ranks(3, "traced_allreduce", "2", "300000", env={"NCCLLAB_TRACE": str(tmp_path)})
    doc = json.loads(json.dumps(export.perfetto(str(tmp_path))))  # round-trips as plain JSON
    evs = doc["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {0: "rank 0", 1: "rank 1", 2: "rank 2"}
    threads = {(e["pid"], e["args"]["name"]) for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(r, f"channel {c}") for r in range(3) for c in range(2)} <= threads
    assert {(r, "collectives") for r in range(3)} <= threads
    xs = [e for e in evs if e["ph"] == "X"]
    assert xs and all(e["dur"] >= 0 and e["ts"] >= 0 for e in xs)
    assert {e["cat"] for e in xs} == {"coll", "channel", "prim", "step"}
    rows = export.movements(str(tmp_path))
    assert rows and {"from", "to", "chunk", "slot", "step", "bytes", "op"} <= set(rows[0])


def test_hang_report_names_the_stalled_rank(tmp_path):
    # a ring (4 ranks on 2 cores would take the tree for 4000 B: the cpu tuner's rule)
    proc = run_ranks(4, "stuck", "6", env={"NCCLLAB_TIMEOUT": "3", "NCCLLAB_HANG_DIR": str(tmp_path),
                                            "NCCL_ALGO": "Ring"}, check=False, timeout=120)
    assert proc.returncode != 0
    verdict = hang.diagnose(str(tmp_path))
    assert verdict["culprit"] == 1, verdict
    reports = hang.load_reports(str(tmp_path))
    assert 1 not in reports and 2 in reports
    w = reports[2]["waits"][0]   # rank 2 receives from rank 1 on channel 0, at the first step of the call
    assert (w["channel"], w["peer"], w["step"], w["slot"]) == (0, 1, 0, 0)
    assert w["what"] in ("tail", "LL flag")  # Simple or LL, whichever the cost model picks for 4000 B
    assert w["prim"] == "recv_reduce_send"


def test_hang_report_over_net_shows_the_proxy_ops(tmp_path):
    """Across nodes the report says where each proxy op stands (posted, transmitted, received, done), so a step
    that left one rank and never reached the next shows on which side it stopped."""
    proc = run_ranks(4, "stuck", "6", env={"NCCLLAB_TIMEOUT": "3", "NCCLLAB_HANG_DIR": str(tmp_path)},
                     check=False, timeout=120, nodes=2)
    assert proc.returncode != 0
    reports = hang.load_reports(str(tmp_path))
    # a rank waiting for NET data has a receive op posted that has received nothing of this step
    stalled = [(r, p) for r, rep in reports.items() for p in rep["proxy"] for w in rep["waits"]
               if p["dir"] == "recv" and p["peer"] == w["peer"] and p["posted"] > p["received"]]
    assert stalled, {r: (rep["waits"], rep["proxy"]) for r, rep in reports.items()}
    r, p = stalled[0]
    assert any(line.startswith(f"rank {r} proxy: channel {p['channel']} recv rank {p['peer']}")
               for line in hang.diagnose(str(tmp_path))["waits"])


def test_net_proxy_ops_and_steps_are_traced(tmp_path):
    run_ranks(4, "traced_allreduce", "1", "300000", env={"NCCLLAB_TRACE": str(tmp_path), "NCCL_PROTO": "Simple",
                                                         "NCCL_ALGO": "Ring", "NCCL_MAX_NCHANNELS": "1"}, nodes=2)
    meta, events = export.load(str(tmp_path))
    ops = [e for e in events if e["kind"] == "proxy_op" and e["seq"] == 0]
    steps = [e for e in events if e["kind"] == "proxy_step" and e["seq"] == 0]
    # rank 1 sends to rank 2 over NET, rank 2 receives from rank 1 (ring 0 1 2 3 across 2 nodes)
    send = [e for e in ops if e["rank"] == 1 and e["is_send"]]
    recv = [e for e in ops if e["rank"] == 2 and not e["is_send"]]
    assert len(send) == 1 and send[0]["peer"] == 2 and recv and recv[0]["peer"] == 1
    assert send[0]["nsteps"] == recv[0]["nsteps"] and send[0]["nsteps"] % 4 == 0
    sent = sum(e["bytes"] for e in steps if e["rank"] == 1 and e["is_send"])
    got = sum(e["bytes"] for e in steps if e["rank"] == 2 and not e["is_send"])
    kernel = sum(e["bytes"] for e in events if e["kind"] == "step" and e["rank"] == 1 and e["send_peer"] == 2)
    assert sent == got == kernel > 0
    tids = {e["tid"] for e in export.perfetto(str(tmp_path))["traceEvents"] if e.get("cat") == "proxy_step"}
    assert tids == {export.PROXY_TID}
