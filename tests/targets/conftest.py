import subprocess
import sys
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parents[1] / "data" / "plugin_target"


@pytest.fixture(scope="session")
def plugin_target_path(tmp_path_factory) -> Path:
    """The plug-in target package installed the way pip installs any package, into a folder of its own."""
    where = tmp_path_factory.mktemp("plugin")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(where), str(PLUGIN)], check=True, capture_output=True)
    return where
