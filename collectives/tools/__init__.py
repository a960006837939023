"""The command lines beside the nccl-tests runner: ``launcher`` (a script as N local ranks, as mpirun would),
``tune`` (NCCL's cost model for any machine, size by size) and ``topology`` (NCCL's topology search over one node's
XML, printed as NCCL prints it).  Named so that none shares a name with the ``graph/`` and ``device/`` modules it
calls (``graph/topo.py`` is ``ncclTopoSystem``, ``device/launch.py`` is ``ncclLaunchKernel``)."""
