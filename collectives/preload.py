"""What every rank does before its first collective, done once in a launcher (``collectives.job.spawn``'s
``preload``), so that the ranks it forks (``collectives.misc.forked``) start with it done.

NCCL has no such step: its library is loaded by each rank's program and its kernels were compiled when NCCL was
built.  Ours is Python, so each fresh rank imports the communicator (numpy, numba, our modules: 0.5 s of CPU here)
and, at its first compiled call, numba loads its CPU target's typing and lowering registries (0.12 s) before it
reads the kernel from its disk cache.  Both are done here.  The kernels themselves are left to each rank: loading
one from the cache takes milliseconds once the registries are in, and where the cache is cold (no ``./lab``
setup) a launcher must not compile all sixteen before starting anyone.
"""
from __future__ import annotations

import importlib


def preload(*modules: str) -> None:
    """Import the communicator and ``modules`` (what the ranks' program imports besides), and load numba's CPU
    target.  Only a head start: the ranks import whatever is still missing themselves."""
    for name in ("collectives.api", "collectives.comm", *modules):
        importlib.import_module(name)
    try:
        from numba.core.registry import cpu_target
        cpu_target.target_context.refresh()
        cpu_target.typing_context.refresh()
    except (ImportError, AttributeError):  # another numba's internals: the ranks load it at their first call
        pass
