"""A regular (non-editable) install carries the kernel sources: the wheel holds cuda/'s files
as scratchops/_cuda next to the binding, and an installed copy's scratchops._build finds them
there (the JIT build compiles from them on first use). The sdist carries cuda/ (MANIFEST.in).

Building runs pip with build isolation, as `pip install .` does: pip fetches setuptools for
the build, into an environment without torch, so a build that imported scratchops (setup.cfg's
`version = attr:` must be read statically) would fail here. Without a network, point pip at a folder holding a setuptools wheel
(PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR; scripts/fetch_build_wheels.sh fills .whl/ with one)."""

import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
KERNEL_FILES = sorted(p.name for p in (REPO / "cuda").iterdir()
                      if p.suffix in (".cu", ".cuh", ".h"))
# What a source distribution holds: the files the build reads.
SOURCE_FILES = ["setup.py", "setup.cfg", "pyproject.toml", "MANIFEST.in", "README.md"]


def pip(*args, cwd):
    result = subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, (
        f"pip {' '.join(args)} failed (without a network, see this file's docstring):\n"
        f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


@pytest.fixture(scope="module")
def source_tree(tmp_path_factory):
    """A copy of what the build reads (so it writes no build/ into the checkout)."""
    tree = tmp_path_factory.mktemp("src") / "scratchops-src"
    tree.mkdir()
    for name in SOURCE_FILES:
        shutil.copy2(REPO / name, tree / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "_cuda")
    shutil.copytree(REPO / "cuda", tree / "cuda", ignore=ignore)
    shutil.copytree(REPO / "scratchops", tree / "scratchops", ignore=ignore)
    return tree


@pytest.fixture(scope="module")
def wheel(source_tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    pip("wheel", "--no-deps", "-q", "-w", str(out), str(source_tree), cwd=out)
    (built,) = out.glob("scratchops-*.whl")
    return built


def test_the_wheel_holds_every_kernel_source_and_the_binding(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for name in KERNEL_FILES:
            assert f"scratchops/_cuda/{name}" in names, name
            assert archive.read(f"scratchops/_cuda/{name}") == (REPO / "cuda" / name).read_bytes()
        assert "scratchops/csrc/binding.cpp" in names
    assert KERNEL_FILES and "launchers.h" in KERNEL_FILES


def test_an_installed_wheel_finds_its_kernel_sources(wheel, tmp_path):
    target = tmp_path / "site"
    pip("install", "--no-deps", "--no-index", "-q", "--target", str(target), str(wheel),
        cwd=tmp_path)
    probe = ("import scratchops, scratchops._build as b; print(scratchops.__file__); "
             "print(b.cuda_dir()); print('\\n'.join(str(p) for p in b.kernel_sources()))")
    # Run away from the checkout, with the installed copy first on the path.
    env = {**os.environ, "PYTHONPATH": str(target)}
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    package_file, cuda_dir, *sources = (Path(line).resolve() for line in result.stdout.split())
    package = target.resolve() / "scratchops"
    assert package_file == package / "__init__.py"
    assert cuda_dir == package / "_cuda"
    assert sorted(p.name for p in cuda_dir.iterdir()) == KERNEL_FILES
    assert sources[0] == package / "csrc" / "binding.cpp"
    assert [s.name for s in sources[1:]] == [n for n in KERNEL_FILES if n.endswith(".cu")]
    assert all(s.is_file() and s.is_relative_to(package) for s in sources)


@pytest.mark.skipif(importlib.util.find_spec("setuptools") is None,
                    reason="setuptools is not installed in this environment")
def test_the_sdist_holds_cuda(source_tree, tmp_path):
    # setuptools' own sdist step, in a subprocess (torch depends on setuptools, so it is
    # usually there)
    script = "import setuptools.build_meta as b, sys; print(b.build_sdist(sys.argv[1]))"
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=source_tree,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    with tarfile.open(tmp_path / result.stdout.split()[-1]) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    assert {f"cuda/{n}" for n in KERNEL_FILES} <= names
    assert "scratchops/csrc/binding.cpp" in names
