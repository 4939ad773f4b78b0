"""The llm generator against a real local chat-completions server with scripted answers."""

from __future__ import annotations

import itertools
import logging
import socket
import time

import pytest

from farm.config import describe, load_settings
from farm.errors import FarmError
from farm.generators import load_generator
from farm.generators.base import Candidate, Context
from farm.generators.llm import prompts
from farm.generators.llm.client import ChatClient, LLMError, RateLimiter
from farm.generators.llm.extract import extract
from farm.generators.llm.generator import LLMGenerator
from tests.llm_server import (
    GOOD_CODE,
    NO_MODELNEW_CODE,
    STATIC_FAIL_CODE,
    SYNTAX_ERROR_CODE,
    TASK_SOURCE,
    ChatServer,
    Reply,
    answer,
    error,
    fenced,
    good,
    slow,
)

KEY = "sk-test-0123456789abcdef"
PARENT_SOURCE = TASK_SOURCE.replace("class Model(", "class ModelNew(")


@pytest.fixture(autouse=True)
def no_openai_env(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


@pytest.fixture
def server():
    with ChatServer() as s:
        yield s


def make_generator(server, **options) -> LLMGenerator:
    settings = {"base_url": server.url, "model": "test-model", "api_key": KEY, "temperature": 0.5,
                "max_tokens": 1000, "timeout_s": 5.0, "max_retries": 2, "repair_rounds": 2,
                "requests_per_minute": 0, "backoff_s": 0.01}
    return LLMGenerator(**{**settings, **options})


def make_client(server, **options) -> ChatClient:
    settings = {"api_key": KEY, "timeout_s": 5.0, "max_retries": 3, "requests_per_minute": 0, "backoff_s": 0.01}
    return ChatClient(server.url, "test-model", **{**settings, **options})


def context(target="ascend", errors=()) -> Context:
    return Context(task_code=TASK_SOURCE, op="scale2", source="mini", target=target,
                   device={"num_aicore": 24, "num_vectorcore": 48}, recent_errors=list(errors))


def parent(**kw) -> Candidate:
    fields = {"id": "p1", "source": PARENT_SOURCE, "generator": "seed", "verdict": "pass", "time_ms": 0.25,
              "speedup": 1.5, "lineage": 1, "generation": 3, "note": "BLOCK 32->64"}
    return Candidate(**{**fields, **kw})


def ask(messages=None):
    return messages or [{"role": "user", "content": "hello"}]


# -- extraction ------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, reason", [
    ("I would use a bigger block.", "has no ```python fenced block"),
    (fenced(GOOD_CODE, label=""), "found 1 unlabelled fenced block"),
    (fenced(GOOD_CODE) + "and also\n" + fenced(GOOD_CODE), "2 ```python fenced blocks (lines 1, 22)"),
    (fenced(SYNTAX_ERROR_CODE), "syntax error at line 15"),
    (fenced(NO_MODELNEW_CODE), "defines no top-level class ModelNew"),
    (fenced(STATIC_FAIL_CODE), "rejected by the static checks (cheat): imports subprocess (line 1)"),
    ("```python\n" + GOOD_CODE, "never closed"),
    ("```python\n```\n", "block is empty"),
], ids=["prose", "unlabelled", "two-blocks", "syntax", "no-modelnew", "static", "unclosed", "empty"])
def test_extraction_rejects_each_bad_form_with_its_reason(text, reason):
    result = extract(text)
    assert not result.ok and result.source == ""
    assert reason in result.reason


def test_extraction_accepts_one_python_block_among_prose_and_other_blocks():
    text = "Change: wider blocks\n```bash\npip install triton\n```\n" + fenced(GOOD_CODE, "py") + "Done."
    result = extract(text)
    assert result.ok and result.source == GOOD_CODE


# -- the generator end to end ----------------------------------------------------------------------


def test_good_answer_becomes_a_proposal(server):
    server.script(good("BLOCK 64->256"))
    gen = make_generator(server)
    proposals = gen.propose(parent(), [], context(), n=1)
    assert len(proposals) == 1
    p = proposals[0]
    assert p.source == GOOD_CODE and p.generator == "llm" and p.note == "BLOCK 64->256"
    body = server.requests[0].body
    assert server.requests[0].path == "/v1/chat/completions"
    assert body["model"] == "test-model" and body["temperature"] == 0.5 and body["max_tokens"] == 1000
    assert [m["role"] for m in body["messages"]] == ["system", "user"]


def test_n_proposals_take_n_requests(server):
    server.script(good("a"), good("b"), good("c"))
    proposals = make_generator(server).propose(parent(), [], context(), n=3)
    assert [p.note for p in proposals] == ["a", "b", "c"]
    assert len(server.requests) == 3


def test_repair_round_sends_the_error_back_and_succeeds(server):
    server.script(answer("Use BLOCK=256, it will be faster."), good())
    gen = make_generator(server)
    proposals = gen.propose(parent(), [], context())
    assert len(proposals) == 1 and proposals[0].source == GOOD_CODE
    assert "after 1 format repair(s)" in proposals[0].note
    first, second = server.requests
    assert len(second.messages) == len(first.messages) + 2
    assert second.messages[-2] == {"role": "assistant", "content": "Use BLOCK=256, it will be faster."}
    assert second.messages[-1]["role"] == "user"
    assert "the answer has no ```python fenced block" in second.messages[-1]["content"]


def test_every_bad_form_from_the_server_is_sent_back_in_turn(server):
    bad = [fenced(GOOD_CODE) * 2, fenced(SYNTAX_ERROR_CODE), fenced(STATIC_FAIL_CODE), fenced(PARENT_SOURCE)]
    server.script(*[answer(t) for t in bad], good())
    gen = make_generator(server, repair_rounds=4)
    assert len(gen.propose(parent(), [], context())) == 1
    assert len(gen.rejections) == 4
    expected = ["2 ```python fenced blocks", "syntax error at line 15", "imports subprocess",
                "the parent unchanged"]
    for request, reason, logged in zip(server.requests[1:], expected, gen.rejections):
        assert reason in request.messages[-1]["content"] and reason in logged


def test_no_proposal_after_repair_rounds_are_spent(server):
    server.script(answer("no code"), answer("still no code"))
    gen = make_generator(server, repair_rounds=1)
    assert gen.propose(parent(), [], context()) == []
    assert len(server.requests) == 2


def test_a_cut_off_answer_says_so(server):
    server.script(answer("```python\nimport torch\n", finish_reason="length"), good())
    gen = make_generator(server)
    gen.propose(parent(), [], context())
    assert "cut off at llm.max_tokens" in server.requests[1].messages[-1]["content"]


def test_failed_parent_is_repaired_with_its_error_and_the_chain_is_bounded(server):
    failing = parent(verdict="compile_error", error="MLIRCompilationError: ub overflow, requires 8577280 bits",
                     time_ms=None, speedup=None)
    server.script(good("smaller BLOCK_SUB"))
    gen = make_generator(server, repair_rounds=1)
    [fixed] = gen.propose(failing, [], context())
    messages = server.requests[0].messages
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert PARENT_SOURCE.strip() in messages[2]["content"]
    assert "ub overflow, requires 8577280 bits" in messages[3]["content"]
    assert "verdict `compile_error`" in messages[3]["content"]
    assert "repair of compile_error" in fixed.note
    # the repair failed too: with repair_rounds=1 the chain ends without asking again
    again = parent(id="p2", source=fixed.source, verdict="runtime_error", error="segfault")
    assert gen.propose(again, [], context()) == []
    assert len(server.requests) == 1


# -- prompt contents -------------------------------------------------------------------------------


def test_prompt_holds_task_target_rules_parent_inspirations_and_last_error(server):
    server.script(good())
    inspiration = parent(id="i1", source=GOOD_CODE.replace("_scale", "_scale_fast"), lineage=2, speedup=2.5)
    ctx = context(errors=["Traceback (most recent call last):\n  ...\nRuntimeError: grid should be less than 65536!"])
    make_generator(server).propose(parent(), [inspiration], ctx)
    system, user = (m["content"] for m in server.requests[0].messages)
    assert "kernel engineer" in system
    # the task: its docstring, Reference, get_inputs; its kernel is left to the parent
    assert "Scale a vector by two with a Triton kernel." in user
    assert "class Reference(nn.Module):" in user and "return x * 2.0" in user and "def get_inputs():" in user
    assert "`forward(self, x)`" in user
    # the ascend rules and the device
    assert "Huawei Ascend NPU" in user and "num_vectorcore=48" in user
    assert "65535" in user and "1572864 bits" in user and "triton.language.extra.ascend.libdevice" in user
    # the parent with its numbers, the inspiration, the last error
    assert PARENT_SOURCE.strip() in user and "0.25 ms; speedup 1.5x" in user
    assert "_scale_fast" in user and "speedup 2.5x" in user
    assert "RuntimeError: grid should be less than 65536!" in user
    # the answer rules, from farm.evaluate.static_checks
    assert "exactly one fenced code block labelled python" in user and "subprocess" in user


def test_each_target_has_its_own_rules():
    texts = {t: prompts.target_section(context(target=t)) for t in ("ascend", "cuda", "cpu", "tpu")}
    assert "UB" in texts["ascend"] and "num_warps" in texts["cuda"] and "TRITON_INTERPRET=1" in texts["cpu"]
    assert texts["tpu"].startswith("## Target: tpu")


def test_long_inspirations_and_errors_are_trimmed():
    long_source = "\n".join(f"x{i} = {i}" for i in range(5000))
    section = prompts.inspirations_section([parent(id=f"i{k}", source=long_source) for k in range(5)])
    assert section.count("### Inspiration") == prompts.MAX_INSPIRATIONS
    assert "characters cut] ..." in section and len(section) < 4 * prompts.INSPIRATION_CHARS
    errors = prompts.errors_section(["E" * 10_000 + "\nthe last line"] * 5)
    assert errors.count("```text") == prompts.MAX_ERRORS and "the last line" in errors


# -- the client: retries, timeouts, limits, tokens, secrets ----------------------------------------


def test_retries_429_with_retry_after_and_500_then_succeeds(server):
    server.script(error(429, "slow down", retry_after="0.3"), error(500, "overloaded"), answer("ok"))
    client = make_client(server)
    start = time.monotonic()
    assert client.complete(ask()).text == "ok"
    assert len(server.requests) == 3 and client.retries == 2
    assert server.requests[1].at - server.requests[0].at >= 0.29  # Retry-After honoured
    assert time.monotonic() - start < 2


def test_gives_up_after_max_retries(server):
    server.script(error(503, "down"), error(503, "down"))
    with pytest.raises(LLMError, match=r"HTTP 503 .*down \(gave up after 2 attempts\)") as info:
        make_client(server, max_retries=1).complete(ask())
    assert info.value.status == 503 and server.url in str(info.value)


@pytest.mark.parametrize("status", [400, 401, 404])
def test_no_retry_on_other_4xx(server, status):
    server.script(error(status, "model 'x' does not exist", retry_after="0"), answer("never sent"))
    with pytest.raises(LLMError, match=rf"LLM endpoint {server.url}/chat/completions: HTTP {status}") as info:
        make_client(server).complete(ask())
    assert "model 'x' does not exist" in str(info.value) and info.value.status == status
    assert len(server.requests) == 1


def test_generator_skips_a_proposal_whose_retries_ran_out(server):
    server.script(error(503, "down"), error(503, "down"), good("second"))
    proposals = make_generator(server, max_retries=1).propose(parent(), [], context(), n=2)
    assert [p.note for p in proposals] == ["second"]


def test_generator_raises_a_refused_request_at_once(server):
    server.script(error(401, "invalid key"))
    with pytest.raises(LLMError, match="HTTP 401"):
        make_generator(server).propose(parent(), [], context(), n=3)
    assert len(server.requests) == 1


def test_an_unusable_answer_costs_only_its_proposal(server):
    server.script(Reply(content=None, finish_reason="content_filter"), good("b"))
    proposals = make_generator(server).propose(parent(), [], context(), n=2)
    assert [p.note for p in proposals] == ["b"]
    server.script(Reply(content=None))
    with pytest.raises(LLMError, match=r"no message content \(finish_reason stop\)"):
        make_generator(server).propose(parent(), [], context(), n=1)


def test_timeout_is_an_error_naming_the_limit_and_is_retried(server):
    server.script(slow(3.0))
    start = time.monotonic()
    with pytest.raises(LLMError, match=r"no answer within 0.3 s \(llm.timeout_s\)"):
        make_client(server, timeout_s=0.3, max_retries=0).complete(ask())
    assert time.monotonic() - start < 1.5
    server.script(slow(3.0), answer("in time"))
    assert make_client(server, timeout_s=0.3, max_retries=1).complete(ask()).text == "in time"


def test_unreachable_endpoint_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens
    client = ChatClient(f"http://127.0.0.1:{port}/v1", "m", max_retries=1, backoff_s=0.01)
    with pytest.raises(LLMError, match=rf"127.0.0.1:{port}/v1/chat/completions: cannot connect.*gave up after 2"):
        client.complete(ask())


def test_redirects_are_not_followed(server):
    server.script(Reply(status=307, headers={"Location": "http://127.0.0.1:9/elsewhere"}, raw=b""))
    with pytest.raises(LLMError, match=r"HTTP 307 .*redirects are not followed: check llm.base_url"):
        make_client(server).complete(ask())
    assert len(server.requests) == 1


def test_an_answer_that_is_not_json_points_at_base_url(server):
    server.script(Reply(raw=b"<html>a web page</html>"))
    with pytest.raises(LLMError, match="not JSON.*is llm.base_url the API root"):
        make_client(server).complete(ask())


def test_rate_limit_spaces_requests(server):
    server.script(*[answer("ok")] * 4)
    client = make_client(server, requests_per_minute=600)  # one every 0.1 s
    sent, post = [], client._post
    client._post = lambda data: sent.append(time.monotonic()) or post(data)
    for _ in range(4):
        client.complete(ask())
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert all(gap >= 0.095 for gap in gaps), gaps
    # what the server saw, give or take the loopback's jitter on a busy machine
    assert server.requests[-1].at - server.requests[0].at >= 0.2


def test_rate_limiter_reserves_evenly_spaced_slots():
    now, slept = [100.0], []

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    limiter = RateLimiter(120, clock=lambda: now[0], sleep=sleep)  # one every 0.5 s
    assert [limiter.wait() for _ in range(3)] == [0.0, 0.5, 0.5]
    now[0] += 0.2  # some time passes: the next waits out the rest
    assert limiter.wait() == pytest.approx(0.3)
    now[0] += 5.0
    assert limiter.wait() == 0.0 and slept == [0.5, 0.5, pytest.approx(0.3)]
    assert RateLimiter(0).wait() == 0.0


def test_token_accounting_sums_usage(server):
    server.script(answer("a", 10, 5), answer("b", 7, 3), Reply(content="c"))  # the last reports no usage
    client = make_client(server)
    results = [client.complete(ask()) for _ in range(3)]
    assert results[0].usage.total_tokens == 15
    u = client.usage
    assert (u.requests, u.prompt_tokens, u.completion_tokens, u.total_tokens) == (3, 17, 8, 25)


def test_generator_usage_counts_repair_rounds(server):
    server.script(answer("no code", 1000, 10), good())
    gen = make_generator(server)
    gen.propose(parent(), [], context())
    assert gen.usage.requests == 2 and gen.usage.prompt_tokens == 1100 and gen.usage.completion_tokens == 60


def test_api_key_is_a_bearer_token_and_never_logged_or_raised(server, caplog):
    caplog.set_level(logging.DEBUG)
    # a 429 (logged retry), then a 401 whose message echoes the key, as some providers do
    server.script(error(429, f"rate limited for key {KEY}", retry_after="0"),
                  error(401, f"Incorrect API key provided: {KEY}"))
    gen = make_generator(server)
    with pytest.raises(LLMError) as info:
        gen.propose(parent(), [], context())
    assert all(r.headers["Authorization"] == f"Bearer {KEY}" for r in server.requests)
    assert KEY not in str(info.value) and "Incorrect API key provided: ****" in str(info.value)
    assert "retry 1 of 2" in caplog.text and KEY not in caplog.text
    assert KEY not in repr(gen) and KEY not in repr(gen.client)


def test_no_authorization_header_without_a_key(server):
    server.script(answer("ok"))
    make_client(server, api_key=None).complete(ask())
    assert "Authorization" not in server.requests[0].headers


# -- construction and settings ---------------------------------------------------------------------


def test_generator_without_base_url_is_a_clear_error():
    with pytest.raises(FarmError, match=r"llm generator needs llm.base_url"):
        LLMGenerator(model="m")
    with pytest.raises(FarmError, match=r"llm.base_url must be an http:// or https:// URL"):
        LLMGenerator(base_url="localhost:8000/v1", model="m")
    with pytest.raises(FarmError, match=r"unknown option\(s\) temprature"):
        LLMGenerator(base_url="http://127.0.0.1:1/v1", model="m", temprature=0.1)


def test_generator_takes_its_defaults_from_the_settings(server, monkeypatch):
    monkeypatch.setenv("FARM_LLM_BASE_URL", server.url)
    monkeypatch.setenv("FARM_LLM_MODEL", "served-model")
    monkeypatch.setenv("FARM_LLM_REQUESTS_PER_MINUTE", "0")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    server.script(good())
    gen = load_generator("llm", temperature=0.1)
    assert len(gen.propose(parent(), [], context())) == 1
    request = server.requests[0]
    assert request.body["model"] == "served-model" and request.body["temperature"] == 0.1
    assert request.headers["Authorization"] == f"Bearer {KEY}"


def test_llm_settings_alias_openai_variables_and_mask_the_key():
    settings, origin = load_settings(env={"OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": "http://h/v1"})
    assert settings.llm.api_key == KEY and origin["llm.api_key"] == "env OPENAI_API_KEY"
    assert settings.llm.base_url == "http://h/v1" and settings.llm.repair_rounds == 2
    rows = {r["key"]: r for r in describe(settings, origin)}
    assert rows["llm.api_key"]["value"] == "****" + KEY[-2:]
