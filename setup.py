"""The build: pyproject.toml says what taotrace is; this file only adds the optional compiled modules.

`pip install .` builds the pure-Python package. `TAOTRACE_COMPILE=1 pip install .` also compiles
the modules listed in proxy/compiled.py with mypyc into C extensions (it needs a C compiler and
Python's headers; pip fetches mypy, which brings mypyc, into the isolated build environment).
"""

from __future__ import annotations

import os

from setuptools import setup  # type: ignore[import-untyped]  # setuptools ships no types (types-setuptools would, for this one line)

from proxy.compiled import MODULES

MYPY = "mypy~=2.4.1"  # the compiler the compiled modules are tested with (`make test-compiled`), as [lint]

if os.environ.get("TAOTRACE_COMPILE") != "1":
    setup()
else:
    try:
        from mypyc.build import mypycify
    except ImportError:  # pip's first pass, asking what the build needs: it installs mypy, then builds
        setup(setup_requires=[MYPY])
    else:
        setup(ext_modules=mypycify(list(MODULES), opt_level="3"))
