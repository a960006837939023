"""Read back what a DOT picture claims, through the real Graphviz: ``dot -Tdot_json`` (as written) or ``-Tjson``
(after layout, with positions).  Tests check nodes, edges, labels and clusters from this, not the DOT text."""
from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field


@dataclass
class Graph:
    label: str
    nodes: dict = field(default_factory=dict)      # name -> attributes
    edges: list = field(default_factory=list)      # (tail, head, attributes)
    clusters: dict = field(default_factory=dict)   # name -> {"label": str, "nodes": set of names}

    def edge_set(self) -> set:
        return {(t, h) for t, h, _ in self.edges}

    def labelled(self, tail: str, head: str) -> list[str]:
        return [a.get("label", "") for t, h, a in self.edges if (t, h) == (tail, head)]

    def pos(self, name: str) -> tuple[float, float]:
        x, y = self.nodes[name]["pos"].split(",")
        return float(x), float(y)


def parse(source: str, layout: bool = False) -> Graph:
    doc = json.loads(subprocess.run(["dot", "-Tjson" if layout else "-Tdot_json"], input=source,
                                    capture_output=True, text=True, check=True, timeout=120).stdout)
    objects = doc.get("objects", [])
    nsub = doc.get("_subgraph_cnt", 0)
    names = {o["_gvid"]: o["name"] for o in objects[nsub:]}
    g = Graph(doc.get("label", ""))
    for o in objects[nsub:]:
        g.nodes[o["name"]] = o
    for o in objects[:nsub]:
        if o["name"].startswith("cluster"):
            g.clusters[o["name"]] = {"label": o.get("label", ""), "nodes": {names[i] for i in o.get("nodes", [])}}
    for e in doc.get("edges", []):
        g.edges.append((names[e["tail"]], names[e["head"]], e))
    return g
