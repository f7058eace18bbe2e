"""`probe`, `doctor` and `demo --real` behind a corporate proxy: they reach their target the way
`HTTPS_PROXY` / `HTTP_PROXY` / `NO_PROXY` say, by `serve`'s rules; the doctor says which way it
went and tells a forward proxy that refuses (407, 403, 502) or is down apart from a target that
is unreachable; probe says what its connect time and round trip cover through a tunnel; the
proxy's credentials never show. Against a real forward proxy on port 0 (tests/forwardproxy.py)
and the simulator, over TLS for `upstream.test` (a name only the forward proxy knows)."""

from __future__ import annotations

import asyncio
import io
import ipaddress
import json
import logging
import re
import socket
import ssl
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiohttp import web
from yarl import URL

from proxy.sim import SimRunning, SimSettings, build_app, running
from proxy.tools import probe as probe_cmd
from proxy.tools.clientconfig import load_target
from proxy.tools.demo import DemoSettings, demo
from proxy.tools.doctor import Check, DoctorSettings, diagnose, report
from proxy.tools.probe import ProbeSettings
from proxy.tools.route import route_for
from tests.forwardproxy import ForwardProxyServer

KEY = "sk-tools-key-0123456789"
PASSWORD = "pa:ss@w0rd-CANARY"  # characters that need quoting in a URL
QUOTED = "pa%3Ass%40w0rd-CANARY"
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy")


def _sim_settings() -> SimSettings:
    return SimSettings(port=0, time_scale=0.25, require_key=True, api_keys=[KEY], path_prefix="/v1")


@pytest.fixture
async def tls_sim(ca: trustme.CA) -> AsyncIterator[int]:
    """The simulator over TLS with a certificate for `upstream.test`: its port."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("upstream.test").configure_cert(context)
    runner = web.AppRunner(build_app(_sim_settings()), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
    yield runner.addresses[0][1]
    await runner.cleanup()


@pytest.fixture
async def sim() -> AsyncIterator[SimRunning]:
    async with running(_sim_settings()) as srv:
        yield srv


@pytest.fixture
def trust(ca: trustme.CA, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ssl.SSLContext:
    """The throwaway CA trusted: as a context (for `diagnose`) and as the system trust store a
    user sets (`SSL_CERT_FILE`, for the commands); no proxy variable set but the test's own."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _doctor(base_url: str, environ: Mapping[str, str], tls: ssl.SSLContext) -> tuple[list[Check], str]:
    settings = DoctorSettings(base_url=base_url, api_key=KEY, timeout=5.0)
    checks = await diagnose(load_target(settings), settings.timeout, environ=environ, tls=tls)
    out = io.StringIO()
    report(load_target(settings), checks, False, out)
    return checks, out.getvalue()


def _network_failed(checks: list[Check]) -> Check:
    assert [c.status for c in checks] == ["ok", "fail", "skip", "skip", "skip"], checks
    return checks[1]


# --- which way: serve's rules, said in words --------------------------------------------------


@pytest.mark.parametrize(
    ("url", "environ", "described", "connect"),
    [
        ("https://api.example.com/v1", {}, "direct", "DNS, TCP, TLS"),
        ("https://api.example.com/v1", {"HTTPS_PROXY": f"http://me:{QUOTED}@proxy.corp:3128"},
         "through the forward proxy http://proxy.corp:3128 (from HTTPS_PROXY)",
         "TCP to the forward proxy + CONNECT + TLS with the target through the tunnel"),
        ("http://api.example.com/v1", {"http_proxy": "proxy.corp:3128"},
         "through the forward proxy http://proxy.corp:3128 (from http_proxy)", "TCP to the forward proxy"),
        ("https://api.example.com/v1", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": ".example.com"},
         "direct (NO_PROXY matches api.example.com)", "DNS, TCP, TLS"),
        ("http://127.0.0.1:8787/v1", {"HTTP_PROXY": "http://p:1"}, "direct (loopback is never proxied)", "DNS, TCP, TLS"),
        ("https://api.example.com/v1", {"HTTPS_PROXY": "socks5://p:1", "NO_PROXY": "*"}, "direct (NO_PROXY matches api.example.com)", "DNS, TCP, TLS"),
    ],
)  # fmt: skip
def test_the_route_is_serve_s_decision_in_words(
    url: str, environ: dict[str, str], described: str, connect: str
) -> None:
    route = route_for(URL(url), environ)
    assert (route.described, route.connect_means) == (described, connect)
    assert "CANARY" not in repr(route) and "me:" not in route.described


def test_the_credentials_go_on_connect_for_https_and_on_each_request_for_http() -> None:
    environ = {
        "HTTPS_PROXY": f"http://me:{QUOTED}@proxy.corp:3128",
        "HTTP_PROXY": f"http://me:{QUOTED}@proxy.corp:3128",
    }
    tunnel = route_for(URL("https://api.example.com"), environ).options({"Authorization": "Bearer k"})
    plain = route_for(URL("http://api.example.com"), environ).options({"Authorization": "Bearer k"})
    assert tunnel["proxy"] == plain["proxy"] == URL("http://proxy.corp:3128")  # no credentials in the URL
    assert tunnel["headers"] == {"Authorization": "Bearer k"}
    assert tunnel["proxy_headers"]["Proxy-Authorization"].startswith("Basic ")
    assert plain["headers"]["Proxy-Authorization"] == tunnel["proxy_headers"]["Proxy-Authorization"]
    assert "proxy_headers" not in plain


# --- doctor: each outcome ------------------------------------------------------------------------


async def test_doctor_passes_through_the_tunnel_and_says_so(
    tls_sim: int, forward: ForwardProxyServer, trust: ssl.SSLContext
) -> None:
    checks, text = await _doctor(f"https://upstream.test:{tls_sim}/v1", {"HTTPS_PROXY": forward.url()}, trust)
    assert all(c.status == "ok" for c in checks), text
    network = checks[1].detail
    assert network.startswith(f"through the forward proxy http://127.0.0.1:{forward.port} (from HTTPS_PROXY): ")
    assert f"CONNECT upstream.test:{tls_sim} answered 200" in network
    assert "TLS with upstream.test through the tunnel" in network and "GET /models answered 200" in network
    # every request went through the tunnel: the raw check, GET /models, the stream
    assert {s.line for s in forward.seen} == {f"CONNECT upstream.test:{tls_sim} HTTP/1.1"} and len(forward.seen) == 3
    if sys.platform.startswith("linux"):
        assert re.search(r"your network adds at least [\d.]+ ms of the [\d.]+ ms TTFT \(", checks[-1].detail), text
        assert "round trip to the forward proxy" in checks[-1].detail


async def test_doctor_through_a_proxy_for_an_http_target(sim: SimRunning, forward: ForwardProxyServer) -> None:
    port = URL(sim.url).port
    checks, text = await _doctor(
        f"http://upstream.test:{port}/v1", {"HTTP_PROXY": forward.url()}, ssl.create_default_context()
    )
    assert all(c.status == "ok" for c in checks), text
    assert checks[1].detail.startswith(f"through the forward proxy http://127.0.0.1:{forward.port} (from HTTP_PROXY)")
    assert f"GET http://upstream.test:{port}/v1/models HTTP/1.1" in [s.line for s in forward.seen]


@pytest.mark.parametrize(
    ("credentials", "given", "cause", "fix"),
    [
        (("u", PASSWORD), None,
         "the forward proxy http://127.0.0.1:{proxy} (from HTTPS_PROXY) wants credentials (407 Proxy Authentication Required) and none are set",
         "set HTTPS_PROXY=http://USER:PASSWORD@127.0.0.1:{proxy}"),
        (("u", "right"), ("u", QUOTED),
         "the forward proxy http://127.0.0.1:{proxy} (from HTTPS_PROXY) wants credentials (407 Proxy Authentication Required) and refused the ones given",
         "set HTTPS_PROXY=http://USER:PASSWORD@127.0.0.1:{proxy}"),
    ],
)  # fmt: skip
async def test_doctor_tells_a_proxy_that_wants_credentials(
    tls_sim: int,
    trust: ssl.SSLContext,
    credentials: tuple[str, str],
    given: tuple[str, str] | None,
    cause: str,
    fix: str,
) -> None:
    server = await ForwardProxyServer(hosts={"upstream.test": "127.0.0.1"}, credentials=credentials).start()
    try:
        url = server.url(*given) if given else server.url()
        checks, text = await _doctor(f"https://upstream.test:{tls_sim}/v1", {"HTTPS_PROXY": url}, trust)
    finally:
        await server.close()
    failed = _network_failed(checks)
    assert (failed.detail, failed.fix) == (cause.format(proxy=server.port), fix.format(proxy=server.port)), text
    assert "CANARY" not in text and QUOTED not in text


async def test_doctor_tells_a_proxy_that_refuses_or_cannot_reach_the_target(
    tls_sim: int, forward: ForwardProxyServer, trust: ssl.SSLContext
) -> None:
    checks, _ = await _doctor(f"https://blocked.test:{tls_sim}/v1", {"HTTPS_PROXY": forward.url()}, trust)
    failed = _network_failed(checks)
    assert failed.detail == (
        f"the forward proxy http://127.0.0.1:{forward.port} (from HTTPS_PROXY) refused to open a tunnel to "
        f"blocked.test:{tls_sim} (403 Forbidden)"
    )
    assert failed.fix is not None and "NO_PROXY" in failed.fix
    closed = _closed_port()  # the forward proxy is up; the target behind it is not
    checks, _ = await _doctor(f"https://upstream.test:{closed}/v1", {"HTTPS_PROXY": forward.url()}, trust)
    failed = _network_failed(checks)
    assert failed.detail.startswith(
        f"the forward proxy http://127.0.0.1:{forward.port} (from HTTPS_PROXY) could not open a tunnel to "
        f"upstream.test:{closed} (502 Bad Gateway): the forward proxy is up, the target is unreachable from it"
    )


async def test_doctor_tells_a_proxy_that_is_down_apart_from_the_target(tls_sim: int, trust: ssl.SSLContext) -> None:
    closed = _closed_port()
    checks, text = await _doctor(
        f"https://upstream.test:{tls_sim}/v1", {"https_proxy": f"http://127.0.0.1:{closed}"}, trust
    )
    failed = _network_failed(checks)
    assert (
        failed.detail
        == f"cannot connect to the forward proxy http://127.0.0.1:{closed} (from https_proxy): Connection refused"
    )
    assert failed.fix is not None and "https_proxy" in failed.fix
    assert "upstream.test" not in failed.detail  # the target was never tried: not its fault


async def test_doctor_tells_tls_through_the_tunnel_apart(tls_sim: int, forward: ForwardProxyServer) -> None:
    """The tunnel opens; the target's certificate is from a CA this machine does not trust (as
    when a forward proxy intercepts TLS): the fix names SSL_CERT_FILE."""
    untrusting = ssl.create_default_context()
    checks, _ = await _doctor(f"https://upstream.test:{tls_sim}/v1", {"HTTPS_PROXY": forward.url()}, untrusting)
    failed = _network_failed(checks)
    assert failed.detail == f"TLS with upstream.test:{tls_sim} through the tunnel failed (CERTIFICATE_VERIFY_FAILED)"
    assert failed.fix is not None and "SSL_CERT_FILE" in failed.fix


async def _not_a_forward_proxy(answer: bytes) -> asyncio.Server:
    """A listener that answers any request with `answer` and closes (a SOCKS port, a dying proxy)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1024)
        writer.write(answer)
        await writer.drain()
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"\x05\xff", "it closed the connection during CONNECT"),
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "it answered CONNECT with something not HTTP (a SOCKS port?)"),
    ],
)
async def test_doctor_tells_a_listener_that_is_no_forward_proxy(answer: bytes, why: str, trust: ssl.SSLContext) -> None:
    server = await _not_a_forward_proxy(answer)
    port = server.sockets[0].getsockname()[1]
    try:
        checks, _ = await _doctor("https://upstream.test/v1", {"HTTPS_PROXY": f"http://127.0.0.1:{port}"}, trust)
    finally:
        server.close()
        await server.wait_closed()
    assert _network_failed(checks).detail == (
        f"cannot connect to the forward proxy http://127.0.0.1:{port} (from HTTPS_PROXY): {why}"
    )


async def test_doctor_names_a_bad_proxy_variable_without_its_credentials(tls_sim: int, trust: ssl.SSLContext) -> None:
    checks, text = await _doctor(
        f"https://upstream.test:{tls_sim}/v1", {"HTTPS_PROXY": f"socks5://u:{QUOTED}@127.0.0.1:1080"}, trust
    )
    failed = _network_failed(checks)
    assert failed.detail.startswith("HTTPS_PROXY uses a socks5:// proxy; only http:// forward proxies are supported")
    assert "CANARY" not in text


async def test_doctor_goes_direct_under_no_proxy_and_says_so(
    sim: SimRunning, forward: ForwardProxyServer, trust: ssl.SSLContext
) -> None:
    port = URL(sim.url).port
    checks, text = await _doctor(
        f"http://upstream.test:{port}/v1", {"HTTP_PROXY": forward.url(), "NO_PROXY": "other.org,.test"}, trust
    )
    failed = _network_failed(checks)  # direct: and only the forward proxy knows upstream.test
    assert failed.detail.startswith("direct (NO_PROXY matches upstream.test): cannot resolve 'upstream.test'"), text
    assert failed.fix is not None and failed.fix.endswith("or take it out of NO_PROXY to go through the forward proxy")
    checks, text = await _doctor(sim.base_url, {"HTTP_PROXY": forward.url()}, trust)
    assert all(c.status == "ok" for c in checks), text
    assert checks[1].detail.startswith("direct (loopback is never proxied): 127.0.0.1 resolved")
    assert forward.seen == []


def _resolves_here(name: str) -> bool:
    """`name` resolves, to this machine's loopback only (where the simulator listens)."""
    try:
        infos = socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return all(ipaddress.ip_address(str(info[4][0])).is_loopback for info in infos)


@pytest.mark.skipif(not _resolves_here(socket.gethostname()), reason="this host's name does not resolve to itself")
async def test_doctor_passes_direct_when_no_proxy_names_the_host(
    forward: ForwardProxyServer, trust: ssl.SSLContext
) -> None:
    name = socket.gethostname()
    async with running(_sim_settings()) as srv:
        base = f"http://{name}:{URL(srv.url).port}/v1"
        checks, text = await _doctor(base, {"HTTP_PROXY": forward.url(), "NO_PROXY": name}, trust)
    assert all(c.status == "ok" for c in checks), text
    assert checks[1].detail.startswith(f"direct (NO_PROXY matches {name.lower()}): ")
    assert forward.seen == []


# --- probe ----------------------------------------------------------------------------------------


def _probe(monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], **flags: Any) -> tuple[int, str]:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    out = io.StringIO()
    code = probe_cmd.run(ProbeSettings(api_key=KEY, timeout=5.0, max_tokens=8, **flags), out)
    return code, out.getvalue()


async def _run_in_thread(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """The commands run their own event loop (`asyncio.run`): give them a thread."""
    return await asyncio.to_thread(fn, *args, **kwargs)


async def test_probe_through_the_tunnel_says_what_connect_covers(
    tls_sim: int, trust: ssl.SSLContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = await ForwardProxyServer(
        hosts={"upstream.test": "127.0.0.1"}, credentials=("me", PASSWORD), connect_delay=0.1
    ).start()
    try:
        environ = {"HTTPS_PROXY": slow.url("me", QUOTED)}
        base = f"https://upstream.test:{tls_sim}/v1"
        code, text = await _run_in_thread(_probe, monkeypatch, environ, base_url=base, json_output=True)
        assert code == 0, text
        doc = json.loads(text)
        code, table = await _run_in_thread(_probe, monkeypatch, environ, base_url=base)
    finally:
        await slow.close()
    assert doc["forward_proxy"] == f"http://127.0.0.1:{slow.port}"
    assert doc["connect_s"] >= 0.1  # TCP to the proxy + CONNECT (held 0.1 s by the proxy) + TLS: one connect
    assert doc["ttft_s"] > doc["connect_s"]
    assert (
        code == 0
        and (
            f"route: through the forward proxy http://127.0.0.1:{slow.port} (from HTTPS_PROXY); network = opening the "
            "connection (TCP to the forward proxy + CONNECT + TLS with the target through the tunnel) + one round trip "
            "to the forward proxy"
        )
        in table
    )
    if sys.platform.startswith("linux"):
        assert "your network adds at least" in table and "round trip to the forward proxy" in table
    assert {s.line for s in slow.seen} == {f"CONNECT upstream.test:{tls_sim} HTTP/1.1"}
    assert "CANARY" not in text + table and QUOTED not in text + table and "me:" not in text + table


async def test_probe_names_the_forward_proxy_when_it_fails(
    tls_sim: int, forward: ForwardProxyServer, trust: ssl.SSLContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed = _closed_port()
    base = f"https://upstream.test:{tls_sim}/v1"
    code, text = await _run_in_thread(_probe, monkeypatch, {"HTTPS_PROXY": f"http://127.0.0.1:{closed}"}, base_url=base)
    assert code == 1
    assert f"error: cannot connect to the forward proxy http://127.0.0.1:{closed} (from HTTPS_PROXY): " in text, text
    code, text = await _run_in_thread(
        _probe, monkeypatch, {"HTTPS_PROXY": forward.url()}, base_url=f"https://blocked.test:{tls_sim}/v1"
    )
    assert code == 1 and f"refused to open a tunnel to blocked.test:{tls_sim} (403 Forbidden)" in text, text
    server = await ForwardProxyServer(hosts={"upstream.test": "127.0.0.1"}, credentials=("u", "p")).start()
    try:  # an http target: the 407 comes as the answer itself
        code, text = await _run_in_thread(
            _probe, monkeypatch, {"HTTP_PROXY": server.url()}, base_url=f"http://upstream.test:{tls_sim}/v1"
        )
    finally:
        await server.close()
    assert code == 1 and "wants credentials (407 Proxy Authentication Required) and none are set" in text, text


@pytest.mark.parametrize("value", ["socks5://u:secret-CANARY@p:1080", "https://u:secret-CANARY@p:443", "http://"])
def test_probe_refuses_a_bad_proxy_variable_in_one_line(
    value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    code, out = _probe(monkeypatch, {"HTTPS_PROXY": value}, base_url="https://api.example.com/v1")
    err = capsys.readouterr().err
    assert code == 2 and out == "" and err.startswith("probe: HTTPS_PROXY ") and err.count("\n") == 1
    assert "CANARY" not in err


# --- demo --real -------------------------------------------------------------------------------


async def test_demo_real_goes_through_the_forward_proxy(
    sim: SimRunning, forward: ForwardProxyServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", forward.url())
    settings = DemoSettings(
        once=True, port=0, metrics_port=0, max_tokens=4, base_tokens=100, cache_tokens=200, reasoning_max_tokens=72,
        real=True, upstream=f"http://upstream.test:{URL(sim.url).port}", api_key=KEY,
    )  # fmt: skip
    out = io.StringIO()
    code, results = await demo(settings, out)
    assert code == 0 and len(results) == 10 and all(r.client.ok for r in results)  # 3 experiments, 2 reasoning runs
    assert f"through the forward proxy http://127.0.0.1:{forward.port} (from HTTP_PROXY)" in out.getvalue()
    assert forward.seen and all(  # absolute-form: one line per connection (later requests pass as they are)
        s.line.split()[1].startswith(f"http://upstream.test:{URL(sim.url).port}/v1/") for s in forward.seen
    )


async def test_demo_on_all_interfaces_reaches_its_simulator_directly(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--host 0.0.0.0` gives the simulator the URL http://0.0.0.0:port: this machine, never
    sent to a forward proxy (which could not reach it: here, none listens)."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{_closed_port()}")
    settings = DemoSettings(
        once=True, host="0.0.0.0", port=0, metrics_port=0, time_scale=0.25, max_tokens=4, base_tokens=100,
        cache_tokens=200, reasoning_max_tokens=72,
    )  # fmt: skip
    code, results = await demo(settings, io.StringIO())
    assert code == 0 and len(results) == 10 and all(r.client.ok for r in results)  # 3 experiments, 2 reasoning runs


async def test_demo_real_refuses_a_bad_proxy_variable_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "socks5://u:secret-CANARY@p:1080")
    code, _ = await demo(DemoSettings(once=True, port=0, metrics_port=0, real=True, api_key=KEY), io.StringIO())
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("demo: HTTPS_PROXY uses a socks5:// proxy") and "CANARY" not in err


# --- credentials: in no output at all ------------------------------------------------------------


async def test_the_proxy_s_credentials_never_appear_in_any_output(
    tls_sim: int, trust: ssl.SSLContext, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    from proxy.tools import doctor as doctor_cmd

    caplog.set_level(logging.DEBUG)  # every log line of the tools and of demo's proxy, too
    base = f"https://upstream.test:{tls_sim}/v1"
    seen = []
    for accepted in (("me", PASSWORD), ("me", "other")):  # through, then refused (407)
        server = await ForwardProxyServer(hosts={"upstream.test": "127.0.0.1"}, credentials=accepted).start()
        environ = {"HTTPS_PROXY": server.url("me", QUOTED)}
        try:
            for as_json in (False, True):
                seen.append(await _run_in_thread(_probe, monkeypatch, environ, base_url=base, json_output=as_json))
                out = io.StringIO()
                settings = DoctorSettings(base_url=base, api_key=KEY, timeout=5.0, json_output=as_json)
                seen.append((await _run_in_thread(doctor_cmd.run, settings, out), out.getvalue()))
        finally:
            await server.close()
    codes = [code for code, _ in seen]
    assert codes == [0, 0, 0, 0, 1, 1, 1, 1]  # the same runs pass through, then fail at the proxy
    server = await ForwardProxyServer(hosts={"upstream.test": "127.0.0.1"}, credentials=("me", PASSWORD)).start()
    try:  # demo --real: the proxy it starts reaches the (TLS) upstream through the tunnel
        monkeypatch.setenv("HTTPS_PROXY", server.url("me", QUOTED))
        out = io.StringIO()
        demo_settings = DemoSettings(
            once=True, port=0, metrics_port=0, max_tokens=4, base_tokens=100, cache_tokens=200,
            real=True, upstream=f"https://upstream.test:{tls_sim}", api_key=KEY,
        )  # fmt: skip
        code, _ = await demo(demo_settings, out)
    finally:
        await server.close()
    assert (
        code == 0 and f"through the forward proxy http://127.0.0.1:{server.port} (from HTTPS_PROXY)" in out.getvalue()
    )
    seen.append((code, out.getvalue()))
    everything = "".join(text for _, text in seen) + capsys.readouterr().err + caplog.text
    assert "wants credentials (407 Proxy Authentication Required) and refused the ones given" in everything
    for secret in ("CANARY", QUOTED, PASSWORD, "me:", "me%", "bWU6"):  # bWU6: base64 of "me:"
        assert secret not in everything
