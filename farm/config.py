"""Settings: one dataclass tree, one precedence rule.

    command-line option > environment (FARM_*, standard AWS_*) > config file > built-in default

The config file is `--config`, else `$FARM_CONFIG`, else `configs/farm.yaml` of the current
directory or of the checkout, else the copy an installed package carries (farm/bundled/). Every
effective value remembers where it came from, so `farm config show` can say it; secrets are
masked there.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from farm.config_checks import check_value, check_variables, coerce, did_you_mean
from farm.errors import ConfigError
from farm.paths import default_config_files, shipped_tasks

DEFAULT_STORE = "file://~/.farm/store"


def _meta(help: str, env: str | None = None, secret: bool = False, ge: float | None = None, gt: float | None = None,
          le: float | None = None, option: str | None = None, folder: bool = False) -> dict:
    """A setting's help, the standard variable that also feeds it, whether it is a secret, its
    range (at least ge, more than gt, at most le: farm.config_checks), the command option that
    sets it, and whether it names a folder."""
    rng = (ge, gt, le) if (ge, gt, le) != (None, None, None) else None
    return {"help": help, "env": env, "secret": secret, "range": rng, "option": option, "folder": folder}


class _Section:
    """A settings section checks its fields' declared ranges when built in code too (load_settings
    checks each value first, naming where it came from)."""

    def __post_init__(self) -> None:
        name = _SECTIONS.get(type(self).__name__, "")
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            check_value(getattr(self, f.name), f.metadata.get("range"), f"{name}{f.name}")


@dataclass
class CorpusSettings(_Section):
    tasks_dir: str = field(
        default="",
        metadata=_meta("folder holding one sub-folder per source (default: the checkout's tasks/, else the "
                       "copy an installed package carries)", folder=True),
    )
    sources: dict[str, str] = field(
        default_factory=dict,
        metadata=_meta("extra sources, name: folder of KernelBench-style task files"),
    )
    shapes: dict[str, dict[str, Any]] = field(
        default_factory=dict,
        metadata=_meta("small shapes outside the files: '<source>' or '<source>/<op>': {CONSTANT: value}"),
    )
    small_budget_mb: float = field(
        default=4.0,
        metadata=_meta("derived small shapes: inputs + parameters + outputs at most this (MiB)", gt=0),
    )
    small_budget_mflop: float = field(
        default=1.0,
        metadata=_meta("derived small shapes: matmul/conv work of one forward at most this (MFLOP; soft)", gt=0),
    )
    memory_limit_mb: float = field(
        default=0.0,
        metadata=_meta("stop a task whose inputs, parameters and outputs exceed this (MiB, measured on the meta "
                       "device before allocating); 0: half of the memory available", ge=0),
    )
    space_max: int = field(default=16384, metadata=_meta("a derived shape space's dimensions reach at most this", ge=1))
    small_space_max: int = field(default=64, metadata=_meta("the same at small shapes (the interpreter runs cases)",
                                                            ge=1))
    akg_root: str = field(
        default="",
        metadata=_meta("an AKG checkout: its sglang, vllm/triton_ops, vllm/torch_ops folders become the "
                       "sources sglang, vllm_triton, vllm_torch (replacing the bundled ones)", folder=True),
    )


@dataclass
class S3Settings(_Section):
    endpoint_url: str | None = field(
        default=None,
        metadata=_meta("S3-compatible endpoint (MinIO, Ceph RGW, ...)", env="AWS_ENDPOINT_URL"),
    )
    region: str | None = field(default=None, metadata=_meta("S3 region", env="AWS_DEFAULT_REGION"))
    access_key_id: str | None = field(
        default=None, metadata=_meta("access key", env="AWS_ACCESS_KEY_ID", secret=True)
    )
    secret_access_key: str | None = field(
        default=None, metadata=_meta("secret key", env="AWS_SECRET_ACCESS_KEY", secret=True)
    )
    addressing_style: str = field(
        default="path", metadata=_meta("'path' (S3-compatible servers) or 'virtual' (AWS)")
    )
    max_attempts: int = field(default=8, metadata=_meta("attempts per request (standard retry mode)", ge=1))
    multipart_threshold_mb: int = field(default=64, metadata=_meta("objects larger than this are sent in parts", ge=1))
    multipart_chunksize_mb: int = field(default=64, metadata=_meta("size of one part", ge=1))
    connect_timeout_s: float = field(default=10.0, metadata=_meta("connection timeout", gt=0))
    read_timeout_s: float = field(default=60.0, metadata=_meta("read timeout", gt=0))

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.addressing_style not in ("path", "virtual"):
            raise ConfigError(f"s3.addressing_style must be 'path' or 'virtual', not {self.addressing_style!r}")


SEED_MAX = 2**32 - 1  # the widest range every generator a task may seed takes (numpy's)


@dataclass
class ReferenceSettings(_Section):
    seed: int = field(default=0, metadata=_meta("seed for get_init_inputs/get_inputs", ge=0, le=SEED_MAX,
                                                option="--seed"))
    # a child starts in seconds (torch's import alone): a shorter limit fails every op
    timeout_s: float = field(default=600.0, metadata=_meta("limit per op, in its own process", ge=1, option="--timeout"))
    seed_sets: int = field(default=4, metadata=_meta("secret input sets per reference-data-mode op (task-format.md)",
                                                     ge=1))
    cases: int = field(default=-1, metadata=_meta("cases of the shape space recorded beside each .pt; -1: 6, 2 on cpu",
                                                  ge=-1))
    jobs: int = field(default=1, metadata=_meta(
        "ops whose reference data is made at once on one device; 0: 1 on cpu, else a quarter of the cores, at most 4",
        ge=0, option="--jobs"))
    ship_max_mb: float = field(default=256.0, metadata=_meta("a set over this many MiB is kept compact (-1: never)",
                                                             ge=-1))


@dataclass
class CheckSettings(_Section):
    timeout_s: float = field(default=300.0, metadata=_meta("limit per op for `farm ops check`", ge=1,
                                                           option="--timeout"))


@dataclass
class LLMSettings(_Section):
    base_url: str | None = field(
        default=None,
        metadata=_meta("OpenAI-compatible API root, e.g. http://localhost:8000/v1", env="OPENAI_BASE_URL"),
    )
    model: str = field(default="", metadata=_meta("model name the endpoint serves"))
    api_key: str | None = field(
        default=None, metadata=_meta("API key, sent as a Bearer token", env="OPENAI_API_KEY", secret=True)
    )
    temperature: float = field(default=0.7, metadata=_meta("sampling temperature (OpenAI's range)", ge=0, le=2))
    max_tokens: int = field(default=8192, metadata=_meta("answer length limit (0: the endpoint's default)", ge=0))
    timeout_s: float = field(default=300.0, metadata=_meta("socket timeout per request", gt=0))
    max_retries: int = field(default=4, metadata=_meta("retries on connection errors, timeouts, 429 and 5xx", ge=0))
    repair_rounds: int = field(default=2, metadata=_meta("follow-ups that send an error back to the model", ge=0))
    requests_per_minute: float = field(default=60.0, metadata=_meta("client-side rate limit (0: none)", ge=0))


@dataclass
class QueueSettings(_Section):
    """Distributed mode (Celery); see docs/distributed.md."""

    broker_url: str = field(
        default="redis://127.0.0.1:6379/0",
        metadata=_meta("Celery broker: redis://host:port/db (amqp:// works too)", secret=True),
    )
    result_backend: str = field(
        default="", metadata=_meta("Celery result backend; empty: the broker's Redis", secret=True)
    )
    visibility_timeout_s: float = field(
        default=7200.0, metadata=_meta("Redis redelivers an unacked task after this; must exceed the chunk hard limit",
                                       gt=0)
    )
    chunk_candidates: int = field(default=8, metadata=_meta("candidates per search chunk (one task)", ge=1))
    ops_per_device: int = field(
        default=1, metadata=_meta("search chunks (of different ops) a `farm worker` runs at once per device: Celery "
                                  "pool processes, timings kept apart by the device lease (docs/search.md, Pipeline)",
                                  ge=1)
    )
    chunk_time_limit_s: float = field(
        default=1800.0,
        metadata=_meta("soft time limit of a chunk; no candidate starts after half of it; hard limit 10% + 5 s above",
                       gt=0),
    )
    max_redeliveries: int = field(
        default=3, metadata=_meta("times a task lost with its worker is run again before its op is marked failed", ge=0)
    )
    worker_max_tasks_per_child: int = field(
        default=50, metadata=_meta("tasks before a worker's pool process is replaced (0: never)", ge=0)
    )
    # see docs/configuration.md for the longer story of these three
    lock_ttl_s: float = field(default=30.0, metadata=_meta("an op's lock lapses this long after its holder stops", gt=0))
    reconcile_interval_s: float = field(default=30.0, metadata=_meta("how often stranded work is re-enqueued (0: never)",
                                                                     ge=0))
    takeover_s: float = field(default=150.0, metadata=_meta("a taken task with no lock this long: its worker died", gt=0))

    @property
    def chunk_hard_limit_s(self) -> float:
        return round(self.chunk_time_limit_s * 1.1 + 5.0, 1)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.visibility_timeout_s <= self.chunk_hard_limit_s:
            raise ConfigError(f"queue.visibility_timeout_s ({self.visibility_timeout_s:g}) must exceed the chunk hard "
                              f"time limit ({self.chunk_hard_limit_s:g} s, from queue.chunk_time_limit_s), or Redis "
                              "hands a running chunk to a second worker")


@dataclass
class EvaluatorSettings(_Section):
    """The candidate runner's operating-system boundary; see docs/evaluator.md ("Sandbox")."""

    sandbox: str = field(
        default="auto",
        metadata=_meta("auto: run candidates inside bubblewrap where it works here, else without (said once and "
                       "recorded in every verdict); off: never (measurements, debugging)"),
    )
    require_sandbox: bool = field(
        default=False,
        metadata=_meta("refuse to evaluate when no sandbox can be set up (on by default in `farm worker` and the "
                       "worker images)"),
    )
    cases: int = field(default=-1, metadata=_meta("cases of an op's .cases a candidate is verified at (-1: all)",
                                                   ge=-1))
    timed_cases: str = field(default="auto", metadata=_meta(
        "case labels timed for an op's speedup, a geomean (docs/evaluator.md): auto, or bench,low,... [SOURCE:...;]"))
    compile_workers: int = field(
        default=0,
        metadata=_meta("compile-ahead processes per search (docs/search.md): 0 off (default until measured on a "
                       "GPU), -1 auto (min(4, cores - 1) on compiled targets, none on interpreted ones), N", ge=-1),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sandbox not in ("auto", "off"):
            raise ConfigError(f"evaluator.sandbox must be 'auto' or 'off', not {self.sandbox!r}")


@dataclass
class MetricsSettings(_Section):
    """Prometheus endpoints; see docs/operations.md."""

    port: int = field(default=9101, metadata=_meta("`farm worker` serves its metrics here (0: off)", ge=0, le=65535))
    addr: str = field(default="0.0.0.0", metadata=_meta("address the metrics endpoints listen on"))
    exporter_port: int = field(default=9102, metadata=_meta("`farm exporter` serves queue and run metrics here", ge=0,
                                                            le=65535))
    exporter_refresh_s: float = field(
        default=10.0, metadata=_meta("the exporter reads the broker and the store at most this often", ge=0)
    )
    finished_runs_window_h: float = field(
        default=24.0, metadata=_meta("the exporter keeps showing a finished run for this many hours", ge=0)
    )


@dataclass
class AscendSettings(_Section):
    frontend_python: str = field(
        default="",
        metadata=_meta("python of the triton-ascend virtualenv for the frontend check (`farm ascend setup-frontend`; "
                       "empty: ~/.farm/ascend-frontend if it exists; env FARM_ASCEND_FRONTEND_PYTHON)"),
    )


@dataclass
class Settings:
    store: str = field(
        default=DEFAULT_STORE, metadata=_meta("storage URL: file:///path or s3://bucket/prefix", option="--store")
    )
    corpus: CorpusSettings = field(default_factory=CorpusSettings)
    s3: S3Settings = field(default_factory=S3Settings)
    reference: ReferenceSettings = field(default_factory=ReferenceSettings)
    check: CheckSettings = field(default_factory=CheckSettings)
    llm: LLMSettings = field(default_factory=LLMSettings)
    queue: QueueSettings = field(default_factory=QueueSettings)
    evaluator: EvaluatorSettings = field(default_factory=EvaluatorSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    ascend: AscendSettings = field(default_factory=AscendSettings)

    def tasks_dir(self) -> Path:
        if self.corpus.tasks_dir:
            path = Path(self.corpus.tasks_dir).expanduser()
            if not path.is_dir():  # else every source would be "unknown", the setting never named
                what = "is a file, not a folder" if path.exists() else "does not exist"
                raise ConfigError(f"corpus.tasks_dir {path} ({named(self, 'corpus.tasks_dir')}) {what}")
            return path
        return shipped_tasks() or Path.cwd() / "tasks"


# a section's prefix by its class, for its own checks' messages
_SECTIONS = {tp.__name__: f"{name}." for name, tp in typing.get_type_hints(Settings).items()
             if isinstance(tp, type) and dataclasses.is_dataclass(tp)}


@dataclass(frozen=True)
class Leaf:
    """One setting: its dotted key, its type, its metadata."""

    key: str
    type: Any
    help: str
    env: str
    secret: bool
    range: tuple | None = None
    option: str | None = None
    folder: bool = False


def leaves(cls: type = Settings, prefix: str = "") -> list[Leaf]:
    hints = typing.get_type_hints(cls)
    out: list[Leaf] = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out.extend(leaves(tp, key + "."))
            continue
        env = "FARM_" + key.replace(".", "_").upper()
        m = f.metadata
        out.append(Leaf(key, tp, m.get("help", ""), env, m.get("secret", False), m.get("range"), m.get("option"),
                        m.get("folder", False)))
    return out


def _aliases(cls: type = Settings, prefix: str = "") -> dict[str, str]:
    """Standard variables (AWS_*, OPENAI_*) that also feed a setting, below its FARM_* name."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out.update(_aliases(hints[f.name], f"{prefix}{f.name}."))
        elif f.metadata.get("env"):
            out[f"{prefix}{f.name}"] = f.metadata["env"]
    return out


def find_config_file(explicit: str | os.PathLike | None) -> tuple[Path | None, str]:
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise ConfigError(f"config file {path} (--config) does not exist")
        return path, "--config"
    if os.environ.get("FARM_CONFIG"):
        path = Path(os.environ["FARM_CONFIG"]).expanduser()
        if not path.is_file():
            raise ConfigError(f"config file {path} (FARM_CONFIG) does not exist")
        return path, "FARM_CONFIG"
    for candidate in default_config_files():
        if candidate.is_file():
            return candidate, "default location"
    return None, ""


def _flatten_file(data: Any, path: Path, known: dict[str, Leaf], prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        where = f"'{prefix.rstrip('.')}'" if prefix else "the top level"
        raise ConfigError(f"{path}: {where} must be a mapping of settings, not {data!r}")
    out = {}
    for name, value in data.items():
        key = f"{prefix}{name}"
        if key in known:
            out[key] = value
        elif any(k.startswith(key + ".") for k in known):
            out.update(_flatten_file(value or {}, path, known, key + "."))
        else:
            raise ConfigError(f"{path}: unknown key '{key}' (known: {', '.join(sorted(known))})")
    return out


def environment_settings() -> Settings:
    """The settings of this process's environment and config file, without a command's --config
    or --set: what a library caller that passes none gets (an evaluator, a search). Read afresh
    each time and kept nowhere, so that what one command loaded never reaches a later call (a
    process-wide "current settings" once left every later evaluator of a test session without
    its sandbox after one `--set evaluator.sandbox=off`)."""
    return load_settings()[0]


def load_settings(
    config: str | os.PathLike | None = None,
    overrides: dict[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    sets: dict[str, Any] | None = None,
) -> tuple[Settings, dict[str, str]]:
    """Build the effective settings and, for each dotted key, where its value came from.
    `sets` are --set KEY=VALUE, `overrides` a command's own options (which win). Each value is
    checked against its type and range where it is read, and a message names that place."""
    env = os.environ if env is None else env
    known = {leaf.key: leaf for leaf in leaves()}
    aliases = _aliases()
    check_variables(env, [leaf.env for leaf in known.values()])
    values: dict[str, Any] = {}
    origin: dict[str, str] = {k: "default" for k in known}
    said: dict[str, str] = {}  # key -> "set by ..." for messages about a value found wrong later

    def take(key: str, value: Any, where: str, source: str, by: str) -> None:
        leaf = known[key]
        values[key] = coerce(value, leaf.type, where)
        check_value(values[key], leaf.range, where)
        if leaf.folder and values[key] and Path(values[key]).expanduser().is_file():
            raise ConfigError(f"{where}: {values[key]} is a file, not a folder")
        origin[key], said[key] = source, by

    path, _why = find_config_file(config)
    for key, value in _read_file(path, known).items():
        take(key, value, f"{path}: {key}", f"file {path}", f"set in {path}")
    for key, leaf in known.items():
        for var in (leaf.env, aliases.get(key)):
            if var and env.get(var) not in (None, ""):
                take(key, env[var], f"environment {var} ({key})", f"env {var}", f"set by {var}")
                break
    for key, value in (sets or {}).items():
        if key not in known:
            raise ConfigError(f"unknown setting '{key}' (--set{did_you_mean(key, known)})")
        take(key, value, f"--set {key}", "command line", f"set by --set {key}")
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key not in known:
            raise ConfigError(f"unknown setting '{key}'")
        option = known[key].option or f"the option for {key}"
        take(key, value, f"{option} ({key})" if known[key].option else option, "command line", f"set by {option}")

    settings: Settings = _build(Settings, values)
    settings._said = said  # type: ignore[attr-defined]
    return settings, origin


def _read_file(path: Path | None, known: dict[str, Leaf]) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); save the config file as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file: {exc.strerror or exc}") from None
    return _flatten_file(data, path, known)


def named(settings: Settings, key: str) -> str:
    """Where a setting's value came from, as a message says it: "set by FARM_STORE"."""
    return getattr(settings, "_said", {}).get(key, f"the default of {key}")


def _build(cls: type, values: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            kwargs[f.name] = _build(hints[f.name], values, key + ".")
        elif key in values:
            kwargs[f.name] = values[key]
    return cls(**kwargs)


def get(settings: Settings, key: str) -> Any:
    obj: Any = settings
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def mask(value: Any) -> str:
    if value in (None, ""):
        return "-"
    text = str(value)
    return "****" + text[-2:] if len(text) > 6 else "****"


def describe(settings: Settings, origin: dict[str, str]) -> list[dict[str, Any]]:
    """Rows for `farm config show`: key, value (secrets masked), source, env variable, help."""
    rows = []
    for leaf in leaves():
        value = get(settings, leaf.key)
        shown = mask(value) if leaf.secret else value
        rows.append(
            {"key": leaf.key, "value": shown, "source": origin[leaf.key], "env": leaf.env, "help": leaf.help}
        )
    return rows
