"""Attribution: header and body attributes on spans, the salted key fingerprint, and the opt-in
per-attribute metric labels (bounded; absent without --metric-label)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import sys
import time

import aiohttp
import pytest
from pydantic import ValidationError

from proxy.accounting.attribution import (
    KEY_ID,
    Attributor,
    api_key_of,
    is_secret_header,
    key_id,
    parse_header_attributes,
)
from proxy.cli import main
from proxy.config.accounting import accounting_from
from proxy.config.config import load
from proxy.config.settings import Settings
from tests.conftest import ProxyFactory
from tests.fakes import json_handler
from tests.grouped import records_of

SALT = b"0123456789abcdef-test-salt"
CHAT = {
    "id": "c1",
    "model": "gpt-4o-mini",
    "choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1},
}


BOTH_MODES = pytest.mark.parametrize("proxy_workers", [1, 2], indirect=True)  # and the spans a supervisor builds


@pytest.mark.parametrize(
    "header", ["Authorization", "x-api-key", "api-key", "Cookie", "proxy-authorization", "X-Auth-Token", "x-secret"]
)
def test_credential_headers_are_refused_with_a_reason(header: str) -> None:
    with pytest.raises(ValueError, match="may carry a credential"):
        parse_header_attributes([f"{header}=user.id"])
    assert is_secret_header(header)


@pytest.mark.parametrize(
    "item,reason",
    [
        ("x-user-id", "expected NAME=attribute"),
        ("x-user-id=", "expected NAME=attribute"),
        ("x user=user.id", "not a valid header name"),
        ("x-user-id=User Id", "not an attribute name"),
        ("x-model=gen_ai.request.model", "sets itself"),
        ("x-key=taotrace.key.id", "credential"),
        ("x-k=taotrace.key.id", "sets itself"),
        ("x-q=input.value", "sets itself"),  # --capture-io-values' (OpenInference's)
        ("x-a=output.mime_type", "sets itself"),
    ],
)
def test_bad_mappings_are_refused_with_a_reason(item: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_header_attributes([item])


def test_mappings_parse_and_duplicates_are_refused() -> None:
    found = parse_header_attributes(["X-User-Id=user.id", "x-session-id=gen_ai.conversation.id"])
    assert [(m.header, m.attribute) for m in found] == [
        ("x-user-id", "user.id"),
        ("x-session-id", "gen_ai.conversation.id"),
    ]
    with pytest.raises(ValueError, match="mapped twice"):
        parse_header_attributes(["x-a=team", "x-b=team"])


def test_settings_and_the_command_line_refuse_a_credential_header(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValidationError, match="credential"):
        Settings(attribute_header="x-user-id=user.id,cookie=session")
    assert main(["serve", "--attribute-header", "x-user-id=user.id", "--attribute-header", "x-api-key=k"]) == 2
    err = capsys.readouterr().err
    assert "--attribute-header" in err and "'x-api-key' may carry a credential" in err


def test_the_salt_is_never_echoed_by_a_settings_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--key-salt", "short-salt-1"]) == 2
    err = capsys.readouterr().err
    assert "--key-salt" in err and "short-salt-1" not in err


def test_key_id_is_a_salted_hmac_prefix() -> None:
    expected = hmac.new(SALT, b"sk-one", hashlib.sha256).hexdigest()[:12]
    assert key_id(SALT, "sk-one") == expected
    assert key_id(SALT, "sk-one") != key_id(SALT, "sk-two")
    assert key_id(SALT, "sk-one") != key_id(b"another-salt-0123456", "sk-one")
    assert len(expected) == 12 and int(expected, 16) >= 0


def test_the_key_comes_from_bearer_then_x_api_key_then_api_key() -> None:
    assert api_key_of({"Authorization": "Bearer  sk-a "}) == "sk-a"
    assert api_key_of({"Authorization": "Basic dXNlcg==", "x-api-key": "sk-b"}) == "sk-b"
    assert api_key_of({"api-key": "sk-c"}) == "sk-c"
    assert api_key_of({"Authorization": "Bearer "}) is None
    assert api_key_of({}) is None


def test_attributor_truncates_and_prefers_the_header_over_the_body() -> None:
    attributor = Attributor(parse_header_attributes(["x-user-id=user.id", "x-team=team"]), body_user=True, salt=SALT)
    got = dict(attributor({"x-team": "t" * 300, "x-api-key": "sk-x"}, "body-user"))
    assert got == {KEY_ID: key_id(SALT, "sk-x"), "team": "t" * 256, "user.id": "body-user"}
    got = dict(attributor({"x-user-id": "header-user"}, "body-user"))
    assert got == {"user.id": "header-user"}
    assert attributor.names == {KEY_ID, "user.id", "team"}


def test_unknown_or_clashing_metric_labels_are_refused_at_start() -> None:
    with pytest.raises(ValueError, match="not an attribute the proxy records"):
        accounting_from(Settings(metric_label=["user.id"]))  # no --attribute-body-user, no header for it
    with pytest.raises(ValueError, match="clash"):
        accounting_from(Settings(attribute_header=["x-m=model"], metric_label=["model"]))
    ok = accounting_from(Settings(attribute_body_user=True, metric_label=["user.id", KEY_ID]))
    assert ok.metric_labels == ("user.id", KEY_ID)


async def _post(
    session: aiohttp.ClientSession, url: str, key: str, user: str, path: str = "/v1/chat/completions"
) -> None:
    headers = {"Authorization": f"Bearer {key}", "x-session-id": f"s-{user}"}
    body: dict[str, object] = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "user": user}
    if path.endswith("/messages"):
        body = {"model": "claude", "messages": body["messages"], "metadata": {"user_id": user}}
        headers = {"x-api-key": key, "x-session-id": f"s-{user}"}
    async with session.post(url + path, data=json.dumps(body), headers=headers) as resp:
        assert resp.status == 200
        await resp.read()


@BOTH_MODES
async def test_spans_carry_users_sessions_and_key_ids_never_keys(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    async with start_proxy(
        attribute_header=["x-session-id=gen_ai.conversation.id"], attribute_body_user=True, key_salt=SALT.decode()
    ) as p:
        p.serve(json_handler(CHAT))
        for key, user in (("sk-alpha-1", "alice"), ("sk-alpha-1", "bob"), ("sk-beta-2", "carol")):
            await _post(client, p.url, key, user)
        await _post(client, p.url, "sk-beta-2", "dave", path="/v1/messages")
    roots = [s for s in p.spans() if s.kind.name == "CLIENT"]
    got = [
        (s.attributes.get("user.id"), s.attributes.get("gen_ai.conversation.id"), s.attributes[KEY_ID]) for s in roots
    ]
    alpha, beta = key_id(SALT, "sk-alpha-1"), key_id(SALT, "sk-beta-2")
    assert got == [
        ("alice", "s-alice", alpha),
        ("bob", "s-bob", alpha),
        ("carol", "s-carol", beta),
        ("dave", "s-dave", beta),
    ]
    assert alpha != beta
    for span in p.spans():
        text = json.dumps({k: str(v) for k, v in span.attributes.items()})
        assert "sk-alpha-1" not in text and "sk-beta-2" not in text


@BOTH_MODES
async def test_key_id_is_on_by_default_and_body_user_is_off(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    async with start_proxy() as p:
        p.serve(json_handler(CHAT))
        await _post(client, p.url, "sk-one", "alice")
        await _post(client, p.url, "sk-two", "alice")
        await p.settled(2)
    ids = [s.attributes[KEY_ID] for s in p.spans() if s.kind.name == "CLIENT"]
    assert len(ids) == 2 and ids[0] != ids[1] and all(len(i) == 12 for i in ids)
    assert all("user.id" not in s.attributes for s in p.spans())
    assert p.records[0].attributes == ((KEY_ID, ids[0]),)


async def _scrape(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as resp:
        return await resp.text()


async def test_no_attribution_series_without_metric_label(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    async with start_proxy(attribute_body_user=True) as p:
        p.serve(json_handler(CHAT))
        await _post(client, p.url, "sk-one", "alice")
        text = await _scrape(p.metrics_url)
    assert "taotrace_attributed" not in text and "alice" not in text and p.records[0].attributes[0][0] == KEY_ID


async def test_metric_labels_are_bounded_per_attribute(
    start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    async with start_proxy(attribute_body_user=True, metric_label=["user.id"], metric_label_values=2) as p:
        p.serve(json_handler(CHAT))
        for user in ("alice", "bob", "carol", "dave", "alice"):
            await _post(client, p.url, "sk-one", user)
        text = await _scrape(p.metrics_url)
    lines = [line for line in text.splitlines() if line.startswith("taotrace_attributed_requests_total{")]
    counts = {line.split('user_id="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1]) for line in lines}
    assert counts == {"alice": 2.0, "bob": 1.0, "other": 2.0}
    tokens = [line for line in text.splitlines() if line.startswith("taotrace_attributed_tokens_total{")]
    assert any('type="input"' in line and 'user_id="alice"' in line and line.endswith(" 6.0") for line in tokens)


@pytest.mark.skipif(sys.platform != "linux", reason="--workers needs SO_REUSEPORT (Linux)")
async def test_workers_share_one_salt_so_a_key_has_one_id() -> None:
    """Without --key-salt one salt is drawn per start, and the supervisor hands it to every worker."""
    from proxy.workers.supervisor import supervising
    from tests.fakes import FakeUpstream, chat_stream, stream_handler

    upstream = await FakeUpstream(stream_handler(chat_stream(10), gap=0.05)).start()
    settings = Settings(upstream=upstream.url, port=0, metrics_port=0, drain_seconds=2.0, workers=2)

    async def one() -> None:
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s,
            s.post(group.proxy_url + "/v1/chat/completions", json={"model": "m", "stream": True},
                   headers={"Authorization": "Bearer sk-one-key"}) as r,
        ):  # fmt: skip
            await r.read()

    config = load(settings)  # as `taotrace serve` loads it, once, when it checks the settings
    accounting = config.accounting
    try:
        async with supervising(config) as group:
            tasks = [asyncio.ensure_future(one()) for _ in range(12)]
            deadline = time.monotonic() + 10
            while True:  # both workers serve (asked, as a scrape asks them)
                await group.refresh()
                if all(w.in_flight.get(("127.0.0.1", "chat_completions")) for w in group.workers):
                    break
                assert time.monotonic() < deadline, "one worker got every connection"
                await asyncio.sleep(0.02)
            await asyncio.gather(*tasks)
            async with aiohttp.ClientSession() as session:
                records = await records_of(group.metrics_url, session)  # what both workers' live views show
    finally:
        await upstream.close()
    assert len(records) == 12
    ids = {dict(r.attributes)[KEY_ID] for r in records}
    assert ids == {accounting.attributor.key_id("sk-one-key")}  # the salt drawn at start is every worker's


def test_cached_key_ids_equal_the_hmac_and_the_cache_holds_no_key() -> None:
    # The Attributor remembers recent keys' ids; whatever it answers from the cache, evicted or
    # not, is the salted HMAC, and what it keeps is digests, never the key text.
    attributor = Attributor((), body_user=False, salt=SALT, key_id_cache=4)
    keys = [f"sk-key-{i:02d}-{'x' * 40}" for i in range(10)]
    for _ in range(3):  # misses, evictions, then misses again: ids stay the same
        for key in [*keys[:3], *keys, *keys[:3]]:
            assert dict(attributor({"Authorization": f"Bearer {key}"}, None)) == {KEY_ID: key_id(SALT, key)}
    cache = attributor._ids  # private: the one place to check what stays in memory
    assert len(cache) == 4  # bounded
    blob = b"".join(cache) + "".join(cache.values()).encode()
    assert all(len(digest) == 16 for digest in cache) and not any(key[3:].encode() in blob for key in keys)
    other = Attributor((), body_user=False, salt=SALT)  # another process (or attributor): other digests
    other.key_id(keys[0])
    assert not set(other._ids) & set(attributor._ids)
