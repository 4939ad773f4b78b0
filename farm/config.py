"""Settings: one dataclass tree, one precedence rule.

    command-line option > environment (FARM_*, standard AWS_*) > config file > built-in default

The config file is `--config`, else `$FARM_CONFIG`, else `configs/farm.yaml` of the current
directory or of the checkout, else the copy an installed package carries (farm/bundled/). Every
effective value remembers where it came from, so `farm config show` can say it; secrets are
masked there.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from farm.errors import ConfigError
from farm.paths import default_config_files, shipped_tasks

DEFAULT_STORE = "file://~/.farm/store"


def _meta(help: str, env: str | None = None, secret: bool = False) -> dict:
    return {"help": help, "env": env, "secret": secret}


@dataclass
class CorpusSettings:
    tasks_dir: str = field(
        default="",
        metadata=_meta("folder holding one sub-folder per source (default: the checkout's tasks/, else the "
                       "copy an installed package carries)"),
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
        metadata=_meta("derived small shapes: inputs + parameters + outputs at most this (MiB)"),
    )
    small_budget_mflop: float = field(
        default=1.0,
        metadata=_meta("derived small shapes: matmul/conv work of one forward at most this (MFLOP; soft)"),
    )
    memory_limit_mb: float = field(
        default=0.0,
        metadata=_meta("stop a task whose inputs, parameters and outputs exceed this (MiB, measured on the meta "
                       "device before allocating); 0: half of the memory available"),
    )
    space_max: int = field(default=16384, metadata=_meta("a derived shape space's dimensions reach at most this"))
    small_space_max: int = field(default=64, metadata=_meta("the same at small shapes (the interpreter runs cases)"))
    akg_root: str = field(
        default="",
        metadata=_meta("an AKG checkout: its sglang, vllm/triton_ops, vllm/torch_ops folders become the "
                       "sources sglang, vllm_triton, vllm_torch (replacing the bundled ones)"),
    )

    def __post_init__(self) -> None:
        for key in ("space_max", "small_space_max"):
            if type(getattr(self, key)) is not int or getattr(self, key) < 1:
                raise ConfigError(f"corpus.{key} must be a positive whole number, not {getattr(self, key)!r}")


@dataclass
class S3Settings:
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
    max_attempts: int = field(default=8, metadata=_meta("attempts per request (standard retry mode)"))
    multipart_threshold_mb: int = field(default=64, metadata=_meta("objects larger than this are sent in parts"))
    multipart_chunksize_mb: int = field(default=64, metadata=_meta("size of one part"))
    connect_timeout_s: float = field(default=10.0, metadata=_meta("connection timeout"))
    read_timeout_s: float = field(default=60.0, metadata=_meta("read timeout"))


@dataclass
class ReferenceSettings:
    seed: int = field(default=0, metadata=_meta("seed for get_init_inputs/get_inputs"))
    timeout_s: float = field(default=600.0, metadata=_meta("limit per op, in its own process"))
    seed_sets: int = field(default=4, metadata=_meta("secret seed sets per reference-data-mode op (task-format.md)"))
    cases: int = field(default=-1, metadata=_meta("cases of the shape space recorded beside each .pt; -1: 6, 2 on cpu"))
    jobs: int = field(default=1, metadata=_meta(
        "ops whose reference data is made at once on one device; 0: 1 on cpu, else a quarter of the cores, at most 4"))
    ship_max_mb: float = field(default=256.0, metadata=_meta("a set over this many MiB is kept compact (-1: never)"))

    def __post_init__(self) -> None:
        _positive("reference.timeout_s", self.timeout_s)
        for key, least in (("jobs", 0), ("cases", -1), ("ship_max_mb", -1)):
            if getattr(self, key) < least:
                raise ConfigError(f"reference.{key} must be {least} or more, not {getattr(self, key)}")


@dataclass
class CheckSettings:
    timeout_s: float = field(default=300.0, metadata=_meta("limit per op for `farm ops check`"))

    def __post_init__(self) -> None:
        _positive("check.timeout_s", self.timeout_s)


def _positive(key: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{key} (--timeout) must be a number of seconds > 0, not {value:g}")


@dataclass
class LLMSettings:
    base_url: str | None = field(
        default=None,
        metadata=_meta("OpenAI-compatible API root, e.g. http://localhost:8000/v1", env="OPENAI_BASE_URL"),
    )
    model: str = field(default="", metadata=_meta("model name the endpoint serves"))
    api_key: str | None = field(
        default=None, metadata=_meta("API key, sent as a Bearer token", env="OPENAI_API_KEY", secret=True)
    )
    temperature: float = field(default=0.7, metadata=_meta("sampling temperature"))
    max_tokens: int = field(default=8192, metadata=_meta("answer length limit (0: the endpoint's default)"))
    timeout_s: float = field(default=300.0, metadata=_meta("socket timeout per request"))
    max_retries: int = field(default=4, metadata=_meta("retries on connection errors, timeouts, 429 and 5xx"))
    repair_rounds: int = field(default=2, metadata=_meta("follow-ups that send an error back to the model"))
    requests_per_minute: float = field(default=60.0, metadata=_meta("client-side rate limit (0: none)"))


@dataclass
class QueueSettings:
    """Distributed mode (Celery); see docs/distributed.md."""

    broker_url: str = field(
        default="redis://127.0.0.1:6379/0",
        metadata=_meta("Celery broker: redis://host:port/db (amqp:// works too)", secret=True),
    )
    result_backend: str = field(
        default="", metadata=_meta("Celery result backend; empty: the broker's Redis", secret=True)
    )
    visibility_timeout_s: float = field(
        default=7200.0, metadata=_meta("Redis redelivers an unacked task after this; must exceed the chunk hard limit")
    )
    chunk_candidates: int = field(default=8, metadata=_meta("candidates per search chunk (one task)"))
    ops_per_device: int = field(
        default=1, metadata=_meta("search chunks (of different ops) a `farm worker` runs at once per device: Celery "
                                  "pool processes, timings kept apart by the device lease (docs/search.md, Pipeline)")
    )
    chunk_time_limit_s: float = field(
        default=1800.0,
        metadata=_meta("soft time limit of a chunk; no candidate starts after half of it; hard limit 10% + 5 s above"),
    )
    max_redeliveries: int = field(
        default=3, metadata=_meta("times a task lost with its worker is run again before its op is marked failed")
    )
    worker_max_tasks_per_child: int = field(
        default=50, metadata=_meta("tasks before a worker's pool process is replaced (0: never)")
    )
    # see docs/configuration.md for the longer story of these three
    lock_ttl_s: float = field(default=30.0, metadata=_meta("an op's lock lapses this long after its holder stops"))
    reconcile_interval_s: float = field(default=30.0, metadata=_meta("how often stranded work is re-enqueued (0: never)"))
    takeover_s: float = field(default=150.0, metadata=_meta("a taken task with no lock this long: its worker died"))

    @property
    def chunk_hard_limit_s(self) -> float:
        return round(self.chunk_time_limit_s * 1.1 + 5.0, 1)

    def __post_init__(self) -> None:
        if min(self.lock_ttl_s, self.takeover_s) <= 0 or self.reconcile_interval_s < 0:
            raise ConfigError("queue.lock_ttl_s and queue.takeover_s must be > 0, queue.reconcile_interval_s >= 0")
        if self.chunk_candidates < 1 or self.chunk_time_limit_s <= 0 or self.max_redeliveries < 0:
            raise ConfigError("queue.chunk_candidates must be >= 1, queue.chunk_time_limit_s > 0 and "
                              "queue.max_redeliveries >= 0")
        if self.visibility_timeout_s <= self.chunk_hard_limit_s:
            raise ConfigError(f"queue.visibility_timeout_s ({self.visibility_timeout_s:g}) must exceed the chunk hard "
                              f"time limit ({self.chunk_hard_limit_s:g} s, from queue.chunk_time_limit_s), or Redis "
                              "hands a running chunk to a second worker")


@dataclass
class EvaluatorSettings:
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
    cases: int = field(default=-1, metadata=_meta("cases of an op's .cases a candidate is verified at (-1: all)"))
    timed_cases: str = field(default="auto", metadata=_meta(
        "case labels timed for an op's speedup, a geomean (docs/evaluator.md): auto, or bench,low,... [SOURCE:...;]"))
    compile_workers: int = field(
        default=0,
        metadata=_meta("compile-ahead processes per search (docs/search.md): 0 off (default until measured on a "
                       "GPU), -1 auto (min(4, cores - 1) on compiled targets, none on interpreted ones), N"),
    )

    def __post_init__(self) -> None:
        if self.sandbox not in ("auto", "off"):
            raise ConfigError(f"evaluator.sandbox must be 'auto' or 'off', not {self.sandbox!r}")
        if not isinstance(self.cases, int) or self.cases < -1:
            raise ConfigError(f"evaluator.cases must be -1 (all) or a count, not {self.cases!r}")
        if not isinstance(self.compile_workers, int) or self.compile_workers < -1:
            raise ConfigError(f"evaluator.compile_workers must be -1 (auto), 0 (off) or a positive count, "
                              f"not {self.compile_workers!r}")


@dataclass
class MetricsSettings:
    """Prometheus endpoints; see docs/operations.md."""

    port: int = field(default=9101, metadata=_meta("`farm worker` serves its metrics here (0: off)"))
    addr: str = field(default="0.0.0.0", metadata=_meta("address the metrics endpoints listen on"))
    exporter_port: int = field(default=9102, metadata=_meta("`farm exporter` serves queue and run metrics here"))
    exporter_refresh_s: float = field(
        default=10.0, metadata=_meta("the exporter reads the broker and the store at most this often")
    )
    finished_runs_window_h: float = field(
        default=24.0, metadata=_meta("the exporter keeps showing a finished run for this many hours")
    )

    def __post_init__(self) -> None:
        for name in ("port", "exporter_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ConfigError(f"metrics.{name} must be a TCP port (0-65535), not {getattr(self, name)}")
        if self.exporter_refresh_s < 0 or self.finished_runs_window_h < 0:
            raise ConfigError("metrics.exporter_refresh_s and metrics.finished_runs_window_h must be >= 0")


@dataclass
class AscendSettings:
    frontend_python: str = field(
        default="",
        metadata=_meta("python of the triton-ascend virtualenv for the frontend check (`farm ascend setup-frontend`; "
                       "empty: ~/.farm/ascend-frontend if it exists; env FARM_ASCEND_FRONTEND_PYTHON)"),
    )


@dataclass
class Settings:
    store: str = field(
        default=DEFAULT_STORE, metadata=_meta("storage URL: file:///path or s3://bucket/prefix")
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
            return Path(self.corpus.tasks_dir).expanduser()
        return shipped_tasks() or Path.cwd() / "tasks"


@dataclass(frozen=True)
class Leaf:
    """One setting: its dotted key, its type, its metadata."""

    key: str
    type: Any
    help: str
    env: str
    secret: bool


def leaves(cls: type = Settings, prefix: str = "") -> list[Leaf]:
    hints = typing.get_type_hints(cls)
    out: list[Leaf] = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out.extend(leaves(tp, key + "."))
            continue
        env = "FARM_" + key.replace(".", "_").upper()
        out.append(Leaf(key, tp, f.metadata.get("help", ""), env, f.metadata.get("secret", False)))
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


def coerce(value: Any, tp: Any, where: str) -> Any:
    """Check (and for strings from the environment, convert) a value to a field's type."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return coerce(value, inner[0], where)
    if origin is dict:
        if isinstance(value, str):
            value = _parse_mapping(value, where)
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ConfigError(f"{where}: expected a mapping of name: value, got {value!r}")
        return {k: coerce(v, args[1], f"{where}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        elif isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    raise ConfigError(f"{where}: expected {getattr(tp, '__name__', tp)}, got {value!r}")


def _parse_mapping(text: str, where: str) -> dict:
    text = text.strip()
    if text.startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: not valid JSON: {exc}") from None
    pairs = [p for p in text.split(",") if p.strip()]
    if not all("=" in p for p in pairs):
        raise ConfigError(f"{where}: expected JSON or name=value,name=value, got {text!r}")
    return dict(p.strip().split("=", 1) for p in pairs)


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


_CURRENT: Settings | None = None


def current_settings() -> Settings:
    """The settings this process last loaded from its own environment (a CLI command's, with
    its --config and --set; a worker's), else the environment's and the default file's. For
    what applies process-wide: the sandbox policy, the secrets to mask."""
    return _CURRENT if _CURRENT is not None else load_settings()[0]


def load_settings(
    config: str | os.PathLike | None = None,
    overrides: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[Settings, dict[str, str]]:
    """Build the effective settings and, for each dotted key, where its value came from."""
    env = os.environ if env is None else env
    known = {leaf.key: leaf for leaf in leaves()}
    values: dict[str, Any] = {}
    origin: dict[str, str] = {k: "default" for k in known}

    path, _why = find_config_file(config)
    if path is not None:
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); save the config file as UTF-8") from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read the config file: {exc.strerror or exc}") from None
        for key, value in _flatten_file(data, path, known).items():
            values[key] = coerce(value, known[key].type, f"{path}: {key}")
            origin[key] = f"file {path}"

    aliases = _aliases()
    for key, leaf in known.items():
        for var in (leaf.env, aliases.get(key)):
            if var and env.get(var) not in (None, ""):
                values[key] = coerce(env[var], leaf.type, f"environment {var}")
                origin[key] = f"env {var}"
                break

    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key not in known:
            raise ConfigError(f"unknown setting '{key}'")
        values[key] = coerce(value, known[key].type, f"option for {key}")
        origin[key] = "command line"

    settings = _build(Settings, values)
    if env is os.environ:
        global _CURRENT
        _CURRENT = settings
    return settings, origin


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
