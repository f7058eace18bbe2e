"""Several upstreams behind one proxy (`--route`): the pure rules, then end to end against two
fake upstreams with different physics (a slow prefill, a slow decode)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from proxy.cli import main
from proxy.config.routes import Route, Router, default_route_conflict, derived_names, parse_route, routes_for
from proxy.config.settings import Settings
from tests.conftest import Proxied, ProxyFactory
from tests.fakes import FakeUpstream, chat_stream, stream_handler

# --- the rules, pure -------------------------------------------------------------------------


def test_parse_route_forms() -> None:
    r = parse_route("/anthropic=https://api.anthropic.com")
    assert (r.name, r.prefix, r.host, r.port, r.base_path) == (
        "api.anthropic.com",
        "/anthropic",
        "api.anthropic.com",
        443,
        "",
    )
    r = parse_route("Claude:/a/b/=http://127.0.0.1:9000/v1/")
    assert (r.name, r.prefix, r.port, r.base_path, r.base) == (
        "claude",
        "/a/b",
        9000,
        "/v1",
        "http://127.0.0.1:9000/v1",
    )
    assert parse_route("/=https://taotoken.net/api").prefix == ""


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("anthropic=https://x", "not a route"),
        ("/a=ftp://x", "http(s)"),
        ("/a?x=https://x", "must be a path"),
        ("/a//b=https://x", "must be a path"),
        ("BAD NAME:/a=https://x", "route name"),
        ("/a=https://x/?key=1", "query string"),
    ],
)
def test_parse_route_refuses_with_a_reason(spec: str, says: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_route(spec)
    assert says in str(caught.value)


def test_routes_for_adds_upstream_for_root_and_refuses_duplicates() -> None:
    routes = routes_for("https://taotoken.net/api", ["/anthropic=https://api.anthropic.com"])
    assert [(r.name, r.prefix) for r in routes] == [("api.anthropic.com", "/anthropic"), ("taotoken.net", "")]
    assert [r.name for r in routes_for("https://taotoken.net/api", ["o:/=http://other"])] == ["o"]  # the route wins
    with pytest.raises(ValueError, match="two routes for the prefix /a; give each prefix once"):
        routes_for("https://t", ["x:/a=http://h", "y:/a/=http://h"])
    with pytest.raises(ValueError, match="two routes for the prefix /; give each prefix once"):
        routes_for("https://t", ["/=http://h", "/=http://g"])
    with pytest.raises(ValueError, match=r"two routes are named 'x' \(/a and /b\); give each route its own name"):
        routes_for("https://t", ["x:/a=http://127.0.0.1:1", "X:/b=http://127.0.0.1:2"])


def _names(upstream: str, *specs: str) -> list[tuple[str, str]]:
    return [(r.shown_prefix, r.name) for r in routes_for(upstream, specs)]


def test_unnamed_routes_get_distinct_names_from_their_urls() -> None:
    # Two local engines on two ports: host:port, and the host alone for the one host no other route has.
    assert _names("https://taotoken.net/api", "/a=http://127.0.0.1:8001", "/b=http://127.0.0.1:8002") == [
        ("/a", "127.0.0.1:8001"),
        ("/b", "127.0.0.1:8002"),
        ("/", "taotoken.net"),
    ]
    # --upstream takes part: a third engine on the same host.
    assert _names("http://127.0.0.1:8000/v1", "/a=http://127.0.0.1:8001", "/c=https://api.example.com") == [
        ("/a", "127.0.0.1:8001"),
        ("/c", "api.example.com"),
        ("/", "127.0.0.1:8000"),
    ]
    # The same host and port (no port: the scheme's): the prefix tells them apart.
    assert _names("http://h", "/fast=http://h/v1", "/Slow=http://h:80/v2", "/x=https://h") == [
        ("/fast", "/fast=h:80"),
        ("/Slow", "/slow=h:80"),
        ("/x", "h:443"),
        ("/", "/=h:80"),
    ]
    # IPv6 hosts bracketed before the port; a name given explicitly is never taken by another route.
    assert _names("http://[::1]:8000", "/a=http://[::1]:8001", "h:/x=http://g", "/y=http://h", "/z=http://g") == [
        ("/a", "[::1]:8001"),
        ("/x", "h"),
        ("/y", "h:80"),
        ("/z", "g"),
        ("/", "[::1]:8000"),
    ]
    # Prefixes differing only in case, to one host and port: numbered, in the order given.
    assert _names("http://t", "/a=http://h", "/A=http://h") == [("/a", "/a=h:80"), ("/A", "/a=h:80-2"), ("/", "t")]


def test_derived_names_are_stable_and_mirror_and_probe_find_them(monkeypatch: pytest.MonkeyPatch) -> None:
    specs = ["/a=http://127.0.0.1:8001", "/b=http://127.0.0.1:8002", "/c=http://127.0.0.1:8001/v2"]
    names = _names("http://127.0.0.1:8000", *specs)
    assert sorted(_names("http://127.0.0.1:8000", *reversed(specs))) == sorted(names)  # not the order given
    assert names == [
        ("/a", "/a=127.0.0.1:8001"),
        ("/b", "127.0.0.1:8002"),
        ("/c", "/c=127.0.0.1:8001"),
        ("/", "127.0.0.1:8000"),
    ]
    settings = Settings(
        upstream="http://127.0.0.1:8000", routes=specs, mirror="127.0.0.1:8002", mirror_ratio=0.1,
        mirror_max_per_minute=1,
    )  # fmt: skip
    assert settings.mirror == "127.0.0.1:8002"
    from proxy.tools.clientconfig import route_base_url

    environ = {"TAOTRACE_ROUTES": ",".join(specs), "TAOTRACE_UPSTREAM": "http://127.0.0.1:8000"}
    assert route_base_url("127.0.0.1:8002", environ) == "http://127.0.0.1:8002/v1"
    assert route_base_url("/C=127.0.0.1:8001", environ) == "http://127.0.0.1:8001/v2/v1"
    assert derived_names([("/a", parse_route("/a=http://h").url)], taken=["h"]) == ["h:80"]


def test_upstream_and_a_root_route_together_are_a_conflict() -> None:
    assert default_route_conflict(True, ["/=http://h"]) is not None
    assert default_route_conflict(False, ["/=http://h"]) is None  # the route is the root
    assert default_route_conflict(True, ["/a=http://h"]) is None  # --upstream is the root


def test_router_longest_prefix_on_segment_boundaries() -> None:
    routes = routes_for("http://root", ["a:/anthropic=http://a", "ab:/anthropic/beta=http://ab"])
    router = Router([(r, r.name) for r in routes])
    assert router.match("/anthropic/v1/messages") == ("a", "/v1/messages")
    assert router.match("/anthropic/beta/v1/messages?x=1") == ("ab", "/v1/messages?x=1")
    assert router.match("/anthropic/betax") == ("a", "/betax")
    assert router.match("/anthropicx/v1") == ("root", "/anthropicx/v1")  # not a segment boundary
    assert router.match("/anthropic") == ("a", "/")
    assert router.match("/anthropic?x=1") == ("a", "/?x=1")
    assert router.match("/v1/chat/completions") == ("root", "/v1/chat/completions")
    assert router.match("/") == ("root", "/")
    only = Router([(Route("r", "", parse_route("/=http://h").url), "r")])
    assert only.match("/anthropic/x") == ("r", "/anthropic/x")


def test_settings_refuse_a_bad_route_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--route", "/a=notaurl"]) == 2
    assert "--route" in capsys.readouterr().err


def test_serve_refuses_a_real_duplicate_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TAOTRACE_ROUTES", raising=False)
    routes = ["--route", "local:/a=http://127.0.0.1:8001", "--route", "local:/b=http://127.0.0.1:8002"]
    assert main(["serve", "--port", "0", *routes]) == 2
    assert capsys.readouterr().err == (
        "taotrace serve: error: argument --route: two routes are named 'local' (/a and /b); give each route its "
        "own name\n"
    )
    monkeypatch.setenv("TAOTRACE_ROUTES", "/a=http://127.0.0.1:8001,/a/=http://127.0.0.1:8002")
    assert main(["serve", "--port", "0"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "taotrace serve: error: TAOTRACE_ROUTES='/a=http://127.0.0.1:8001,/a/=http://127.0.0.1:8002': two routes "
        "for the prefix /a; give each prefix once"
    ]


def test_serve_refuses_upstream_and_root_route_together(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="taotrace"):
        code = main(["serve", "--upstream", "http://127.0.0.1:9", "--route", "/=http://127.0.0.1:10", "--port", "0"])
    assert code == 2
    assert "--upstream and --route /=URL" in caplog.text


def test_routes_from_the_environment_as_a_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAOTRACE_ROUTES", "a:/a=http://127.0.0.1:1,b:/b=http://127.0.0.1:2")
    assert Settings().routes == ["a:/a=http://127.0.0.1:1", "b:/b=http://127.0.0.1:2"]


# --- end to end: two upstreams, two keys -----------------------------------------------------

# Each upstream's stream has its own frame sizes and timing, so a body relayed from the wrong one shows.
SLOW_PREFILL = stream_handler(chat_stream(6), first_delay=0.25, gap=0.005)
SLOW_DECODE = stream_handler(chat_stream(9, sep=b"\r\n"), first_delay=0.0, gap=0.04)
KEY_A = "sk-canary-aaaa-1111"
KEY_B = "sk-canary-bbbb-2222"


@pytest.fixture
async def second() -> AsyncIterator[FakeUpstream]:
    fake = await FakeUpstream(SLOW_DECODE).start()
    yield fake
    await fake.close()


def _seen_text(fake: FakeUpstream) -> str:
    return "\n".join(
        f"{s.method} {s.path_qs}\n" + "\n".join(f"{k}: {v}" for k, v in s.headers.items()) + "\n" + s.body.decode()
        for s in fake.seen
    )


async def _call(client: aiohttp.ClientSession, url: str, key: str, header: str = "Authorization") -> bytes:
    value = f"Bearer {key}" if header == "Authorization" else key
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with client.post(url, json=body, headers={header: value, "Cookie": f"s={key}"}) as r:
        assert r.status == 200
        return await r.read()


@pytest.mark.parametrize("proxy_workers", [1, 2], indirect=True)
async def test_two_routes_byte_exact_canary_clean_and_labelled(
    start_proxy: ProxyFactory,
    upstream: FakeUpstream,
    second: FakeUpstream,
    client: aiohttp.ClientSession,
    registry: CollectorRegistry,
) -> None:
    upstream.handler = SLOW_PREFILL
    routes = [f"beta:/beta={second.url}/api", f"alpha:/={upstream.url}"]
    async with start_proxy(routes=routes) as p:  # the route for / takes --upstream's place
        a = await _call(client, p.url + "/v1/chat/completions?x=1", KEY_A)
        b = await _call(client, p.url + "/beta/v1/chat/completions?y=2", KEY_B, header="x-api-key")
        records = await p.settled(2)
        spans = await p.settled_spans("chat m", count=2)
    assert a == b"".join(chat_stream(6)) and b == b"".join(chat_stream(9, sep=b"\r\n"))  # byte-exact
    assert [s.path_qs for s in upstream.seen] == ["/v1/chat/completions?x=1"]
    assert [s.path_qs for s in second.seen] == ["/api/v1/chat/completions?y=2"]  # prefix stripped, base added
    # Canaries: each key reached its own upstream, and never the other one.
    seen_a, seen_b = _seen_text(upstream), _seen_text(second)
    assert KEY_A in seen_a and KEY_B not in seen_a
    assert KEY_B in seen_b and KEY_A not in seen_b
    by_upstream = {r.upstream: r for r in records}
    assert set(by_upstream) == {"alpha", "beta"}
    slow_prefill, slow_decode = by_upstream["alpha"].timing, by_upstream["beta"].timing
    assert slow_prefill.ttft is not None and slow_decode.ttft is not None and slow_prefill.ttft > slow_decode.ttft
    assert slow_prefill.tpot is not None and slow_decode.tpot is not None and slow_decode.tpot > slow_prefill.tpot
    for name, fake in (("alpha", upstream), ("beta", second)):
        labels = {"upstream": name, "api": "chat_completions", "model": "m"}
        assert registry.get_sample_value("taotrace_time_to_first_token_seconds_count", labels) == 1
        port = int(fake.url.rsplit(":", 1)[1])
        (span,) = [s for s in spans if s.attributes["taotrace.upstream"] == name]
        assert (span.attributes["server.address"], span.attributes["server.port"]) == ("127.0.0.1", port)
    beta_span = next(s for s in spans if s.attributes["taotrace.upstream"] == "beta")
    assert beta_span.attributes["url.full"] == f"{second.url}/api/v1/chat/completions?y=REDACTED"


async def test_live_view_rows_carry_the_upstream(
    start_proxy: ProxyFactory, upstream: FakeUpstream, second: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    upstream.handler = SLOW_DECODE
    async with start_proxy(routes=[f"beta:/beta={second.url}"]) as p:
        await _call(client, p.url + "/beta/v1/chat/completions", KEY_B)
        await _call(client, p.url + "/v1/chat/completions", KEY_A)
        await p.settled(2)
        async with client.get(p.metrics_url + "/api/requests") as r:
            rows = (await r.json())["requests"]
    assert sorted(row["upstream"] for row in rows) == ["127.0.0.1", "beta"]  # the root's name: its host
    assert all(row["pair_id"] is None and row["mirror"] is False for row in rows)


async def test_without_routes_nothing_changes(proxy: Proxied, client: aiohttp.ClientSession) -> None:
    proxy.serve(SLOW_DECODE)
    body = await _call(client, proxy.url + "/anthropic/v1/chat/completions", KEY_A)
    assert body == b"".join(chat_stream(9, sep=b"\r\n"))
    assert [s.path_qs for s in proxy.upstream.seen] == ["/anthropic/v1/chat/completions"]
    (rec,) = await proxy.settled(1)
    assert rec.upstream == "127.0.0.1"


# --- probe and doctor by route name ----------------------------------------------------------


async def test_probe_by_route_name_calls_that_upstream(monkeypatch: pytest.MonkeyPatch) -> None:
    from proxy.sim import SimSettings, running
    from proxy.tools.clientconfig import load_target
    from proxy.tools.probe import ProbeSettings, probe

    async with running(SimSettings(port=0, time_scale=0.25)) as sim:
        root = sim.base_url.removesuffix("/v1")
        monkeypatch.setenv("TAOTRACE_ROUTES", f"local:/local={root},/elsewhere=http://127.0.0.1:9")
        target = load_target(ProbeSettings(route="LOCAL", api_key="k", max_tokens=3))
        assert target.base_url == sim.base_url
        result = await probe(ProbeSettings(route="local", api_key="k", max_tokens=3), target)
        assert sim.simulator.stats()["requests"][-1]["output_tokens"] == 3
    assert result


def test_probe_and_doctor_refuse_an_unknown_route_or_both(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TAOTRACE_ROUTES", "a:/a=http://127.0.0.1:9")
    monkeypatch.setenv("TAOTRACE_API_KEY", "k")
    assert main(["probe", "--route", "nope"]) == 2
    assert "no route named 'nope'; the proxy's routes (TAOTRACE_ROUTES, TAOTRACE_UPSTREAM): a, taotoken.net" in (
        capsys.readouterr().err
    )
    assert main(["doctor", "--route", "a", "--base-url", "http://127.0.0.1:9/v1"]) == 2
    assert "give --route or --base-url, not both" in capsys.readouterr().err


def test_the_docs_serve_commands_parse() -> None:
    import re
    import shlex
    from pathlib import Path

    from proxy.cli import parse

    text = (Path(__file__).resolve().parents[1] / "docs" / "routes.md").read_text()
    blocks = re.findall(r"^```\n(.*?)^```", text, flags=re.M | re.S)
    commands = [
        line
        for block in blocks
        for line in block.replace("\\\n", " ").splitlines()
        if line.startswith("taotrace serve")
    ]
    assert len(commands) == 2
    for command in commands:
        parsed = parse(shlex.split(command)[1:], environ={})
        assert parsed is not None
        settings = parsed[1]
        assert isinstance(settings, Settings) and settings.routes
