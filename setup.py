"""The build: pyproject.toml says what taotrace is; this file only adds the optional compiled modules.

`pip install .` builds the pure-Python package. With `TAOTRACE_COMPILE=1` the modules listed in
proxy/compiled.py are compiled with mypyc into C extensions. mypyc type-checks them as `make
lint` does (pyproject.toml's mypy settings), so the build runs in an environment that already
has taotrace's dependencies and the `[compile]` extra, without pip's build isolation (docs/deploy.md):

    pip install '.[compile]' && TAOTRACE_COMPILE=1 pip install --no-build-isolation --no-deps --force-reinstall .
"""

from __future__ import annotations

import os
import runpy
from pathlib import Path

from setuptools import setup  # type: ignore[import-untyped]  # setuptools ships no types (types-setuptools would, for this one line)

# Read as a file: the build runs this script without the source tree on sys.path.
MODULES: tuple[str, ...] = runpy.run_path(str(Path(__file__).resolve().parent / "proxy" / "compiled.py"))["MODULES"]

if os.environ.get("TAOTRACE_COMPILE") != "1":
    setup()
else:
    try:
        from mypyc.build import mypycify
    except ImportError:
        raise SystemExit(
            "TAOTRACE_COMPILE=1 needs mypy (which brings mypyc) where the build runs: pip install '.[compile]', "
            "then TAOTRACE_COMPILE=1 pip install --no-build-isolation --no-deps --force-reinstall ."
        ) from None
    setup(ext_modules=mypycify(list(MODULES), opt_level="3"))
