"""NCCL's topology system: nodes and links (``src/graph/topo.cc``: ``ncclTopoGetSystemFromXml`` and what it calls,
``ncclTopoConnectNodes``, ``ncclTopoConnectCpus``, ``ncclTopoSortSystem``, ``ncclTopoPrint``; ``topo.h``).

Bandwidths are C ``float`` in NCCL and the search compares them after subtracting; every stored bandwidth here is
rounded to float32 (``f32``) so that the same comparisons come out the same.  Node ids print as NCCL's
``TYPE/system-localid``.  Not ported: MLOPart split GPUs (a GPU has exactly one DEV), C2C bridges (CXB), GIN/RMA
devices, multi-host systems; BCM switch flattening and C2C links are ported.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from .topo_xml import TopoError, XmlNode, bus_id_to_int

GPU, PCI, NVS, CPU, NIC, NET, GIN, RMA, DEV, CXB = range(10)
NODE_TYPES = ("GPU", "PCI", "NVS", "CPU", "NIC", "NET", "GIN", "RMA", "DEV", "CXB")
LINK_LOC, LINK_NVL, LINK_C2C, LINK_PCI, LINK_SYS, LINK_NET = 0, 1, 3, 4, 9, 10
LINK_TYPES = ("LOC", "NVL", "", "C2C", "PCI", "", "", "", "", "SYS", "NET")
PATH_LOC, PATH_NVL, PATH_NVB, PATH_C2C, PATH_PIX, PATH_PXB, PATH_P2C, PATH_PXN, PATH_PHB, PATH_SYS, PATH_NET, \
    PATH_DIS = range(12)
PATH_TYPES = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS", "NET", "DIS")

LOC_BW = 5000.0
NCCL_TOPO_MAX_NODES = 640      # src/include/graph.h: nodes of one type in a system
NCCL_TOPO_MAX_LINKS = 576      # src/graph/topo.h: links of one node
ARCH_X86, ARCH_POWER, ARCH_ARM = 1, 2, 3
VENDOR_INTEL, VENDOR_AMD, VENDOR_ZHAOXIN = 1, 2, 3
MODEL_BDW, MODEL_SKL, MODEL_SRP, MODEL_ERP = 1, 2, 3, 4
MODEL_YONGFENG = 1
UNDEF = -1


def f32(x: float) -> float:
    """Round to C float, as NCCL stores every bandwidth."""
    return struct.unpack("f", struct.pack("f", x))[0]


def nvlink_bw(sm: int) -> float:
    """``ncclTopoNVLinkBw``: GB/s per NVLink by compute capability."""
    return f32(40.1 if sm >= 100 else 20.6 if sm >= 90 else 12.0 if sm == 86 else 20.0 if sm >= 80 else
               20.0 if sm >= 70 else 18.0 if sm >= 60 else 20.0)


@dataclass(eq=False)
class Link:
    type: int
    bw: float
    rem: "Node"


@dataclass(eq=False)
class Path:
    """``ncclTopoLinkList``: the links from a node to one target, its bottleneck bandwidth and its type."""
    links: list = field(default_factory=list)
    bw: float = 0.0
    type: int = PATH_DIS

    @property
    def count(self) -> int:
        return len(self.links)


@dataclass(eq=False)
class Node:
    type: int
    id: int
    links: list = field(default_factory=list)
    paths: dict = field(default_factory=dict)   # node type -> [Path per node of that type]
    used: int = 0
    # type-specific fields (ncclTopoNode's union)
    dev: int = UNDEF           # GPU/DEV: NVML index; NET: plugin index
    rank: int = UNDEF          # GPU
    sm: int = UNDEF            # GPU/DEV: cudaCompCap
    gdr: int = 0               # GPU/NET
    parent: "Node | None" = None   # GPU: its DEV
    device: int = 0            # PCI/DEV: vendor/device/subsystem packed
    arch: int = UNDEF          # CPU
    vendor: int = UNDEF
    model: int = UNDEF
    bw: float = 0.0            # NET
    latency: float = 0.0
    port: int = UNDEF
    asic: int = 0
    max_channels: int = 64
    coll: int = 0
    local_gpu: int = UNDEF
    net_name: str = ""          # NET: ours, the <net name=...> the net plugin knows the device by

    def name(self) -> str:
        return f"{NODE_TYPES[self.type]}/{self.id >> 56:x}-{self.id & 0x00ffffffffffffff:x}"


class System:
    """``ncclTopoSystem``: nodes per type, maxBw/totalBw once the search is initialised."""

    def __init__(self) -> None:
        self.nodes: list[list[Node]] = [[] for _ in NODE_TYPES]
        self.max_bw = 0.0
        self.total_bw = 0.0
        self.inter = 0
        self.pxn_routes: list[str] = []   # why each PXN path was made, recorded by paths.compute_paths (ours)

    def get(self, type_: int, id_: int) -> Node | None:
        return next((n for n in self.nodes[type_] if n.id == id_), None)

    def create(self, type_: int, id_: int) -> Node:
        """``ncclTopoCreateNode``: at most NCCL_TOPO_MAX_NODES of a type (src/include/graph.h)."""
        if len(self.nodes[type_]) == NCCL_TOPO_MAX_NODES:
            raise TopoError(f"too many {NODE_TYPES[type_]} nodes (NCCL_TOPO_MAX_NODES {NCCL_TOPO_MAX_NODES}); NCCL "
                            f"fails with 'tried to create too many nodes of type {type_}'")
        node = Node(type_, id_)
        self.nodes[type_].append(node)
        return node

    def index(self, node: Node) -> int:
        return self.nodes[node.type].index(node)

    def remove(self, type_: int, index: int) -> None:
        """``ncclTopoRemoveNode``: drop the node and every link to it."""
        dead = self.nodes[type_].pop(index)
        for nodes in self.nodes:
            for n in nodes:
                n.links = [lk for lk in n.links if lk.rem is not dead]

    def gpu_by_rank(self, rank: int) -> int:
        for i, g in enumerate(self.nodes[GPU]):
            if g.rank == rank:
                return i
        raise TopoError(f"no GPU has rank {rank}")


def connect(node: Node, rem: Node, type_: int, bw: float) -> None:
    """``ncclTopoConnectNodes``: add (or widen) a link, keeping links sorted by bandwidth, descending; a new link
    goes after the ones of equal bandwidth."""
    link = next((lk for lk in node.links if lk.rem is rem and lk.type == type_), None)
    if link is None:
        if len(node.links) == NCCL_TOPO_MAX_LINKS:
            raise TopoError(f"{node.name()}: more than NCCL_TOPO_MAX_LINKS ({NCCL_TOPO_MAX_LINKS}) links "
                            f"(src/graph/topo.h)")
        link = Link(type_, 0.0, rem)
        node.links.append(link)
    link.bw = f32(link.bw + bw)
    node.links.remove(link)
    pos = len(node.links)
    while pos > 0 and node.links[pos - 1].bw < link.bw:
        pos -= 1
    node.links.insert(pos, link)


PCI_CLASS = (("0x060400", PCI), ("0x080100", PCI), ("0x068000", NVS), ("0x068001", CPU), ("0x03", GPU),
             ("0x02", NIC))
PCI_GEN = (("2.5 GT/s", 15), ("5 GT/s", 30), ("8 GT/s", 60), ("16 GT/s", 120), ("32 GT/s", 240),
           ("2.5 GT/s PCIe", 15), ("5.0 GT/s PCIe", 30), ("8.0 GT/s PCIe", 60), ("16.0 GT/s PCIe", 120),
           ("32.0 GT/s PCIe", 240), ("64.0 GT/s PCIe", 480))   # x100 Mb/s per lane; unknown: 60
CPU_ARCH = (("x86_64", ARCH_X86), ("arm64", ARCH_ARM), ("ppc64", ARCH_POWER))
CPU_VENDOR = (("GenuineIntel", VENDOR_INTEL), ("AuthenticAMD", VENDOR_AMD), ("CentaurHauls", VENDOR_ZHAOXIN),
              ("  Shanghai  ", VENDOR_ZHAOXIN))


def _kv(text: str, table, default: int) -> int:
    """``kvConvertToInt``: first entry that is a prefix of ``text`` (NCCL compares strlen(key) characters)."""
    for key, value in table:
        if text.startswith(key):
            return value
    return default


def _int_device(pci: XmlNode) -> int:
    """``ncclTopoGetIntDevice``: vendor, device, subsystem vendor and device packed in 16 bits each."""
    out = 0
    for key, shift in (("vendor", 48), ("device", 32), ("subsystem_vendor", 16), ("subsystem_device", 0)):
        if key in pci.attrs:
            out += pci.attr_int(key) << shift
    return out


def _add_gpu(pci: XmlNode, xgpu: XmlNode, system: System, parent: Node, bus: int, bw: float) -> None:
    """``ncclTopoAddGpuSub`` without MLOPart: one DEV node under the switch, one GPU behind it (LOC link)."""
    dev = system.create(DEV, bus)
    dev.device = _int_device(pci)
    dev.sm = xgpu.attr_int("sm")
    dev.dev = xgpu.attr_int("dev")
    connect(dev, parent, LINK_PCI, bw)
    connect(parent, dev, LINK_PCI, bw)
    gpu = system.create(GPU, bus)
    gpu.rank = xgpu.attr_int("rank")
    gpu.sm = dev.sm
    gpu.dev = dev.dev
    gpu.gdr = xgpu.attr_int("gdr")
    gpu.parent = dev
    connect(dev, gpu, LINK_LOC, LOC_BW)
    connect(gpu, dev, LINK_LOC, LOC_BW)


def _add_nic(xnic: XmlNode, system: System, nic: Node) -> None:
    """``ncclTopoAddNic`` / ``ncclTopoAddNet``: one NET node per ``<net>`` with a dev, linked both ways."""
    for xnet in xnic.subs:
        if xnet.name != "net" or "dev" not in xnet.attrs or not xnet.attr_int("net", 1):
            continue
        dev = xnet.attr_int("dev")
        net = system.create(NET, dev)
        net.dev = dev
        net.net_name = xnet.attrs.get("name", "")
        try:
            net.asic = int(xnet.attrs["guid"], 16) if "guid" in xnet.attrs else dev
        except ValueError:
            raise TopoError(f"{xnet.where()}: attribute guid=\"{xnet.attrs['guid']}\" is not a hex number") from None
        mbps = xnet.attr_int("speed", 0)
        net.bw = f32((mbps if mbps > 0 else 10000) / 8000.0)
        try:
            net.latency = f32(float(xnet.attrs.get("latency", "0")))
        except ValueError:
            raise TopoError(f"{xnet.where()}: attribute latency=\"{xnet.attrs['latency']}\" is not a number") \
                from None
        net.port = xnet.attr_int("port", 0)
        net.gdr = xnet.attr_int("gdr", 0)
        net.max_channels = xnet.attr_int("maxconn", 64)
        net.coll = xnet.attr_int("coll", 0)
        connect(nic, net, LINK_NET, net.bw)
        connect(net, nic, LINK_NET, net.bw)


def _add_pci(xpci: XmlNode, system: System, parent: Node, numa: int) -> None:
    """``ncclTopoAddPci``: switches recurse, GPUs and NICs become leaves; link bw = width x lane speed."""
    type_ = _kv(xpci.attr_str("class"), PCI_CLASS, PCI)
    bus = bus_id_to_int(xpci.attr_str("busid"), xpci)
    width = xpci.attr_int("link_width")
    width = 16 if width == 0 else width
    bw = f32(width * _kv(xpci.attr_str("link_speed"), PCI_GEN, 60) / 80.0)
    for xgpu in xpci.subs:
        if xgpu.name == "gpu":
            if "rank" not in xgpu.attrs:
                return
            _add_gpu(xpci, xgpu, system, parent, bus, bw)
    node = None
    xnic = xpci.sub("nic")
    if xnic is not None:
        nic = system.get(NIC, bus)
        if nic is None:
            nic = node = system.create(NIC, bus)
        _add_nic(xnic, system, nic)
    elif type_ == PCI:
        node = system.create(PCI, bus)
        node.device = _int_device(xpci)
        for sub in xpci.subs:
            if sub.name == "pci":
                _add_pci(sub, system, node, numa)
    if node is not None:
        connect(node, parent, LINK_PCI, bw)
        connect(parent, node, LINK_PCI, bw)


def _add_cpu(xcpu: XmlNode, system: System) -> None:
    """``ncclTopoAddCpu``: arch, vendor and Intel model decide the inter-socket bandwidth later."""
    numa = xcpu.attr_int("numaid")
    cpu = system.create(CPU, numa)
    cpu.arch = _kv(xcpu.attr_str("arch"), CPU_ARCH, 0)
    if cpu.arch == ARCH_X86:
        cpu.vendor = _kv(xcpu.attr_str("vendor"), CPU_VENDOR, 0)
        if cpu.vendor in (VENDOR_INTEL, VENDOR_ZHAOXIN):
            family, model = xcpu.attr_int("familyid"), xcpu.attr_int("modelid")
            if cpu.vendor == VENDOR_INTEL:
                cpu.model = (MODEL_ERP if family == 6 and model >= 0xCF else MODEL_SRP if family == 6 and model >= 0x8F
                             else MODEL_SKL if family == 6 and model >= 0x55 else MODEL_BDW)
            elif family == 7 and model == 0x5B:
                cpu.model = MODEL_YONGFENG
    for sub in xcpu.subs:
        if sub.name == "pci":
            _add_pci(sub, system, cpu, numa)
        elif sub.name == "nic":
            nic = system.get(NIC, 0)  # NCCL_TOPO_ID masks the numa bits of a CPU-attached NIC away
            if nic is None:
                nic = system.create(NIC, 0)
                connect(cpu, nic, LINK_PCI, LOC_BW)
                connect(nic, cpu, LINK_PCI, LOC_BW)
            _add_nic(sub, system, nic)


def find_local_cpu(node: Node, came_from: Node | None = None) -> Node | None:
    """``findLocalCpu``: walk up PCI links through switches to the CPU."""
    if node.type == CPU:
        return node
    for link in node.links:
        if link.type == LINK_PCI and link.rem is not came_from and link.rem.type in (PCI, CPU):
            cpu = find_local_cpu(link.rem, node)
            if cpu is not None:
                return cpu
    return None


def _add_nvlinks(xml: XmlNode, system: System, bus_text: str | None = None) -> None:
    """``ncclTopoAddNvLinks``: GPU-GPU, GPU-CPU (IBM) or GPU-NVSwitch links of count x per-link bandwidth."""
    if xml.name == "nvlink":
        dev = system.get(DEV, bus_id_to_int(bus_text or "", xml.parent))
        if dev is None:
            raise TopoError(f"{xml.where()}: NVLink of a GPU that is not in the system")
        count = xml.attr_int("count")
        target_type = _kv(xml.attr_str("tclass"), PCI_CLASS, PCI)
        bw = f32(count * nvlink_bw(dev.sm))
        if target_type == GPU:
            remote = system.get(DEV, bus_id_to_int(xml.attr_str("target"), xml, "target"))
            if remote is not None:
                connect(dev, remote, LINK_NVL, bw)
            return
        if target_type == CPU:
            remote = find_local_cpu(dev)
        else:
            remote = system.nodes[NVS][0] if system.nodes[NVS] else system.create(NVS, 0)
        if remote is not None:
            connect(dev, remote, LINK_NVL, bw)
            connect(remote, dev, LINK_NVL, bw)
        return
    bus = xml.attrs.get("busid", bus_text)
    for sub in xml.subs:
        _add_nvlinks(sub, system, bus)


def _add_c2c(xml: XmlNode, system: System, bus_text: str | None = None) -> None:
    """``ncclTopoAddC2c``: a Grace-Hopper style chip-to-chip link between a GPU and its CPU (count x bw MB/s)."""
    if xml.name == "c2c":
        dev = system.get(DEV, bus_id_to_int(bus_text or "", xml.parent))
        if dev is None:
            raise TopoError(f"{xml.where()}: C2C link of a GPU that is not in the system")
        bw = f32(xml.attr_int("bw") * xml.attr_int("count") / 1000.0)
        cpu = find_local_cpu(dev)
        if cpu is not None:
            connect(dev, cpu, LINK_C2C, bw)
            connect(cpu, dev, LINK_C2C, bw)
        return
    bus = xml.attrs.get("busid", bus_text)
    for sub in xml.subs:
        _add_c2c(sub, system, bus)


def _add_pci_links(xml: XmlNode, system: System, bus_text: str | None = None) -> None:
    """``ncclTopoAddPciLinks``: explicit ``<pcilink>`` between switches (LOC bandwidth)."""
    if xml.name == "pcilink":
        pci = system.get(PCI, bus_id_to_int(bus_text or "", xml.parent))
        if pci is None:
            raise TopoError(f"{xml.where()}: <pcilink> under {xml.parent.where()}, which is not a PCI switch")
        remote = system.get(PCI, bus_id_to_int(xml.attr_str("target"), xml, "target"))
        if remote is not None:
            connect(pci, remote, LINK_LOC, LOC_BW)
        return
    bus = xml.attrs.get("busid", bus_text)
    for sub in xml.subs:
        _add_pci_links(sub, system, bus)


def _bcm_gen(device: int, level: int) -> int:
    if device & 0xfffffffffffff000 == 0x1000c0101000a000:
        return 4
    if device & 0xfffffffffffff000 == (0x1000c03010000000 | level * 0x1000):
        return 5
    return 0


def flatten_bcm_switches(system: System) -> None:
    """``ncclTopoFlattenBcmSwitches``: a Broadcom Gen4/Gen5 switch's second level is folded into the first."""
    s = 0
    while s < len(system.nodes[PCI]):
        sw = system.nodes[PCI][s]
        gen = _bcm_gen(sw.device, 0)
        if not gen:
            s += 1
            continue
        subs = [lk.rem for lk in sw.links if lk.rem.type == PCI and _bcm_gen(lk.rem.device, 1) == gen]
        sw.links = [lk for lk in sw.links if lk.rem not in subs]
        for sub in subs:
            for lk in sub.links:
                if lk.rem is sw:
                    continue
                sw.links.append(lk)
                back = next(b for b in lk.rem.links if b.rem is sub)
                back.rem = sw
            system.remove(PCI, system.index(sub))
        sw.device |= 0xffff
        s = 0


def inter_cpu_bw(cpu: Node) -> float:
    """``ncclTopoGetInterCpuBw``: QPI/UPI/xGMI bandwidth between sockets."""
    if cpu.arch == ARCH_POWER:
        return 32.0
    if cpu.arch == ARCH_ARM:
        return 6.0
    if cpu.arch == ARCH_X86 and cpu.vendor == VENDOR_INTEL:
        return {MODEL_ERP: 40.0, MODEL_SRP: 22.0, MODEL_SKL: 10.0}.get(cpu.model, 6.0)
    if cpu.arch == ARCH_X86 and cpu.vendor == VENDOR_AMD:
        return 16.0
    if cpu.arch == ARCH_X86 and cpu.vendor == VENDOR_ZHAOXIN:
        return 9.0 if cpu.model == MODEL_YONGFENG else 6.0
    return LOC_BW


def _sort(node: Node, up: Node | None) -> None:
    """``ncclTopoSort``: the link towards the CPU goes last, recursively down the PCI tree."""
    if up is not None:
        i = next(i for i, lk in enumerate(node.links) if lk.rem is up)
        node.links.append(node.links.pop(i))
    for link in list(node.links):
        if link.type == LINK_PCI and link.rem is not up:
            _sort(link.rem, node)


def system_from_xml(xml: XmlNode) -> System:
    """``ncclTopoGetSystemFromXml`` for one host."""
    system = System()
    for sub in xml.subs:
        if sub.name == "cpu":
            _add_cpu(sub, system)
    _add_nvlinks(xml, system)
    _add_c2c(xml, system)
    _add_pci_links(xml, system)
    flatten_bcm_switches(system)
    for a in system.nodes[CPU]:
        for b in system.nodes[CPU]:
            if a is not b:
                connect(a, b, LINK_SYS, inter_cpu_bw(a))
    for cpu in system.nodes[CPU]:
        _sort(cpu, None)
    return system


def _print_rec(node: Node, prev: Node | None, prefix: str, out: list[str]) -> None:
    if node.type == GPU:
        text = f"{node.name()} ({node.rank})"
    elif node.type == CPU:
        text = f"{node.name()} ({node.arch}/{node.vendor}/{node.model})"
    elif node.type in (PCI, DEV):
        text = f"{node.name()} ({node.device:x})"
    else:
        text = node.name()
    out.append(prefix + text)
    pad = " " * len(prefix)
    for link in node.links:
        head = f"{pad}+ {LINK_TYPES[link.type]}[{link.bw:2.1f}] - "
        if link.type == LINK_LOC:
            out.append(f"{pad}+ {LINK_TYPES[link.type]}[{link.bw:2.1f}] - {link.rem.name()}")
        elif link.type != LINK_PCI or link.rem is not prev:
            if link.type == LINK_PCI:
                _print_rec(link.rem, node, head, out)
            elif link.rem.type == NET:
                r = link.rem
                out.append(f"{head}{r.name()} ({r.coll}/{r.asic:x}/{r.port}/{r.bw:f})")
            else:
                out.append(head + link.rem.name())


def print_system(system: System) -> list[str]:
    """``ncclTopoPrint`` (the node tree; ``paths.print_paths`` adds the path lines)."""
    out = [f"=== System : maxBw {system.max_bw:2.1f} totalBw {system.total_bw:2.1f} ==="]
    for cpu in system.nodes[CPU]:
        _print_rec(cpu, None, "", out)
    out.append("==========================================")
    return out
