"""The README's commands are the ones CI runs, verbatim (so a green CI means they work on a
brand-new machine)."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def readme_commands():
    text = (REPO / "README.md").read_text()
    section = text.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, re.S)]


def ci_lines():
    return [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]


def test_readme_lists_torch_then_the_two_commands():
    torch_line, install_and_run, tests = readme_commands()
    assert torch_line == "python3 -m pip install torch"
    assert install_and_run.endswith(" && scratchops run")
    assert tests.startswith("python3 -m pytest")


def test_ci_runs_the_readme_install_step_and_test_command_verbatim():
    _, install_and_run, tests = readme_commands()
    install = install_and_run[: -len(" && scratchops run")]
    lines = ci_lines()
    assert install in lines and tests in lines
    assert lines.index(install) < lines.index(tests)
    # Nothing else installs what the README does not: only torch, the stand-in CUDA build.
    pip_lines = [line for line in lines if "pip install" in line and line != install]
    assert pip_lines == ["python3 -m pip install -q torch==2.13.0"]
