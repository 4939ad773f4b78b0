"""One candidate over the recorded cases of an op's shape space, from per-case captures.

Inductor compiles for one shape (`dynamic=False`): its kernels hold sizes, grids and strides
as constants. The evaluator verifies a candidate at every recorded case of the op's shape
space (docs/evaluator.md, "The cases of the shape space"), so farm.generators.inductor.capture
compiles the ground truth again at each case's inputs (capture["cases"]), and this module joins
the assembled modules (farm.generators.inductor.assemble) into one: the benchmark case's
kernels and `ModelNew`, each case's kernels that differ from those under a `c<i>_` prefix, its
forward as `ModelNew._forward_<i>`, and a `forward` that picks the one compiled for the inputs'
shapes, strides and dtypes (a shape no case has is refused, as before). The dispatch follows
the recorded cases only: a size between them has no kernels (docs/inductor.md).
"""

from __future__ import annotations

import ast

from farm import pyast
from farm.generators.inductor.assemble import assemble
from farm.generators.inductor.backward import _Prefix
from farm.generators.inductor.layers import Unsupported

_PER_CASE = ("wrapper", "launches", "inputs", "graph_inputs", "outputs", "n_results")

_KEY_FN = '''
def _input_key(*args):
    """What a case's kernels were compiled for: each tensor input's shape, strides and dtype."""
    return tuple((tuple(a.shape), tuple(a.stride()), str(a.dtype)) if isinstance(a, torch.Tensor) else repr(a)
                 for a in args)
'''


def assemble_cases(cap: dict, target: str | None = None) -> str:
    """The candidate for a capture with per-case captures; plain assemble() without them."""
    bench = assemble(cap, target)
    if not cap.get("cases"):
        return bench
    tree = pyast.parse(bench)
    model = _model_class(tree)
    forward = _method(model, "forward")
    params = [a.arg for a in forward.args.args[1:]]
    forward.name = "_forward_0"
    known = {name: ast.unparse(n) for n in tree.body if (name := _defined(n))}
    keys = [(_key_literal(cap["inputs"]), "benchmark case", "_forward_0")]
    extra: list[ast.stmt] = []
    for i, sub in enumerate(cap["cases"], start=1):
        body, method = _case_module(cap, sub, target, i, known)
        if [a.arg for a in method.args.args[1:]] != params:
            raise Unsupported(f"the forward at the {sub['case'].get('label')} case takes other arguments")
        extra += body
        model.body.append(method)
        keys.append((_key_literal(sub["inputs"]), _describe(sub["case"]), method.name))
    model.body.append(_dispatcher(params, keys))
    at = next(i for i, n in enumerate(tree.body) if n is model)
    tree.body[at:at] = [*pyast.parse(_KEY_FN).body, *extra]
    doc = tree.body[0]
    if isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str):
        doc.value.value = doc.value.value.replace(
            "Shape-specialized: correct only for the captured input shapes",
            f"Dispatches on its inputs: kernels compiled at each of {len(keys)} recorded cases of the shape space\n"
            "(one torch.compile per case, dynamic=False); correct only for those input shapes")
    source = ast.unparse(ast.fix_missing_locations(tree)) + "\n"
    pyast.parse(source)
    return source


def _case_module(cap: dict, sub: dict, target: str | None, index: int,
                 known: dict[str, str]) -> tuple[list[ast.stmt], ast.FunctionDef]:
    """(module-level statements the benchmark module lacks, renamed `c<i>_`; the case's forward)."""
    one = {**cap, **{k: sub[k] for k in _PER_CASE}}
    one.pop("cases", None)
    try:
        tree = pyast.parse(assemble(one, target))
    except Unsupported as exc:
        raise Unsupported(f"at the {_describe(sub['case'])}: {exc}") from None
    top = [(name, n) for n in tree.body if (name := _defined(n)) and name != "ModelNew"]
    differ = {name for name, n in top if known.get(name) != ast.unparse(n)}
    while True:  # a definition that uses a renamed one is renamed too
        more = {name for name, n in top if name not in differ and _uses(n) & differ}
        if not more:
            break
        differ |= more
    renamer = _Prefix(differ, f"c{index}_")
    body = [renamer.visit(n) for name, n in top if name in differ]
    method = renamer.visit(_method(_model_class(tree), "forward"))
    method.name = f"_forward_{index}"
    return body, method


def _dispatcher(params: list[str], keys: list[tuple[str, str, str]]) -> ast.FunctionDef:
    args = ", ".join(params)
    doc = "; ".join(f"{method}: {label}" for _, label, method in keys)
    lines = [f"def forward(self, {args}):", f"    {doc!r}", f"    _key = _input_key({args})"]
    for literal, _, method in keys:
        lines += [f"    if _key == {literal}:", f"        return self.{method}({args})"]
    lines.append(f"    raise AssertionError(f'compiled for the inputs of {len(keys)} recorded cases, got {{_key}}')")
    fn = pyast.parse("\n".join(lines)).body[0]
    assert isinstance(fn, ast.FunctionDef)  # the text above is one
    return fn


def _key_literal(inputs: list[dict]) -> str:
    parts = [repr((tuple(d["shape"]), tuple(d["stride"]), d["dtype"])) if d["tensor"] else repr(d["value"])
             for d in inputs]
    return f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"


def _describe(case: dict) -> str:
    values = ", ".join(f"{k}={v}" for k, v in sorted((case.get("values") or {}).items()))
    return f"{case.get('label', 'case')} case ({values}{', dtype=' + case['dtype'] if case.get('dtype') else ''})"


def _defined(node: ast.stmt) -> str | None:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    return None


def _uses(node: ast.stmt) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _model_class(tree: ast.Module) -> ast.ClassDef:
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew")


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)
