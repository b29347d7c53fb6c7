"""The package's shape, on any machine: no import circle inside scratchops, the operators apart
from the tools (scratchops.tools imports the library, never the other way), no module too long
to read in one sitting, and KernelBench's tolerance written once, so that the tolerance a
report prints is the one it used."""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "scratchops"
MAX_MODULE_LINES = 350


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_modules(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules that `name` imports anywhere in its file (in a function too): each
    imported name resolved to the longest module it names."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    targets = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: up level - 1 packages from this module's package
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([node.module] if node.module else []))
            targets += [f"{base}.{alias.name}" for alias in node.names]
    result = set()
    for target in targets:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            result.add(target)
    return result


def test_no_import_circle_in_the_package():
    known = modules()
    assert "scratchops" in known and "scratchops._library" in known  # the walk found the package
    graph = {name: imported_modules(name, path, known) for name, path in known.items()}
    assert "scratchops._fakes" in graph["scratchops._library"]  # and it sees relative imports

    def circle_from(start, seen=()):
        for dep in sorted(graph[start]):
            if dep in seen:
                return [*seen[seen.index(dep):], dep]
            found = circle_from(dep, (*seen, dep))
            if found:
                return found
        return None

    for name in sorted(graph):
        circle = circle_from(name, (name,))
        assert circle is None, " -> ".join(circle)


def test_the_operators_do_not_import_the_tools():
    known = modules()
    for name, path in known.items():
        if name.startswith("scratchops.tools") or name == "scratchops.__main__":
            continue  # (__main__ is the command line's entry point)
        uses = {m for m in imported_modules(name, path, known) if m.startswith("scratchops.tools")}
        assert not uses, (name, uses)


def test_no_module_over_the_length_limit():
    lengths = {path.relative_to(PACKAGE.parent).as_posix(): len(path.read_text().splitlines())
               for path in modules().values()}
    assert lengths
    assert {p: n for p, n in lengths.items() if n > MAX_MODULE_LINES} == {}


def test_the_tolerance_is_written_once():
    sites = [f"{path.relative_to(PACKAGE.parent).as_posix()}:{i}"
             for path in sorted(PACKAGE.rglob("*.py"))
             for i, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"1e-0?4\b|0\.0001\b", line)]
    assert len(sites) == 1 and sites[0].startswith("scratchops/tools/report.py:"), sites


# ------------------------------------------------------------------------ the kernel files
CUDA = PACKAGE.parent / "cuda"
MAX_KERNEL_FILE_LINES = 400
MAX_FUNCTION_LINES = 120
_CONTAINER = re.compile(r"\b(namespace|struct|class|union|enum)\b[^;()]*$|extern\s+\"C\"\s*$")


def _without_comments(text: str) -> str:
    """The text with comments and string literals blanked (newlines kept)."""
    def blank(match):
        return re.sub(r"[^\n]", " ", match.group(0))

    return re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"', blank, text, flags=re.S)


def function_lengths(text: str) -> dict[str, int]:
    """Lines of each function body of a C++ file (from its opening brace's line to its closing
    one's), member functions included, keyed by the function's header."""
    code = _without_comments(text)
    lengths, header_start = {}, 0
    i, containers = 0, 0  # containers: the namespace / struct bodies we are inside
    while i < len(code):
        ch = code[i]
        if ch in ";}":
            if ch == "}" and containers:
                containers -= 1
            header_start = i + 1
        elif ch == "{":
            header = code[header_start:i].strip()
            if _CONTAINER.search(header) or not header:
                containers += 1
                header_start = i + 1
            else:
                depth, j = 1, i + 1  # skip the block: a function body or an initialiser
                while depth and j < len(code):
                    depth += {"{": 1, "}": -1}.get(code[j], 0)
                    j += 1
                if "(" in header and not header.rstrip().endswith("="):
                    name = " ".join(header.split())[-90:]
                    lengths[name] = code.count("\n", i, j) + 1
                i, header_start = j, j
                continue
        elif ch == "#":  # a preprocessor line
            end = code.find("\n", i)
            i = len(code) if end < 0 else end
            header_start = i
            continue
        i += 1
    return lengths


def test_kernel_files_and_functions_stay_readable():
    # (binding.cpp, the one C++ file that includes torch, is one file by rule: its functions
    # are held to the limit, its length is not.)
    kernels = sorted([*CUDA.glob("*.cu"), *CUDA.glob("*.cuh"), *CUDA.glob("*.h")])
    assert len(kernels) > 10
    long_files = {f.name: n for f in kernels if (n := len(f.read_text().splitlines()))
                  > MAX_KERNEL_FILE_LINES}
    assert long_files == {}
    files = [*kernels, PACKAGE / "csrc" / "binding.cpp"]
    long_functions = {f"{f.name}: {name}": n for f in files
                      for name, n in function_lengths(f.read_text()).items()
                      if n > MAX_FUNCTION_LINES}
    assert long_functions == {}


def test_function_lengths_are_measured():
    text = ("namespace a {\nstruct S {\n  int f() {\n    return 1;\n  }\n};\n"
            "__global__ void k(int x) {\n  if (x) {\n  }\n}\nconstexpr int t[] = {1, 2};\n}\n")
    assert function_lengths(text) == {"int f()": 3, "__global__ void k(int x)": 4}
