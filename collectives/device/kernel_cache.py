"""numba's disk cache for the lab's compiled CPU kernels, stamped with every source they are compiled from.

numba (``numba.core.caching``) keeps each ``cache=True`` function's machine code under ``__pycache__`` and reuses it
while the function's own file is unchanged: its locator stamps an entry with a hash of that one file.  Our kernels
are built across files: ``ll_compiled.run_ops`` and ``simple_compiled.run_ops`` inline ``compiled_common``'s
helpers and the control array's layout, ``ll_kernels``' LL128 tables, ``futex``'s constants and ``NCCL_STEPS``.
With numba's stamp, a change to ``compiled_common.py`` alone (say, one more header word) left the kernels' cached
code reading the old layout, and an 8-rank AllReduce returned wrong values until the cache was deleted.  So
``install`` puts, ahead of numba's own locators, the same locators with one change: for a function of the
``KERNEL_MODULES`` the stamp is a hash of all of ``SOURCES``, so editing any of them recompiles every kernel once.
Other functions keep numba's locators.  NCCL has no counterpart: its kernels are compiled when NCCL is built.
"""
from __future__ import annotations

import functools
import hashlib
import os

from numba.core import caching

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
KERNEL_MODULES = ("compiled_common.py", "ll_compiled.py", "simple_compiled.py", "ll_kernels.py")
SOURCES = tuple(os.path.join(_HERE, name) for name in KERNEL_MODULES) + (
    os.path.join(_ROOT, "misc", "futex.py"), os.path.join(_ROOT, "include", "device.py"))
_KERNEL_FILES = frozenset(SOURCES[:len(KERNEL_MODULES)])


def sources_stamp(paths: tuple = SOURCES) -> str:
    """A hash of the contents of ``paths``, in order (re-read when a file's size or time changes)."""
    return _stamp(tuple((p, *_stat(p)) for p in paths))


def _stat(path: str) -> tuple:
    st = os.stat(path)
    return st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=None)
def _stamp(files: tuple) -> str:
    h = hashlib.sha256()
    for path, _, _ in files:
        with open(path, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


class _KernelStamp:
    """A numba locator, for the kernels' functions only, whose stamp covers every file they are built from."""

    def get_source_stamp(self):
        return sources_stamp()

    @classmethod
    def from_function(cls, py_func, py_file):
        if os.path.abspath(py_file) not in _KERNEL_FILES:
            return None
        return super().from_function(py_func, py_file)


def install() -> None:
    """Put the kernels' locators first in numba's list (once; each kernel module calls it before its first cached
    function).  A numba without that list keeps its own (the cache then goes stale as described above, as
    before)."""
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)  # the name before numba 0.60
    classes = getattr(impl, "_locator_classes", None)
    if classes is None or any(issubclass(c, _KernelStamp) for c in classes):
        return
    bases = [c for c in (getattr(caching, n, None) for n in ("UserProvidedCacheLocator", "InTreeCacheLocator",
                                                             "UserWideCacheLocator")) if c is not None]
    impl._locator_classes = [type(f"Kernel{b.__name__}", (_KernelStamp, b), {}) for b in bases] + list(classes)
