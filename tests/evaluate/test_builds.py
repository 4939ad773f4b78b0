"""The trusted builder of Triton's C helpers (farm.evaluate.builds, farm.evaluate.build_client):
one compile per source for the evaluator's life, run outside every candidate, in a sandbox
that sees nothing a runner does not, and an entry reaches a runner only when its own request
hashes the same."""

import importlib.util
import json
import os
import shutil
import socket
import sysconfig

import pytest

from farm.evaluate import build_client, builds, sandbox, wire
from farm.evaluate.forkserver import ForkedChild, ForkServer
from farm.evaluate.runner import Limits, Runner
from farm.targets import resolve_device

pytestmark = pytest.mark.skipif(not os.environ.get("CI") and (shutil.which("bwrap") is None or shutil.which("gcc") is None),
                                reason="bubblewrap or gcc is not installed (CI=true makes this a failure)")

MODULE = r'''
#define PY_SSIZE_T_CLEAN
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(%d); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "%s", NULL, -1, methods};
PyMODINIT_FUNC PyInit_%s(void) { return PyModule_Create(&mod); }
'''


def _source(value: int, name: str = "helper") -> str:
    return MODULE % (value, name, name)


def _answer(so: bytes, folder, name: str = "helper") -> int:
    path = folder / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    path.write_bytes(so)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.answer()


@pytest.fixture
def builder():
    found = sandbox.probe()
    assert found.on, found.why
    return builds.Builder(found)


def _request(value: int, **extra) -> builds.Request:
    return builds.Request.parse(json.dumps({"name": "helper", "source": _source(value), **extra}).encode())


def test_a_helper_is_compiled_once_and_a_different_source_never_gets_its_entry(builder, tmp_path):
    first = builder.get(_request(41))
    assert builder.get(_request(41)) == first and (builder.builds, builder.hits) == (1, 1)
    other = builder.get(_request(7))  # the same name, another source: its own compile
    assert builder.builds == 2
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert _answer(first, tmp_path / "a") == 41 and _answer(other, tmp_path / "b") == 7


def test_the_compile_sees_no_host_file_a_runner_could_not(builder, tmp_path):
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "creds.h").write_text('#error "AKIA-HOST-SECRET"\n')
    req = builds.Request.parse(json.dumps({"name": "helper", "source": '#include "creds.h"\n',
                                           "include_dirs": [str(secret)]}).encode())
    with pytest.raises(builds.Refused) as caught:
        builder.get(req)
    assert "AKIA-HOST-SECRET" not in str(caught.value) and "creds.h" in str(caught.value)


@pytest.mark.parametrize("body", [b"[]", b"{", json.dumps({"name": "../x", "source": ""}).encode(),
                                  json.dumps({"name": "h", "source": "", "libraries": ["a"] * 40}).encode(),
                                  json.dumps({"name": "h", "source": "", "language": "fortran"}).encode()])
def test_malformed_requests_are_refused(body):
    with pytest.raises(builds.Refused):
        builds.Request.parse(body)


def _ask(sock, payload: bytes) -> tuple[dict, bytes]:
    wire.send_frame(sock, payload)
    deadline = 10 ** 9
    return json.loads(wire.recv_frame(sock, 1 << 20, deadline)), wire.recv_frame(sock, 1 << 30, deadline)


def test_one_runner_gets_a_bounded_number_of_answers_and_an_oversized_request_ends_its_channel(builder, monkeypatch):
    monkeypatch.setattr(builds, "MAX_BUILDS", 2)
    ours, theirs = socket.socketpair()
    thread = builds.serve(ours, builder)
    assert _ask(theirs, b"nonsense")[0]["ok"] is False
    assert _ask(theirs, b"nonsense")[0]["ok"] is False
    thread.join(10)  # two answered: its channel is closed, the runner compiles for itself
    assert not thread.is_alive()
    with pytest.raises((EOFError, OSError)):
        _ask(theirs, b"nonsense")
    ours, theirs = socket.socketpair()
    thread = builds.serve(ours, builder)
    theirs.sendall((1 << 40).to_bytes(8, "big"))  # a frame of a terabyte announced: not read
    thread.join(10)
    assert not thread.is_alive() and theirs.recv(1) == b""


def test_the_runner_side_hook_uses_the_builder_and_its_own_compiler_once_the_builder_is_gone(builder, tmp_path):
    ours, theirs = socket.socketpair()
    builds.serve(ours, builder)
    impl = build_client._Impl(theirs)
    for value, folder in ((5, tmp_path / "built"), (6, tmp_path / "own")):
        folder.mkdir()
        src = folder / "helper.c"
        src.write_text(_source(value))
        so = impl("helper", str(src), str(folder), [], [], [])
        assert _answer(open(so, "rb").read(), folder) == value
        ours.close()  # the builder gone: the second is the runner's own compile
    assert builder.builds == 1 and impl.sock is None


COMPILE = r'''
import os
from triton.runtime.build import compile_module_from_src
mod = compile_module_from_src(src=%r, name="helper")
raise RuntimeError(f"ANSWER {mod.answer()} FROM {os.environ.get('TRITON_CACHE_DIR')}")
'''


@pytest.mark.parametrize("forked", [False, True])
def test_runners_get_their_helpers_from_the_builder_and_the_second_runner_compiles_nothing(forked):
    found = sandbox.probe()
    spec = resolve_device("cpu")
    builder = builds.builder_for(found, spec.target.sandbox_paths())
    before = (builder.builds, builder.hits)
    value = 1000 + os.getpid() % 1000 + 1000 * forked  # a source no earlier test built
    limits = Limits(start_s=90, compile_s=60, run_s=10, time_s=20, host_memory_mb=4096, log_mb=64, scratch_mb=64,
                    tmp_mb=32, tasks=64)
    server = ForkServer(spec, limits, found) if forked else None  # not among those the process lends
    try:
        if server is not None:
            server.start()
        for _ in range(2):
            box = Runner(spec, limits, found)
            if server is not None:
                server.busy, box.server = True, server
            try:
                box.start()
                assert isinstance(box.proc, ForkedChild) == forked
                reply = box.call("load_source", 60, source=COMPILE % _source(value), init_inputs=[])
                assert f"ANSWER {value}" in str(reply.get("error")), reply
            finally:
                box.close()
    finally:
        if server is not None:
            server.close()
    assert (builder.builds - before[0], builder.hits - before[1]) == (1, 1)


def test_a_socket_closed_under_the_builders_wait_ends_its_thread_quietly():
    """A runner killed while its builder thread waits closes the socket under it: the wait
    ends, with no exception left to the thread (select on a closed socket raises ValueError)."""
    import socket

    from farm.evaluate import builds

    ours, theirs = socket.socketpair()
    theirs.close()
    ours.close()
    assert builds._serve(ours, lambda request: b"") is None
