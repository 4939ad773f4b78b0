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
