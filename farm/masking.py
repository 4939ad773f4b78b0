"""Which text is a secret, and masking it: a candidate's log and reason cross back to the user
(plain and --json output, stored results), so every secret the farm knows of is replaced on the
way out, whatever file or variable it came from."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from farm.config import Settings, get, leaves

_SECRET_VAR = re.compile(r"(KEY|SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|AUTH)", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"://[^:/@\s]*:([^@/\s]+)@")
MIN_SECRET_CHARS = 6  # shorter values ("1", "yes") would mask ordinary text


def secret_values(settings: Settings | None = None, env: Mapping[str, str] | None = None) -> list[str]:
    """The secrets the farm knows of: settings marked secret (the password of a URL among
    them), and variables named like a key, token, secret or password, or holding a URL with a
    password. Longest first, so that masking a secret never leaves a longer one's tail."""
    env = os.environ if env is None else env
    configured = [str(get(settings, leaf.key)) for leaf in leaves()
                  if leaf.secret and get(settings, leaf.key)] if settings is not None else []
    values = set(configured)
    values.update(value for name, value in env.items() if _SECRET_VAR.search(name))
    for text in [*configured, *env.values()]:
        values.update(_URL_PASSWORD.findall(text))
    return sorted((v for v in values if len(v) >= MIN_SECRET_CHARS), key=len, reverse=True)


def mask_secrets(text: str, secrets: list[str]) -> str:
    for value in secrets:
        if value in text:
            text = text.replace(value, "****")
    return text
