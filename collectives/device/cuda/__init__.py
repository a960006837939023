"""NCCL's device code as numba-cuda kernels (NCCL ``src/device/``): one persistent kernel per collective launch,
one block per channel, the Simple and LL protocols with volatile polling and system-scope publication.

Modules, one concept each: ``clock`` (the spin deadline's timer), ``sync`` (volatile loads, fenced stores, the
thread-group barrier, the abort word), ``reduce`` (``reduce_kernel.h``'s element ops), ``prims_simple`` and
``prims_ll`` (``prims_simple.h`` / ``prims_ll.h``), ``kernel`` (``runRing`` of the five ring collectives,
``runTreeSplit``, ``ncclKernelMain``), ``threads`` (ranks as threads of one process, direct pointers).
Import ``collectives.device.backend`` first: it selects the real GPU or numba's simulator.  LL128 is not here.
"""
