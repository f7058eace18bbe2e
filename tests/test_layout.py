"""The package layout shows the design; these tests keep it that way.

Which package may import which is written as contracts in pyproject.toml (`[tool.importlinter]`,
the layers docs/development.md draws: a request's way from the command line down to the
dialects), checked here and by `make lint`; no module imports itself back through others.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp
import importlinter.cli  # noqa: F401 - configures import-linter's application, as its command does
from importlinter.application.use_cases import lint_imports

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "proxy"


def test_each_package_imports_only_the_layers_below_it() -> None:
    # The use case, not `importlinter.cli.lint_imports`: that one reconfigures logging for the
    # whole process (disabling every other logger). What it prints says which import broke which.
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), cache_dir=None, no_logo=True)


def test_no_module_imports_itself_back() -> None:
    """No import cycle anywhere in proxy/, however long (imports for type checking aside): none is
    broken by an import inside a function either, since those are imports too."""
    graph = grimp.build_graph("proxy", exclude_type_checking_imports=True, cache_dir=None)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while (w := stack.pop()) != v:
                component.add(w)
            if component:
                cycles.append({v, *component})

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    assert not cycles, cycles


def test_ui_ships_its_static_files_as_package_data() -> None:
    names = {p.name for p in (PKG / "ui" / "static").iterdir()}
    assert {"index.html", "app.js", "charts.js", "style.css"} <= names


def test_importing_the_parsers_does_not_load_the_server_or_opentelemetry() -> None:
    code = "import sys, proxy.dialects.sse, proxy.dialects; print(sorted(m for m in sys.modules if m.startswith(('opentelemetry', 'proxy.serve', 'aiohttp.web'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# What proxy/ may not import from OpenTelemetry: the metrics API (metrics are aggregated by our own
# code), an exporter by name (exporters other than our OTLP one are found by their entry points,
# as the SDK finds them), the protos and protobuf (we write the wire format ourselves). The SDK's
# public API is used (the resource, the exporters' interface). Tests use all of them, as references.
_NOT_AT_RUNTIME = (
    "opentelemetry.metrics",
    "opentelemetry.exporter",
    "opentelemetry.proto",
    "google.protobuf",
)


def _not_at_runtime(name: str) -> bool:
    return any(name == banned or name.startswith(banned + ".") for banned in _NOT_AT_RUNTIME)


def _private(name: str) -> bool:
    """A dotted name with a `_`-prefixed part (dunders aside): private to its package."""
    return any(part.startswith("_") and not part.endswith("__") for part in name.split("."))


def _opentelemetry_uses(path: Path) -> list[str]:
    """Every OpenTelemetry (or protobuf) name `path` imports, lazily too, and every attribute it
    reads through a module it imported so (`trace._TRACER_PROVIDER`), as dotted names."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    names: list[str] = []
    bound: dict[str, str] = {}  # local name -> the module it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names.append(alias.name)
                bound[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            for alias in node.names:
                names.append(f"{node.module}.{alias.name}")
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain = [node.attr]
            base: ast.expr = node.value
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in bound:
                names.append(".".join([bound[base.id], *reversed(chain)]))
    return [n for n in names if n.split(".")[0] in ("opentelemetry", "google")]


def test_the_proxy_uses_only_public_opentelemetry_names() -> None:
    """proxy/ uses the API and the SDK through their public names only (any release of
    pyproject.toml's range: a `_` name may change in any release), and no exporter, proto or
    protobuf module by name."""
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        for name in _opentelemetry_uses(path):
            if _not_at_runtime(name) or _private(name):
                bad.append(f"{path.relative_to(PKG)}: {name}")
    assert bad == []


def test_the_scan_finds_private_and_banned_names(tmp_path: Path) -> None:
    """The scan above catches each way a module can reach a private or banned name; the SDK's public ones pass."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from opentelemetry import trace\n"
        "import opentelemetry.context as ctx\n"
        "def f():\n"
        "    from opentelemetry.sdk.trace import TracerProvider\n"
        "    from opentelemetry.sdk.resources import _DEFAULT_RESOURCE\n"
        "    from opentelemetry.exporter.zipkin.json import ZipkinExporter\n"
        "    from opentelemetry.trace.span import _SPAN_ID_MAX_VALUE\n"
        "    from opentelemetry.util._decorator import _agnosticcontextmanager\n"
        "    return trace._TRACER_PROVIDER, ctx._RUNTIME_CONTEXT, trace.get_current_span, trace.__name__\n"
    )
    uses = _opentelemetry_uses(sample)
    flagged = sorted({n for n in uses if _not_at_runtime(n) or _private(n)})
    assert flagged == [
        "opentelemetry.context._RUNTIME_CONTEXT",
        "opentelemetry.exporter.zipkin.json",
        "opentelemetry.exporter.zipkin.json.ZipkinExporter",
        "opentelemetry.sdk.resources._DEFAULT_RESOURCE",
        "opentelemetry.trace._TRACER_PROVIDER",
        "opentelemetry.trace.span._SPAN_ID_MAX_VALUE",
        "opentelemetry.util._decorator",
        "opentelemetry.util._decorator._agnosticcontextmanager",
    ]
    assert {"opentelemetry.trace.get_current_span", "opentelemetry.sdk.trace.TracerProvider"} <= set(uses)
