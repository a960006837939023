"""NCCL's topology search (collectives.graph.topo_xml/topo/paths/search/connect, collectives.tools.topology): the shared
fixtures line for line, and small hand-written machines whose answer follows from NCCL's rules."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from collectives.graph.connect import channel_lines, rank_lines
from collectives.graph.init_topo import run_topology
from collectives.graph.search import BALANCED_TREE, RING, TREE
from collectives.graph.topo import GPU, NET, NVS, PATH_NVB, PATH_NVL, PATH_PHB, PATH_PIX, PATH_PXB, PATH_SYS, f32
from collectives.graph.topo_xml import StandIns, TopoError
from collectives.tools.topology import render
from conftest import FIXTURES, ROOT

TOPO = FIXTURES / "topo"
SKIP_LOADER = ("Loading", "Filled", "NVLink target", "TOPO/NET")  # harness paths and plugin chatter differ


def oracle_lines(name: str) -> list[str]:
    text = (TOPO / name).read_text().splitlines()
    return [line for line in text if " NCCL INFO " in line and not any(s in line for s in SKIP_LOADER)]


def our_lines(xml: Path, **stand) -> list[str]:
    r = run_topology(str(xml), stand=StandIns(**stand))
    return [line for line in render(r) if not line.startswith("#") and not any(s in line for s in SKIP_LOADER)]


FIXTURE_CASES = [("ndv5.oracle.txt", "ndv5-topo.azure.xml", {"sm": 90}),
                 ("dgxh100-like.oracle.txt", "dgxh100-like.xml", {})]


def _required(lines: list[str]) -> list[str]:
    """The lines the issue requires equal: System, Pattern, channel GPU lines, Channel NN/MM, Trees."""
    keep = re.compile(r"NCCL INFO (=== System|Pattern |[ \d]\d : GPU/|Channel \d\d/\d\d :|Trees )")
    return [line for line in lines if keep.search(line)]


@pytest.mark.parametrize("oracle,xml,stand", FIXTURE_CASES)
def test_fixture_required_lines_equal(oracle, xml, stand):
    if not TOPO.exists():
        pytest.skip("shared topology fixtures absent")
    expected = _required(oracle_lines(oracle))
    assert len(expected) > 40
    assert _required(our_lines(TOPO / xml, **stand)) == expected


@pytest.mark.parametrize("oracle,xml,stand", FIXTURE_CASES)
def test_fixture_every_info_line_equal(oracle, xml, stand):
    """Stronger than required: the node tree, every path line, Tree and Ring lines too, in NCCL's order."""
    if not TOPO.exists():
        pytest.skip("shared topology fixtures absent")
    assert our_lines(TOPO / xml, **stand) == oracle_lines(oracle)


# ---------------------------------------------------------------- hand-written machines
CPU = '<cpu numaid="{n}" affinity="ff" arch="x86_64" vendor="{vendor}" familyid="{fam}" modelid="{model}">'
INTEL = dict(vendor="GenuineIntel", fam=6, model=143)       # Sapphire Rapids: inter-socket 22 GB/s
AMD = dict(vendor="AuthenticAMD", fam=23, model=49)


def pci(bus, cls="0x060400", speed="16.0 GT/s PCIe", width=16, inner="", extra=""):
    return f'<pci busid="{bus}" class="{cls}" link_speed="{speed}" link_width="{width}"{extra}>{inner}</pci>'


def gpu(bus, sm=80, nvlinks=(), speed="16.0 GT/s PCIe"):
    links = "".join(f'<nvlink target="{t}" count="{c}" tclass="{cls}"/>' for t, c, cls in nvlinks)
    return pci(bus, "0x030200", speed, inner=f'<gpu dev="0" sm="{sm}" rank="0" gdr="1">{links}</gpu>')


def write(tmp_path, cpus, name="t.xml") -> Path:
    body = "".join(CPU.format(n=i, **kind) + inner + "</cpu>" for i, (kind, inner) in enumerate(cpus))
    path = tmp_path / name
    path.write_text(f'<system version="1">{body}</system>')
    return path


def dgx1(tmp_path) -> Path:
    """The DGX-1 hybrid cube mesh: 8 V100, NVLink 2.0 GPU to GPU (doubled links on the cube edges)."""
    bus = ["0000:06:00.0", "0000:07:00.0", "0000:0a:00.0", "0000:0b:00.0",
           "0000:85:00.0", "0000:86:00.0", "0000:89:00.0", "0000:8a:00.0"]
    mesh = {0: {1: 1, 2: 1, 3: 2, 4: 2}, 1: {0: 1, 2: 2, 3: 1, 5: 2}, 2: {0: 1, 1: 2, 3: 2, 6: 1},
            3: {0: 2, 1: 1, 2: 2, 7: 1}, 4: {0: 2, 5: 1, 6: 1, 7: 2}, 5: {1: 2, 4: 1, 6: 2, 7: 1},
            6: {2: 1, 4: 1, 5: 2, 7: 2}, 7: {3: 1, 4: 2, 5: 1, 6: 2}}

    def g(i):
        return gpu(bus[i], 70, [(bus[j], c, "0x030200") for j, c in mesh[i].items()], "8.0 GT/s PCIe")

    def sw(b, pair):
        return pci(b, speed="8.0 GT/s PCIe", inner=g(pair[0]) + g(pair[1]))
    return write(tmp_path, [(INTEL | {"model": 79}, sw("0000:03:00.0", (0, 1)) + sw("0000:08:00.0", (2, 3))),
                            (INTEL | {"model": 79}, sw("0000:83:00.0", (4, 5)) + sw("0000:88:00.0", (6, 7)))])


def test_dgx1_cube_mesh_ring_is_ncclS(tmp_path):
    """NCCL's well-known DGX-1 rings: PCI order is not a ring over NVLink, the search finds 0 3 2 1 5 6 7 4."""
    r = run_topology(str(dgx1(tmp_path)), stand=StandIns(nics=False))
    assert r.ring.pattern == RING and r.ring.type_intra == PATH_NVL
    assert r.ring.intra[0] == [0, 3, 2, 1, 5, 6, 7, 4]
    assert r.ring.n_channels * r.ring.bw_intra <= 6 * 20.0          # 6 NVLink ports of 20 GB/s per V100
    assert channel_lines(r.channels)[0] == "Channel 00/12 : 0 3 2 1 5 6 7 4"
    for order in r.ring.channels():                                   # every hop of every ring is an NVLink
        for i, a in enumerate(order):
            b = order[(i + 1) % 8]
            ga, gb = (r.system.gpu_by_rank(x) for x in (a, b))
            assert r.system.nodes[GPU][ga].paths[GPU][gb].type == PATH_NVL


def test_nvswitch_box_channels_and_bandwidth(tmp_path):
    """12 NVLinks of 20 GB/s to a switch (A100): 6 rings of 40 GB/s fill 240 GB/s; Dup doubles them to 12 x 20."""
    busids = [f"0000:{0x10 + 0x10 * i:02x}:00.0" for i in range(4)]
    sw = pci("0000:01:00.0", inner="".join(pci(b, "0x030200") for b in busids))
    r = run_topology(str(write(tmp_path, [(AMD, sw)])), stand=StandIns(sm=80, nvlinks=12))
    assert r.system.max_bw == r.system.total_bw == 240.0
    assert len(r.system.nodes[NVS]) == 1
    assert (r.ring.n_channels, r.ring.bw_intra, r.tree.n_channels, r.tree.bw_intra) == (12, 20.0, 12, 20.0)
    assert r.channels.n == 24 and r.tree.pattern == BALANCED_TREE
    assert r.ring.intra[0] == [0, 1, 2, 3]


def test_pcie_box_goes_through_the_cpus(tmp_path):
    """No NVLink: GPUs on one switch are PIX, across switches of one CPU PHB, across CPUs SYS; one ring."""
    def sw(base):
        return pci(f"0000:{base:02x}:00.0", inner=gpu(f"0000:{base + 1:02x}:00.0", 89) +
                   gpu(f"0000:{base + 2:02x}:00.0", 89))
    xml = write(tmp_path, [(AMD, sw(0x10) + sw(0x30)), (AMD, sw(0x90) + sw(0xb0))])
    r = run_topology(str(xml), stand=StandIns(nvlinks=0, nics=False))
    paths = r.system.nodes[GPU][0].paths[GPU]
    assert [p.type for p in paths[1:]] == [PATH_PIX, PATH_PHB, PATH_PHB, PATH_SYS, PATH_SYS, PATH_SYS, PATH_SYS]
    assert r.ring.type_intra == PATH_SYS and r.ring.n_channels == 1
    assert r.ring.bw_intra == 15.0                   # AMD xGMI 16 GB/s, the next speed below it
    assert not r.system.nodes[NET]


def test_two_level_switch_is_pxb_and_nvb_needs_a_relay(tmp_path):
    """PXB across two switch levels; NVB when two GPUs only meet through a third GPU's NVLinks."""
    b = ["0000:21:00.0", "0000:22:00.0", "0000:41:00.0"]
    nvl = "0x030200"
    g0 = gpu(b[0], 80, [(b[1], 4, nvl)])
    g1 = gpu(b[1], 80, [(b[0], 4, nvl), (b[2], 4, nvl)])
    g2 = gpu(b[2], 80, [(b[1], 4, nvl)])
    inner = pci("0000:20:00.0", inner=g0 + g1) + pci("0000:40:00.0", inner=g2)
    xml = write(tmp_path, [(INTEL, pci("0000:10:00.0", inner=inner))])
    r = run_topology(str(xml), stand=StandIns(nics=False))
    p = r.system.nodes[GPU][0].paths[GPU]
    assert p[1].type == PATH_NVL and p[2].type == PATH_NVB
    assert p[2].bw == f32(4 * 20.0)
    r2 = run_topology(str(xml), stand=StandIns(nics=False), nvls=False)
    assert r2.ring.type_intra <= PATH_NVB


def test_pxb_without_nvlink(tmp_path):
    inner = pci("0000:20:00.0", inner=gpu("0000:21:00.0")) + pci("0000:40:00.0", inner=gpu("0000:41:00.0"))
    xml = write(tmp_path, [(INTEL, pci("0000:10:00.0", inner=inner))])
    r = run_topology(str(xml), stand=StandIns(nvlinks=0, nics=False))
    assert r.system.nodes[GPU][0].paths[GPU][1].type == PATH_PXB


def test_fusion_puts_other_ranks_gpus_after_the_nics(tmp_path):
    """ncclTopoFuseXml: rank 0's XML keeps its GPU in place, the others are appended after each switch's NICs,
    which is the order ncclTopoPrint shows."""
    sw = pci("0000:10:00.0", inner=pci("0000:11:00.0", "0x030200") + pci("0000:12:00.0", "0x020700") +
             pci("0000:13:00.0", "0x030200"))
    r = run_topology(str(write(tmp_path, [(INTEL, sw)])), stand=StandIns(sm=90))
    tree = [line.strip() for line in r.system_lines]
    kids = [t.split(" - ")[1].split()[0] for t in tree if t.startswith("+ PCI[") and "CPU" not in t]
    assert kids[1:] == ["DEV/0-11000", "NIC/0-12000", "DEV/0-13000"]


def test_nranks_trims_gpus_and_no_nics(tmp_path):
    busids = [f"0000:{0x10 + 0x10 * i:02x}:00.0" for i in range(4)]
    sw = pci("0000:01:00.0", inner="".join(pci(b, "0x030200") for b in busids) + pci("0000:90:00.0", "0x020700"))
    xml = write(tmp_path, [(INTEL, sw)])
    r = run_topology(str(xml), nranks=2, stand=StandIns(sm=90, nics=False))
    assert len(r.system.nodes[GPU]) == 2 and not r.system.nodes[NET]
    r = run_topology(str(xml), stand=StandIns(sm=90))
    assert len(r.system.nodes[GPU]) == 4 and len(r.system.nodes[NET]) == 1
    assert r.stand_in_notes  # the output says what stood in for NVML and the net plugin


def test_single_gpu_is_a_tree_of_one(tmp_path):
    r = run_topology(str(write(tmp_path, [(INTEL, gpu("0000:11:00.0", 90))])), stand=StandIns(nics=False))
    assert r.tree.pattern == TREE and r.system.max_bw == 5000.0
    assert rank_lines(r.channels, 0)[-1].startswith("Trees [0] -1/-1/-1->0->-1")


def test_tree_chains_follow_the_tree_graph_on_dgx1(tmp_path):
    """Each rank's Trees line is connectTrees over the TREE graph's chain (not the ring's)."""
    r = run_topology(str(dgx1(tmp_path)), stand=StandIns(nics=False))
    line = rank_lines(r.channels, 0)[-1]
    chain = r.tree.intra[0]
    assert line.startswith(f"Trees [0] {chain[1]}/-1/-1->0->-1")    # BALANCED_TREE: rank 0 heads chain 0


# ---------------------------------------------------------------- bad input names the element and attribute
@pytest.mark.parametrize("body,needle", [
    ('<system version="2"></system>', 'version="2"'),
    ('<system version="1"><cpu arch="x86_64"><pci busid="0000:10:00.0" class="0x030200" '
     'link_speed="16.0 GT/s PCIe" link_width="16"><gpu sm="90"/></pci></cpu></system>', "'numaid'"),
    ('<system version="1"><cpu numaid="0" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="1">'
     '<pci busid="0000:10:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="x16">'
     '<gpu sm="90"/></pci></cpu></system>', 'link_width="x16"'),
    ('<system version="1"><cpu numaid="0" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="1">'
     '<pci busid="zz:10:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">'
     '<gpu sm="90"/></pci></cpu></system>', 'busid="zz:10:00.0"'),
    ('<system version="1"><cpu numaid="0" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="1">'
     '<pci busid="0000:10:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16"/></cpu></system>',
     "--sm"),
    ('<system version="1"><cpu', "not well-formed"),
])
def test_errors_name_element_and_attribute(tmp_path, body, needle):
    path = tmp_path / "bad.xml"
    path.write_text(body)
    with pytest.raises(TopoError) as e:
        run_topology(str(path), stand=StandIns(nics=False))
    assert needle in str(e.value)


def test_cli_bad_input_is_one_line_and_nonzero(tmp_path):
    path = tmp_path / "bad.xml"
    path.write_text('<system version="1"><cpu numaid="0" arch="x86_64" vendor="AuthenticAMD"><pci '
                    'busid="0000:10:00.0" class="0x030200" link_speed="16.0 GT/s PCIe"><gpu sm="90"/></pci></cpu>'
                    '</system>')
    proc = subprocess.run([sys.executable, "-m", "collectives.tools.topology", str(path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "link_width" in proc.stderr and "Traceback" not in proc.stderr


def test_trees_line_fills_ncclS_1024_byte_buffer():
    """initTransportsRank writes the entries into char line[1024] (1022 characters at most) after 'Trees'."""
    from collectives.graph.trees import connect_trees, trees_log_line
    t0, t1 = connect_trees([list(range(16))], "BALANCED_TREE")
    line = trees_log_line(5, [t0, t1] * 32)
    assert line.startswith("Trees [0] 6/-1/-1->5->4 [1] 6/-1/-1->5->4") and len(line) == len("Trees") + 1022
    assert trees_log_line(5, [t0]) == "Trees [0] 6/-1/-1->5->4"
