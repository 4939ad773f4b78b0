"""No behaviour keyed on a target's name outside its own module (issue 36, item 3).

The farm asks a target what it can do (farm.targets.base: capabilities and hooks) instead of
comparing its name, so a target from another package gets every behaviour a built-in one gets.
This test reads every module under farm/ and fails on a string literal equal to a built-in
target's name, alias or torch device type that is compared (==, !=, in, not in, is), tested
with startswith/endswith, or used as the key of a dict literal (a table keyed by target),
anywhere but in that target's own module(s). A literal that is no target (a torch device type
of a tensor, a name inside source code being ported) is allowed below, each with why.
"""

import ast
from pathlib import Path

from farm.targets import builtin_targets

ROOT = Path(__file__).resolve().parents[1]
FARM = ROOT / "farm"

# each built-in target's own modules (a folder: every module under it)
OWN = {
    "cuda": ("farm/targets/cuda.py",),
    "cpu": ("farm/targets/builtin.py",),
    "ascend": ("farm/ascend/",),
    "npu": ("farm/ascend/",),  # the Ascend target's torch device type and alias
}

# (module, literal) -> why that comparison is not about a target
ALLOWED = {
    ("farm/corpus/inputs.py", "cpu"): "a tensor's torch device type: task inputs must be CPU tensors",
    ("farm/reference/drawn.py", "cpu"): "a torch device type: the host has no device memory to ask torch about",
    ("farm/export/package.py", "cpu"): "the torch device AOT launches are recorded on: the host runs the interpreter",
    ("farm/export/package_runtime.py", "cpu"): "the exported package's runtime, which imports nothing of the "
                                               "farm: a tensor's torch device type",
    ("farm/ascend/lint/rules.py", "cuda"): "CUDA APIs in kernel source being linted (`.cuda()`, the cuda rule set)",
    ("farm/ascend/port/passes.py", "cuda"): "CUDA device strings and `.cuda()` in source being ported to Ascend",
    ("farm/cli/app.py", "ascend"): "the `farm ascend` command group, Ascend's own CLI (farm/cli/ascend_cmd.py)",
}


def _names() -> set[str]:
    names = set()
    for t in builtin_targets():
        names |= {t.name, t.torch_device, *t.aliases}
    return names


def _literals(node: ast.AST) -> list[str]:
    """String constants of a node, or of a tuple/list/set of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def _keyed(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, literal) of every comparison, prefix test or dict key that is a string literal."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                found += [(node.lineno, s) for s in _literals(operand)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("startswith", "endswith"):
            for arg in node.args:
                found += [(node.lineno, s) for s in _literals(arg)]
        elif isinstance(node, ast.Dict):
            found += [(k.lineno, k.value) for k in node.keys
                      if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    return found


def _own(module: str, name: str) -> bool:
    return any(module == p or (p.endswith("/") and module.startswith(p)) for p in OWN.get(name, ()))


def test_every_builtin_target_name_has_its_own_modules():
    assert _names() == set(OWN), "list the new target's own modules in OWN"


def test_no_target_name_is_compared_outside_its_own_module():
    names = _names()
    bad, used = [], set()
    for path in sorted(FARM.rglob("*.py")):
        module = path.relative_to(ROOT).as_posix()
        for line, literal in _keyed(ast.parse(path.read_text(), str(path))):
            if literal not in names or _own(module, literal):
                continue
            if (module, literal) in ALLOWED:
                used.add((module, literal))
                continue
            bad.append(f"{module}:{line}: '{literal}' (ask the target: farm/targets/base.py)")
    assert not bad, "behaviour keyed on a target's name:\n" + "\n".join(bad)
    assert not set(ALLOWED) - used, f"allowed but no longer there: {sorted(set(ALLOWED) - used)}"
