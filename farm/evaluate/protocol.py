"""The messages between the evaluator and a runner, typed on both sides of the trust line.

A command is a dataclass: the evaluator builds it (a wrong or missing field fails there, not
in the runner), pickles it (the runner trusts the evaluator) and the runner calls the method
of the same name with its fields. A reply crosses back as plain data (farm.evaluate.wire) and
is parsed here into the reply type its command names: every field checked for its type and
bounds, texts cut, counts non-negative, tensors only where tensors belong. Whatever does not
parse is the runner's `cheat`, never an exception in the evaluator.

Replies read as attributes; `reply["x"]` and `reply.get("x")` read the same fields, so that
code (and tests that script a runner) may treat a reply like the mapping it arrives as.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

TEXT = 20_000  # characters of a runner's error text kept (farm.evaluate.evaluator cuts further)
MAX_SAMPLES = 100_000
MAX_KEYS = 64


class BadReply(Exception):
    """A reply that does not have its type's shape."""


# ---------------------------------------------------------------- replies

_R = TypeVar("_R", bound="Reply")


@dataclass
class Reply:
    ok: ClassVar[bool] = True

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name, default) if name in self._names() or name == "ok" else default

    def __getitem__(self, name: str) -> Any:
        if name != "ok" and name not in self._names():
            raise KeyError(name)
        return getattr(self, name)

    def keys(self) -> list[str]:  # `{**reply}`: its fields, as the mapping it arrived as
        return sorted(self._names())

    def __contains__(self, name: str) -> bool:
        return name == "ok" or (name in self._names() and getattr(self, name) is not None)

    @classmethod
    def _names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    @classmethod
    def parse(cls: type[_R], tree: dict) -> _R:
        """The reply from the plain data a runner sent: each field checked (BadReply if not)."""
        values = {}
        for f in fields(cls):
            if f.name in tree:
                check = _OUTPUTS.get(cls.__name__) if f.name == "outputs" else _FIELD_CHECK.get(f.name)
                values[f.name] = (check or _CHECK[str(f.type)])(tree[f.name], f.name)  # annotations are text
        return cls(**values)


@dataclass
class Failure(Reply):
    ok: ClassVar[bool] = False
    kind: str = "runtime_error"
    error: str = ""
    restart: bool = False  # the runner found itself tampered with and has exited


@dataclass
class Started(Reply):
    device: dict = field(default_factory=dict)


@dataclass
class Done(Reply):
    error: str = ""  # warm: the garbage forward's error, reported and never judged


@dataclass
class Launches(Reply):
    """What the runner says it launched: evidence, never the decision."""

    launches: int = 0
    kernels: list = field(default_factory=list)
    side_stream: bool = False
    foreign_thread: bool = False


@dataclass
class RunResult(Launches):
    outputs: list | None = None
    mutated_inputs: list = field(default_factory=list)
    threads_alive: int = 0
    ghost_error: str = ""


@dataclass
class BackwardResult(Reply):
    launches_forward: int = 0
    launches_backward: int = 0
    kernels_backward: list = field(default_factory=list)
    grad_inputs: list | None = None
    grad_params: dict | None = None
    ghost_error: str = ""


@dataclass
class TimeResult(Launches):
    stats: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)
    min_calls: int = 0


@dataclass
class RoundResult(Launches):
    samples: list = field(default_factory=list)
    captured: bool = False
    outputs: dict | None = None
    swap_check: str | None = None
    capture_error: str = ""
    detail: str = ""
    wall_ms: float | None = None  # the evaluator's clock around the round (farm.evaluate.timer), not the runner's


@dataclass
class FloorResult(Reply):
    limits: dict | None = None


# ---------------------------------------------------------------- commands


@dataclass
class Command:
    """A command names the runner method it calls; its fields are that method's arguments."""

    reply: ClassVar[type[Reply]] = Done
    carries_outputs: ClassVar[int] = 0  # output sets a reply may hold (sizes its frame)

    @property
    def verb(self) -> str:
        """The runner method this command calls."""
        return _NAMES[type(self)]

    def arguments(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class LoadSource(Command):
    source: str
    init_inputs: list
    name: str = "candidate"


@dataclass
class LoadTask(Command):
    path: str
    source: str
    shapes: str
    which: str
    init_inputs: list
    policy: Any = None
    slot: str | None = None
    reference: str | None = None


@dataclass
class PutInputs(Command):
    key: str
    inputs: list
    output_nbytes: list | None = None


@dataclass
class Run(Command):
    reply: ClassVar[type] = RunResult
    carries_outputs: ClassVar[int] = 1
    key: str
    inplace_args: tuple = ()
    poison: bool = True
    ghost: bool = False


@dataclass
class RunBackward(Command):
    reply: ClassVar[type] = BackwardResult
    carries_outputs: ClassVar[int] = 4  # input and parameter gradients
    key: str
    indices: list
    grad_outputs: list
    ghost: bool = False


@dataclass
class Time(Command):
    reply: ClassVar[type] = TimeResult
    keys: list
    options: dict = field(default_factory=dict)
    probe_keys: tuple = ()
    inplace_args: tuple = ()

    @property
    def output_sets(self) -> int:
        return len(self.keys) + len(self.probe_keys)


@dataclass
class TimeRound(Command):
    reply: ClassVar[type] = RoundResult
    slot: str | None
    keys: list
    mode: str
    reps: int
    calls: int = 0
    inplace_args: tuple = ()
    flush: str = "write"
    outputs: bool = False
    swap_key: str | None = None

    @property
    def output_sets(self) -> int:
        return (len(self.keys) + 1) if self.outputs else 0


@dataclass
class DeviceLimits(Command):
    reply: ClassVar[type] = FloorResult


@dataclass
class Unload(Command):
    pass


@dataclass
class Warm(Command):
    key: str


@dataclass
class Exit(Command):
    pass


_NAMES: dict[type[Command], str] = {LoadSource: "load_source", LoadTask: "load_task", PutInputs: "put_inputs", Run: "run",
          RunBackward: "run_backward", Time: "time", TimeRound: "time_round", DeviceLimits: "device_limits",
          Unload: "unload", Warm: "warm", Exit: "exit"}
COMMANDS = {name: cls for cls, name in _NAMES.items()}


def command(verb: str, /, **args: Any) -> Command:
    """The command `verb` with these fields (a misspelt or missing field raises TypeError here)."""
    try:
        cls = COMMANDS[verb]
    except KeyError:
        raise TypeError(f"no runner command {verb!r}") from None
    return cls(**args)


def parse_reply(cmd: Command | None, tree: Any) -> Reply:
    """The typed reply to `cmd`, or Failure(kind="cheat") saying what was wrong with it."""
    try:
        if not isinstance(tree, dict):
            raise BadReply(f"a {type(tree).__name__} instead of a mapping")
        if tree.get("ok") is not True:
            failure = Failure.parse(tree)
            if failure.kind not in KINDS:
                raise BadReply(f"an unknown verdict kind {failure.kind[:40]!r}")
            return failure
        if isinstance(cmd, Exit):
            return Done()
        return (Started if cmd is None else cmd.reply).parse(tree)
    except BadReply as exc:
        return Failure(kind="cheat", error=f"the runner's reply to {getattr(cmd, 'verb', 'start')} is not of its "
                                           f"type: {exc}")


def reply_for(verb: str, tree: dict) -> Reply:
    """`tree` parsed as the reply to a `verb` command (scripted runners in tests use it)."""
    cls = COMMANDS[verb]
    return parse_reply(cls.__new__(cls), tree)


KINDS = ("compile_error", "runtime_error", "timeout", "crash", "mismatch", "cheat")


# ---------------------------------------------------------------- field checks


def _bool(v, name):
    if not isinstance(v, bool):
        raise BadReply(f"{name} is not a bool")
    return v


def _count(v, name):
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise BadReply(f"{name} is not a count")
    return v


def _text(v, name):
    if not isinstance(v, str):
        raise BadReply(f"{name} is not text")
    return v[:TEXT]


def _opt_text(v, name):
    return None if v is None else _text(v, name)


def _opt_number(v, name):
    if v is None:
        return None
    return _number(v, name)


def _number(v, name):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadReply(f"{name} is not a number")
    return float(v)


def _texts(v, name):
    if not isinstance(v, list) or len(v) > 10_000:
        raise BadReply(f"{name} is not a list of names")
    return [_text(x, name)[:200] for x in v]


def _counts(v, name):
    if not isinstance(v, list) or len(v) > 10_000:
        raise BadReply(f"{name} is not a list of counts")
    return [_count(x, name) for x in v]


def _samples(v, name):
    if not isinstance(v, list) or len(v) > MAX_SAMPLES:
        raise BadReply(f"{name} is not a list of times")
    out = [_number(x, name) for x in v]
    if any(not math.isfinite(x) or x < 0 for x in out):
        raise BadReply(f"{name} holds a time that is negative or not finite")
    return out


def _values(v, name, depth: int = 0):
    """Outputs: tensors, plain values and lists of them (the wire has already checked tensors)."""
    import torch

    if depth > 8:
        raise BadReply(f"{name} is nested too deeply")
    if isinstance(v, torch.Tensor) or v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, list):
        return [_values(x, name, depth + 1) for x in v]
    raise BadReply(f"{name} holds a {type(v).__name__}")


def _opt_values(v, name):
    if v is None:
        return None
    if not isinstance(v, list):
        raise BadReply(f"{name} is not a list of outputs")
    return _values(v, name)


def _outputs_by_key(v, name):
    if v is None:
        return None
    if not isinstance(v, dict) or len(v) > MAX_KEYS:
        raise BadReply(f"{name} is not a mapping of input sets to outputs")
    return {_text(k, name)[:100]: _opt_values(x, name) for k, x in v.items()}


def _grads(v, name):
    if v is None:
        return None
    if not isinstance(v, dict):
        raise BadReply(f"{name} is not a mapping of parameters to gradients")
    return {_text(k, name)[:200]: _values(x, name) for k, x in v.items()}


def _plain(v, name, depth: int = 0):
    """Stats and device facts: numbers, texts, bools, None, and lists or mappings of them."""
    if depth > 4:
        raise BadReply(f"{name} is nested too deeply")
    if v is None or isinstance(v, (bool, int, float, str)):
        return v[:TEXT] if isinstance(v, str) else v
    if isinstance(v, list) and len(v) <= MAX_SAMPLES:
        return [_plain(x, name, depth + 1) for x in v]
    if isinstance(v, dict) and len(v) <= 1000:
        return {_text(k, name)[:200]: _plain(x, name, depth + 1) for k, x in v.items()}
    raise BadReply(f"{name} holds something that is not plain data")


def _mapping(v, name):
    if not isinstance(v, dict):
        raise BadReply(f"{name} is not a mapping")
    return _plain(v, name)


def _opt_mapping(v, name):
    return None if v is None else _mapping(v, name)


_CHECK = {"bool": _bool, "int": _count, "str": _text, "str | None": _opt_text, "float | None": _opt_number,
          "list": _texts, "dict": _mapping, "dict | None": _opt_mapping, "list | None": _opt_values}
# fields whose generic annotation says less than what they hold
_FIELD_CHECK = {"kernels": _texts, "kernels_backward": _texts, "mutated_inputs": _counts, "samples": _samples,
                "grad_inputs": _opt_values, "grad_params": _grads, "stats": _mapping, "device": _mapping,
                "limits": _opt_mapping}
_OUTPUTS = {"RunResult": _opt_values, "TimeResult": _outputs_by_key, "RoundResult": _outputs_by_key}
