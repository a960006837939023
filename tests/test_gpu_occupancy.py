"""The checks a GPU launch passes before it is made (collectives/device/cuda/occupancy.py), each refusal one line:
blocks per SM from the kernel's registers, every rank's channels resident at once, and a hardware queue per
rank-thread (``CUDA_DEVICE_MAX_CONNECTIONS``).  Pure arithmetic: no GPU needed."""
import pytest

from collectives.device.backend import Device
from collectives.device.common import CollectiveError
from collectives.device.cuda import occupancy as occ


@pytest.mark.parametrize("regs,threads,blocks", [
    (96, 640, 1),    # the lab's kernels: 96 registers (their cap) x 640 threads = 61,440 of 65,536
    (128, 640, 0),   # unbounded they use 128+: the launch could not even start
    (64, 256, 4),    # 2,048 registers per warp: 32 warps, 8 per block
    (32, 256, 8),    # then the SM's 64 warps bind
    (16, 32, 32),    # and the 32 blocks
])
def test_blocks_per_sm_from_registers(regs, threads, blocks):
    assert occ.blocks_per_sm(regs, threads) == blocks


def test_residency_refuses_in_one_line():
    assert occ.residency(64, 640, 96, 1, 132, "4 ranks as threads") is None   # 4 ranks x 16 channels on an H200
    msg = occ.residency(160, 640, 96, 1, 132, "10 ranks as threads")
    assert "\n" not in msg and msg.startswith("10 ranks as threads: 160 blocks of 640 threads cannot all be resident")
    assert "1 block(s) fit on each of the 132 SMs (132 in all)" in msg


def test_a_hardware_queue_per_rank_thread():
    assert occ.connections(8, {}) is None
    msg = occ.connections(16, {})
    assert msg.startswith("16 ranks as threads on one GPU need CUDA_DEVICE_MAX_CONNECTIONS >= 16 "
                          "(it is 8, the default)")
    assert occ.connections(16, {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}) is None
    assert "(it is 12)" in occ.connections(16, {"CUDA_DEVICE_MAX_CONNECTIONS": "12"})
    assert "at most 32 hardware queues" in occ.connections(33, {"CUDA_DEVICE_MAX_CONNECTIONS": "32"})


class _FakeGpu(Device):
    name, is_gpu = "cuda", True


def test_threadcomm_refuses_before_touching_the_gpu(monkeypatch):
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    from collectives.device.cuda.threads import ThreadComm
    with pytest.raises(CollectiveError, match=r"^16 ranks as threads on one GPU need CUDA_DEVICE_MAX_CONNECTIONS"):
        ThreadComm(16, 1, _FakeGpu())
