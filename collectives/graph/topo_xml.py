"""NCCL's topology XML (``src/graph/xml.cc``, ``xml.h``; the XML steps of ``ncclTopoGetSystem`` in ``topo.cc``).

``load_xml`` reads a file as ``ncclTopoGetXmlFromFile`` does (``<system version="1">``, cpu/pci/gpu/nvlink/nic/net/
pcilink/c2c nodes, attribute order kept).  ``rank_xml`` is one rank's view before fusion: its own GPU filled in and
marked ``keep`` (``ncclTopoFillGpu``), every NIC the net plugin reports filled and marked (``ncclTopoPopulateNics``),
the rest trimmed (``ncclTopoTrimXml``).  ``fused_xml`` fuses the ranks' views in rank order (``ncclTopoFuseXml``),
which is why on a bare file every GPU but rank 0's lands after its switch's NICs.

Stand-ins (NCCL asks NVML and the net plugin; we cannot): a GPU without a ``<gpu>`` child gets ``--sm`` and, when
it has no ``<nvlink>``, ``--nvlinks`` links to a hidden NVSwitch (NCCL's default is its per-SM maximum); every PCI
node of class ``0x02xxxx`` is one IB NIC (400 Gb/s, GPUDirect RDMA).  Not ported: sysfs/NVML discovery, NIC
fusion into virtual NICs (``ncclTopoMakeVNics``), MNNVL cliques.

Limits are NCCL's parser's (``xmlLoadSub``; ``NCCL_TOPO_XML_MAX_NODES`` of ``topo.h``, ``MAX_STR_LEN``,
``MAX_ATTR_COUNT``, ``MAX_SUBS`` of ``xml.h``), checked while expat streams the file, so ten thousand GPUs are
refused at the 256th node.  On purpose unlike NCCL: a file larger than those limits can hold (``MAX_XML_BYTES``)
is refused unread, and a DOCTYPE is refused (NCCL's parser has none; its entities could expand without bound).
"""
from __future__ import annotations

import os
import xml.parsers.expat as expat
from dataclasses import dataclass, field

NVSWITCH_CLASS = "0x068000"
HIDDEN_NVSWITCH = "fffffff:ffff:ff"
GPU_DEVICE_BY_SM = {70: "0x1db1", 80: "0x20b2", 90: "0x2330", 100: "0x2901"}


class TopoError(ValueError):
    """A topology file NCCL would reject; the message names the element and attribute."""


@dataclass(eq=False)
class XmlNode:
    name: str
    attrs: dict = field(default_factory=dict)
    subs: list = field(default_factory=list)
    parent: "XmlNode | None" = None

    def get(self, key: str, default=None):
        return self.attrs.get(key, default)

    def where(self) -> str:
        """How an error names this node: tag plus its identifying attribute."""
        for key in ("busid", "name", "numaid", "target", "dev"):
            if key in self.attrs:
                return f"<{self.name} {key}=\"{self.attrs[key]}\">"
        return f"<{self.name}>"

    def attr_str(self, key: str) -> str:
        if key not in self.attrs:
            raise TopoError(f"{self.where()}: missing attribute '{key}'")
        return self.attrs[key]

    def attr_int(self, key: str, default: int | None = None) -> int:
        if key not in self.attrs:
            if default is not None:
                return default
            raise TopoError(f"{self.where()}: missing attribute '{key}'")
        text = self.attrs[key].strip()
        try:
            return int(text, 0) if text.lower().startswith(("0x", "-0x")) else int(text)
        except ValueError:
            raise TopoError(f"{self.where()}: attribute {key}=\"{text}\" is not an integer") from None

    def sub(self, name: str) -> "XmlNode | None":
        return next((s for s in self.subs if s.name == name), None)

    def add(self, tag: str, **attrs) -> "XmlNode":
        node = XmlNode(tag, {k: str(v) for k, v in attrs.items()}, [], self)
        self.subs.append(node)
        return node

    def walk(self):
        yield self
        for s in self.subs:
            yield from s.walk()

    def copy(self, parent: "XmlNode | None" = None) -> "XmlNode":
        node = XmlNode(self.name, dict(self.attrs), [], parent)
        node.subs = [s.copy(node) for s in self.subs]
        return node


KNOWN = {"system": {"cpu"}, "cpu": {"pci", "nic"}, "pci": {"pci", "gpu", "nic", "pcilink"},
         "gpu": {"nvlink", "c2c"}, "nic": {"net"}, "net": set(), "nvlink": set(), "pcilink": set(), "c2c": set(),
         "graphs": {"graph"}, "graph": {"channel"}, "channel": {"net", "gpu"}}   # the last three: NCCL_GRAPH_FILE

# NCCL's parser limits.  src/graph/topo.h: a topology file is read into NCCL_TOPO_XML_MAX_NODES nodes, and the
# parser fails on the next node once they are used (xml.cc xmlLoadSub: "XML parser is limited to %d nodes");
# src/graph/xml.h: MAX_STR_LEN names and values (253 characters with the quote and the NUL), MAX_ATTR_COUNT
# attributes kept per node (the rest are read and ignored), MAX_SUBS children per node.
NCCL_TOPO_XML_MAX_NODES = 256
NCCL_GRAPH_XML_MAX_NODES = 4096   # src/graph/topo.h, for graph files (graph_xml.py)
MAX_STR_LEN = 255
MAX_ATTR_COUNT = 16
MAX_SUBS = 640
# The largest file those limits let hold: every node with a 253-character name and 16 attributes of 253-character
# keys and values, plus its closing tag, about 2.2 MB; twice that is allowed for comments and indentation.
# (On purpose unlike NCCL, which would read any amount of comment or whitespace: a file past this is refused
# before it is read, so a huge file costs neither time nor memory.)
MAX_XML_BYTES = 2 * NCCL_TOPO_XML_MAX_NODES * (2 + 253 + MAX_ATTR_COUNT * (1 + 253 + 2 + 253 + 1) + 2 + 253 + 3)


def load_xml(path: str, root: str = "system") -> XmlNode:
    """``ncclTopoGetXmlFromFile`` + ``ncclTopoXmlLoadSystem``: the ``<system>`` tree, version checked.  Streamed
    through expat in 64 KiB pieces; NCCL's limits (above) are checked as nodes arrive, so a file of ten thousand
    GPUs is refused at its 256th node.  ``root="graphs"``: a graph file (``ncclTopoGetXmlGraphFromFile``), whose
    version the caller checks."""
    max_nodes = NCCL_TOPO_XML_MAX_NODES if root == "system" else NCCL_GRAPH_XML_MAX_NODES
    try:
        size = os.stat(path).st_size
        if size > MAX_XML_BYTES:
            raise TopoError(f"{path}: {size / 2**20:.1f} MiB, more than a topology NCCL can read holds "
                            f"({MAX_XML_BYTES / 2**20:.1f} MiB: NCCL_TOPO_XML_MAX_NODES {NCCL_TOPO_XML_MAX_NODES} "
                            f"nodes of MAX_ATTR_COUNT {MAX_ATTR_COUNT} attributes of MAX_STR_LEN {MAX_STR_LEN})")
        f = open(path, "rb")
    except OSError as e:
        raise TopoError(f"{path}: cannot read ({e.strerror})") from None
    stack: list[XmlNode | None] = []   # the open elements; None for one NCCL's loader skips (and its subtree)
    top: list[XmlNode] = []
    count = 0

    def start(tag: str, attrs: dict) -> None:
        nonlocal count
        parent = stack[-1] if stack else None
        known = tag == root if not stack else parent is not None and tag in KNOWN.get(parent.name, ())
        if not stack and not known:
            raise TopoError(f"{path}: top element is <{tag}>, expected <{root}>")
        if not known:                  # NCCL's loader skips tags it has no handler for
            stack.append(None)
            return
        count += 1
        if count >= max_nodes:
            raise TopoError(f"{path}: more than {max_nodes - 1} nodes; NCCL's XML parser is limited "
                            f"to {max_nodes} (NCCL_TOPO_XML_MAX_NODES, src/graph/topo.h)")
        if len(tag) > MAX_STR_LEN - 2 or any(len(k) > MAX_STR_LEN - 2 or len(v) > MAX_STR_LEN - 2
                                             for k, v in attrs.items()):
            raise TopoError(f"{path}: <{tag[:40]}>: a name or value longer than NCCL reads (MAX_STR_LEN "
                            f"{MAX_STR_LEN}, src/graph/xml.h)")
        node = XmlNode(tag, dict(list(attrs.items())[:MAX_ATTR_COUNT]), [], parent)
        if parent is not None:
            if len(parent.subs) == MAX_SUBS:
                raise TopoError(f"{parent.where()}: more than {MAX_SUBS} children (MAX_SUBS, src/graph/xml.h)")
            parent.subs.append(node)
        else:
            top.append(node)
        stack.append(node)

    def doctype(*_) -> None:           # NCCL's parser has no DOCTYPE (and entities could expand without bound)
        raise TopoError(f"{path}: a DOCTYPE declaration; NCCL's topology files have none")

    parser = expat.ParserCreate()
    parser.StartElementHandler = start
    parser.EndElementHandler = lambda tag: stack.pop()
    parser.StartDoctypeDeclHandler = doctype
    parser.EntityDeclHandler = doctype
    try:
        with f:
            read = 0
            while True:
                chunk = f.read(1 << 16)
                read += len(chunk)
                if read > MAX_XML_BYTES:   # not a regular file (a pipe): the same bound, while reading
                    raise TopoError(f"{path}: more than {MAX_XML_BYTES / 2**20:.1f} MiB (the most a topology "
                                    f"NCCL can read holds)")
                parser.Parse(chunk, not chunk)
                if not chunk:
                    break
    except expat.ExpatError as e:
        raise TopoError(f"{path}: not well-formed XML ({e})") from None
    except OSError as e:
        raise TopoError(f"{path}: cannot read ({e.strerror})") from None
    system = top[0]
    if root != "system":
        return system
    version = system.attr_int("version")
    if version != 1:
        raise TopoError(f"<system>: attribute version=\"{version}\" is not 1 (NCCL's XML topology version)")
    return system


def bus_id_to_int(text: str, node: XmlNode | None = None, attr: str = "busid") -> int:
    """``busIdToInt64``: the hex digits of a PCI id, separators skipped ("0000:18:00.0" -> 0x18000)."""
    digits = "".join(c for c in text if c not in ":.")
    try:
        return int(digits, 16)
    except ValueError:
        where = node.where() if node is not None else "<?>"
        raise TopoError(f"{where}: attribute {attr}=\"{text}\" is not a PCI bus id") from None


@dataclass(frozen=True)
class StandIns:
    """What a real run would get from NVML and the net plugin (see the module docstring)."""
    sm: int | None = None
    nvlinks: int | None = None
    nics: bool = True
    nic_speed: int = 400000     # Mbps the stand-in plugin reports per NIC (NDR; 200000 for HDR)


def max_nvlinks(sm: int) -> int:
    """``ncclTopoGetXmlFromGpu``: the NVLinks NVML is asked about, per compute capability."""
    return 0 if sm < 60 else 4 if sm < 70 else 6 if sm < 80 else 12 if sm < 90 else 18


def _is_gpu_pci(node: XmlNode) -> bool:
    return node.name == "pci" and (node.sub("gpu") is not None or node.get("class", "").startswith("0x03"))


def _is_nic_pci(node: XmlNode) -> bool:
    return node.name == "pci" and node.sub("gpu") is None and (
        node.get("class", "").startswith("0x02") or node.sub("nic") is not None)


def gpu_pcis(system: XmlNode) -> list[XmlNode]:
    """The GPUs of the file in PCI bus order: CUDA's device order, so GPU i becomes dev i and rank i."""
    pcis = [n for n in system.walk() if _is_gpu_pci(n)]
    for p in pcis:
        p.attr_str("busid")
    return sorted(pcis, key=lambda p: bus_id_to_int(p.attrs["busid"], p))


def fill_gpu(pci: XmlNode, rank: int, stand: StandIns, log: list[str], first_rank: int = 0) -> XmlNode:
    """``ncclTopoFillGpu`` for one rank's GPU: complete the ``<gpu>`` node and mark it ``keep``.  ``rank`` is the
    local rank (the CUDA device); the communicator rank is ``first_rank + rank`` (node-major clusters)."""
    gpu = pci.sub("gpu")
    if gpu is None:
        pci.attrs.setdefault("class", "0x03")
        gpu = pci.add("gpu")
    if "sm" not in gpu.attrs:
        if stand.sm is None:
            raise TopoError(f"{pci.where()}: the GPU has no 'sm' attribute (NCCL reads it from the driver); "
                            f"give it with --sm, e.g. --sm 90")
        gpu.attrs["sm"] = str(stand.sm)
    sm = gpu.attr_int("sm")
    if "vendor" not in pci.attrs:
        pci.attrs.update(vendor="0x10de", device=GPU_DEVICE_BY_SM.get(sm, "0x0000"), subsystem_vendor="0x0",
                         subsystem_device="0x0")
    gpu.attrs.setdefault("dev", str(rank))
    gpu.attrs["rank"] = str(first_rank + rank)
    gpu.attrs.setdefault("gdr", "1")
    gpu.attrs["mlopart"] = "-1"
    gpu.attrs["keep"] = "1"
    if gpu.sub("nvlink") is None:
        count = stand.nvlinks if stand.nvlinks is not None else max_nvlinks(sm)
        if count > 0:
            gpu.add("nvlink", target=HIDDEN_NVSWITCH, count=count, tclass=NVSWITCH_CLASS)
            log.append(f"NVLink target {HIDDEN_NVSWITCH} not visible, assuming NVSwitch")
    for link in gpu.subs:
        if link.name == "nvlink":
            link.attr_int("count")
            link.attrs.setdefault("tclass", NVSWITCH_CLASS)
    return gpu


def fill_nics(system: XmlNode, stand: StandIns, log: list[str]) -> None:
    """``ncclTopoPopulateNics`` with the stand-in plugin: one IB device per NIC PCI node, numbered in PCI bus
    order (as mlx5_N follows PCI enumeration)."""
    if not stand.nics:
        return
    n = 0
    pcis = [p for p in system.walk() if _is_nic_pci(p)]
    for pci in sorted(pcis, key=lambda p: bus_id_to_int(p.attr_str("busid"), p)):
        nic = pci.sub("nic") or pci.add("nic")
        nets = [s for s in nic.subs if s.name == "net"] or [nic.add("net", name=f"mlx5_{n}")]
        for net in nets:
            net.attrs.setdefault("name", f"mlx5_{n}")
            net.attrs["keep"] = "1"
            net.attrs["dev"] = str(n)
            for key, value in (("latency", "0"), ("speed", str(stand.nic_speed)), ("port", "1"),
                               ("guid", hex(0x1000 + n)), ("maxconn", "65536"), ("gdr", "1")):
                net.attrs.setdefault(key, value)
            net.attrs["net"] = "1"
            log.append(f"ncclTopoPopulateNics : Filled {net.attrs['name']} in topo with busid {pci.get('busid')}")
            n += 1


def trim_xml(node: XmlNode) -> int:
    """``ncclTopoTrimXml``: drop pci/cpu/nic/net branches holding nothing marked ``keep``."""
    if node.attrs.get("keep") == "1":
        del node.attrs["keep"]
        return 1
    keep = sum(trim_xml(s) for s in list(node.subs))
    if keep == 0 and node.name in ("pci", "cpu", "nic", "net") and node.parent is not None:
        node.parent.subs.remove(node)
    return keep


def _same(a: XmlNode, b: XmlNode) -> bool:
    return a.name == b.name and a.attrs == b.attrs


def fuse_xml(dst: XmlNode | None, src: XmlNode) -> XmlNode:
    """``ncclTopoFuseXml``: add every node of ``src`` that ``dst`` lacks (same tag and attributes), in place."""
    if dst is None:
        return src.copy()

    def rec(d: XmlNode, s: XmlNode) -> None:
        for child in s.subs:
            match = next((x for x in d.subs if _same(x, child)), None)
            if match is None:
                d.subs.append(child.copy(d))
            else:
                rec(match, child)
    rec(dst, src)
    return dst


def rank_xml(system: XmlNode, rank: int, stand: StandIns, log: list[str], first_rank: int = 0) -> XmlNode:
    """One rank's XML before fusion: file + its GPU + the plugin's NICs, trimmed."""
    mine = system.copy()
    pcis = gpu_pcis(mine)
    fill_gpu(pcis[rank], rank, stand, log, first_rank)
    fill_nics(mine, stand, log)
    trim_xml(mine)
    return mine


def fused_xml(system: XmlNode, nranks: int, stand: StandIns, log: list[str] | None = None,
              first_rank: int = 0) -> XmlNode:
    """What ``ncclTopoGetSystem`` hands to ``ncclTopoGetSystemFromXml`` on one node of ``nranks`` ranks: only
    this node's ranks (``first_rank`` ...) are fused, as NCCL fuses the ranks of one host hash."""
    log = [] if log is None else log
    ngpus = len(gpu_pcis(system))
    if ngpus == 0:
        raise TopoError("<system>: no GPU found (a <pci> with class 0x03xxxx or a <gpu> child)")
    if nranks < 1 or nranks > ngpus:
        raise TopoError(f"--nranks {nranks}: the file has {ngpus} GPUs")
    fused = None
    for r in range(nranks):
        fused = fuse_xml(fused, rank_xml(system, r, stand, log if r == 0 else [], first_rank))
    return fused


def dump_xml(node: XmlNode, indent: int = 0) -> str:
    """``ncclTopoDumpXmlToFile``'s layout, for NCCL_TOPO_DUMP_FILE-like output."""
    attrs = "".join(f' {k}="{v}"' for k, v in node.attrs.items())
    pad = "  " * indent
    if not node.subs:
        return f"{pad}<{node.name}{attrs}/>\n"
    inner = "".join(dump_xml(s, indent + 1) for s in node.subs)
    return f"{pad}<{node.name}{attrs}>\n{inner}{pad}</{node.name}>\n"
