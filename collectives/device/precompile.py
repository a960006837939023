"""Every compiled CPU kernel, compiled once into numba's disk cache: ``python -m collectives.device.precompile``.

NCCL compiles its device code when NCCL is built: ``src/device/generate.py`` writes one instantiation per
collective, reduction, type and protocol, and ``make`` compiles them all (its second argument, ``ONLY_FUNCS``,
narrows the list for developers).  Ours are numba functions (``compiled.KERNELS``) compiled at their first call,
for the type that call brings.  Left to that, a fresh checkout pays twice:

* every rank of the first job compiles the same kernel at the same moment: 8 ranks, 8 compilations of 3-8 s each
  on a machine of 2 cores;
* two processes compiling different types of one function race on its cache index: numba's
  ``IndexDataCacheFile.save`` reads the index, adds its entry under the first free data file name and writes both
  back, so two writers can pick the same name and leave one type's entry pointing at the other's machine code.

So ``./lab`` runs this at setup, in one process, for every kernel and every type a compiled call can bring
(``compiled.SUPPORTED``), as NCCL's build instantiates every type.  With the cache warm it only loads each (under
a second in all).  ``--types`` narrows the types, as ``ONLY_FUNCS`` does.
"""
from __future__ import annotations

import argparse
import sys
import time

import numba
import numpy as np

from .compiled import KERNELS, SUPPORTED


def kernel_signature(dtype: np.dtype) -> tuple:
    """The types ``Compiled.run`` passes a kernel: the int64 control array, the input and output (contiguous arrays
    of the call's type) and the int64 signature."""
    words = numba.types.Array(numba.int64, 1, "C")
    data = numba.types.Array(numba.from_dtype(np.dtype(dtype)), 1, "C")
    return words, data, data, words


def precompile(dtypes=None) -> tuple[int, int]:
    """Compile (or load from the cache) every kernel for each of ``dtypes`` (default: every supported type), one
    after the other in this process; returns (compiled, loaded)."""
    kernels = list({id(k): k for k in KERNELS.values()}.values())  # LL and LL128 share one function
    compiled = loaded = 0
    for kernel in kernels:
        for dtype in sorted(dtypes or SUPPORTED, key=str):
            misses = sum(kernel.stats.cache_misses.values())
            kernel.compile(kernel_signature(dtype))
            if sum(kernel.stats.cache_misses.values()) > misses:
                compiled += 1
            else:
                loaded += 1
    return compiled, loaded


def _types(text: str) -> list:
    names = [t.strip() for t in text.split(",") if t.strip()]
    known = {str(d): d for d in SUPPORTED}
    bad = [t for t in names if t not in known]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"not a compiled type: {','.join(bad) or repr(text)} (compiled: "
                                         f"{','.join(sorted(known))}; the others run the readable primitives)")
    return [known[t] for t in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collectives.device.precompile", description=__doc__.split("\n")[0])
    parser.add_argument("--types", type=_types, default=None, help="comma-separated numpy type names (default: all)")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    compiled, loaded = precompile(args.types)
    print(f"precompile: {compiled + loaded} kernels in numba's cache ({compiled} compiled, {loaded} loaded) "
          f"in {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
