"""The module stack holds (docs/design.md, "The module stack"): no import cycles, imports
inside functions included, and no private name imported from another module. Read from
the source with ``ast``, so the check is the code, not a list kept by hand."""

import ast
import pathlib

import simlib

ROOT = pathlib.Path(simlib.__file__).resolve().parent


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _parents(target: str, importer: str) -> set[str]:
    """The packages whose ``__init__`` runs first when ``target`` is imported (below the
    root, whose ``__init__`` imports nothing), except the importer's own."""
    parts = target.split(".")
    return {p for p in (".".join(parts[:i]) for i in range(2, len(parts)))
            if p != importer and not importer.startswith(p + ".")}


def _imports(modules):
    """``({module: {imported module}}, [(module, source, private name)])``."""
    edges, private = {m: set() for m in modules}, []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                if not source.startswith("simlib"):
                    continue
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    target = sub if sub in modules else source
                    if target != name:
                        edges[name].add(target)
                    edges[name].update(_parents(target, name))
                    if (target == source and alias.name.startswith("_")
                            and not alias.name.startswith("__")):
                        private.append((name, source, alias.name))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("simlib") and alias.name != name:
                        edges[name].add(alias.name)
                        edges[name].update(_parents(alias.name, name))
    return edges, private


def _cycles(edges):
    """Strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on, groups, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in list(edges):
        if v not in index:
            visit(v)
    return groups


def test_no_import_cycles():
    edges, _ = _imports(_modules())
    assert _cycles(edges) == []


def test_no_private_name_is_imported_across_modules():
    _, private = _imports(_modules())
    assert private == []


def test_the_checks_see_a_cycle_and_a_private_import(tmp_path):
    """The two checks above can fail: a planted cycle and private import are found."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [["a", "b", "c"]]
    modules = _modules()
    _, private = _imports({**modules, "simlib._planted": _planted(tmp_path)})
    assert ("simlib._planted", "simlib._solve", "_hidden") in private


def _planted(tmp_path):
    path = tmp_path / "_planted.py"
    path.write_text("from ._solve import _hidden\n")
    return path
