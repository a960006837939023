"""Imports only point down: the packages form floors (NCCL's include/ and misc/ at the bottom, then transports,
the device code and the graph code, then the communicator, then the pictures), and no import of ours, at module
level or inside a function, goes from a floor to one that imports it back.  Program entry points (``__main__.py``)
are the top of the stack and may import anything."""
import ast
from pathlib import Path

from conftest import ROOT

# a module's floor: its package, with collectives' two subpackages as floors of their own
FLOORS = ("collectives.device", "collectives.graph", "collectives", "transports", "tracing", "visualize", "misc",
          "include")


def floor_of(module: str) -> str | None:
    return next((f for f in FLOORS if module == f or module.startswith(f + ".")), None)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module of ours that ``path`` imports, wherever the import statement is."""
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found |= {f"{target}.{a.name}" for a in node.names}  # "from pkg import module"
    return {m for m in found if floor_of(m)}


def floor_graph() -> dict[str, dict[str, list[str]]]:
    """floor -> floor it imports -> the modules that do it."""
    graph: dict[str, dict[str, list[str]]] = {f: {} for f in FLOORS}
    for floor in ("collectives", "transports", "tracing", "visualize", "misc", "include"):
        for path in sorted((ROOT / floor).rglob("*.py")):
            if path.name == "__main__.py":
                continue
            here = floor_of(module_name(path))
            for target in imports_of(path):
                there = floor_of(target)
                if there != here:
                    graph[here].setdefault(there, []).append(module_name(path))
    return graph


def cycles(graph: dict) -> list[list[str]]:
    found, seen = [], set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in graph[node]:
            if nxt in path:
                cycle = path[path.index(nxt):] + [nxt]
                key = frozenset(cycle)
                if key not in seen:
                    seen.add(key)
                    found.append(cycle)
            else:
                walk(nxt, path + [nxt])

    for start in graph:
        walk(start, [start])
    return found


def test_no_import_cycle_between_floors():
    graph = floor_graph()
    found = cycles(graph)
    detail = [" -> ".join(c) + ": " + "; ".join(f"{a}->{b} in {sorted(set(graph[a][b]))}" for a, b in zip(c, c[1:]))
              for c in found]
    assert not found, "\n".join(detail)


def test_the_bottom_floors_import_only_below_them():
    graph = floor_graph()
    assert set(graph["tracing"]) == set(), graph["tracing"]
    assert set(graph["misc"]) <= {"tracing"}, graph["misc"]
    assert set(graph["include"]) <= {"tracing", "misc"}, graph["include"]


def test_the_checker_sees_a_cycle():
    assert cycles({"a": {"b": []}, "b": {"a": []}}) and not cycles({"a": {"b": []}, "b": {}})
