"""Children through the forkserver (farm.runtime.children)."""

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_child_starts_under_a_temp_dir_too_deep_for_a_unix_socket(tmp_path):
    """The forkserver's socket lives under multiprocessing's temp dir; a TMPDIR whose path leaves
    no room for it ("AF_UNIX path too long": a test's or a batch scheduler's job folder) must not
    stop every child from starting."""
    deep = tmp_path / ("d" * 60) / ("e" * 40)
    deep.mkdir(parents=True)
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent("""
        from farm.runtime.children import run_in_child

        def answer(report):
            return 42

        if __name__ == "__main__":
            print(run_in_child(answer, (), timeout_s=120).status)
    """))
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin", "TMPDIR": str(deep), "PYTHONPATH": str(REPO),
                              "HOME": str(tmp_path)})
    assert res.stdout.strip() == "ok", res.stdout + res.stderr[-2000:]


def _interpreted_row_sum(report):
    """In the child: was torch._dynamo there before anything ran, and does an interpreted kernel
    that uses a Triton built-in (tl.sum) still run?"""
    import torch
    import triton
    import triton.language as tl

    preloaded = "torch._dynamo" in sys.modules

    @triton.jit
    def _row_sum(x_ptr, y_ptr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(y_ptr + tl.program_id(0), tl.sum(tl.load(x_ptr + offs), axis=0))

    x, y = torch.arange(8.0), torch.zeros(1)
    _row_sum[(1,)](x, y, BLOCK=8)
    return preloaded, y.item()


def test_an_interpreter_process_preloads_torch_dynamo_for_its_children_and_they_still_interpret(monkeypatch):
    """The suite runs under TRITON_INTERPRET=1 (tests/conftest.py), as a cpu worker does: each
    child would import torch._dynamo on its first op on the meta device (1.7 CPU-seconds), so the
    forkserver has; Triton, imported with it, is still the interpreter in the child."""
    from farm.runtime.children import preload, run_in_child

    outcome = run_in_child(_interpreted_row_sum, (), timeout_s=120, env={"TRITON_INTERPRET": "1"})
    assert outcome.ok and outcome.value == (True, 28.0), outcome.error
    assert preload() == ["torch", "torch._dynamo"]
    monkeypatch.delenv("TRITON_INTERPRET")  # elsewhere Triton must not be imported before a child's env
    assert preload() == ["torch"]
