"""The aiohttp release whose internals proxy/exchange/protocol.py relies on, and those internals.

An upgrade must be deliberate: when the installed aiohttp is another minor release, or a private
name listed in proxy/exchange/protocol.py (`AIOHTTP_INTERNALS`) is gone, this fails, naming it. Then re-read
the names in the new release, rerun tests/adversarial/test_smuggling.py, and move
`AIOHTTP_VERIFIED` and pyproject.toml's pin.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import re
from pathlib import Path

import pytest
from aiohttp import abc, http_exceptions, web

from proxy.exchange.protocol import AIOHTTP_INTERNALS, AIOHTTP_VERIFIED, GuardedAppRunner, refusal_for

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")

ROOT = Path(__file__).resolve().parent.parent


def test_installed_aiohttp_is_the_verified_release() -> None:
    installed = importlib.metadata.version("aiohttp")
    assert ".".join(installed.split(".")[:2]) == AIOHTTP_VERIFIED, (
        f"aiohttp {installed} installed, but proxy/exchange/protocol.py's internals were verified against "
        f"{AIOHTTP_VERIFIED}: read its docstring before upgrading"
    )


def test_pyproject_pins_the_verified_minor_version() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = [d.replace(" ", "") for d in deps if re.match(r"aiohttp\b", d)]
    assert len(pins) == 1, pins
    m = re.fullmatch(r"aiohttp~=(\d+\.\d+)\.\d+", pins[0])
    assert m, f"{pins[0]}: pin aiohttp as ~=X.Y.Z (compatible within the verified minor)"
    assert m.group(1) == AIOHTTP_VERIFIED


async def test_every_listed_internal_is_where_proxy_protocol_expects_it() -> None:
    checked: dict[str, bool] = {}
    checked["web.AppRunner._make_server"] = inspect.iscoroutinefunction(getattr(web.AppRunner, "_make_server", None))
    runner = GuardedAppRunner(web.Application(), handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        server = runner.server
        assert server is not None
        # The override ran: the runner's server is ours, built from aiohttp's own.
        assert type(server).__name__ == "_GuardedServer" and server.handler_cancellation is True
        checked["web.Server._kwargs"] = isinstance(getattr(server, "_kwargs", None), dict)
        checked["web.Server._loop"] = getattr(server, "_loop", None) is not None
        for name in ("request_handler", "request_factory"):
            checked[f"web.Server.{name}"] = callable(getattr(server, name, None))
        checked["web.Server.handler_cancellation"] = hasattr(server, "handler_cancellation")
        checked["web.Server.__call__"] = isinstance(server(), web.RequestHandler)
        checked["web.Server.pre_shutdown"] = callable(getattr(web.Server, "pre_shutdown", None))
    finally:
        await runner.cleanup()
    params = list(inspect.signature(web.RequestHandler.handle_error).parameters)
    checked["web.RequestHandler.handle_error"] = params == ["self", "request", "status", "exc", "message"]
    checked["web.BaseRequest.writer.output_size"] = isinstance(
        inspect.getattr_static(web.BaseRequest, "writer", None), property
    ) and hasattr(abc.AbstractStreamWriter, "output_size")
    err = http_exceptions.BadHttpMessage("Invalid header value char:\n\n  b'X: \\x00'\n     ^")
    checked["http_exceptions.HttpProcessingError.message"] = (
        isinstance(err, http_exceptions.HttpProcessingError)
        and isinstance(getattr(err, "message", None), str)
        and refusal_for(err).message == "malformed HTTP request (Invalid header value char); nothing was forwarded"
    )
    checked["http_exceptions.LineTooLong"] = issubclass(
        http_exceptions.LineTooLong, http_exceptions.HttpProcessingError
    )
    # RelayedResponse: the flag exists (True on StreamResponse) and is what decides the send.
    checked["web.StreamResponse._send_headers_immediately"] = getattr(
        web.StreamResponse, "_send_headers_immediately", None
    ) is True and "self._send_headers_immediately" in inspect.getsource(web.StreamResponse._write_headers)
    assert sorted(checked) == sorted(AIOHTTP_INTERNALS), "every name listed is checked here, and only those"
    missing = [name for name, ok in checked.items() if not ok]
    assert not missing, f"aiohttp internals proxy/exchange/protocol.py relies on are gone or changed: {missing}"
