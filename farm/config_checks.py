"""The checks of farm.config, apart: a value against its setting's type and declared range, and
the FARM_* variables of the environment against the names the farm reads.

A setting's range lives in its field's metadata (farm.config: ge=, gt=, le=), so the table of
ranges is one, shown in docs/reference/settings.md. Every value is checked where it is read
(config file, environment, --set, a command's option), and the message names that place.

Unknown FARM_* variables (docs/configuration.md, "Environment"): one that is close to a name
the farm reads (FARM_STORE_URL for FARM_STORE) is an error, since the setting it was meant for
silently keeps another value (the store would be the default one); one close to nothing is
said once and ignored, as other tools may share the prefix. An empty one changes nothing.
"""

from __future__ import annotations

import difflib
import json
import math
import sys
import types
import typing
from collections.abc import Iterable
from typing import Any

from farm.errors import ConfigError

# FARM_* variables that are no setting, and what reads each: known, so never reported.
OTHER_VARIABLES = {
    "FARM_CONFIG": "the config file (farm --config)",
    "FARM_CACHE_DIR": "the per-user cache (farm.paths)",
    "FARM_TIMING_CPU": "the core timing runners share (farm.evaluate.quiet)",
    "FARM_LEASE_DIR": "the device leases' lock files (farm.evaluate.lease)",
    "FARM_WORKER_DEVICE": "set by `farm worker` for its processes",
    "FARM_WORKER_SLOT": "set by `farm worker` for its processes",
    "FARM_WORKER_QUEUES": "set by `farm worker` for its processes",
    "FARM_ASCEND_ARCH": "the Ascend frontend check's architecture (farm.ascend.frontend_compile)",
    "FARM_BENCH_COMMIT": "bench/: the commit a benchmark records",
    "FARM_RETIME_LOCK": "bench/retime.py: the lock that makes each op's device work exclusive",
    "FARM_WHEELS": "scripts/build-worker-image",
    "FARM_BUILD_CA": "scripts/build-worker-image",
    "FARM_BUILD_LOG": "scripts/build-worker-image",
    "FARM_IMAGE_TAG": "scripts/build-worker-image",
    "FARM_CHECKOV_VENV": "scripts/validate-deploy",
    "FARM_MONOKLE_DIR": "scripts/validate-deploy",
    "FARM_VALIDATE_LOG": "scripts/validate-deploy",
    "FARM_S3_BUCKET": "deploy/compose",
    "FARM_VERSION": "deploy/compose",
    "FARM_PROMETHEUS_URL": "deploy/compose and deploy/k8s (Grafana)",
    "FARM_IMPORT_LOG": "tests/cli/test_dependencies.py",
    "FARM_TEST_AMQP_URL": "tests/distributed/test_exporter.py",
    "FARM_TEST_SLOW": "tests/cli/test_signals.py (a task that sleeps mid-op)",
}
PREFIX = "FARM_"
_said: set[str] = set()  # unknown variables already warned of in this process


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
    elif tp in (int, float):
        if isinstance(value, str):
            try:
                return tp(value)
            except ValueError:
                pass
        # a whole number is a float too, never the other way round
        elif isinstance(value, (int, tp)) and not isinstance(value, bool):
            return tp(value)
    elif tp is str and isinstance(value, str):
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


Range = tuple  # (at least, more than, at most): each a number or None


def _num(x: float) -> str:
    if isinstance(x, int):
        return str(x)
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else f"{x:g}"


def range_text(rng: Range | None) -> str:
    low, above, high = rng or (None, None, None)
    parts = [f"{sign} {_num(bound)}" for sign, bound in ((">=", low), (">", above), ("<=", high)) if bound is not None]
    return " and ".join(parts)


def check_value(value: Any, rng: Range | None, where: str) -> None:
    """A number within its setting's range; a float also finite (nan passes no comparison, and
    inf is no limit any setting means)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: must be a finite number{' ' + range_text(rng) if rng else ''}, not {value}")
    low, above, high = rng or (None, None, None)
    if (low is not None and not value >= low) or (above is not None and not value > above) or (
            high is not None and not value <= high):
        raise ConfigError(f"{where}: must be {range_text(rng)}, not {_num(value)}")


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """'; did you mean 'tune'?' for a name spelt nearly like a known one, else '': for the
    parenthesis that names the option."""
    near = difflib.get_close_matches(name, [str(k) for k in known], n=1, cutoff=0.6)
    return f"; did you mean {near[0]!r}?" if near else ""


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name a mistyped one was meant as: the same in other case, a known name with
    words added (FARM_STORE_URL) or cut short (FARM_LLM_TEMP), else one spelt nearly alike."""
    upper, known = name.upper(), sorted(set(known))
    if upper in known:
        return upper
    tail = upper.removeprefix(PREFIX)
    tails = {k.removeprefix(PREFIX): k for k in known if k.startswith(PREFIX)}
    longer = [k for t, k in tails.items() if tail.startswith(t + "_")]
    if longer:
        return max(longer, key=len)
    shorter = [k for t, k in tails.items() if tail and t.startswith(tail)]
    if len(shorter) == 1:
        return shorter[0]
    near = difflib.get_close_matches(tail, list(tails), n=1, cutoff=0.75)
    return tails[near[0]] if near else None


def check_variables(env: typing.Mapping[str, str], settings_vars: Iterable[str]) -> None:
    """Every non-empty FARM_* variable is one the farm reads: a typo of one is an error naming
    it, any other is said once on stderr."""
    known = set(settings_vars) | set(OTHER_VARIABLES)
    for name in sorted(env):
        if not name.upper().startswith(PREFIX) or name in known or not env[name]:
            continue
        meant = closest(name, known)
        if meant:
            case = " (names are upper case)" if meant == name.upper() else ""
            raise ConfigError(f"environment variable {name} is not one the farm reads: did you mean {meant}{case}? "
                              "(rename or unset it; `farm config show` lists every setting's variable)")
        if name not in _said:
            _said.add(name)
            print(f"warning: environment variable {name} is not one the farm reads: ignored (`farm config show` "
                  "lists every setting's variable)", file=sys.stderr)
