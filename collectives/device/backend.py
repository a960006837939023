"""The device layer: buffers, streams and events behind one interface (NCCL has ``cudaMalloc``/``cuMem*``,
``cudaStream_t`` and ``cudaEvent_t``; the lab's CPU path has numpy over shared memory).

Back-ends, chosen by ``NCCLLAB_DEVICE`` (default ``cpu``) or by name:

* ``cpu``: numpy arrays; streams and events do nothing (the CPU path runs synchronously).
* ``cuda``: cupy memory, one cupy stream per rank, numba-cuda kernels (``collectives/device/cuda``).
* ``cudasim``: numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``): device memory is numpy, kernels are Python.

The simulator must be chosen before ``numba.cuda`` is first imported: ``get_device("cudasim")`` sets the variable
and reloads numba's configuration, and refuses (one line, naming the kernel module imported too early) if the
real ``numba.cuda`` is already loaded.  The callers (``device/cuda/rank.py``, ``device/cuda/threads.py``) import the
kernel modules only once the device is chosen.
"""
from __future__ import annotations

import os
import sys

import numpy as np

DEVICES = ("cpu", "cuda", "cudasim")


class DeviceError(RuntimeError):
    """A device that cannot be used here; the message is one line."""


class Stream:
    """A rank's queue of work (``cudaStream_t``); ``synchronize`` waits for it."""

    def __init__(self, raw=None):
        self.raw = raw

    def synchronize(self) -> None:
        if self.raw is not None:
            self.raw.synchronize()


class Device:
    name = "cpu"
    is_gpu = False

    def empty(self, shape, dtype) -> np.ndarray:
        return np.empty(shape, dtype)

    def zeros(self, shape, dtype) -> np.ndarray:
        return np.zeros(shape, dtype)

    def to_device(self, host: np.ndarray):
        return np.array(host, copy=True)

    def to_host(self, arr) -> np.ndarray:
        return np.asarray(arr)

    def stream(self) -> Stream:
        return Stream()

    def wrap(self, host: np.ndarray):
        """Host memory (a shared-memory segment) as this device's array, without a copy."""
        return host

    def select(self, local_rank: int) -> int:
        """Take this rank's GPU (``cudaSetDevice(localRank % count)``, as nccl-tests does); returns its index."""
        return 0

    def kernel_view(self, arr, dtype=None):
        """What a kernel argument should be: the array itself, retyped (``view``) when asked."""
        return arr if dtype is None else arr.view(dtype)

    def synchronize(self) -> None:
        pass


class SimDevice(Device):
    """numba's simulator: a device array wraps a numpy array; views of it share that memory, and a launch uses
    it in place (a plain numpy argument would be copied in and out, and two views of one buffer would part)."""
    name = "cudasim"

    def __init__(self):
        from numba import cuda
        self.cuda = cuda

    def empty(self, shape, dtype):
        return self.cuda.to_device(np.empty(shape, dtype))

    def zeros(self, shape, dtype):
        return self.cuda.to_device(np.zeros(shape, dtype))

    def to_device(self, host):
        return self.cuda.to_device(np.ascontiguousarray(host))

    def to_host(self, arr):
        return arr if isinstance(arr, np.ndarray) else arr.copy_to_host()

    def wrap(self, host: np.ndarray):
        """The simulator's device array over ``host`` itself: a launch then works in that memory (a segment in
        /dev/shm is seen by the other ranks' processes), where ``to_device`` would copy."""
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
        return FakeCUDAArray(host)


class CudaDevice(Device):
    """cupy memory and streams; kernels get numba views of cupy arrays (``__cuda_array_interface__``)."""
    name = "cuda"
    is_gpu = True

    def __init__(self):
        import cupy  # noqa: F401  (the gpu extra)
        self.cp = cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise DeviceError("NCCLLAB_DEVICE=cuda: no CUDA device visible")

    def empty(self, shape, dtype):
        return self.cp.empty(shape, dtype)

    def zeros(self, shape, dtype):
        return self.cp.zeros(shape, dtype)

    def to_device(self, host):
        """numpy (copied up), or any device array: ``__cuda_array_interface__`` (cupy, numba, torch) or DLPack,
        taken without a copy."""
        if not isinstance(host, np.ndarray) and not hasattr(host, "__cuda_array_interface__") \
                and hasattr(host, "__dlpack__"):
            return self.cp.from_dlpack(host)
        return self.cp.asarray(host)

    def to_host(self, arr):
        return arr if isinstance(arr, np.ndarray) else self.cp.asnumpy(self.to_device(arr))

    def stream(self) -> Stream:
        return Stream(self.cp.cuda.Stream(non_blocking=True))

    def select(self, local_rank: int) -> int:
        index = local_rank % self.cp.cuda.runtime.getDeviceCount()
        self.cp.cuda.Device(index).use()
        from numba import cuda
        cuda.select_device(index)  # numba's context on the same GPU as cupy's
        return index

    def synchronize(self) -> None:
        self.cp.cuda.runtime.deviceSynchronize()


def _enable_simulator() -> None:
    if "numba.cuda" in sys.modules and not _simulating():
        # numba decides at its first import whether numba.cuda is the simulator; say who imported it too early
        early = sorted(m for m in sys.modules if m.startswith("collectives.device.cuda.") and m.rsplit(".", 1)[1]
                       not in ("occupancy",))
        who = f" ({early[0]} was imported before the device was chosen)" if early else ""
        raise DeviceError(f"cudasim: numba.cuda is already loaded for a real GPU in this process{who}; choose the "
                          f"device before importing the kernels, or set NUMBA_ENABLE_CUDASIM=1 before starting Python")
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    from numba.core import config
    config.reload_config()


def _simulating() -> bool:
    from numba.core import config
    return bool(config.ENABLE_CUDASIM)


def get_device(name: str | None = None) -> Device:
    """The device named, else ``NCCLLAB_DEVICE``, else ``cpu``; a bad name or an unusable device: DeviceError."""
    name = (name or os.environ.get("NCCLLAB_DEVICE", "") or "cpu").strip().lower()
    if name not in DEVICES:
        raise DeviceError(f"unknown device {name!r} (NCCLLAB_DEVICE / --device: choose from {', '.join(DEVICES)})")
    if name == "cpu":
        return Device()
    if name == "cudasim":
        _enable_simulator()
        return SimDevice()
    try:
        return CudaDevice()
    except ImportError as exc:
        raise DeviceError(f"device cuda needs cupy and numba-cuda (pip install -e .[gpu]): {exc}") from None
    except Exception as exc:  # cupy raises its own runtime errors when there is no driver
        raise DeviceError(f"device cuda unusable here: {str(exc).splitlines()[0]}") from None


def gpu_protocols(device: str, text: str) -> str:
    """``NCCL_PROTO`` for the GPU kernels: ``^LL128`` when unset (NCCL enables LL128 by itself only on paths it
    has validated, ``tuning.cc``; the lab's topology is not one), else as given (LL128 named: it runs)."""
    return text if text.strip() else "^LL128"


def device_and_protocols(name: str | None, proto_text: str) -> tuple[Device, str]:
    """The communicator's device (``--device`` / ``NCCLLAB_DEVICE``) and the ``NCCL_PROTO`` its kernels can run."""
    device = get_device(name)
    return device, proto_text if device.name == "cpu" else gpu_protocols(device.name, proto_text)
