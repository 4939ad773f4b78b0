"""The ground truth's own constructor, copied into a candidate, for a module whose state no
`torch.nn` constructor call rebuilds (docs/inductor.md, "Parameters and buffers"): a bare
`nn.Parameter(torch.randn(...))`, a plain tensor attribute, a cos/sin table a helper method
computes. Run in the same order under the same seed, the same statements draw the same numbers
and compute the same tables."""

from __future__ import annotations

import ast
import builtins

from farm import pyast
from farm.generators.inductor.layers import Unsupported, same_state, tensor_state

# module names a copied constructor may use, with the import that gives the candidate each one
INIT_IMPORTS = {"torch": "import torch", "nn": "import torch.nn as nn", "F": "import torch.nn.functional as F",
                "math": "import math"}
# names a copied helper may not take: the candidate's own (farm.generators.inductor.assemble)
RESERVED = {"ModelNew", "forward", "__init__", "_check", "_reinterpret", "_dev", "_ret", "triton", "tl", "aten"}


def copied_init(cls, model, init_inputs: list, seed: int) -> dict:
    """The ground truth's __init__ body, the methods it calls on self and the module-level
    functions and literal constants those use (transitively; annotations dropped). Accepted
    only if nothing else from its module is used, and if the copy, built here under the seed the
    ground truth was built with, holds every one of its tensors (parameters, buffers, plain
    tensor attributes) bit for bit; else Unsupported says why.

    {"body": ["self.conv = nn.Conv2d(...)", ...], "methods": [source, ...],
     "module": [source, ...], "imports": ["import torch.nn as nn", ...]}"""
    import inspect
    import textwrap

    from farm.runtime.tensors import seed_all

    name = cls.__name__
    try:
        fn = pyast.parse(textwrap.dedent(inspect.getsource(cls.__init__))).body[0]
    except (OSError, TypeError, SyntaxError, IndexError) as exc:
        raise Unsupported(f"{name}.__init__'s source cannot be read to copy it: {exc}") from None
    if not isinstance(fn, ast.FunctionDef) or fn.args.vararg or fn.args.kwarg:
        raise Unsupported(f"{name}.__init__ takes *args/**kwargs: its copy could not name them")
    fn.body = [s for s in fn.body if not _is_docstring(s) and not _is_super_init(s)]
    deps = _Dependencies(cls, getattr(cls.__init__, "__globals__", {}))
    deps.scan(fn)
    body = [line for s in _strip_annotations(fn).body for line in ast.unparse(s).splitlines()]
    copy = {"body": body, "methods": [ast.unparse(m) for m in deps.methods.values()],
            "module": sorted(deps.module.values(), key=lambda text: (text.startswith("def "), text)),
            "imports": [INIT_IMPORTS[m] for m in sorted(deps.imports)]}
    rebuilt_cls = _build_copy(fn, copy)
    seed_all(seed)
    try:
        rebuilt = rebuilt_cls(*init_inputs)
    except Exception as exc:  # noqa: BLE001
        raise Unsupported(f"a copy of {name}.__init__ fails: {type(exc).__name__}: {exc}") from None
    if not same_state(tensor_state(model), tensor_state(rebuilt)):
        raise Unsupported(f"a copy of {name}.__init__ does not hold the ground truth's values (its state is "
                          "not a function of the seed and the constructor's arguments)")
    return copy


class _Dependencies:
    """What a copied constructor needs: methods called on self (from the class, not nn.Module),
    module-level functions and literal constants, and which of torch/nn/F/math it imports."""

    def __init__(self, cls, scope: dict):
        import torch.nn as nn

        self.cls, self.scope = cls, scope
        self.owners = [k for k in cls.__mro__ if k not in (nn.Module, object)]
        self.methods: dict[str, ast.FunctionDef] = {}
        self.module: dict[str, str] = {}
        self.imports: set[str] = set()

    def scan(self, fn: ast.FunctionDef, method: bool = True) -> None:
        bound = {a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs}
        bound |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
        defaults = [ast.Expr(d) for d in fn.args.defaults + fn.args.kw_defaults if d is not None]
        body = ast.Module(body=defaults + _strip_annotations(fn).body, type_ignores=[])
        for node in ast.walk(body):
            if method and isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "self" and isinstance(node.ctx, ast.Load):
                self._method(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in bound:
                self._global(node.id)

    def _method(self, attr: str) -> None:
        import inspect
        import textwrap

        owner = next((k for k in self.owners if attr in vars(k)), None)
        if owner is None or attr in self.methods:
            return  # an attribute the constructor sets, or nn.Module's own (register_buffer, ...)
        value = vars(owner)[attr]
        if not inspect.isfunction(value):
            raise Unsupported(f"{self.cls.__name__}.__init__ uses self.{attr}, a {type(value).__name__}: a copy in "
                              "a candidate could not")
        if attr in RESERVED:
            raise Unsupported(f"{self.cls.__name__}.__init__ calls self.{attr}, a name the candidate has for itself")
        fn = pyast.parse(textwrap.dedent(inspect.getsource(value))).body[0]
        if not isinstance(fn, ast.FunctionDef):  # a lambda: scan() reads a def's arguments
            raise Unsupported(f"{self.cls.__name__}.__init__ calls self.{attr}, which is no plain def: a copy "
                              "could not")
        fn.decorator_list = []
        self.methods[attr] = _strip_annotations(fn)
        self.scan(fn)

    def _global(self, name: str) -> None:
        import inspect
        import textwrap

        if name in self.module or name in self.imports:
            return
        value = self.scope.get(name, getattr(builtins, name, None))
        if name in INIT_IMPORTS and value is _module_of(name):
            self.imports.add(name)
            return
        if name not in self.scope and hasattr(builtins, name):
            return
        if inspect.isfunction(value) and value.__module__ == self.cls.__module__ and name not in RESERVED:
            fn = pyast.parse(textwrap.dedent(inspect.getsource(value))).body[0]
            if not isinstance(fn, ast.FunctionDef):  # a lambda: scan() reads a def's arguments
                raise Unsupported(f"{self.cls.__name__}.__init__ uses {name}, which is no plain def: a copy could not")
            fn.decorator_list = []
            self.module[name] = "PENDING"  # a recursive helper meets itself
            self.scan(fn, method=False)
            self.module[name] = ast.unparse(_strip_annotations(fn))
            return
        text = _constant(value)
        if text is not None and name not in RESERVED:
            self.module[name] = f"{name} = {text}"
            return
        raise Unsupported(f"{self.cls.__name__}.__init__ uses {name} from its module: a copy in a candidate "
                          "could not")


def _module_of(name: str):
    import math

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    return {"torch": torch, "nn": nn, "F": F, "math": math}[name]


def _constant(value) -> str | None:
    """repr(value) for a literal (numbers, strings, None, tuples of them) that round-trips."""
    if value is None or isinstance(value, (bool, int, float, str)) or (
            isinstance(value, tuple) and all(_constant(v) is not None for v in value)):
        text = repr(value)
        try:
            return text if ast.literal_eval(text) == value else None
        except (ValueError, SyntaxError):
            return None
    return None


class _NoAnnotations(ast.NodeTransformer):
    """Annotations name typing and the task's own types, which a candidate does not import."""

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.annotation = None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.returns = None
        self.generic_visit(node)
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign):
        if node.value is None:
            return None
        return ast.copy_location(ast.Assign(targets=[node.target], value=node.value), node)


def _strip_annotations(fn: ast.FunctionDef) -> ast.FunctionDef:
    return ast.fix_missing_locations(_NoAnnotations().visit(fn))


def _build_copy(fn: ast.FunctionDef, copy: dict):
    """A module class whose __init__ and methods are the copy, built as the candidate will build it."""
    import math

    import torch
    import torch.nn as nn

    args = ast.unparse(fn.args)
    lines = [f"class _Copy(nn.Module):\n    def __init__({args}):", "        super().__init__()",
             *(f"        {line}" for line in copy["body"])]
    for method in copy["methods"]:
        lines += [f"    {line}" for line in method.splitlines()]
    source = "\n".join(copy["module"] + lines)
    scope = {"torch": torch, "nn": nn, "F": torch.nn.functional, "math": math}
    exec(compile(source, "<copied __init__>", "exec", dont_inherit=True), scope)  # noqa: S102 - the task's own code
    return scope["_Copy"]


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _is_super_init(stmt: ast.stmt) -> bool:
    """`super().__init__()` or `super(Model, self).__init__()`: the candidate makes its own."""
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    return (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "__init__"
            and isinstance(call.func.value, ast.Call) and isinstance(call.func.value.func, ast.Name)
            and call.func.value.func.id == "super")
