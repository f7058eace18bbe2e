"""The package layout shows the design; these tests keep it that way.

    proxy/            the core: settings, app, forward, upstream, headers, sse, dialects, timing, ...
    proxy/telemetry/  spans, OTLP encoding, metrics, access log (fed finished records)
    proxy/ui/         the live view (ring of recent records, overview window, page + JSON API)
    proxy/tools/      demo, probe, doctor: clients of an endpoint
    proxy/sim/        the simulated upstream

The core never imports tools/ or sim/; sim/ imports nothing of the proxy but `proxy.server.lifecycle`
and `proxy.server.listen` (the process-lifetime and port-binding helpers every long-running command
shares); telemetry/ and ui/ never
import tools/ or sim/ (tools/demo may use ui/ to publish its experiments).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "proxy"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    # importlib.import_module("proxy.x") with a literal counts too (the CLI loads commands so)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("proxy."):
            found.add(node.value)
    return {name for name in found if name == "proxy" or name.startswith("proxy.")}


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ("tools", "sim", "telemetry", "ui"):
        return parts[1]
    return "core"


def _modules(layer: str) -> list[Path]:
    files = sorted(PKG.rglob("*.py"))
    return [f for f in files if _layer(".".join(("proxy", *f.relative_to(PKG).with_suffix("").parts))) == layer]


@pytest.mark.parametrize(
    "layer,forbidden", [("core", {"tools", "sim"}), ("telemetry", {"tools", "sim", "ui"}), ("ui", {"tools", "sim"})]
)
def test_lower_layers_never_import_tools_or_sim(layer: str, forbidden: set[str]) -> None:
    bad = []
    for path in _modules(layer):
        if path.name == "cli.py":
            continue  # the command line is the one place that names every command
        bad += [f"{path.relative_to(PKG)} imports {m}" for m in _imports(path) if _layer(m) in forbidden]
    assert not bad, bad


def test_sim_imports_nothing_of_the_proxy_but_lifecycle_and_listen() -> None:
    shared = ("proxy.server.lifecycle", "proxy.server.listen")
    bad = []
    for path in _modules("sim"):
        for module in _imports(path):
            if (
                _layer(module) != "sim"
                and module not in shared
                and not module.startswith(tuple(m + "." for m in shared))
            ):
                bad.append(f"{path.relative_to(PKG)} imports {module}")
    assert not bad, bad


def test_ui_ships_its_static_files_as_package_data() -> None:
    names = {p.name for p in (PKG / "ui" / "static").iterdir()}
    assert {"index.html", "app.js", "charts.js", "style.css"} <= names


def test_importing_the_parsers_does_not_load_the_server_or_opentelemetry() -> None:
    code = "import sys, proxy.dialects.sse, proxy.dialects; print(sorted(m for m in sys.modules if m.startswith(('opentelemetry', 'proxy.serve', 'aiohttp.web'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (anywhere in it, lazily too); packages' lazy
    attribute loaders (`proxy/__init__.py`) left out."""
    modules: dict[str, Path] = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = path.relative_to(PKG).with_suffix("").parts
        modules[".".join(("proxy", *(parts[:-1] if parts[-1] == "__init__" else parts)))] = path

    def module_of(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    return {m: {module_of(n) for n in _imports(p)} - {m, "proxy", ""} for m, p in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_serve_the_reporting_and_the_group_import_one_way() -> None:
    """serve.py, the composition root, chooses one process or a group; nothing it builds on
    imports it back (the supervisor once imported serve.py, which imported the supervisor)."""
    ours = ("proxy.serve", "proxy.server.serving", "proxy.reporting.reporting", "proxy.workers")
    bad = [c for c in _cycles(_import_graph()) if any(m.startswith(ours) for m in c)]
    assert not bad, bad


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
