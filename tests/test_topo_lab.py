"""The topology search feeding the lab: --topo runs (bitwise, with the searched rings and trees), tune --topo, the
presets' topology files, and the machine picture's content."""
import os
import re
import subprocess
import sys

import pytest

from collectives.graph.connect import channel_lines, rank_lines
from collectives.graph.init_topo import run_topology
from collectives.graph.presets import dgx_a100, dgx_h100
from collectives.graph.topo import GPU, NVS
from collectives.graph.topo_feed import machine
from collectives.graph.topo_xml import StandIns
from conftest import ROOT
from visualize import nccl_tests
from visualize.machine import _key, machine as machine_dot

ENV = {**os.environ, "NCCLLAB_TIMEOUT": "60", "NCCL_SOCKET_IFNAME": "lo"}
NDV5 = ROOT / "topologies" / "azure-ndv5-topo.xml"
NDV4 = ROOT / "topologies" / "azure-ndv4-topo.xml"


def square(tmp_path):
    """4 V100 whose NVLinks form the ring 0-2-1-3 (no NVLink 0-1 or 2-3): PCI order is not a ring."""
    bus = ["0000:11:00.0", "0000:12:00.0", "0000:13:00.0", "0000:14:00.0"]
    peers = {0: (2, 3), 1: (2, 3), 2: (0, 1), 3: (0, 1)}
    gpus = "".join(
        f'<pci busid="{bus[i]}" class="0x030200" link_speed="8.0 GT/s PCIe" link_width="16">'
        f'<gpu dev="{i}" sm="70" rank="{i}" gdr="1">'
        + "".join(f'<nvlink target="{bus[j]}" count="2" tclass="0x030200"/>' for j in peers[i])
        + "</gpu></pci>" for i in range(4))
    xml = (f'<system version="1"><cpu numaid="0" affinity="ff" arch="x86_64" vendor="GenuineIntel" familyid="6" '
           f'modelid="85"><pci busid="0000:10:00.0" class="0x060400" link_speed="8.0 GT/s PCIe" link_width="16">'
           f'{gpus}</pci></cpu></system>')
    path = tmp_path / "square.xml"
    path.write_text(xml)
    return path


def test_square_search_is_not_pci_order(tmp_path):
    r = run_topology(str(square(tmp_path)), stand=StandIns(nics=False))
    assert r.ring.intra[0] in ([0, 2, 1, 3], [0, 3, 1, 2])
    assert r.channels.rings[0] == r.ring.intra[0] and r.channels.search_channels == r.ring.n_channels
    assert r.channels.tree_pattern in ("BALANCED_TREE", "TREE")


@pytest.mark.parametrize("module", ["collectives.ring", "collectives.tree"])
def test_topo_run_is_bitwise_and_uses_the_searched_channels(tmp_path, module):
    """The CPU ranks run exactly the searched rings and trees (their own INFO lines say so), results bitwise."""
    xml = square(tmp_path)
    r = run_topology(str(xml), stand=StandIns(nics=False))
    proc = subprocess.run([sys.executable, "-m", module, "--topo", str(xml), "-b", "4K", "-e", "64K", "-f", "16",
                           "-n", "1", "-w", "0"], env={**ENV, "NCCL_DEBUG": "INFO"}, capture_output=True,
                          text=True, timeout=400, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    t = nccl_tests.parse(proc.stdout)[0]
    assert t.rows and all(row.out_of_place["wrong"] == 0 and row.in_place["wrong"] == 0 for row in t.rows)
    log = proc.stdout + proc.stderr
    got_channels = re.findall(r"NCCL INFO (Channel \d\d/\d\d : [\d ]+)\n", log)
    assert got_channels == channel_lines(r.channels)
    for rank in range(4):
        trees = re.findall(rf"\[{rank}\] NCCL INFO (Trees .*)\n", log)
        assert trees == [rank_lines(r.channels, rank)[-1]]


def test_tune_topo_takes_the_searched_graph():
    r = run_topology(str(NDV5), stand=StandIns(sm=90))
    m = machine(r, "ndv5")
    assert (m.ring.n_channels, m.ring.bw_intra, m.ring.type_intra, m.ring.type_inter) == (12, 30.0, "NVL", "PIX")
    assert (m.tree.n_channels, m.tree.bw_intra, m.max_tree_pattern) == (12, 30.0, 1)
    assert m.comm_channels == 24 and m.min_comp_cap == 90 and m.cpu_vendor == "intel"
    proc = subprocess.run([sys.executable, "-m", "collectives.tools.tune", "--topo", str(NDV5), "--sm", "90", "-b", "1G",
                           "-e", "1G"], env=ENV, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "ring 12 x 30 GB/s, tree 12 x 30 GB/s" in proc.stdout.splitlines()[0]


def test_dgx_presets_are_the_topology_files_searched():
    h, a = dgx_h100(), dgx_a100()
    assert (h.ring.n_channels, h.ring.bw_intra, h.comm_channels) == (12, 30.0, 24)
    assert (a.ring.n_channels, a.ring.bw_intra, a.comm_channels) == (12, 20.0, 24)
    assert "azure-ndv5" in h.sources["graph"] and "azure-ndv4" in a.sources["graph"]


def test_ndv4_ring_order():
    """NDv4's GPUs sit on 4 NUMA nodes out of PCI order; NCCL's ring follows the system's GPU order."""
    r = run_topology(str(NDV4), stand=StandIns(sm=80))
    assert channel_lines(r.channels)[0] == "Channel 00/24 : 0 1 6 7 4 5 2 3"


def test_machine_picture_has_every_link_and_the_searched_bandwidths():
    r = run_topology(str(NDV5), stand=StandIns(sm=90))
    src = machine_dot(r, channel=3)
    nvs = _key(r.system.nodes[NVS][0])
    for gpu in r.system.nodes[GPU]:
        g = _key(gpu)
        assert re.search(rf"\b({g} -> {nvs}|{nvs} -> {g}) \[label=\"NVL 370\.8\"", src), g   # GPU-NVSwitch link
        assert re.search(rf"\b{g} \[label=\"GPU rank {gpu.rank}\n", src)
    ring = r.ring.intra[3]
    for i, rank in enumerate(ring):                     # channel 3's ring, hop by hop, at the searched 30 GB/s
        a = _key(r.system.nodes[GPU][r.system.gpu_by_rank(rank)])
        b = _key(r.system.nodes[GPU][r.system.gpu_by_rank(ring[(i + 1) % len(ring)])])
        assert re.search(rf"\b{a} -> {b} \[[^]]*label=\"ring ch3 30 GB/s\"", src), (a, b)
    assert src.count('label="PCI 48"') == 8 + 8 + 8    # GPU and NIC to their switch, switch to CPU
    assert 'label="SYS 22"' in src


def test_visualize_topo_cli(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "visualize", "topo", str(NDV4), "--sm", "80", "-o",
                           str(tmp_path / "m")], env=ENV, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "m.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "ring ch0 20 GB/s" in (tmp_path / "m.dot").read_text()
