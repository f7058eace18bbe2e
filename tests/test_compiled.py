"""The optional compiled build's list of modules, and what the code does so that they can be compiled.

`make test-compiled` runs the whole suite against the compiled modules (tests/conftest.py's
`--compiled` fails the run unless every listed module is a C extension); `make test` against the
pure package (and fails if any of them is compiled).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import marshal
import pickle
import random
from pathlib import Path

import pytest

from proxy.compiled import MODULES
from proxy.dialects import Usage
from proxy.outcome import Outcome
from proxy.sse import SSEEvent
from proxy.workers.plain import Plain, copy_with
from tests.fakes import record_for

ROOT = Path(__file__).resolve().parent.parent


def test_the_listed_modules_are_files_of_the_package_once_each() -> None:
    assert len(set(MODULES)) == len(MODULES)
    for path in MODULES:
        assert path.startswith("proxy/") and path.endswith(".py"), path
        assert (ROOT / path).is_file(), path


def test_no_listed_module_does_io_or_runs_an_event_loop() -> None:
    """Compiled code is the parsers and encoders, fed by the I/O code that stays Python."""
    io = {"asyncio", "socket", "aiohttp", "subprocess", "selectors", "ssl"}
    for path in MODULES:
        tree = ast.parse((ROOT / path).read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            assert not {n.split(".")[0] for n in names} & io, f"{path} imports {names}"


def test_setup_builds_the_modules_of_the_list() -> None:
    text = (ROOT / "setup.py").read_text()
    assert '"proxy" / "compiled.py"' in text and "mypycify(list(MODULES)" in text


@dataclasses.dataclass(frozen=True)
class _Inner:
    a: int
    b: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Outer:
    inner: _Inner | None
    many: tuple[_Inner, ...]
    n: float


def test_the_plain_form_builds_a_class_without_slots_through_its_init() -> None:
    """A class mypyc compiled has no slot descriptors and refuses `object.__new__`, as a frozen
    dataclass without slots does: both are built through `__init__`, keyword by keyword."""
    form = Plain(_Outer)
    obj = _Outer(inner=_Inner(1, "x"), many=(_Inner(2), _Inner(3, "y")), n=0.5)
    back = form.decode(marshal.loads(marshal.dumps(form.encode(obj))))
    assert back == obj and type(back.inner) is _Inner
    assert copy_with(form, obj, n=2.0) == dataclasses.replace(obj, n=2.0)


def _frozen_classes() -> list[tuple[str, ast.ClassDef]]:
    found = []
    for path in MODULES:
        for node in ast.walk(ast.parse((ROOT / path).read_text())):
            if isinstance(node, ast.ClassDef) and any("frozen=True" in ast.unparse(d) for d in node.decorator_list):
                found.append((path, node))
    return found


def test_every_compiled_frozen_class_is_rebuilt_through_init() -> None:
    """Compiled, a frozen dataclass refuses pickle's and copy's field-by-field setattr: each one
    the build compiles says `__reduce__` (proxy/frozen.py)."""
    classes = _frozen_classes()
    assert len(classes) >= 5
    missing = [
        f"{path}: {node.name}"
        for path, node in classes
        if not any(isinstance(f, ast.FunctionDef) and f.name == "__reduce__" for f in node.body)
    ]
    assert not missing, missing


def test_a_record_and_the_frozen_values_it_is_made_of_pickle_and_copy() -> None:
    """Code that embeds the proxy may pickle a record or copy it, whichever build it runs on (a
    compiled frozen class is rebuilt through `__init__`, not set field by field)."""
    from proxy.dialects import DIALECTS
    from proxy.outcome import Facts
    from proxy.telemetry.aggregate import AttributeSet

    record = dataclasses.replace(record_for("chat_completions", "m", 200, random.Random(1)), usage=Usage(1, 2, 3, 4, 5))
    chat = DIALECTS.for_path("/v1/chat/completions")
    assert chat is not None
    values = [
        record,
        record.usage,
        SSEEvent("message", b"{}", "7"),
        Outcome(502, "stream_cut", True),
        Facts(status=200, refused=None, end="complete"),
        chat,
        chat.inspect(b'{"model": "m", "stream": true, "temperature": 0.5}'),
        AttributeSet.of({"api": "chat"}),
    ]
    for value in values:
        assert pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)) == value
        assert copy.deepcopy(value) == value and copy.copy(value) == value


def test_the_check_says_which_build_runs_and_from_where(capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m proxy.compiled`, as deploy.md has users run it after installing."""
    import proxy
    from proxy import compiled

    compiled.main()
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{len(compiled.compiled_modules())} of the {len(MODULES)} modules")
    assert f"taotrace imported from {Path(proxy.__file__).resolve().parent}" in out
