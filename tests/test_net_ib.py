"""The net plugin's semantics, the same tests for NET/Socket and NET/IB (on the software verbs provider here; on
pyverbs where an RDMA device exists), in one process; NET/IB's own rules (tag matching, size clamp, QP split,
adaptive-routing write pair, CTS FIFO); and its faults, each one line naming the peer."""
import re
import time

import numpy as np
import pytest

from conftest import wait_pair, wait_request
from transports.net_ib import IbNet
from transports.net_ib.common import IB_WRITE_CHUNK_ALIGNMENT
from transports.net_ib.init import hca_selected, parse_hca
from transports.net_plugin import NetError
from transports.net_socket import SocketNet

IB_CONFIGS = {"ib": {}, "ib-4qp": {"NCCL_IB_QPS_PER_CONNECTION": "4"},
              "ib-4qp-split": {"NCCL_IB_QPS_PER_CONNECTION": "4", "NCCL_IB_SPLIT_DATA_ON_QPS": "1"},
              "ib-no-ar": {"NCCL_IB_ADAPTIVE_ROUTING": "0"}}


def make_pair(kind, monkeypatch, extra=None):
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "lo")
    for k, v in {**IB_CONFIGS.get(kind, {}), **(extra or {})}.items():
        monkeypatch.setenv(k, v)
    net = SocketNet() if kind == "socket" else IbNet()
    net.init()
    handle, lc = net.listen(0)
    deadline = time.monotonic() + 10
    send = net.connect(0, handle, deadline)
    recv = net.accept(lc, deadline)
    net.close_listen(lc)
    if kind != "socket":  # NCCL calls connect/accept until both say ready; our proxy lets isend/irecv do it
        while not (send.progress_connect() & recv.progress_connect()):
            assert time.monotonic() < deadline
    return net, send, recv


@pytest.fixture(params=["socket", *IB_CONFIGS])
def pair(request, monkeypatch):
    net, send, recv = make_pair(request.param, monkeypatch)
    yield net, send, recv
    net.close_send(send)
    net.close_recv(recv)


@pytest.fixture
def ib_pair(monkeypatch):
    net, send, recv = make_pair("ib", monkeypatch)
    yield net, send, recv
    net.close_send(send)
    net.close_recv(recv)


def post(fn, *args, limit=10.0):
    """isend/irecv return no request until the plugin can take one (NET/IB: until the CTS is there)."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        req = fn(*args)
        if req is not None:
            return req
    raise AssertionError(f"{fn.__name__} never returned a request")


wait = wait_request


def test_sizes(pair):
    net, send, recv = pair
    for size in (0, 1, 128, 129, 8192, 8193, 100_000, 3 << 20):
        data = np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8)
        out = np.zeros(size + 64, np.uint8)
        r = post(net.irecv, recv, [memoryview(out)], [len(out)], [0], [None])
        s = post(net.isend, send, memoryview(data), size, 0, None)
        assert wait_pair(net, s, r) == (size, size)
        assert np.array_equal(out[:size], data) and not out[size:].any()


def test_many_outstanding_requests_complete_in_order(pair):
    net, send, recv = pair
    bufs = [np.full(50_000 + i, i, np.uint8) for i in range(20)]
    outs = [np.zeros(60_000, np.uint8) for _ in range(20)]
    rs = [post(net.irecv, recv, [memoryview(o)], [len(o)], [0], [None]) for o in outs]
    ss = [post(net.isend, send, memoryview(b), len(b), 0, None) for b in bufs]
    end, done = time.monotonic() + 20, {}
    while len(done) < 40 and time.monotonic() < end:  # like the proxy: keep testing every request
        for i, q in enumerate(rs + ss):
            if i not in done:
                ok, size = net.test(q)
                if ok:
                    done[i] = size
    assert [done.get(i) for i in range(20)] == [50_000 + i for i in range(20)]
    assert all((o[:50_000 + i] == i).all() and not o[50_000 + i:].any() for i, o in enumerate(outs))


def test_oversized_send(pair):
    """Socket: the receiver rejects it ("message truncated").  IB: the sender clamps it to the posted size."""
    net, send, recv = pair
    out = np.zeros(100, np.uint8)
    r = post(net.irecv, recv, [memoryview(out)], [100], [0], [None])
    s = post(net.isend, send, memoryview(np.ones(200, np.uint8)), 200, 0, None)
    if isinstance(net, SocketNet):
        net.test(s)
        with pytest.raises(NetError, match="message truncated"):
            wait(net, r)
    else:
        assert wait(net, s) == 100 and wait(net, r) == 100 and (out == 1).all()


def test_tag_matching(ib_pair):
    net, send, recv = ib_pair
    out = np.zeros(64, np.uint8)
    r = post(net.irecv, recv, [memoryview(out)], [64], [7], [None])
    data = np.arange(64, dtype=np.uint8)
    end = time.monotonic() + 2
    while time.monotonic() < end:  # the CTS for tag 7 is there, but a send with tag 3 does not match it
        assert net.isend(send, memoryview(data), 64, 3, None) is None
    s = post(net.isend, send, memoryview(data), 64, 7, None)
    assert wait(net, s) == 64 and wait(net, r) == 64 and np.array_equal(out, data)


def test_no_send_before_the_receive_is_posted(ib_pair):
    net, send, recv = ib_pair
    data = np.ones(64, np.uint8)
    for _ in range(1000):  # fifoHead + 1 is not in the slot yet
        assert net.isend(send, memoryview(data), 64, 0, None) is None
    assert send.fifo_head == 0


@pytest.mark.parametrize("cfg", ["ib-4qp-split", "ib-4qp"])
def test_split_chunks_and_write_counts(cfg, monkeypatch):
    net, send, recv = make_pair(cfg, monkeypatch, {"NCCL_IB_AR_THRESHOLD": "1000000000"})
    try:
        for size in (1000, 100_001):
            data = np.ones(size, np.uint8)
            out = np.zeros(size, np.uint8)
            r = post(net.irecv, recv, [memoryview(out)], [size], [0], [None])
            s = post(net.isend, send, memoryview(data), size, 0, None)
            wait(net, s)
            wait(net, r)
            assert (out == 1).all()
        chunks = send.stats["chunks"]
        if cfg == "ib-4qp-split":  # every request on all 4 QPs, chunks of 128-B multiples, the last one shorter
            assert send.stats["data_wrs"] == 8 and chunks[:4] == [256, 256, 256, 232]
            assert all(c % IB_WRITE_CHUNK_ALIGNMENT == 0 for c in chunks[4:7]) and sum(chunks[4:]) == 100_001
        else:  # one QP per request, round-robin
            assert send.stats["data_wrs"] == 2 and chunks == [1000, 100_001]
        assert recv.stats["cts"] == 2
    finally:
        net.close_send(send)
        net.close_recv(recv)


def test_adaptive_routing_sends_data_then_a_zero_byte_imm(monkeypatch):
    net, send, recv = make_pair("ib", monkeypatch)  # InfiniBand link: AR on, threshold 8192
    try:
        for size in (8192, 8193):
            out = np.zeros(size, np.uint8)
            r = post(net.irecv, recv, [memoryview(out)], [size], [0], [None])
            s = post(net.isend, send, memoryview(np.full(size, 3, np.uint8)), size, 0, None)
            assert wait(net, s) == size and wait(net, r) == size and (out == 3).all()
        assert send.stats["data_wrs"] == 3 and send.stats["imm_wrs"] == 2  # 1 WR at 8192, 2 above
    finally:
        net.close_send(send)
        net.close_recv(recv)


def test_hca_grammar():
    assert parse_hca("^=mlx5_1:1,mlx5_2") == (True, True, [("mlx5_1", 1), ("mlx5_2", -1)])
    assert hca_selected("mlx5_0", 1, "mlx5") and not hca_selected("mlx5_0", 1, "=mlx5")
    assert hca_selected("mlx5_0", 1, "mlx5_0:1") and not hca_selected("mlx5_0", 2, "mlx5_0:1")
    assert not hca_selected("mlx5_1", 1, "^mlx5_1") and hca_selected("mlx5_0", 1, "^mlx5_1")
    assert hca_selected("mlx5_10", 1, "^=mlx5_1") and hca_selected("x", 1, "")


def test_no_device_selected_is_one_line(monkeypatch):
    monkeypatch.setenv("NCCL_IB_HCA", "=nosuchhca")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "lo")
    with pytest.raises(NetError, match=r"^NET/IB : No device found\. \(NCCL_IB_HCA==nosuchhca\)$"):
        IbNet().init()


# --- faults ----------------------------------------------------------------------------------------------------

def test_bad_rkey_is_a_remote_access_error_naming_the_peer(ib_pair):
    net, send, recv = ib_pair
    out = np.zeros(4096, np.uint8)
    post(net.irecv, recv, [memoryview(out)], [4096], [0], [None])
    end = time.monotonic() + 10
    while int(send.fifo_idx[0]) != 1 and time.monotonic() < end:
        pass
    send.cts_fifo["rkeys"][0, 0, 0] ^= 0x5A5A  # the receive info as if corrupted in flight
    s = post(net.isend, send, memoryview(np.ones(4096, np.uint8)), 4096, 0, None)
    with pytest.raises(NetError) as err:
        wait(net, s)
    msg = str(err.value)
    assert msg.startswith(f"NET/IB : Got completion from peer {send.peer} with status=remote access error(10)")
    assert "\n" not in msg and not out.any()


def test_qp_in_error_fails_the_next_transfer(ib_pair):
    net, send, recv = ib_pair
    e = net.V.e
    recv.qps[0].modify(net.V.QPAttr(qp_state=e.IBV_QPS_ERR), e.IBV_QP_STATE)
    out = np.zeros(64, np.uint8)
    with pytest.raises(NetError, match=re.escape(f"from peer {recv.peer} with status=Work Request Flushed Error(5)")):
        r = post(net.irecv, recv, [memoryview(out)], [64], [0], [None])
        wait(net, r)


def test_plugin_selection(monkeypatch):
    from transports import net_select
    from transports.verbs import pyverbs_shim
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("NCCL_NET", "Foo")
    with pytest.raises(NetError, match=r"^NCCL_NET=Foo: network not found"):
        net_select.select_plugin()
    monkeypatch.setenv("NCCL_NET", "ib")
    monkeypatch.setenv("NCCL_IB_DISABLE", "1")
    with pytest.raises(NetError, match=r"^NCCL_NET=IB: NET/IB : disabled by NCCL_IB_DISABLE=1$"):
        net_select.select_plugin()
    monkeypatch.delenv("NCCL_IB_DISABLE")
    assert net_select.select_plugin().name == "IB"
    monkeypatch.delenv("NCCL_NET")  # by default IB only on a real device, as NCCL finds no HCA otherwise
    assert net_select.select_plugin().name == ("IB" if pyverbs_shim.device_names() else "Socket")
