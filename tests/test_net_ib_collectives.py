"""Collectives over NET/IB between emulated nodes (NCCL_HOSTID), on the software verbs provider: bitwise against
the NCCL-order reference for every collective and protocol, 1 and 4 QPs per connection, split on and off, chaos
mode; the log lines; the trace events; a peer killed mid-transfer."""
import os
import re

import pytest

from workers import Case
from conftest import run_ranks
from tracing import export
from tracing.events import read_rank_file
from visualize import diagrams, ib_sequence

ALL = ["allreduce", "reducescatter", "allgather", "broadcast", "reduce"]
IB = {"NCCL_NET": "IB", "NCCLLAB_VERBS": os.environ.get("NCCLLAB_VERBS", "auto"), "NCCLLAB_TIMEOUT": "60"}


@pytest.mark.parametrize("proto,qps,split", [("Simple", "1", "0"), ("LL", "4", "1"), ("LL128", "4", "0")])
def test_two_nodes_of_two_bitwise(proto, qps, split):
    run_ranks(4, "bitwise", Case(channels=2, counts=[0, 7, 70_001], dtypes=["float32", "bfloat16"], colls=ALL).arg(),
              env={**IB, "NCCL_PROTO": proto, "NCCL_IB_QPS_PER_CONNECTION": qps, "NCCL_IB_SPLIT_DATA_ON_QPS": split},
              nodes=2, timeout=400)


@pytest.mark.parametrize("proto,unit", [("Simple", "64"), ("LL", "64"), ("LL128", "128")])
def test_four_nodes_chaos_bitwise(proto, unit):
    """Shuffled placement and delayed completions change nothing (LL128 lines need 128-B units: chaos.py)."""
    run_ranks(4, "bitwise", Case(channels=1, counts=[3, 100_003], dtypes=["float32"], colls=ALL).arg(),
              env={**IB, "NCCL_PROTO": proto, "NCCLLAB_SIM_CHAOS": "11", "NCCLLAB_SIM_CHAOS_UNIT": unit,
                   "NCCL_IB_QPS_PER_CONNECTION": "4", "NCCL_IB_SPLIT_DATA_ON_QPS": "1"}, nodes=4, timeout=400)


def test_ib_log_lines():
    proc = run_ranks(4, "bitwise", Case(channels=1, counts=[7], dtypes=['float32'], colls=["allreduce"]).arg(),
                     env={**IB, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}, nodes=2)
    out = proc.stdout
    assert "Channel 00/0 : 1[1] -> 2[0] [send] via NET/IB/0" in out
    assert "Channel 00/0 : 1[1] -> 2[0] [receive] via NET/IB/0" in out
    assert "NET/IB : Using [0]" in out and ":1/IB ; OOB lo:127.0.0.1<0>" in out


def test_trace_has_the_ib_message_sequence(tmp_path):
    run_ranks(4, "traced_allreduce", "1", "5000", env={**IB, "NCCLLAB_TRACE": str(tmp_path)}, nodes=2)
    _, events = read_rank_file(str(tmp_path / "trace-rank2.jsonl"))  # rank 2 receives from rank 1, sends to 0
    ib = [e for e in events if e["kind"] == "net_ib"]
    kinds = {(e["is_send"], e["event"]) for e in ib}
    assert {(False, "cts_posted"), (True, "cts_seen"), (True, "wr_posted"), (True, "completion"),
            (False, "completion")} <= kinds
    recv = [e for e in ib if not e["is_send"] and e["slot"] == 0]
    assert [e["event"] for e in recv][:2] == ["cts_posted", "completion"]
    pf = [e for e in export.perfetto(str(tmp_path))["traceEvents"] if e.get("cat") == "net_ib"]
    assert pf and all(e["tid"] == export.PROXY_TID + e["args"]["channel"] for e in pf)  # on the proxy's track
    assert any(e["name"].startswith("IB cts_posted slot 0") for e in pf)
    # the message-sequence diagram drawn from it: CTS write receiver -> sender, data + IMM sender -> receiver
    _, merged = export.load(str(tmp_path))
    r, s = ib_sequence.pick(merged)
    src = ib_sequence.ib_sequence(r, s)
    name = {id(e): f"e{i}" for i, e in enumerate(sorted(r + s, key=lambda e: e["t0"]))}
    cts = next(name[id(e)] for e in r if e["event"] == "cts_posted")
    seen = next(name[id(e)] for e in s if e["event"] == "cts_seen")
    wr = next(name[id(e)] for e in s if e["event"] == "wr_posted")
    done = next(name[id(e)] for e in r if e["event"] == "completion")
    assert re.search(rf"{cts} -> {seen} \[label=\"RDMA_WRITE 64-B ncclIbSendFifo", src)
    assert re.search(rf"{wr} -> {done} \[label=\"data \+ WRITE_WITH_IMM", src)
    assert r[0]["t0"] < s[0]["t0"] and s[-1]["event"] == "completion"
    (png,) = diagrams.render(src, str(tmp_path / "ibseq"), formats=("png",))
    assert os.path.getsize(png) > 0


def test_killed_peer_is_named():
    proc = run_ranks(4, "sigkill", "2", env={**IB, "NCCLLAB_TIMEOUT": "20"}, nodes=2, check=False, timeout=120)
    assert proc.returncode != 0
    assert "NET connection with rank 2" in proc.stderr or "rank 2 (pid" in proc.stderr, proc.stderr[-3000:]
