"""The layout is the architecture (docs/architecture.md): each stage of the flow is one package,
a stage imports only the stages below it, and no module imports itself back through others."""

import ast
from pathlib import Path

import pytest

FARM = Path(__file__).resolve().parents[1] / "farm"

# lowest first; a package may import its own modules and any package of a lower rank
RANKS = {
    "errors": 0, "pyast": 0, "paths": 0, "procs": 0,
    "config_checks": 0.5,  # config's checks, apart for its size: errors below, config above
    "config": 1, "masking": 2,
    "targets": 2, "observe": 2,
    "runtime": 3, "storage": 3,
    "corpus": 4,
    "reference": 5,
    "ascend": 6,
    "evaluate": 7,
    "generators": 8,
    "search": 9,
    "distributed": 10,
    "export": 11,
    "report": 12,
    "cli": 13,
    "__main__": 14,
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in FARM.rglob("*.py"):
        parts = path.relative_to(FARM.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(path: Path, name: str) -> set[str]:
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("farm"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.startswith("farm"):
                out.add(module)
                out.update(f"{module}.{a.name}" for a in node.names)
    return out


def _stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_package_has_a_rank():
    stages = {_stage(m) for m in _modules()} - {None, "__init__"}
    assert stages <= set(RANKS), f"rank these in RANKS and docs/architecture.md: {stages - set(RANKS)}"


def test_a_stage_imports_only_lower_stages():
    modules = _modules()
    bad = []
    for name, path in modules.items():
        mine = _stage(name)
        if mine is None:
            continue
        for target in _imports(path, name):
            theirs = _stage(target)
            if theirs is None or theirs == mine or theirs not in RANKS:
                continue
            if RANKS[theirs] >= RANKS[mine]:
                bad.append(f"{name} -> {target}")
    assert not bad, "imports of an equal or higher stage:\n" + "\n".join(sorted(bad))


def test_no_import_cycles_between_modules():
    modules = _modules()
    graph = {name: {t for t in _imports(path, name) if t in modules and t != name}
             for name, path in modules.items()}
    # a package's __init__ importing its own submodules is how it exports them, not a cycle
    for name in graph:
        graph[name] = {t for t in graph[name] if not t.startswith(name + ".")}
    state: dict[str, int] = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(cycles)


@pytest.mark.parametrize("limit", [520])
def test_no_module_is_over_about_500_lines(limit):
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > limit}
    assert not long, f"split along its seams: {long}"
