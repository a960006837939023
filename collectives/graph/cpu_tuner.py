"""The lab's tuner plugin for its CPU machine (NCCL ``src/include/plugin/tuner/tuner_v6.h``: ``getCollInfo``, as
``plugins/tuner/example/plugin.c`` applies its configuration: the cost of the configured algorithm and protocol set
to 0.0 in the cost table NCCL computed, where the table has that entry).

Its constants are the cpu preset's (``presets.CPU_CONSTANTS``, measured with one rank per core); its first rule is
for more ranks than cores on one node.  There every rank shares a core, so the time of a small AllReduce is the
work of all ranks together, not the depth of the algorithm: a ring runs 2(n-1) primitives on every rank, the tree
(a chain on one node) runs two, one each way.  Measured with ``benchmarks/tuning_check.py`` on this 2-core machine
(5 alternating rounds, docs/measured.md): Tree/Simple ahead of the model's pick from 512 B to 32 KiB at 3, 4 and 8
ranks (1.1-1.7x), Ring/LL ahead below 512 B at 8 ranks.  Above, where the ring's bytes start to count, the crossover
moves with the ranks a core (2026-12-07, forced Ring/Simple against Tree/Simple, 64 KiB to 2 MiB): at 3 and 4 ranks
Tree ahead up to 512 KiB (128 KiB 1.23x and 1.69x, 256 KiB 1.19-1.27x at 4 ranks in four runs, 512 KiB 1.08-1.30x)
and behind from 1 MiB (Ring 1.4-1.5x at 4 ranks); at 8 ranks, 4 a core, Tree ahead at 128 KiB (1.39x) and behind
from 256 KiB (Ring 1.2-1.9x).  So, as a configuration line of NCCL's example tuner: AllReduce, one node, oversubscribed,
``TREE_SIMPLE_FROM`` to ``TREE_SIMPLE_TO`` bytes -> Tree/Simple, to ``TREE_SIMPLE_TO_CROWDED`` from
``CROWDED_RANKS_PER_CORE`` ranks a core.  NCCL's own formula cannot say this: its latency is a depth (base + steps x
per-step latency) and Tree and Ring have the same number of steps on one node.

Its second rule reads ``getCollInfo``'s ``regBuff``, which ``ncclGetAlgoInfo`` (``src/enqueue.cc``) sets when both the
send and the receive buffer are registered and valid (``ncclRegFind``, ``ncclRegLocalIsValid``; NCCL also sets it while
a CUDA graph is captured with ``NCCL_GRAPH_REGISTER``, which the lab has no counterpart of).  Across nodes a registered
Ring/Simple AllReduce sends from and receives into the user's buffers (``register.py``), where Tree copies every NET
step into and out of the FIFOs (NCCL registers NET buffers for the ring only: ``src/register/coll_reg.cc``'s Tree
branch covers P2P and CollNet).  The cost table cannot see that.  Measured at 4 ranks (4 x 1 and 2 x 2 emulated nodes,
forced Ring/Simple against Tree/Simple in the same processes, 3 alternating rounds, 2026-12-07, docs/measured.md):
Tree ahead up to 1 MiB (0.71x and 0.92x Ring's time), level at 2 MiB at 4 x 1 (1.02x) and behind at 2 x 2 (1.20x),
behind from 4 MiB (1.21-1.69x), where the model still picks it up to 8 MiB.  So: AllReduce, several nodes, buffers
registered, from ``RING_SIMPLE_FROM`` bytes -> Ring/Simple.  Like NCCL's ``regBuff``, the rule does not know
that an in-place or avg call will not use the registration (``ring_net`` declines those, as ``coll_reg.cc`` does):
such a call runs Ring through the FIFOs, measured within 15% of Tree from 2 MiB at 4 x 1.

With several ranks a node (2 x 2: SHM inside, NET between) the same holds unregistered: ``tuning_check.py --nodes 2``
measured forced Ring/Simple 1.28x and 1.42x faster than the model's Tree/Simple at 2 and 4 MiB (3 rounds,
2026-12-07), and 1.29-1.45x from 2 to 8 MiB in another run, even at 16 MiB; the preset's NET row charges a ring
step between nodes 860 us where a node has several ranks (``hw_latencies[NET][RING]``), which moves the model's
crossover to 8 MiB.  So the rule also applies there without registration; at one rank a node (4 x 1, where the
ring's NET steps are charged the tree's 360 us) the unregistered picks were within 15% and stay the model's.

Where that ring rule fires with more ranks than cores it also returns ``getCollInfo``'s ``nChannels`` (NCCL's
example tuner's ``channels`` column): one channel below ``RING_ONE_CHANNEL_BELOW`` bytes, where
``ncclGetAlgoInfo`` then replaces the nMaxChannels ``topoGetAlgoInfo`` derived (two here, the communicator's).  With
four ranks on two cores, a second channel halves every NET message and doubles the sockets each rank serves, without
a core to run it on.  Measured
with both communicators in the same processes (the communicator's two channels against ``NCCL_MAX_NCHANNELS=1``, 5
alternating rounds, 2026-12-07, docs/measured.md), one channel's time against two: 4 x 1 registered 0.77-0.90x from
2 to 8 MiB (two runs), 0.91-0.93x at 16 MiB, 0.94-1.0x at 32 MiB, 1.01x at 64 MiB and 1.10-1.11x at 128 MiB; 2 x 2
registered 0.85-0.98x from 2 to 32 MiB, 1.0x at 64 MiB, 1.11-1.12x at 128 MiB; 2 x 2 unregistered 0.93-0.97x from 2
to 64 MiB.  A tree (the model's pick below 2 MiB, and at 4 x 1 unregistered) was slower on one channel (1.08-1.32x
at 1 to 8 MiB), so the rule asks nothing there.
"""
from __future__ import annotations

from collectives.misc.param import env_str
from tracing import debug

TREE_SIMPLE_FROM, TREE_SIMPLE_TO = 512, 512 << 10
TREE_SIMPLE_TO_CROWDED, CROWDED_RANKS_PER_CORE = 128 << 10, 4
RING_SIMPLE_FROM = 2 << 20
RING_ONE_CHANNEL_BELOW = 64 << 20


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

    def __init__(self, nnodes: int = 1, ranks_per_node: float = 1.0, ranks_per_core: float = 1.0):
        """``ranks_per_core``: the ranks on this machine (the communicator's count, emulated nodes included) over
        its cores; above 1 the machine is oversubscribed.  The Tree rule is for one oversubscribed node only, since
        across nodes the NET steps dominate (the preset's NET row), and ends sooner from ``CROWDED_RANKS_PER_CORE``;
        the ring rule is for several nodes only, registered or with several ranks a node, and asks one channel
        only when oversubscribed (where it was measured)."""
        oversubscribed = ranks_per_core > 1
        self.active = nnodes == 1 and oversubscribed
        self.tree_to = TREE_SIMPLE_TO_CROWDED if ranks_per_core >= CROWDED_RANKS_PER_CORE else TREE_SIMPLE_TO
        self.across = nnodes > 1
        self.shared_nodes = nnodes > 1 and ranks_per_node > 1
        self.one_channel = nnodes > 1 and oversubscribed

    def get_coll_info(self, func: str, nbytes: int, table: dict, reg_buff: bool = False) -> int:
        """``getCollInfo``: prefer Tree/Simple or Ring/Simple where a rule applies and the table has it (NCCL_ALGO
        and NCCL_PROTO still decide: a disabled entry stays -1).  ``reg_buff``: NCCL's ``regBuff``, both buffers
        registered.  Returns its ``nChannels``: 1 where the ring rule set Ring/Simple below
        ``RING_ONE_CHANNEL_BELOW`` with more ranks than cores, else 0 (NCCL keeps its own count)."""
        if func != "AllReduce":
            return 0
        if self.active and TREE_SIMPLE_FROM <= nbytes <= self.tree_to:
            pick = ("Tree", "Simple")
        elif self.across and (reg_buff or self.shared_nodes) and nbytes >= RING_SIMPLE_FROM:
            pick = ("Ring", "Simple")
        else:
            return 0
        if table.get(pick, -1.0) < 0:
            return 0
        table[pick] = 0.0
        return int(self.one_channel and pick == ("Ring", "Simple") and nbytes < RING_ONE_CHANNEL_BELOW)

    def describe(self) -> str:
        """The INFO line NCCL's plugins print when they load, with the rule in force."""
        if self.active:
            rule = (f"AllReduce of {TREE_SIMPLE_FROM} B to {self.tree_to >> 10} KiB -> Tree/Simple (more ranks than "
                    f"cores on one node)")
        elif self.shared_nodes:
            rule = f"AllReduce from {RING_SIMPLE_FROM >> 20} MiB -> Ring/Simple (across nodes of several ranks)"
        elif self.across:
            rule = (f"AllReduce from {RING_SIMPLE_FROM >> 20} MiB with registered buffers -> Ring/Simple (across "
                    f"nodes)")
        else:
            rule = "the cpu preset's constants only"
        if self.one_channel:
            rule += f", one channel below {RING_ONE_CHANNEL_BELOW >> 20} MiB"
        return f"TUNER/Plugin: Using {self.name}: {rule}"
