"""The real-GPU side of collectives/device/cuda, checked without a GPU: numba lowers the kernels to PTX for sm_90
(an H200), and the PTX is read for what only the hardware would otherwise show.

* NCCL's polling discipline (``sync.py``): every spin loop (a loop that polls and reads the deadline clock) loads
  with ``ld.volatile`` / ``ld.relaxed`` only, holds no atomic read-modify-write, and the kernel's one atomic left
  is the deadline's claim of the abort record (``atom.cas``, after a spin has given up); groups meet at named
  barriers (``barrier.red.or``), never at a counter in global memory; every publication is ``fence.acq_rel.sys``
  then ``st.relaxed.sys``; no spin sleeps.
* LL128 moves 16-byte halves of its 128-byte lines (``ld/st.volatile.global.v2.u64``) and votes per warp.
* Float Avg pre-multiplies with ``mul.rn`` (never fused into an FMA with the next add).
* Integer Avg wraps the sum in its own type before dividing it (the NCCL ``FuncSum<T>`` result), with no float
  arithmetic: the element operations are lowered for each integer type, and the same Python functions, compiled by
  numba for the CPU (the same typing rules), are run on sums that overflow.
* The kernels' disk-cache keys (``cache=True``) are the same in two processes and differ between variants.

Needs NVVM from a CUDA toolkit (``CUDA_HOME`` or ``/usr/local/cuda*``); skipped without one.  One subprocess
compiles everything (about 30 s on 2 cores), a second one recomputes the cache keys."""
import glob
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_PRELUDE = r"""
import json, sys
import numpy as np
from numba import cuda, types
import numba.cuda.dispatcher as dispatcher

class _H200:  # device functions ask the current device for its compute capability; there is none here
    compute_capability = (9, 0)

dispatcher.get_current_device = lambda: _H200()
from collectives.device.cuda import kernel as K
from collectives.device.cuda.reduce_kernel import make_ops
A = lambda t, n: types.Array(t, n, "C")
i64, u64 = types.int64, types.uint64


def kernel_sig(dt):  # kernel.ARGS, in order
    return (A(i64, 1), A(i64, 2), A(i64, 3), A(i64, 3), A(dt, 2), A(dt, 2), A(dt, 2), A(u64, 3), A(dt, 5),
            A(types.uint32, 5), A(u64, 3), A(dt, 6), A(u64, 6), A(i64, 2), A(i64, 2), A(i64, 2), A(i64, 4), A(i64, 1),
            A(dt, 1))


class _Codegen:  # what a cache key needs of the codegen: the target's identity
    @staticmethod
    def magic_tuple():
        return ("nvptx64-nvidia-cuda", (9, 0), "")


def cache_keys():
    out = {}
    for v in VARIANTS:
        kern = K.get_kernel(*v)
        out["/".join(v)] = list(kern._cache._index_key(kernel_sig(getattr(types, v[2])), _Codegen())[2]) + [
            kern._cache._cache_file._index_name]
    return out

VARIANTS = [("sum", "bf16", "uint16", "Simple"), ("max", "half", "float16", "LL"),
            ("avg", "float", "float32", "LL128"), ("sum", "int", "uint8", "Simple")]
"""

_COMPILE = _PRELUDE + r"""
outdir = sys.argv[1]
report = {"keys": cache_keys(), "ints": {}}
for v in VARIANTS[:3]:
    ptx, _ = cuda.compile_ptx(K.get_kernel(*v).py_func, kernel_sig(getattr(types, v[2])), cc=(9, 0))
    open(f"{outdir}/{v[3]}.ptx", "w").write(ptx)

from numba import njit
for name in ("int8", "uint8", "int32", "uint32", "int64", "uint64"):
    fn, premul, postdiv = make_ops("avg", "int", name)

    def k(out, a, b, c, n):
        out[0] = postdiv(fn(fn(a[0], b[0]), c[0]), n[0])
    T = getattr(types, name)
    ptx, _ = cuda.compile_ptx(k, (A(T, 1), A(T, 1), A(T, 1), A(T, 1), A(i64, 1)), cc=(9, 0))
    open(f"{outdir}/avg_{name}.ptx", "w").write(ptx)
    # the same Python functions, compiled for the CPU by numba (the same typing rules as for CUDA)
    f, p = njit(fn.py_func), njit(postdiv.py_func)

    @njit
    def avg3(a, b, c, n, out):
        for i in range(a.size):
            out[i] = p(f(f(a[i], b[i]), c[i]), n)
    info = np.iinfo(name)
    rng = np.random.default_rng(1)
    x = [rng.integers(info.max // 2, info.max, 4096, dtype=name, endpoint=True) for _ in range(3)]
    if info.min < 0:
        x[1] = -x[1]
    got = np.empty_like(x[0])
    avg3(x[0], x[1], x[2], np.int64(3), got)
    with np.errstate(over="ignore"):
        s = (x[0] + x[1]) + x[2]  # numpy arrays wrap in their type, as C's does
    want = np.array([int(v) // 3 if v >= 0 else -((-int(v)) // 3) for v in s], dtype=name)  # C's truncation
    report["ints"][name] = {"wrong": int(np.count_nonzero(got != want)), "overflowed": int(np.count_nonzero(
        s.astype(object) != sum(xi.astype(object) for xi in x)))}
print(json.dumps(report))
"""

_KEYS = _PRELUDE + r"""
print(json.dumps({"keys": cache_keys()}))
"""


def _cuda_home():
    for home in [os.environ.get("CUDA_HOME", "")] + sorted(glob.glob("/usr/local/cuda*"), reverse=True):
        if home and glob.glob(os.path.join(home, "**", "libnvvm.so*"), recursive=True):
            return home
    return None


def _run(code: str, *args, cache_dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env.update(CUDA_HOME=_cuda_home(), PYTHONPATH=str(ROOT), NUMBA_CACHE_DIR=str(cache_dir))
    p = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    if _cuda_home() is None:
        pytest.skip("no CUDA toolkit with NVVM here")
    out = tmp_path_factory.mktemp("ptx")
    report = _run(_COMPILE, str(out), cache_dir=out / "cache")
    return out, report


KERNELS = ("Simple", "LL", "LL128")


def _ptx(lowered, name):
    return (lowered[0] / f"{name}.ptx").read_text()


def _loops(lines):
    """(first, last) line of every loop: a branch back to a label above it."""
    at = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"^\s*(\$L__\w+):", line))}
    return [(at[m.group(1)], i) for i, line in enumerate(lines)
            if (m := re.search(r"\bbra(?:\.uni)?\s+(\$L__\w+);", line)) and at.get(m.group(1), i + 1) <= i]


def _spin_loops(lines):
    """Loops that poll (a volatile load) and read the deadline clock, with no smaller such loop inside."""
    def polls_and_times(lp):
        body = lines[lp[0]:lp[1] + 1]
        return any("ld.volatile.global" in x for x in body) and any("%globaltimer" in x for x in body)
    cands = [lp for lp in _loops(lines) if polls_and_times(lp)]
    return [lp for lp in cands if not any(o != lp and lp[0] <= o[0] and o[1] <= lp[1] for o in cands)]


def _memory_ops(body):
    """The memory instructions of some PTX lines: plain ones by opcode, inline-asm ones by what they hold."""
    ops = []
    for line in body:
        line = line.strip()
        for m in re.finditer(r"(?<![\w.])((?:ld|st|atom|red)\.[\w.]+)", line):
            if ".param" not in m.group(1) and ".local" not in m.group(1):
                ops.append(m.group(1))
    return ops


@pytest.mark.parametrize("proto", KERNELS)
def test_kernel_compiles_for_sm90(lowered, proto):
    ptx = _ptx(lowered, proto)
    assert ".target sm_90" in ptx
    assert "%globaltimer" in ptx           # the spin deadline's clock
    assert "nanosleep" not in ptx          # a GPU spin does not sleep (NCCL's do not)


@pytest.mark.parametrize("proto,expected", [("Simple", 4), ("LL", 4), ("LL128", 4)])
def test_every_spin_loop_polls_with_a_volatile_load_and_no_atomic(lowered, proto, expected):
    """Simple: tail and head waits (inlined for the ring and the tree); LL: head credit and the line reads;
    LL128: head credit and the line waits."""
    lines = _ptx(lowered, proto).splitlines()
    spins = _spin_loops(lines)
    assert len(spins) >= expected, spins
    for first, last in spins:
        ops = _memory_ops(lines[first:last + 1])
        assert ops, (first, last)
        bad = [op for op in ops if not op.startswith(("ld.volatile.global", "ld.relaxed."))]
        assert not bad, f"spin loop at PTX lines {first}-{last} does {bad}"
    atoms = {m.group(0) for line in lines for m in re.finditer(r"(?<![\w.])(atom|red)\.[\w.]+", line)}
    assert atoms == {"atom.global.cas.b64"}, atoms   # the abort record's claim, once, after a deadline passed


@pytest.mark.parametrize("proto", KERNELS)
def test_groups_meet_at_named_barriers_and_publish_with_fence_then_relaxed_store(lowered, proto):
    lines = _ptx(lowered, proto).splitlines()
    assert any("barrier.red.or.pred" in x for x in lines)
    assert not any(re.search(r"\b(bar|barrier)\.sync\s+0\b", x) for x in lines)  # no block-wide __syncthreads
    stores = [i for i, x in enumerate(lines) if "st.relaxed.sys.global" in x]
    assert stores
    for i in stores:  # the last memory instruction before each publication is the system-scope fence
        j = i - 1
        while j >= 0 and not re.search(r"\b(ld|st|atom|fence|membar)\.", lines[j]) and "fence." not in lines[j]:
            j -= 1
        assert "fence.acq_rel.sys" in lines[j], f"publication at PTX line {i} follows {lines[j].strip()!r}"
    assert not any("membar.gl" in x or "fence.sc" in x for x in lines)


def test_ll128_moves_16_byte_line_halves_and_votes_per_warp(lowered):
    ptx = _ptx(lowered, "LL128")
    assert "ld.volatile.global.v2.u64" in ptx and "st.volatile.global.v2.u64" in ptx
    assert "vote.sync.any.pred" in ptx


def test_float_avg_premultiplies_without_fma(lowered):
    ptx = _ptx(lowered, "LL128")  # the (avg, float32) variant
    assert "mul.rn.f32" in ptx
    assert "fma.rn.f32" not in ptx


@pytest.mark.parametrize("name", ["int8", "uint8", "int32", "uint32", "int64", "uint64"])
def test_integer_avg_wraps_the_sum_in_its_type(lowered, name):
    ptx = [x.strip() for x in _ptx(lowered, f"avg_{name}").splitlines() if x.startswith("\t")]
    assert not [x for x in ptx if re.search(r"\.f(32|64)\b", x)], "float arithmetic in integer Avg"
    bits = int(re.sub(r"\D", "", name))
    if bits < 64:  # numba widens int8 + int8 to int64: the wrap is a narrowing back to the type
        sign = "s" if name.startswith("int") else "u"
        narrow = re.compile(rf"cvt\.{sign}\d+\.{sign}{bits}\b|and\.b\d+\s+\S+,\s*\S+,\s*{(1 << bits) - 1};")
        assert any(narrow.search(x) for x in ptx), "no wrap to the element type before the division"
    ints = lowered[1]["ints"][name]
    assert ints["overflowed"] > 0         # the inputs did overflow the type
    assert ints["wrong"] == 0             # and the wrapped, truncated Avg is NCCL's


def test_kernel_cache_keys_are_stable_across_processes_and_distinct(lowered, tmp_path):
    """Each variant: (hash of its code, hash of what its closure refers to, its index file).  The same in two
    processes, or the cache never hits; a file of its own per variant, or parallel compiles overwrite each other's
    index."""
    first = lowered[1]["keys"]
    second = _run(_KEYS, cache_dir=tmp_path / "cache")["keys"]
    assert first == second
    assert len({k[1] for k in first.values()}) == len(first)
    assert len({k[2] for k in first.values()}) == len(first)
