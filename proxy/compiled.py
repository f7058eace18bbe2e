"""The optional compiled build: which modules mypyc compiles, and which of them this process runs compiled.

The pure-Python package is the reference and the fallback: `pip install .` compiles nothing.
With `TAOTRACE_COMPILE=1` the build (setup.py) compiles the modules below with mypyc, the
parsers and encoders that run once per event or once per request, into C extensions that are
imported in place of their `.py` files ([Performance](../docs/performance.md#the-compiled-build)).
The same tests run against both (`make test-compiled`).

A module belongs here only if it is pure (no I/O, no event loop), type-checked, and measured
to cost less compiled. mypyc enforces the annotations at run time and makes its classes final
and their instances closed to `object.__new__`: a class that a plug-in subclasses says so with
`mypyc_attr(allow_interpreted_subclasses=True)`, and `proxy.workers.plain` builds compiled
dataclasses through their `__init__`.
"""

from __future__ import annotations

import importlib
import importlib.machinery
from pathlib import Path

__all__ = ["MODULES", "compiled_modules"]

# Paths relative to the repository, as mypyc takes them (setup.py reads this tuple).
MODULES: tuple[str, ...] = (
    "proxy/dialects/sse.py",
    "proxy/exchange/outcome.py",
    "proxy/exchange/headers.py",
    "proxy/dialects/__init__.py",
    "proxy/dialects/chat.py",
    "proxy/dialects/completions.py",
    "proxy/dialects/content.py",
    "proxy/dialects/dialect.py",
    "proxy/dialects/embeddings.py",
    "proxy/dialects/messages.py",
    "proxy/dialects/reader.py",
    "proxy/dialects/registry.py",
    "proxy/dialects/responses.py",
    "proxy/telemetry/aggregate.py",
    "proxy/telemetry/exposition.py",
    "proxy/telemetry/otlp.py",
    "proxy/upstream/_cycle.py",
    "proxy/upstream/_request.py",
    "proxy/upstream/_response.py",
)


def _module_name(path: str) -> str:
    name = path.removesuffix(".py").replace("/", ".")
    return name.removesuffix(".__init__")


def compiled_modules() -> list[str]:
    """The modules of `MODULES` that this process imports from a C extension (imports them all)."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    found = []
    for path in MODULES:
        name = _module_name(path)
        origin = getattr(importlib.import_module(name), "__file__", None) or ""
        if origin.endswith(suffixes):
            found.append(name)
    return found


def main() -> None:
    """`python -m proxy.compiled`: which build this environment runs, and from where."""
    found = compiled_modules()
    print(
        f"{len(found)} of the {len(MODULES)} modules of the compiled build are compiled"
        + ("" if found else ": pure Python")
    )
    for name in found:
        print(f"  {name}")
    package = Path(importlib.import_module("proxy").__file__ or ".").resolve().parent
    print(f"taotrace imported from {package}")
    if package.parent == Path.cwd().resolve() and not found:
        # `python -m` puts the working directory first on sys.path: in a checkout, `proxy` is its .py files.
        print("  (the working directory's: to check the installed build, run this from another directory)")


if __name__ == "__main__":
    main()
