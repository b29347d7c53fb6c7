"""The README tells the truth: its commands are the ones CI runs, verbatim (so a green CI
means they work on a brand-new machine), the install hint printed by scratchops is the
README's, and its operator table lists what is registered."""

import ast
import inspect
import re
from pathlib import Path

import scratchops
from scratchops import _build, _library

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
RUN = " && scratchops run"


def readme_commands():
    section = README.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, re.S)]


def commands(path):
    """The commands of a shell script: its lines without comments and blank lines."""
    lines = (line.split(" #", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def test_readme_lists_torch_then_the_two_commands():
    torch_line, install_and_run, tests = readme_commands()
    assert torch_line == "python3 -m pip install torch"
    assert install_and_run == "python3 -m pip install -e ." + RUN
    assert tests == "python3 -m pytest tests -q -rs"


def test_ci_runs_the_readme_install_step_and_test_command_verbatim():
    # Exactly these commands, in this order: a fresh virtual environment, the CPU build of
    # torch in it (the stand-in for the CUDA build the README installs first), then the
    # README's install step (before `&& scratchops run`, which needs a GPU) and its test
    # command. Anything else .ci/run would install, or any drift of either side, fails here.
    _, install_and_run, tests = readme_commands()
    assert commands(REPO / ".ci" / "run") == [
        "set -euo pipefail",
        'cd "$(dirname "$0")/.."',
        'VENV="$(mktemp -d)/venv"',
        'python3 -m venv "$VENV"',
        '. "$VENV/bin/activate"',
        "python3 -m pip install -q torch==2.13.0",
        install_and_run.removesuffix(RUN),
        tests,
    ]


def test_gpu_check_installs_with_the_readme_command():
    _, install_and_run, _ = readme_commands()
    script = (REPO / "scripts" / "gpu_check.sh").read_text()
    steps = re.findall(r"run_step install \d+ (.*?) ;;", script)
    assert [step.replace("$PY", "python3") for step in steps] == [install_and_run.removesuffix(RUN)]


def test_the_install_hint_is_the_readmes():
    torch_line, install_and_run, _ = readme_commands()
    hint = _build.INSTALL_HINT
    assert f"`{torch_line}`" in hint and f"`{install_and_run.removesuffix(RUN)}`" in hint
    assert "https://pytorch.org/get-started/locally/" in README and \
        "https://pytorch.org/get-started/locally/" in hint


def operator_table():
    """(function name, operator names) per row of the README's operator table."""
    section = README.split("## Operators", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    table = []
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split(" | ")]
        function = re.match(r"`(\w+)\(", cells[0]).group(1)
        table.append((function, re.findall(r"`(\w+)`", cells[2])))
    return table


# The public callables that are not operators: the build and the tensor-core engine setting.
NOT_OPERATORS = ("is_available", "load", "why_unavailable", "set_tensor_core_path",
                 "get_tensor_core_path", "tensor_core_path", "tensor_core_engine")


def test_the_operator_table_matches_what_is_registered():
    table = operator_table()
    functions = [function for function, _ in table]
    assert sorted(functions) == sorted(name for name in scratchops.__all__
                                       if callable(getattr(scratchops, name)) and
                                       name not in NOT_OPERATORS)
    named = {op for _, ops in table for op in ops}
    assert named == set(_library.SCHEMAS)
    # A function named like an operator runs that operator.
    for function, ops in table:
        if function in _library.SCHEMAS:
            assert ops == [function], (function, ops)


def test_the_operator_table_shows_each_functions_signature():
    # Parameter names, kinds (keyword-only after `*`) and defaults, as the functions have them.
    section = README.split("## Operators", 1)[1].split("\n## ", 1)[0]
    cells = [row.strip("|").split(" | ")[0].strip().strip("`")
             for row in section.splitlines() if row.startswith("| `")]
    required = object()
    for cell in cells:
        written = ast.parse(f"def {cell}: pass").body[0].args
        positional = [(a.arg, required) for a in written.args]
        for i, default in enumerate(written.defaults, len(positional) - len(written.defaults)):
            positional[i] = (positional[i][0], eval(compile(ast.Expression(default), cell,
                                                            "eval"), {}))
        keyword = [(a.arg, required if d is None else eval(compile(ast.Expression(d), cell,
                                                                   "eval"), {}))
                   for a, d in zip(written.kwonlyargs, written.kw_defaults)]
        parameters = inspect.signature(getattr(scratchops, cell.split("(")[0])).parameters
        actual = [(p.name, required if p.default is p.empty else p.default, p.kind)
                  for p in parameters.values()]
        kinds = [inspect.Parameter.POSITIONAL_OR_KEYWORD] * len(positional) + \
            [inspect.Parameter.KEYWORD_ONLY] * len(keyword)
        assert [(n, d, k) for (n, d), k in zip(positional + keyword, kinds)] == actual, cell


def test_no_word_a_user_cannot_act_on():
    # (the GPU machine this project borrows for its checks means nothing to a user)
    for pattern in (r"\blent\b", r"device machine", r"--no-build-isolation"):
        assert not re.search(pattern, README), pattern
