"""The verbs API the IB plugin is written against: pyverbs on real HCAs, or the software provider (a stand-in).

``load()`` returns one namespace with pyverbs' class names (``Context``, ``PD``, ``MR``, ``CQ``, ``QP``,
``QPInitAttr``, ``QPCap``, ``QPAttr``, ``AHAttr``, ``GlobalRoute``, ``GID``, ``SGE``, ``SendWR``, ``RecvWR``) and
its enums as ``e``, so ``transports.net_ib`` runs the same code on both.  ``NCCLLAB_VERBS`` = ``auto`` (pyverbs
when it finds a device, else the software provider), ``pyverbs`` or ``sim``.  NCCL itself dlopens libibverbs
(``src/misc/ibvwrap.cc``); there is no provider of its own.
"""
from __future__ import annotations

import types

from collectives.misc.param import env_str
from tracing import debug

from . import pyverbs_shim

_loaded: dict = {}

# ibv_wc_status_str(): the words libibverbs prints for a completion status
WC_STATUS_STR = {0: "success", 1: "local length error", 2: "local QP operation error", 3: "local EE context "
                 "operation error", 4: "local protection error", 5: "Work Request Flushed Error", 6: "memory "
                 "management operation error", 7: "bad response error", 8: "local access error", 9: "remote "
                 "invalid request error", 10: "remote access error", 11: "remote operation error", 12: "transport "
                 "retry counter exceeded", 13: "RNR retry counter exceeded", 14: "local RDD violation error", 15:
                 "remote invalid RD request", 16: "aborted error", 17: "invalid EE context number", 18: "invalid EE "
                 "context state", 19: "fatal error", 20: "response timeout error", 21: "general error"}
WC_OPCODE_STR = {0: "SEND", 1: "RDMA_WRITE", 2: "RDMA_READ", 128: "RECV", 129: "RECV_RDMA_WITH_IMM"}


class VerbsUnavailable(RuntimeError):
    """NCCLLAB_VERBS asked for something this machine does not have."""


def _namespace(name: str, mods: dict, enums) -> types.SimpleNamespace:
    ns = types.SimpleNamespace(name=name, e=enums)
    for cls in ("Context", "PD", "MR", "CQ", "QP", "QPInitAttr", "QPCap", "QPAttr", "AHAttr", "GlobalRoute", "GID",
                "SGE", "SendWR", "RecvWR"):
        setattr(ns, cls, mods[cls])
    return ns


def load() -> types.SimpleNamespace:
    """The verbs implementation for this process (chosen once), with ``device_names``, the HCAs it sees."""
    if _loaded:
        return _loaded["ns"]
    want = env_str("NCCLLAB_VERBS", "auto").lower()
    if want not in ("auto", "sim", "pyverbs"):
        raise VerbsUnavailable(f"NCCLLAB_VERBS={want!r}: expected auto, sim or pyverbs")
    names = None if want == "sim" else pyverbs_shim.device_names()
    if want == "pyverbs" and not names:
        why = "pyverbs is not installed" if names is None else "pyverbs finds no RDMA device"
        raise VerbsUnavailable(f"NCCLLAB_VERBS=pyverbs but {why}")
    if names:
        ns = _namespace("pyverbs", pyverbs_shim.classes(), pyverbs_shim.enums())
        ns.device_names = names
        debug.info("NET", f"NET/IB : verbs from pyverbs, devices {','.join(names)}")
    else:
        from . import sim
        ns = _namespace("sim", sim.classes(), sim.enums)
        ns.device_names = sim.device_names()
        why = "NCCLLAB_VERBS=sim" if want == "sim" else ("no pyverbs" if names is None else "no RDMA device")
        debug.info("NET", f"NET/IB : verbs from the software provider (stand-in for an HCA; {why})")
    _loaded["ns"] = ns
    return ns


def emulate_nics(names: list[str]) -> None:
    """An emulated node's NICs (its topology's, in net-device order) become the software provider's devices, one
    HCA each; pyverbs' devices are the machine's own and stay as they are."""
    from . import sim
    sim.emulate_nics(names)
    if _loaded and _loaded["ns"].name == "sim":
        _loaded["ns"].device_names = sim.device_names()
