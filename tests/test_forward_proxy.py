"""Behind a corporate proxy: `HTTPS_PROXY` / `HTTP_PROXY` / `NO_PROXY` as curl, requests and
aiohttp read them, a CONNECT tunnel for https upstreams (TLS end to end, checked against a
throwaway CA), absolute-form requests for http ones, Basic credentials sent and never shown,
the tunnel timed inside `connect`, and clear 502s when the forward proxy refuses or is down.
Against a real forward proxy on port 0 (tests/forwardproxy.py)."""

from __future__ import annotations

import base64
import logging
import socket
import ssl
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import trustme
from aiohttp import web
from yarl import URL

from proxy.config.envproxy import ForwardProxy, bypassed, forward_proxy_for
from proxy.config.settings import Settings
from proxy.exchange.record import RequestRecord
from proxy.exchange.timing import PhaseClock
from proxy.serve import run as serve_run
from proxy.serve import running
from proxy.upstream import UpstreamPool
from tests.forwardproxy import ForwardProxyServer

PASSWORD = "pa:ss@w0rd-CANARY"  # characters that need quoting in a URL
QUOTED = "pa%3Ass%40w0rd-CANARY"


# --- the environment, read as the usual clients read it ---------------------------------------


@pytest.mark.parametrize(
    ("upstream", "environ", "expected"),
    [
        ("https://api.example.com", {"HTTPS_PROXY": "http://proxy.corp:3128"}, ("proxy.corp", 3128, "HTTPS_PROXY")),
        ("https://api.example.com", {"https_proxy": "proxy.corp"}, ("proxy.corp", 80, "https_proxy")),  # curl: no scheme = http, port 80
        ("https://api.example.com", {"HTTPS_PROXY": "http://a:1", "https_proxy": "http://b:2"}, ("b", 2, "https_proxy")),
        ("https://api.example.com", {"HTTP_PROXY": "http://p:1"}, None),  # HTTP_PROXY is for http upstreams
        ("http://api.example.com", {"HTTP_PROXY": "http://p:1"}, ("p", 1, "HTTP_PROXY")),
        ("http://api.example.com", {"http_proxy": "http://q:2", "HTTP_PROXY": "http://p:1"}, ("q", 2, "http_proxy")),
        ("http://api.example.com", {"HTTPS_PROXY": "http://p:1"}, None),
        ("https://api.example.com", {"ALL_PROXY": "http://p:1"}, None),  # not read, as aiohttp's trust_env
        ("https://api.example.com", {"HTTPS_PROXY": "  "}, None),
        ("https://api.example.com", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "example.com"}, None),
        ("https://api.example.com", {"HTTPS_PROXY": "http://p:1", "no_proxy": "other.com", "NO_PROXY": "*"}, ("p", 1, "HTTPS_PROXY")),  # lower-case wins
        ("https://127.0.0.1:8443", {"HTTPS_PROXY": "http://p:1"}, None),  # loopback: always direct
        ("https://localhost", {"HTTPS_PROXY": "http://p:1"}, None),
        ("http://[::1]:8000", {"HTTP_PROXY": "http://p:1"}, None),
        ("https://[2001:db8::1]", {"HTTPS_PROXY": "http://[fd00::5]:3128"}, ("fd00::5", 3128, "HTTPS_PROXY")),
    ],
)  # fmt: skip
def test_which_variable_applies(upstream: str, environ: dict[str, str], expected: tuple[str, int, str] | None) -> None:
    found = forward_proxy_for(URL(upstream), environ)
    assert (None if found is None else (found.host, found.port, found.variable)) == expected


@pytest.mark.parametrize(
    ("host", "port", "no_proxy", "direct"),
    [
        ("api.example.com", 443, "", False),
        ("api.example.com", 443, "*", True),
        ("api.example.com", 443, "example.com", True),  # a name matches its subdomains...
        ("example.com", 443, "example.com", True),  # ...and itself
        ("api.example.com", 443, ".example.com", True),  # a leading dot changes nothing (curl, requests)
        ("example.com", 443, ".example.com", True),
        ("badexample.com", 443, "example.com", False),  # whole labels only
        ("API.Example.COM", 443, "example.com", True),  # case-insensitive
        ("api.example.com", 443, "foo.org, example.com", True),  # commas and spaces
        ("api.example.com", 443, "foo.org example.com", True),
        ("api.example.com", 443, "example.com:443", True),  # name:port matches that port only
        ("api.example.com", 8443, "example.com:443", False),
        ("10.1.2.3", 80, "10.1.2.3", True),
        ("10.1.2.3", 80, "10.1.2.4", False),
        ("10.1.2.3", 80, "10.0.0.0/8", True),  # CIDR (requests, curl >= 7.86, Go)
        ("11.1.2.3", 80, "10.0.0.0/8", False),
        ("10.1.2.3", 8080, "10.1.2.3:8080", True),
        ("2001:db8::1", 443, "2001:db8::/32", True),
        ("2001:db8::1", 443, "[2001:db8::1]:443", True),
        ("2001:db8::1", 443, "2001:db8::1", True),
        ("127.0.0.1", 80, "", True),  # loopback: always direct (Go's rule)
        ("127.9.9.9", 80, "", True),
        ("::1", 80, "", True),
        ("localhost", 80, "", True),
        ("0.0.0.0", 8788, "", True),  # unspecified: this machine (a server bound to all interfaces)
        ("::", 8788, "", True),
        ("api.example.com", 443, ",, ,", False),
        ("api.example.com", 443, "*.example.com", False),  # no wildcards inside names (curl, urllib)
    ],
)  # fmt: skip
def test_no_proxy_matching(host: str, port: int, no_proxy: str, direct: bool) -> None:
    assert bypassed(host, port, no_proxy) is direct


def test_credentials_become_basic_auth_and_are_never_shown() -> None:
    found = forward_proxy_for(URL("https://api.example.com"), {"HTTPS_PROXY": f"http://me%40corp:{QUOTED}@proxy:8080"})
    assert found is not None and found.shown == "http://proxy:8080"
    assert found.authorization == "Basic " + base64.b64encode(f"me@corp:{PASSWORD}".encode()).decode()
    assert PASSWORD not in repr(found) and QUOTED not in repr(found) and "CANARY" not in found.where


@pytest.mark.parametrize("raw", ["socks5://user:secret-CANARY@p:1080", "https://user:secret-CANARY@p:443", "http://"])
def test_an_unusable_proxy_url_is_refused_by_name(raw: str) -> None:
    with pytest.raises(ValueError, match="HTTPS_PROXY") as caught:
        forward_proxy_for(URL("https://api.example.com"), {"HTTPS_PROXY": raw})
    assert "CANARY" not in str(caught.value)


def test_serve_refuses_an_unusable_proxy_at_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "socks5://user:secret-CANARY@p:1080")
    with caplog.at_level(logging.ERROR):
        assert serve_run(Settings(upstream="https://api.example.com", port=0, metrics_port=0)) == 2
    assert "only http:// forward proxies are supported" in caplog.text and "CANARY" not in caplog.text


# --- through a real forward proxy ---------------------------------------------------------------


@pytest.fixture
async def tls_upstream(ca: trustme.CA) -> AsyncIterator[int]:
    """An HTTPS server for `upstream.test` (a name only the forward proxy knows)."""
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("upstream.test").configure_cert(server_ctx)
    runner = await _app_runner(server_ctx)
    yield runner.addresses[0][1]
    await runner.cleanup()


@pytest.fixture
async def plain_upstream() -> AsyncIterator[int]:
    runner = await _app_runner(None)
    yield runner.addresses[0][1]
    await runner.cleanup()


async def _app_runner(ssl_context: ssl.SSLContext | None) -> web.AppRunner:
    async def echo(request: web.Request) -> web.Response:
        seen = "proxy-authorization" in request.headers
        return web.json_response({"path": request.path_qs, "tls": request.secure, "saw_proxy_auth": seen})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context).start()
    return runner


def _trusting(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    return ctx


async def _get(pool: UpstreamPool, path: str = "/v1/models?x=1") -> tuple[int, bytes, PhaseClock]:
    import time

    phase = PhaseClock(time.perf_counter())
    resp = await pool.request("GET", path, [("Accept", "application/json")], b"", phase)
    body = bytearray()

    def sink(chunk: bytes) -> bool:
        body.extend(chunk)
        return False  # never pause

    await resp.relay(sink, _drained)
    resp.close()
    return resp.status, bytes(body), phase


async def _drained() -> None:
    return None


async def test_an_https_upstream_through_the_connect_tunnel_is_verified_end_to_end(
    ca: trustme.CA, tls_upstream: int
) -> None:
    slow = await ForwardProxyServer(
        hosts={"upstream.test": "127.0.0.1"}, credentials=("me@corp", PASSWORD), connect_delay=0.1
    ).start()
    try:
        found = forward_proxy_for(
            URL(f"https://upstream.test:{tls_upstream}"),
            {"HTTPS_PROXY": f"http://me%40corp:{QUOTED}@127.0.0.1:{slow.port}"},
        )
        assert found is not None
        pool = UpstreamPool(
            URL(f"https://upstream.test:{tls_upstream}/api"), connect_timeout=5, read_timeout=5, keepalive=5,
            ssl_context=_trusting(ca), forward_proxy=found,
        )  # fmt: skip
        status, body, phase = await _get(pool)
        again = await _get(pool)
        await pool.close()
    finally:
        await slow.close()
    assert status == 200 and b'"tls": true' in body and b'"path": "/v1/models?x=1"' in body
    assert b'"saw_proxy_auth": false' in body  # the credentials are for the proxy only
    assert [s.line for s in slow.seen] == [f"CONNECT upstream.test:{tls_upstream} HTTP/1.1"]  # one tunnel, reused
    assert slow.seen[0].authorization == found.authorization
    assert phase.connect is not None and phase.connect >= 0.1  # TCP + CONNECT + TLS: one `connect` step
    assert again[2].reused is True


async def test_tls_through_the_tunnel_is_checked_against_the_upstream_s_name(
    tls_upstream: int, forward: ForwardProxyServer
) -> None:
    pool = UpstreamPool(
        URL(f"https://upstream.test:{tls_upstream}"), connect_timeout=5, read_timeout=5, keepalive=5,
        forward_proxy=ForwardProxy(host="127.0.0.1", port=forward.port, variable="HTTPS_PROXY"),
    )  # fmt: skip
    with pytest.raises(Exception, match="TLS handshake with upstream upstream.test"):  # the system CAs don't know it
        await _get(pool)
    await pool.close()


async def test_an_http_upstream_gets_absolute_form_requests_with_the_credentials(plain_upstream: int) -> None:
    server = await ForwardProxyServer(hosts={"upstream.test": "127.0.0.1"}, credentials=("u", PASSWORD)).start()
    try:
        found = forward_proxy_for(
            URL(f"http://upstream.test:{plain_upstream}"), {"HTTP_PROXY": f"http://u:{QUOTED}@127.0.0.1:{server.port}"}
        )
        pool = UpstreamPool(
            URL(f"http://upstream.test:{plain_upstream}/api"), connect_timeout=5, read_timeout=5, keepalive=5,
            forward_proxy=found,
        )  # fmt: skip
        status, body, _ = await _get(pool, "/api/v1/models?x=1")
        await pool.close()
    finally:
        await server.close()
    assert status == 200 and b'"saw_proxy_auth": false' in body and b'"path": "/api/v1/models?x=1"' in body
    assert server.seen[0].line == f"GET http://upstream.test:{plain_upstream}/api/v1/models?x=1 HTTP/1.1"
    assert found is not None and server.seen[0].authorization == found.authorization


# --- the whole proxy, configured by the environment as a user would --------------------------


async def _through_taotrace(
    monkeypatch: pytest.MonkeyPatch, upstream: str, environ: dict[str, str], path: str = "/v1/models"
) -> tuple[int, str, list[RequestRecord]]:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    records: list[RequestRecord] = []
    settings = Settings(upstream=upstream, port=0, metrics_port=0, connect_timeout=3)
    async with running(settings, on_record=records.append) as srv, aiohttp.ClientSession() as session:
        async with session.get(srv.proxy_url + path, headers={"Proxy-Authorization": "Basic client-own"}) as r:
            return r.status, await r.text(), records


async def test_serve_reaches_an_https_upstream_through_https_proxy(
    monkeypatch: pytest.MonkeyPatch, ca: trustme.CA, tls_upstream: int, forward: ForwardProxyServer, tmp_path: Path
) -> None:
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    status, text, records = await _through_taotrace(
        monkeypatch,
        f"https://upstream.test:{tls_upstream}",
        {"HTTPS_PROXY": forward.url(), "SSL_CERT_FILE": str(bundle)},  # the system trust store, as OpenSSL reads it
    )
    assert status == 200 and '"tls": true' in text, text
    assert [s.line for s in forward.seen] == [f"CONNECT upstream.test:{tls_upstream} HTTP/1.1"]
    assert forward.seen[0].authorization is None  # the client's own Proxy-Authorization is hop-by-hop: dropped
    timing = records[0].timing
    assert timing.connect is not None and timing.network >= timing.connect
    if sys.platform.startswith("linux"):  # TCP_INFO of the socket under the tunnel's TLS: to the forward proxy
        tcp = records[0].tcp
        assert tcp is not None and tcp.rtt is not None and tcp.rtt > 0 and tcp.retransmits == 0


@pytest.mark.parametrize(
    ("upstream_name", "environ", "words"),
    [
        ("blocked.test", {}, "refused to open a tunnel to blocked.test:{port}: 403 Forbidden"),
        ("upstream.test", {"credentials": "1"}, "wants credentials (407 Proxy Authentication Required) and they are missing: set HTTPS_PROXY=http://USER:PASSWORD@127.0.0.1:{proxy}"),
    ],
)  # fmt: skip
async def test_a_proxy_that_refuses_is_a_clear_502(
    monkeypatch: pytest.MonkeyPatch,
    tls_upstream: int,
    upstream_name: str,
    environ: dict[str, str],
    words: str,
) -> None:
    server = await ForwardProxyServer(
        hosts={"upstream.test": "127.0.0.1"}, refuse=frozenset({"blocked.test"}),
        credentials=("u", "p") if environ else None,
    ).start()  # fmt: skip
    try:
        status, text, records = await _through_taotrace(
            monkeypatch, f"https://{upstream_name}:{tls_upstream}", {"HTTPS_PROXY": server.url()}
        )
    finally:
        await server.close()
    assert status == 502 and words.format(port=tls_upstream, proxy=server.port) in text, text
    assert records[0].error_type == "connect"


async def test_wrong_credentials_are_a_502_that_never_shows_them(
    monkeypatch: pytest.MonkeyPatch, plain_upstream: int, caplog: pytest.LogCaptureFixture
) -> None:
    server = await ForwardProxyServer(hosts={"upstream.test": "127.0.0.1"}, credentials=("u", "right")).start()
    try:
        with caplog.at_level(logging.DEBUG):
            status, text, _ = await _through_taotrace(
                monkeypatch, f"http://upstream.test:{plain_upstream}", {"HTTP_PROXY": server.url("u", QUOTED)}
            )
    finally:
        await server.close()
    assert status == 502 and "wants credentials (407 Proxy Authentication Required) and they were refused" in text
    assert "CANARY" not in text and "CANARY" not in caplog.text and QUOTED not in caplog.text


async def test_a_proxy_that_is_down_is_a_clear_502(monkeypatch: pytest.MonkeyPatch, tls_upstream: int) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    status, text, _ = await _through_taotrace(
        monkeypatch, f"https://upstream.test:{tls_upstream}", {"https_proxy": f"http://127.0.0.1:{closed}"}
    )
    assert status == 502
    assert f"cannot connect to forward proxy http://127.0.0.1:{closed} (from https_proxy)" in text, text


async def test_no_proxy_and_loopback_go_direct(
    monkeypatch: pytest.MonkeyPatch, plain_upstream: int, forward: ForwardProxyServer
) -> None:
    status, _, _ = await _through_taotrace(
        monkeypatch, f"http://127.0.0.1:{plain_upstream}", {"HTTP_PROXY": forward.url()}
    )
    assert status == 200 and forward.seen == []  # loopback is never proxied
    status, _, _ = await _through_taotrace(
        monkeypatch, f"http://upstream.test:{plain_upstream}", {"HTTP_PROXY": forward.url(), "NO_PROXY": ".test"}
    )
    assert status == 502 and forward.seen == []  # direct: and nobody but the proxy knows upstream.test
