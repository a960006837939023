"""send / recv between real processes (``collectives/p2p.py`` over ``device/sendrecv.py``), bitwise, over SHM and
across emulated nodes over NET/Socket; groups; the failure of a send whose peer never receives."""
import json
import time

import pytest

from conftest import run_ranks

# 0 bytes, one element, odd counts, the LL/Simple switch at 16 KiB per channel, several Simple chunks and parts
COUNTS = [0, 1, 7, 4095, 4096, 4097, 70001, 300007]


def pairs(n: int, nodes: int = 1, counts=COUNTS, dtypes=("float32", "int32"), env=None):
    proc = run_ranks(n, "pairs", json.dumps(counts), json.dumps(list(dtypes)), nodes=nodes, env=env,
                     script="p2p_workers.py")
    oks = [line for line in proc.stdout.splitlines() if " ok " in line]
    assert len(oks) == n, proc.stdout
    assert all(line.endswith(f"ok {n * len(counts) * len(dtypes)} receives") for line in oks), proc.stdout
    return proc


@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_pair_over_shm(n):
    proc = pairs(n, env={"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT"})
    assert "via SHM/direct" in proc.stdout + proc.stderr


def test_every_pair_across_two_nodes_over_net():
    proc = pairs(4, nodes=2, counts=[0, 1, 7, 4097, 70001, 300007], dtypes=("float32", "float16"),
                 env={"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"})
    out = proc.stdout + proc.stderr
    assert "/1 : 0[0] -> 2[0] [send] via NET/Socket/0" in out, out[-3000:]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ring_exchange_in_one_group(n):
    proc = run_ranks(n, "ring", "100003", "float32", script="p2p_workers.py")
    assert proc.stdout.count("ok ring") == n


@pytest.mark.parametrize("when", ["first", "connected", "busy"])
def test_unmatched_send_names_both_ranks(when):
    proc = run_ranks(2, "unmatched", when, env={"NCCLLAB_TIMEOUT": "3" if when == "busy" else "10"},
                     script="p2p_workers.py", check=False, timeout=120)
    assert proc.returncode != 0
    lines = (proc.stdout + proc.stderr).splitlines()
    for rank in (0, 1):
        named = [line for line in lines if f"rank {rank}:" in line and "rank 0" in line and "rank 1" in line]
        assert named, (rank, proc.stdout[-3000:], proc.stderr[-5000:])
    if when == "busy":
        assert any("rank 0: no message from rank 1 within 3 s (NCCLLAB_TIMEOUT)" in line for line in lines), lines


@pytest.mark.parametrize("mode,stuck,bytes_", [
    ("bigger_send", 0, "send 4194304 B to rank 1"),     # the sender waits for credit; rank 1 is in AllReduce
    ("smaller_send", 1, "recv 4194304 B from rank 0"),  # the receiver waits for data; rank 0 is in AllReduce
    ("split", 0, "send 4194304 B to rank 1"),           # the second send of rank 0's group: rank 1 split it off
    ("left", 0, "send 4194304 B to rank 1"),            # rank 1 exited
])
def test_p2p_failures_are_named(mode, stuck, bytes_):
    """Every rank ends well before the deadline (30 s here), with one line from the stuck rank naming both ranks,
    the op, its byte count and its round; the other rank's line quotes it (or it has exited)."""
    t0 = time.monotonic()
    proc = run_ranks(3, "named", mode, script="p2p_workers.py", check=False, timeout=120)
    took = time.monotonic() - t0
    assert proc.returncode != 0
    lines = (proc.stdout + proc.stderr).splitlines()
    other = 1 - stuck
    named = [line for line in lines if line.lstrip("NCCL WARN ").startswith(f"rank {stuck}:") or
             f"rank {stuck}: rank {other}" in line]
    primary = [line for line in named if bytes_ in line and "round" in line and f"rank {other}" in line and
               ("moved on to AllReduce" in line if mode != "left" else "is gone" in line)]
    assert primary, (mode, proc.stdout[-3000:], proc.stderr[-5000:])
    assert took < 25, took


def test_p2p_failure_across_nodes_ends_at_the_deadline():
    """Across nodes no status page is shared: a receive of more bytes than the peer sent ends at NCCLLAB_TIMEOUT,
    after the early WARN, the waiting rank's line naming its peer, bytes and round.  (The other way round, and a
    split group's extra send, can complete over NET/Socket unseen: the network takes the sender's bytes.)"""
    t0 = time.monotonic()
    proc = run_ranks(2, "named", "smaller_send", nodes=2, script="p2p_workers.py", check=False, timeout=120,
                     env={"NCCLLAB_TIMEOUT": "6", "NCCLLAB_WARN_AFTER": "2"})
    took = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    warn = out.find("NCCLLAB_WARN_AFTER")
    final = [line for line in out.splitlines() if "rank 1:" in line and "NCCLLAB_TIMEOUT" in line and
             "recv 4194304 B from rank 0" in line and "round 1" in line]
    assert warn != -1 and final and out.find(final[0]) > warn, out[-4000:]
    assert took < 60, took


@pytest.mark.parametrize("n", [1, 2])
def test_invalid_usage_and_nested_groups(n):
    proc = run_ranks(n, "usage", script="p2p_workers.py")
    assert proc.stdout.count("ok usage") == n


@pytest.mark.parametrize("n,nodes", [(1, 1), (2, 1), (3, 1), (4, 1), (4, 2)])
def test_all_to_all(n, nodes):
    proc = run_ranks(n, "alltoall", json.dumps([0, 1, 7, 4097, 50001]), json.dumps(["float32", "int8"]), nodes=nodes,
                     script="p2p_workers.py")
    assert proc.stdout.count("ok alltoall") == n


@pytest.mark.parametrize("n,nodes,env", [
    (3, 1, {"NCCL_MIN_P2P_NCHANNELS": "8"}),                                   # p2p channels beyond the rings'
    (3, 1, {"NCCL_P2P_LL_THRESHOLD": "0", "NCCL_CHUNK_SIZE": "12345"}),        # Simple only, an odd chunk size
    (4, 2, {"NCCL_MIN_P2P_NCHANNELS": "8", "NCCL_NCHANNELS_PER_NET_PEER": "4"}),
    (4, 2, {"NCCL_ALLOC_P2P_NET_LL_BUFFERS": "1", "NCCL_P2P_NET_CHUNKSIZE": "65536"}),  # LL over NET
])
def test_channel_and_chunk_variables(n, nodes, env):
    pairs(n, nodes=nodes, counts=[0, 3, 5000, 20001, 1 << 20], dtypes=("float32",), env=env)
