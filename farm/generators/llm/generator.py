"""The llm generator: candidates written by a model behind any OpenAI-compatible endpoint.

Each of the n proposals is one conversation (farm.generators.llm.prompts): the task, the target's rules,
the parent, inspirations and recent errors. An answer that fails strict extraction
(farm.generators.llm.extract) has its reason sent back as a follow-up message, up to repair_rounds
times. A parent that failed evaluation is repaired the same way across calls: its error is
sent back after it, and a chain of such repairs stops after repair_rounds.
"""

from __future__ import annotations

import hashlib
import logging

from farm.config import load_settings
from farm.errors import FarmError
from farm.generators.base import Candidate, Context, Generator, Proposal
from farm.generators.llm import prompts
from farm.generators.llm.client import ChatClient, Completion, LLMError, Usage
from farm.generators.llm.extract import Extracted, extract

log = logging.getLogger(__name__)

# the llm.* settings; an option left out (or None) takes the setting's effective value
OPTIONS = ("base_url", "model", "api_key", "temperature", "max_tokens", "timeout_s", "max_retries",
           "repair_rounds", "requests_per_minute")
CLIENT_OPTIONS = ("backoff_s",)  # client tuning that is no setting (tests shorten it)
NOTE_CHARS = 80  # of the answer's "Change:" line, kept as the proposal's note


class LLMGenerator(Generator):
    name = "llm"

    def __init__(self, **options) -> None:
        unknown = sorted(set(options) - set(OPTIONS) - set(CLIENT_OPTIONS))
        if unknown:
            known = ", ".join(OPTIONS + CLIENT_OPTIONS)
            raise FarmError(f"llm generator: unknown option(s) {', '.join(unknown)}; known: {known}")
        given = {k: v for k, v in options.items() if v is not None}
        if any(k not in given for k in OPTIONS):
            defaults = load_settings()[0].llm
            given = {**{k: getattr(defaults, k) for k in OPTIONS}, **given}
        if not given["base_url"]:
            raise FarmError("llm generator needs llm.base_url: the OpenAI-compatible API root, e.g. "
                            "http://localhost:8000/v1 (set FARM_LLM_BASE_URL, --set llm.base_url=... "
                            "or llm: base_url: in the config file)")
        if not given["model"]:
            raise FarmError("llm generator needs llm.model: the name of a model the endpoint serves "
                            "(FARM_LLM_MODEL, --set llm.model=... or the config file)")
        self.repair_rounds = max(0, int(given["repair_rounds"]))
        extra = {k: given[k] for k in CLIENT_OPTIONS if k in given}
        self.client = ChatClient(
            given["base_url"], given["model"], given["api_key"], temperature=given["temperature"],
            max_tokens=given["max_tokens"], timeout_s=given["timeout_s"], max_retries=given["max_retries"],
            requests_per_minute=given["requests_per_minute"], **extra,
        )
        self.rejections: list[str] = []  # why answers were refused, most recent last (for reports)
        self._repair_depth: dict[str, int] = {}  # sha256 of a proposed repair -> repairs in its chain

    def __repr__(self) -> str:
        return f"LLMGenerator({self.client!r})"

    @property
    def usage(self) -> Usage:
        """Requests answered and tokens spent by this generator so far."""
        return self.client.usage

    def propose(self, parent: Candidate, inspirations: list[Candidate], ctx: Context, n: int = 1) -> list[Proposal]:
        depth = 0
        if prompts.failed(parent):
            depth = self._repair_depth.get(_digest(parent.source), 0) + 1
            if depth > self.repair_rounds:
                log.info("llm: not repairing %s again: %d repair rounds spent (llm.repair_rounds)",
                         parent.id, depth - 1)
                return []
        messages = prompts.build_messages(parent, inspirations, ctx)
        proposals: list[Proposal] = []
        last_error: LLMError | None = None
        for _ in range(n):
            try:
                proposal = self._converse(list(messages), parent)
            except LLMError as exc:
                if exc.status is not None and not exc.retryable:
                    raise  # a refused request (auth, model name, ...) will not get better
                log.warning("llm: %s", exc)
                last_error = exc
                continue
            if proposal is not None:
                if depth:
                    self._repair_depth[_digest(proposal.source)] = depth
                proposals.append(proposal)
        if not proposals and last_error is not None:
            raise last_error
        return proposals

    def _converse(self, messages: list[dict[str, str]], parent: Candidate) -> Proposal | None:
        """One candidate: ask, then send each extraction failure back, up to repair_rounds times."""
        for round_ in range(self.repair_rounds + 1):
            completion = self.client.complete(messages)
            result = extract(completion.text)
            if result.ok and result.source.strip() != parent.source.strip():
                return Proposal(result.source, self.name, note=_note(completion, parent, round_))
            reason = _reason(result, completion)
            self.rejections.append(reason)
            log.info("llm: answer rejected (round %d of %d): %s", round_ + 1, self.repair_rounds + 1, reason)
            messages += [
                {"role": "assistant", "content": completion.text},
                {"role": "user", "content": prompts.repair_answer_message(reason)},
            ]
        return None


def _reason(result: Extracted, completion: Completion) -> str:
    if result.ok:
        return "the module is the parent unchanged: change something"
    if completion.finish_reason == "length":
        return f"{result.reason} (the answer was cut off at llm.max_tokens; write less prose)"
    return result.reason


def _note(completion: Completion, parent: Candidate, rounds: int) -> str:
    prose = completion.text.split("```", 1)[0]  # the Change: line comes before the code
    change = next((line.split(":", 1)[1].strip() for line in prose.splitlines()
                   if line.strip().lower().startswith("change:")), "")
    parts = [change[:NOTE_CHARS] or "llm rewrite"]
    if prompts.failed(parent):
        parts.append(f"repair of {parent.verdict}")
    if rounds:
        parts.append(f"after {rounds} format repair(s)")
    return "; ".join(parts)


def _digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()
