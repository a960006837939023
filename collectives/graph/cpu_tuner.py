"""The lab's tuner plugin for its CPU machine (NCCL ``src/include/plugin/tuner/tuner_v6.h``: ``getCollInfo``, as
``plugins/tuner/example/plugin.c`` applies its configuration: the cost of the configured algorithm and protocol set
to 0.0 in the cost table NCCL computed, where the table has that entry).

Its constants are the cpu preset's (``presets.CPU_CONSTANTS``, measured with one rank per core); its one rule is
for more ranks than cores on one node.  There every rank shares a core, so the time of a small AllReduce is the
work of all ranks together, not the depth of the algorithm: a ring runs 2(n-1) primitives on every rank, the tree
(a chain on one node) runs two, one each way.  Measured with ``benchmarks/tuning_check.py`` on this 2-core machine
(5 alternating rounds, docs/measured.md): Tree/Simple ahead of the model's pick from 512 B to 32 KiB at 3, 4 and 8
ranks (1.1-1.7x), Ring/LL ahead below 512 B at 8 ranks, Ring/Simple and Tree/Simple even from 256 KiB.  So, as a
configuration line of NCCL's example tuner: AllReduce, one node, oversubscribed, ``TREE_SIMPLE_FROM`` to
``TREE_SIMPLE_TO`` bytes -> Tree/Simple.  NCCL's own formula cannot say this: its latency is a depth (base + steps x
per-step latency) and Tree and Ring have the same number of steps on one node.
"""
from __future__ import annotations

from collectives.misc.param import env_str
from tracing import debug

TREE_SIMPLE_FROM, TREE_SIMPLE_TO = 512, 64 << 10


def tuner_plugin() -> bool:
    """``ncclTunerPluginLoad``'s first question: ``NCCL_TUNER_PLUGIN=none`` (any case) loads no plugin, and the
    cost model's own choice stands; anything else keeps this one (the lab loads no libraries)."""
    name = env_str("NCCL_TUNER_PLUGIN")
    if name:
        debug.info("ENV|TUNING", f"NCCL_TUNER_PLUGIN set by environment to {name}")
    return name.lower() != "none"


class CpuTuner:
    """``ncclTuner_v6_t`` for the CPU lab: ``init`` (the constructor: the communicator's shape) and
    ``get_coll_info``."""
    name = "cpu-lab"

    def __init__(self, nnodes: int = 1, oversubscribed: bool = False):
        """``oversubscribed``: more ranks on this machine than cores (the communicator's count, emulated nodes
        included); the rule is for one node only, since across nodes the NET steps dominate (the preset's NET
        row)."""
        self.active = nnodes == 1 and oversubscribed

    def get_coll_info(self, func: str, nbytes: int, table: dict) -> tuple | None:
        """``getCollInfo``: prefer Tree/Simple where the rule applies and the table has it (NCCL_ALGO and
        NCCL_PROTO still decide: a disabled entry stays -1).  Returns the (algorithm, protocol) it set, or None."""
        if (self.active and func == "AllReduce" and TREE_SIMPLE_FROM <= nbytes <= TREE_SIMPLE_TO
                and table.get(("Tree", "Simple"), -1.0) >= 0):
            table[("Tree", "Simple")] = 0.0
            return ("Tree", "Simple")
        return None

    def describe(self) -> str:
        """The INFO line NCCL's plugins print when they load, with the rule in force."""
        rule = (f"AllReduce of {TREE_SIMPLE_FROM} B to {TREE_SIMPLE_TO >> 10} KiB -> Tree/Simple (more ranks than "
                f"cores on one node)") if self.active else "the cpu preset's constants only"
        return f"TUNER/Plugin: Using {self.name}: {rule}"
