"""The wheel carries the checkout's task folders and default config as package data
(farm/bundled/tasks/, farm/bundled/farm.yaml), so an installed `farm run` finds the demo source
with no checkout. They stay at the top of the checkout, where the README, the tests and the
images use them; only the built package gets a copy (farm.config looks in the checkout first).
Everything else is in pyproject.toml."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
BUNDLED = {"tasks": "**/*.py", "configs": "farm.yaml"}  # checkout folder: what the wheel takes of it


class BuildPyWithBundledData(build_py):
    def run(self):
        super().run()
        if self.editable_mode:  # an editable install reads the checkout itself
            return
        for folder, pattern in BUNDLED.items():
            for source in sorted((ROOT / folder).glob(pattern)):
                if "__pycache__" in source.parts:
                    continue
                relative = source.relative_to(ROOT / folder)
                dest = Path(self.build_lib, "farm", "bundled", *(("tasks",) if folder == "tasks" else ()), relative)
                self.mkpath(str(dest.parent))
                self.copy_file(str(source), str(dest))


setup(cmdclass={"build_py": BuildPyWithBundledData})
