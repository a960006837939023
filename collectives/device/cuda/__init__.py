"""NCCL's device code as numba-cuda kernels (NCCL ``src/device/``): one persistent kernel per collective launch,
one block per channel, the Simple, LL and LL128 protocols with NCCL's polling discipline (one volatile poller per
peer, named barriers, system-scope publication).

Modules, one concept each: ``ptx`` (the inline PTX numba lacks: volatile and relaxed accesses, fences, named
barriers, ``%globaltimer``), ``clock`` (the spin deadline's timer), ``sync`` (polls, publication, the group
barrier, the abort word), ``reduce`` (``reduce_kernel.h``'s element ops), ``prims_simple``, ``prims_ll`` and
``prims_ll128`` (``prims_simple.h`` / ``prims_ll.h`` / ``prims_ll128.h``), ``kernel`` (``runRing`` of the five ring
collectives, ``runTreeSplit``, ``ncclKernelMain``), ``layout`` (the connection pool), ``call`` (``ncclDevWorkColl``),
``occupancy`` (what a launch must fit).  Import ``collectives.device.backend`` first: it selects the real GPU or
numba's simulator.
"""
