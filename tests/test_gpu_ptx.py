"""The real-GPU side of collectives/device/cuda compiles: numba lowers the kernel to PTX for sm_90 (an H200) with
no GPU present, so typing errors in code the simulator never compiles (``%globaltimer``, libdevice bit casts,
64-bit atomics on LL lines, the fp16 intrinsics) fail here rather than on the first GPU.  Needs NVVM from a CUDA
toolkit (``CUDA_HOME`` or ``/usr/local/cuda*``); skipped without one."""
import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_COMPILE = r"""
import sys
from numba import cuda, types
import numba.cuda.dispatcher as dispatcher

class _H200:  # device functions ask the current device for its compute capability; there is none here
    compute_capability = (9, 0)

dispatcher.get_current_device = lambda: _H200()
from collectives.device.cuda import kernel as K
op, kind, dt = sys.argv[1], sys.argv[2], getattr(types, sys.argv[3])
A = lambda t, n: types.Array(t, n, "C")
i64 = types.int64
sig = (A(i64, 1), A(i64, 2), A(i64, 3), A(i64, 3), A(dt, 2), A(dt, 2), A(dt, 2), A(types.uint64, 3), A(dt, 5),
       A(types.uint32, 5), A(i64, 2), A(i64, 2), A(i64, 2), A(i64, 4), A(i64, 1), A(dt, 1))
ptx, _ = cuda.compile_ptx(K.get_kernel(op, kind).py_func, sig, cc=(9, 0))
print(ptx)
"""


def _cuda_home():
    for home in [os.environ.get("CUDA_HOME", "")] + sorted(glob.glob("/usr/local/cuda*"), reverse=True):
        if home and glob.glob(os.path.join(home, "**", "libnvvm.so*"), recursive=True):
            return home
    return None


@pytest.mark.parametrize("op,kind,dtype", [("sum", "bf16", "uint16"), ("max", "half", "float16")])
def test_kernel_compiles_to_ptx_for_sm90(op, kind, dtype):
    home = _cuda_home()
    if home is None:
        pytest.skip("no CUDA toolkit with NVVM here")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env.update(CUDA_HOME=home, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", _COMPILE, op, kind, dtype], env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    ptx = p.stdout
    assert ".target sm_90" in ptx
    assert "%globaltimer" in ptx                       # the spin deadline's clock
    assert "membar.sys" in ptx or "fence.sc.sys" in ptx  # threadfence_system before each publication
    assert "atom.global.exch.b64" in ptx or "atom.exch.b64" in ptx  # LL lines and head/tail stores
    assert "nanosleep" in ptx
