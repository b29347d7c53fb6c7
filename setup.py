"""Packaging: everything is in setup.cfg, but for one step. A regular (non-editable) install
also ships the kernel sources (written in the top-level cuda/) inside the package as
scratchops/_cuda, where scratchops._build finds them; an editable install reads cuda/ in the
checkout."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

KERNEL_SUFFIXES = (".cu", ".cuh", ".h")


class BuildPyWithKernels(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        source = Path(__file__).resolve().parent / "cuda"
        target = Path(self.build_lib) / "scratchops" / "_cuda"
        target.mkdir(parents=True, exist_ok=True)
        for path in source.iterdir():
            if path.suffix in KERNEL_SUFFIXES:
                shutil.copy2(path, target / path.name)


setup(cmdclass={"build_py": BuildPyWithKernels})
