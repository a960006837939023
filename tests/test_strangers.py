"""The hostile-input suite: strangers on every socket of the lab (the bootstrap root, the bootstrap ring, the NET
listeners of the socket and IB plugins, the software verbs provider's wire).  Each stranger kind of
``tests/strangers.py`` connects before the real peer; the job must still complete, bitwise right, in normal time,
no stranger's bytes may run code or reach a reply, and a rank slot taken twice is an error naming both addresses.
"""
import os
import re
import time
from pathlib import Path

import pytest

import strangers
from collectives.bootstrap import JOIN, NCCL_MAGIC
from collectives.misc import sockets
from collectives.misc.listener import HANDSHAKE, SOCKET_TYPE_BOOTSTRAP, Listener, hello

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("collectives", "transports", "tracing", "visualize")
_env, _free_port, _rank, _finish = strangers.job_env, strangers.free_port, strangers.start_rank, strangers.finish


def test_no_code_executing_deserialization_in_the_library():
    """No pickle or marshal anywhere in the library: nothing received can run code."""
    hits = []
    for pkg in LIBRARY:
        for path in (ROOT / pkg).rglob("*.py"):
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"\b(import\s+(c?pickle|marshal|shelve|dill)|from\s+(c?pickle|marshal|shelve)\b|"
                             r"allow_pickle\s*=\s*True)", line):
                    hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not hits, hits


def test_listener_hands_out_the_real_peer_while_strangers_wait(tmp_path):
    """Every kind of stranger connects first (one of them silent); the real peer, second in line, is accepted at
    once, the strangers are dropped, nothing is echoed back, and the pickle ran nothing."""
    marker = tmp_path / "ran"
    lst = Listener(sockets.listen("127.0.0.1"), 0x1234, SOCKET_TYPE_BOOTSTRAP, "test listener")
    held = strangers.connect(lst.address(), marker=str(marker))
    real = sockets.connect(lst.address(), time.monotonic() + 5, "test", hello(0x1234, SOCKET_TYPE_BOOTSTRAP))
    real.sendall(b"join")
    t0 = time.monotonic()
    conn, first, _ = lst.accept(time.monotonic() + 5, "the real peer", first=4)
    assert first == b"join" and time.monotonic() - t0 < 0.5
    with pytest.raises(sockets.BootstrapError, match="stranger connection"):
        lst.accept(time.monotonic() + 1.5, "nobody")  # the silent and half strangers time out meanwhile
    assert lst.dropped == len(strangers.KINDS)
    for s in held:
        s.settimeout(2)
        try:
            assert s.recv(1024) == b""  # dropped without a word: no reply, no magic
        except ConnectionResetError:
            pass
    assert not marker.exists()
    for s in (*held, real, conn):
        s.close()
    lst.close()


def test_wrong_socket_type_is_dropped():
    lst = Listener(sockets.listen("127.0.0.1"), 99, SOCKET_TYPE_BOOTSTRAP, "test listener")
    wrong = sockets.connect(lst.address(), time.monotonic() + 5, "test", HANDSHAKE.pack(99, 3))
    with pytest.raises(sockets.BootstrapError):
        lst.accept(time.monotonic() + 0.5, "nobody")
    assert lst.dropped == 1
    wrong.close()
    lst.close()


def test_bootstrap_root_with_strangers_connected_first(tmp_path):
    """Rank 0 hosts the root at a known port (NCCL_COMM_ID's way); every kind of stranger connects to it before
    ranks 1 and 2 start.  The job completes in normal time, bitwise right, each stranger is dropped (named in an
    INFO line) without a reply, and the pickle ran nothing."""
    sc = strangers.root_scenario(tmp_path)
    assert sc.ok, "\n".join(sc.outs)[-4000:]
    assert sc.seconds < 25, "strangers must not stall init"
    dropped = re.findall(r"bootstrap root: connection from \S+ (.*), discarding peer connection", sc.outs[0])
    assert len(dropped) >= len(strangers.KINDS), sc.outs[0][-3000:]
    assert sorted(k for _, k, t in sc.drops if t is not None) == sorted(strangers.KINDS), sc.drops
    assert not sc.code_ran
    assert "magic=" not in "".join(sc.outs)  # no line ever shows a magic


def test_a_rank_slot_taken_twice_names_both_addresses(tmp_path):
    """NCCL_COMM_ID's fixed magic is public (NCCL_MAGIC): a stranger who sends it can join as rank 1 first.
    The real rank 1 then makes it an error on every rank, naming both addresses, never a silent replacement."""
    port = _free_port()
    env = _env(NCCLLAB_TIMEOUT="20")
    procs = [_rank("allreduce", port, NCCL_MAGIC, 3, 0, "/nonexistent", env)]  # rank 2 never comes
    fake = sockets.connect(("127.0.0.1", port), time.monotonic() + 20, "root",
                           hello(NCCL_MAGIC, SOCKET_TYPE_BOOTSTRAP))
    fake.sendall(JOIN.pack(1, 3, 9, b"127.0.0.1"))
    time.sleep(0.3)  # the stranger's join is in before the real rank 1 starts
    procs.append(_rank("allreduce", port, NCCL_MAGIC, 3, 1, "/nonexistent", env))
    outs = _finish(procs, timeout=60)
    fake.close()
    assert all(p.returncode != 0 for p in procs)
    lines = [ln for out in outs for ln in out.splitlines() if "two processes joined as rank 1" in ln]
    assert len(lines) == 2, "\n".join(outs)[-3000:]
    assert re.search(r"rank 1: 127\.0\.0\.1:\d+ and 127\.0\.0\.1:\d+", lines[0])
    assert all("Traceback" not in out for out in outs)


def test_a_rank_that_never_joins_is_named(tmp_path):
    """Rank 2 never starts: ranks 0 and 1 end at the deadline with one line naming rank 2, not a bare timeout."""
    port, magic = _free_port(), int.from_bytes(os.urandom(8), "little")
    env = _env(NCCLLAB_TIMEOUT="3", NCCL_DEBUG="WARN")
    t0 = time.monotonic()
    procs = [_rank("allreduce", port, magic, 3, 0, "/nonexistent", env)]
    while port not in strangers.listening_ports(procs[0].pid) and time.monotonic() - t0 < 30:
        time.sleep(0.02)  # rank 1 starts once the root listens: the deadline is about rank 2 alone
    outs = _finish(procs + [_rank("allreduce", port, magic, 3, 1, "/nonexistent", env)], timeout=60)
    assert time.monotonic() - t0 < 30
    for out in outs:
        assert re.search(r"BootstrapError: rank [01]: bootstrap root: rank\(s\) 2 never joined within 3 s "
                         r"\(NCCLLAB_TIMEOUT\); 2 of 3 did", out), out[-2000:]
        assert "Traceback" not in out


@pytest.mark.parametrize("net", ["Socket", "IB"])
def test_ring_and_net_listeners_with_strangers_connected_first(tmp_path, net):
    """2 emulated nodes x 1 rank: every listener a rank opens (root, bootstrap ring, each NET listener of the
    plugin) has every kind of stranger connected before its real peer.  The job completes, bitwise right, in
    normal time; every stranger is dropped without a reply; the pickle ran nothing."""
    sc = strangers.net_scenario(tmp_path, net)
    assert sc.ok, "\n".join(sc.outs)[-4000:]
    for what in ("bootstrap ring", f"NET/{net} listener"):
        kinds = sorted(k for w, k, t in sc.drops if w == what and t is not None)
        assert kinds and set(kinds) == set(strangers.KINDS), (what, sc.drops)
    assert all(t is not None for _, _, t in sc.drops), sc.drops  # None: a stranger got a reply
    assert sc.seconds < 40, "strangers must not stall setup"
    assert not sc.code_ran


def test_verbs_wire_drops_strangers():
    """The software provider's HCA listener: strangers first, then a real RDMA write between two HCAs works."""
    from transports import verbs
    V = verbs.load()
    if V.name != "sim":
        pytest.skip("reaches into the software provider")
    import numpy as np
    from verbs_util import buffer, poll, rc_qp, to_rts, write_wr
    from transports.verbs.sim.hca import get_hca
    ctx = V.Context(name=V.device_names[0])
    hca = get_hca(V.device_names[0])
    held = strangers.connect(("127.0.0.1", hca.lid))
    pd = V.PD(ctx)
    cqa, cqb = V.CQ(ctx, 16, None, None, 0), V.CQ(ctx, 16, None, None, 0)
    a, b = rc_qp(V, ctx, pd, cqa), rc_qp(V, ctx, pd, cqb)
    to_rts(V, a, hca.lid, b.qp_num)
    to_rts(V, b, hca.lid, a.qp_num)
    src, mr_src = buffer(V, pd, 64)
    dst, mr_dst = buffer(V, pd, 64)
    src[:] = np.arange(64, dtype=np.uint8)
    a.post_send(write_wr(V, 1, mr_src, src.ctypes.data, 64, mr_dst.rkey, dst.ctypes.data))
    poll(cqa)
    assert np.array_equal(src, dst)
    for s in held:
        s.close()
    a.close()
    b.close()


def test_wire_decoders_refuse_random_and_truncated_bytes():
    """The decoders of what crosses the bootstrap (peer info, connect blobs, the unique id) take random, truncated
    and bit-flipped input with their own one-line error only, never another exception."""
    import random
    from collectives import peers
    from collectives.bootstrap import UniqueId
    from transports import connections
    rng = random.Random(24)
    info = {"rank": 1, "host_hash": 5, "pid": 77, "host": "h", "nchannels": 1,
            "buff_sizes": {"LL": 1 << 18, "LL128": 1 << 20, "Simple": 1 << 22}, "max_channels": 64,
            "min_channels": 0, "tag": "0123456789ab", "rings": [[0, 1, 2], [2, 1, 0]], "proto": "ll", "algo": "",
            "device": "cpu"}
    good_info = peers.encode_peer_info(info, 3)
    assert peers.decode_peer_info(good_info, 3, 1) == info
    good_blobs = connections.encode_blobs({("send", 0, 2): b"", ("recv", 1, 0): b"nccllab-x"})
    assert connections.decode_blobs(good_blobs, 0)[("recv", 1, 0)] == b"nccllab-x"
    from collectives.graph import init_rank
    from collectives.graph.connect import preset
    ring, tree = init_rank.cpu_lab_graphs([0, 1, 2], 2, False)
    good_graphs = init_rank.encode_graph_info(ring, tree, preset(ring, tree, 1, 2), 0)
    assert init_rank.decode_graph_info(good_graphs, 0, 1)[1].intra[:2] == [[0, 1, 2], [0, 1, 2]]
    cases = 0
    for good, decode in ((good_info, lambda b: peers.decode_peer_info(b, 3, 1)),
                         (good_graphs, lambda b: init_rank.decode_graph_info(b, 0, 1)),
                         (good_blobs, lambda b: connections.decode_blobs(b, 0)),
                         (UniqueId("127.0.0.1", 5, 9).to_bytes(), UniqueId.from_bytes)):
        for _ in range(1500):
            choice = rng.random()
            if choice < 0.3:
                raw = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 300)))
            elif choice < 0.6:
                raw = good[:rng.randrange(0, len(good))]
            else:
                b = bytearray(good)
                for _ in range(rng.randrange(1, 4)):
                    b[rng.randrange(len(b))] = rng.getrandbits(8)
                raw = bytes(b)
            try:
                decode(raw)
            except sockets.BootstrapError:
                pass
            cases += 1
    assert cases == 6000
