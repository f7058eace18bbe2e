"""What each install brings, and that `make demo` stays quiet.

pyproject.toml splits the dependencies: the runtime in `dependencies` (what `pip install .` and
`make demo` install), `[test]` and `[stack]` for the test suite (`make test`), `[bench]`,
`[lint]`, and `[dev]` = all of them. These tests keep each import in the right place.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
# Imported only when present, and degrading without them (documented in the README).
OPTIONAL_AT_RUNTIME = {"tiktoken"}


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _names(requirements: list[str]) -> set[str]:
    return {_name(r) for r in requirements}


def _third_party_imports(paths: list[Path]) -> dict[str, Path]:
    """Top-level modules imported by these files that are neither stdlib nor ours."""
    found: dict[str, Path] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in {"proxy", "tests", "__future__"}:
                    found.setdefault(top, path)
    return found


def _distributions(module: str) -> set[str]:
    dists = importlib.metadata.packages_distributions().get(module, [])
    return {d.lower().replace("_", "-") for d in dists}


def _closure(names: set[str]) -> set[str]:
    """These distributions and everything they require (extras aside), as installed."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo += [_name(r) for r in requires if "extra ==" not in r]
    return seen


def _unlisted(paths: list[Path], direct: set[str], local: set[str]) -> list[str]:
    """Imports whose distribution is not installed by `direct` (a dependency of one counts:
    aiohttp brings yarl and multidict, pydantic-settings brings pydantic)."""
    allowed = _closure(direct)
    bad = []
    for module, path in sorted(_third_party_imports(paths).items()):
        if module in OPTIONAL_AT_RUNTIME | local:
            continue
        dists = _distributions(module)
        if not dists & allowed:
            bad.append(f"{path.relative_to(ROOT)} imports {module} ({', '.join(sorted(dists)) or 'not installed'})")
    return bad


def test_the_runtime_needs_only_the_runtime_dependencies() -> None:
    runtime = _names(PROJECT["dependencies"])
    assert not _unlisted(sorted((ROOT / "proxy").rglob("*.py")), runtime, set())


def test_the_tests_need_only_runtime_test_and_stack() -> None:
    extras = PROJECT["optional-dependencies"]
    allowed = _names(PROJECT["dependencies"]) | _names(extras["test"]) | _names(extras["stack"])
    tests = [p for p in (ROOT / "tests").rglob("*.py") if "bench" not in p.relative_to(ROOT / "tests").parts]
    # modules the tests load from their own folders (sys.path): faultproxy, loadgen...
    local = {p.stem for p in (ROOT / "tests").rglob("*.py")} | {"loadgen", "conftest"}
    assert not _unlisted(tests, allowed, local)


def test_the_bench_needs_only_the_runtime_and_bench() -> None:
    extras = PROJECT["optional-dependencies"]
    allowed = _names(PROJECT["dependencies"]) | _names(extras["bench"])
    local = {p.stem for p in (ROOT / "tests" / "bench").glob("*.py")}
    assert not _unlisted(sorted((ROOT / "tests" / "bench").glob("*.py")), allowed, local)


def test_test_tools_stay_out_of_the_runtime_and_dev_has_everything() -> None:
    extras = PROJECT["optional-dependencies"]
    runtime = _names(PROJECT["dependencies"])
    for extra in ("test", "stack", "lint"):
        assert not (_names(extras[extra]) - {"pyyaml"}) & runtime, extra
    assert extras["dev"] == ["taotrace[test,stack,bench,lint]"]


def _recipes(makefile: str) -> dict[str, list[str]]:
    rules: dict[str, list[str]] = {}
    target = None
    for line in makefile.splitlines():
        if line.startswith("\t") and target is not None:
            rules[target].append(line[1:])
        elif re.match(r"^[^\s#][^=]*:", line) and ":=" not in line and "?=" not in line:
            target = line.split(":", 1)[0].strip()
            rules[target] = []
        else:
            target = None if not line.startswith("\t") else target
    return rules


def test_make_demo_and_its_install_steps_are_silent_on_stdout() -> None:
    rules = _recipes((ROOT / "Makefile").read_text())
    for target in ("$(PY)", "$(VENV)/.installed-runtime", "demo"):
        assert rules[target], target
        for line in rules[target]:
            assert line.startswith("@"), f"{target}: make would echo {line!r}"
            if "pip install" in line:
                assert line.endswith(">&2"), f"{target}: pip's output must go to stderr: {line!r}"


def test_make_demo_json_is_only_json_on_stdout() -> None:
    venv = Path(sys.prefix)
    stamp = venv / ".installed-runtime"  # -o: treat the install as done (this venv has it)
    result = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "demo",
            f"VENV={venv}",
            "-o",
            str(stamp),
            "ARGS=--once --json --time-scale 0.05",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [e["name"] for e in report["experiments"]] == ["input_length", "prefix_cache", "model_size", "reasoning"]


def _make_variables(makefile: str) -> dict[str, str]:
    joined = makefile.replace("\\\n", " ")  # a value continued over lines is one value
    return {m[1]: m[2].strip() for m in re.finditer(r"^([A-Z_]+) :?= (.*)$", joined, re.M)}


def _floor(requirements: list[str], name: str) -> str:
    """The `>=` version of `name` in these requirements (with `<2` as its ceiling)."""
    (found,) = [r for r in requirements if _name(r) == name]
    match = re.fullmatch(rf"{re.escape(name)}>=([\d.]+),<2", found)
    assert match, f"{found}: expected {name}>=X,<2"
    return match[1]


def test_the_opentelemetry_range_is_the_one_make_tests() -> None:
    """pyproject.toml's ranges start where `make test-otel-range`'s oldest venv pins them, and its
    newest venv is inside them; it installs no test tool that [test] does not list. The API, the
    SDK and the exporter package share their release numbers (the exporter pins the SDK's minor)."""
    make = _make_variables((ROOT / "Makefile").read_text())
    runtime, test = PROJECT["dependencies"], PROJECT["optional-dependencies"]["test"]
    for name in ("opentelemetry-api", "opentelemetry-sdk", "opentelemetry-exporter-otlp"):
        assert _floor(runtime, name) == make["OTEL_OLDEST"], name
        assert name in make["OTEL_PACKAGES"]
    oldest, newest = (tuple(int(p) for p in make[v].split(".")) for v in ("OTEL_OLDEST", "OTEL_NEWEST"))
    assert oldest < newest < (2,)
    assert set(make["OTEL_RANGE_TOOLS"].split()) <= _names(test)
    assert not {n for n in _names(test) if n.startswith("opentelemetry")}  # the runtime brings them all


def test_every_test_the_opentelemetry_range_runs_exists() -> None:
    """`make test-otel-range` names test files and tests: a name left behind by a rename would
    fail only there, after the whole suite."""
    make = _make_variables((ROOT / "Makefile").read_text())
    for entry in make["OTEL_RANGE_TESTS"].split():
        module, _, name = entry.partition("::")
        path = ROOT / module
        assert path.is_file(), entry
        assert not name or re.search(rf"^(async )?def {re.escape(name)}\(", path.read_text(), re.M), entry


def test_grpcio_comes_with_the_exporter_at_the_floor_the_oldest_end_tests() -> None:
    """No direct grpcio pin: the OTLP exporter package's gRPC exporter brings it, and its floor
    (for this Python) is the one `make test-otel-range`'s oldest venv installs."""
    make = _make_variables((ROOT / "Makefile").read_text())
    assert "grpcio" not in _names(PROJECT["dependencies"])
    assert "grpcio" in _closure({"opentelemetry-exporter-otlp"})
    requires = importlib.metadata.requires("opentelemetry-exporter-otlp-proto-grpc") or []
    grpcio = [r for r in requires if _name(r) == "grpcio"]
    here = [r.split(";", 1)[0] for r in grpcio if ";" not in r or _marker_holds(r.split(";", 1)[1])]
    floors = [re.findall(r">=\s*([\d.]+)", r) for r in here]
    assert floors == [[make["GRPCIO_OLDEST"]]]


def _marker_holds(marker: str) -> bool:
    """An environment marker of the form `python_version < '3.13'` (or ==, >=), for this Python."""
    found = re.fullmatch(r"\s*python_version\s*(<|==|>=)\s*'([\d.]+)'\s*", marker)
    assert found, marker
    here, there = sys.version_info[:2], tuple(int(p) for p in found[2].split("."))
    return {"<": here < there, "==": here == there, ">=": here >= there}[found[1]]
