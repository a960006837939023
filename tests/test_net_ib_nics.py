"""Over NCCL_NET=IB on the software verbs provider, a topology's NICs are the provider's devices (one HCA each,
named as the XML names them), and every ring/tree channel's NET connection opens on the device NCCL's
``ncclTopoGetNetDev`` chose for it (``src/transport/net.cc`` ``sendSetup``/``recvSetup``): the communicator's
``via NET/IB/<dev>`` lines name the same devices as ``collectives.tools.topology --nodes K``'s."""
import os
import re
import subprocess
import sys

import pytest

from collectives.graph.init_cluster import cluster_connections, run_cluster
from collectives.graph.nets import nic_names
from collectives.graph.topo import NET
from collectives.graph.topo_xml import StandIns
from conftest import ROOT
from visualize import nccl_tests

ENV = {**os.environ, "NCCLLAB_TIMEOUT": "90", "NCCL_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "INFO",
       "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_NET": "IB", "NCCLLAB_VERBS": "sim"}
TOPOS = ROOT / "topologies"
# the NET lines' pair, direction and device; the offline tool's /GDRDMA is dropped (the CPU lab has no GDR)
NET_LINE = re.compile(r"(Channel \d\d/0 : \d+\[\d+\] -> \d+\[\d+\] \[(?:send|receive)\] via NET/IB/\d+)")


def net_conns(lines) -> list[str]:
    return sorted(m.group(1) for line in lines if (m := NET_LINE.search(line)))


def test_provider_lists_the_topologys_nics(monkeypatch):
    """One provider device per NIC of the node, in net-device order; without a topology the one ``sim_ib0``."""
    from transports.verbs.sim import device
    assert device.device_names() == ["sim_ib0"]
    r = run_cluster(str(TOPOS / "azure-ndv5-topo.xml"), 1, 2, StandIns(sm=90))
    names = nic_names(r.nodes[0].system)
    assert names == [f"mlx5_{i}" for i in range(8)]
    monkeypatch.setattr(device, "DEVICE_NAMES", list(device.DEVICE_NAMES))
    device.emulate_nics(names)
    assert device.device_names() == names
    assert device.Context(name="mlx5_3").hca is not device.Context(name="mlx5_4").hca


@pytest.mark.parametrize("xml,sm", [("azure-ndv5-topo.xml", "90"), ("azure-ndv4-topo.xml", "80")])
def test_channels_open_on_the_searchs_nics(xml, sm):
    """4 ranks on 2 emulated nodes over NET/IB: bitwise, the provider has the XML's NIC count, and every NET
    connection line (ring and tree) names the device the offline tool's line names."""
    path = TOPOS / xml
    proc = subprocess.run([sys.executable, "-m", "collectives.ring", "-g", "4", "--nodes", "2", "--topo", str(path),
                           "--sm", sm, "-b", "4K", "-e", "64K", "-f", "16", "-n", "1", "-w", "0"],
                          env=ENV, capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    t = nccl_tests.parse(proc.stdout)[0]
    assert t.rows and all(r.out_of_place["wrong"] == 0 and r.in_place["wrong"] == 0 for r in t.rows)
    log = proc.stdout + proc.stderr
    c = run_cluster(str(path), 2, 2, StandIns(sm=int(sm)))
    want = net_conns(line for lines in cluster_connections(c) for line in lines)
    assert len({w.rsplit('/', 1)[1] for w in want}) > 1     # the search spreads the channels over NICs
    assert net_conns(log.splitlines()) == want
    nics = len(c.nodes[0].system.nodes[NET])
    using = re.findall(r"NET/IB : Using((?: \[\d+\]\S+:1/IB)+) ;", log)
    assert len(using) == 4 and set(using) == {"".join(f" [{i}]mlx5_{i}:1/IB" for i in range(nics))}
