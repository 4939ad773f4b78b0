"""A small OpenAI-compatible chat-completions client on the standard library (no new dependency).

    POST {base_url}/chat/completions   {"model", "messages", "temperature", "max_tokens"}

Connection errors, timeouts, 429 (after its Retry-After, when given) and 5xx are retried with
exponential backoff and jitter; any other status fails at once. A client-side limiter spaces
requests evenly (requests per minute). The `usage` of every answer adds up per client.

The API key goes into the Authorization header and nowhere else: errors and log lines name
the endpoint, and a server's error text that echoes the key is masked before it is quoted.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import logging
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from farm.errors import FarmError

log = logging.getLogger(__name__)

BACKOFF_S = 1.0  # delay before the first retry; doubles with each retry, then jitter takes up to half
MAX_BACKOFF_S = 60.0  # the longest wait between two attempts, a server's Retry-After included
ERROR_TEXT_CHARS = 300  # how much of a server's error text an exception quotes
USER_AGENT = "kernel-farm"
RETRY_STATUS = frozenset({429})  # besides every 5xx


class LLMError(FarmError):
    """The endpoint could not be reached, refused the request or gave an unusable answer."""

    def __init__(self, endpoint: str, detail: str, status: int | None = None, *,
                 retryable: bool = False, retry_after: float | None = None):
        self.endpoint, self.detail, self.status = endpoint, detail, status
        self.retryable, self.retry_after = retryable, retry_after
        super().__init__(f"LLM endpoint {endpoint}: {detail}")


@dataclass
class Usage:
    """Tokens as the endpoint reports them in each answer's `usage`, and the answers counted."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    @classmethod
    def of(cls, usage: Any) -> Usage:
        usage = usage if isinstance(usage, dict) else {}
        prompt = _count(usage.get("prompt_tokens"))
        completion = _count(usage.get("completion_tokens"))
        total = _count(usage.get("total_tokens")) or prompt + completion
        return cls(1, prompt, completion, total)

    def add(self, other: Usage) -> None:
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.total_tokens += other.total_tokens


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@dataclass
class Completion:
    text: str
    finish_reason: str = ""  # "stop"; "length" when max_tokens cut the answer
    usage: Usage = field(default_factory=Usage)  # this answer's alone


class RateLimiter:
    """Spaces calls: none starts sooner than 60/per_minute seconds after the one before (0: no limit).

    Callers queue on a lock while they wait, so the spacing holds across threads and a late
    caller never lets the next one in early.
    """

    def __init__(self, per_minute: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.interval = 60.0 / per_minute if per_minute and per_minute > 0 else 0.0
        self._clock, self._sleep = clock, sleep
        self._next = float("-inf")
        self._lock = threading.Lock()

    def wait(self) -> float:
        """Block until this caller may send; returns the seconds waited."""
        if not self.interval:
            return 0.0
        with self._lock:
            delay = max(0.0, self._next - self._clock())
            if delay:
                self._sleep(delay)
            self._next = self._clock() + self.interval
        return delay


def chat_endpoint(base_url: str) -> str:
    """The chat-completions URL of an API root (`http://host:8000/v1`); a full URL is kept."""
    url = base_url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise FarmError(f"llm.base_url must be an http:// or https:// URL, got {base_url!r}")
    return url if url.endswith("/chat/completions") else url + "/chat/completions"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect would resend the key to another address and turn the POST into a GET."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


class ChatClient:
    def __init__(self, base_url: str, model: str, api_key: str | None = None, *,
                 temperature: float = 0.7, max_tokens: int = 8192, timeout_s: float = 300.0,
                 max_retries: int = 4, requests_per_minute: float = 0.0, backoff_s: float = BACKOFF_S,
                 rng: random.Random | None = None):
        self.endpoint = chat_endpoint(base_url)
        self.model = model
        self._api_key = api_key or None
        self.temperature, self.max_tokens = temperature, max_tokens
        self.timeout_s, self.max_retries, self.backoff_s = timeout_s, max(0, max_retries), backoff_s
        self.limiter = RateLimiter(requests_per_minute)
        self.usage = Usage()
        self.retries = 0  # attempts beyond the first, over the client's life
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._opener = urllib.request.build_opener(_NoRedirect)

    def __repr__(self) -> str:
        return f"ChatClient({self.endpoint!r}, model={self.model!r})"

    def complete(self, messages: list[dict[str, str]], *, temperature: float | None = None,
                 max_tokens: int | None = None) -> Completion:
        """One answer to a conversation; raises LLMError when none can be had."""
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature if temperature is None else temperature,
        }
        limit = self.max_tokens if max_tokens is None else max_tokens
        if limit:
            payload["max_tokens"] = limit
        log.debug("POST %s: model %s, %d messages", self.endpoint, self.model, len(messages))
        return self._parse(self._post_with_retries(json.dumps(payload).encode()))

    # -- transport ---------------------------------------------------------------------------

    def _post_with_retries(self, data: bytes) -> bytes:
        for attempt in range(self.max_retries + 1):
            self.limiter.wait()
            try:
                return self._post(data)
            except LLMError as exc:
                if not exc.retryable or attempt == self.max_retries:
                    if exc.retryable and attempt:
                        raise LLMError(self.endpoint, f"{exc.detail} (gave up after {attempt + 1} attempts)",
                                       exc.status, retryable=True) from None
                    raise
                delay = self._delay(attempt, exc.retry_after)
                log.warning("LLM endpoint %s: %s; retry %d of %d in %.2f s",
                            self.endpoint, exc.detail, attempt + 1, self.max_retries, delay)
                with self._lock:
                    self.retries += 1
                time.sleep(delay)
        raise AssertionError("unreachable")

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(MAX_BACKOFF_S, retry_after)
        return min(MAX_BACKOFF_S, self.backoff_s * 2**attempt) * (0.5 + 0.5 * self._rng.random())

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": USER_AGENT}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def _post(self, data: bytes) -> bytes:
        request = urllib.request.Request(self.endpoint, data=data, headers=self._headers(), method="POST")
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                return response.read()
        except urllib.error.HTTPError as exc:
            raise self._http_error(exc) from None
        except TimeoutError:
            raise self._timeout() from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise self._timeout() from None
            raise LLMError(self.endpoint, f"cannot connect: {self._scrub(str(exc.reason))}", retryable=True) from None
        except (http.client.HTTPException, OSError) as exc:
            raise LLMError(self.endpoint, f"connection failed: {type(exc).__name__}: {self._scrub(str(exc))}",
                           retryable=True) from None

    def _timeout(self) -> LLMError:
        return LLMError(self.endpoint, f"no answer within {self.timeout_s:g} s (llm.timeout_s)", retryable=True)

    def _http_error(self, exc: urllib.error.HTTPError) -> LLMError:
        status = exc.code
        try:
            text = exc.read().decode("utf-8", "replace")
        except (OSError, http.client.HTTPException):
            text = ""
        detail = f"HTTP {status} {exc.reason}".rstrip()
        message = self._scrub(_error_message(text))
        if message:
            detail += f": {message}"
        if 300 <= status < 400:
            detail += " (redirects are not followed: check llm.base_url)"
        retryable = status in RETRY_STATUS or status >= 500
        retry_after = _retry_after(exc.headers.get("Retry-After")) if retryable and exc.headers else None
        return LLMError(self.endpoint, detail, status, retryable=retryable, retry_after=retry_after)

    def _scrub(self, text: str) -> str:
        return text.replace(self._api_key, "****") if self._api_key else text

    # -- answer ------------------------------------------------------------------------------

    def _parse(self, raw: bytes) -> Completion:
        try:
            body = json.loads(raw)
        except ValueError:
            snippet = self._scrub(raw[:80].decode("utf-8", "replace"))
            raise LLMError(self.endpoint, f"the answer is not JSON ({snippet!r}...): is llm.base_url the API "
                                          "root, e.g. http://host:8000/v1?") from None
        if not isinstance(body, dict):
            raise LLMError(self.endpoint, "the answer is not a JSON object")
        usage = Usage.of(body.get("usage"))
        with self._lock:  # counted even when the answer proves unusable: the tokens were spent
            self.usage.add(usage)
        choices = body.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            error = self._scrub(_error_message(json.dumps(body.get("error", ""))))
            raise LLMError(self.endpoint, "the answer has no choices" + (f": {error}" if error else ""))
        choice = choices[0]
        text = _content_text((choice.get("message") or {}).get("content"))
        finish = str(choice.get("finish_reason") or "")
        if text is None:
            raise LLMError(self.endpoint, f"the answer has no message content (finish_reason {finish or '-'})")
        return Completion(text, finish, usage)


def _content_text(content: Any) -> str | None:
    """message.content: a string, or (some servers) a list of {"type": "text", "text": ...} parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return "".join(parts) if parts else None
    return None


def _error_message(text: str) -> str:
    """The message of an OpenAI-style error body ({"error": {"message": ...}}), else the text."""
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            text = str(error.get("message") or error.get("detail") or text)
        elif isinstance(error, str):
            text = error
    elif isinstance(body, str):
        text = body
    text = " ".join(text.split())
    return text[:ERROR_TEXT_CHARS] + ("..." if len(text) > ERROR_TEXT_CHARS else "")


def _retry_after(value: str | None) -> float | None:
    """Retry-After as seconds (a number, or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
