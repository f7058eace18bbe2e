"""`taotrace doctor`: each check's failure, in order, against the simulator, a scripted upstream
and the proxy; the key is never printed."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from proxy.serve import running as proxy_running
from proxy.settings import Settings
from proxy.sim import SimRunning, SimSettings, running
from proxy.tools.clientconfig import load_target
from proxy.tools.doctor import Check, DoctorSettings, diagnose, report
from tests.fakes import FakeUpstream, chat_chunk, sse, usage_chunk

ROOT = Path(__file__).resolve().parents[1]
SECRET = "sk-doctor-secret-0123456789"


@pytest.fixture
async def sim() -> AsyncIterator[SimRunning]:
    settings = SimSettings(port=0, time_scale=0.25, require_key=True, api_keys=[SECRET], path_prefix="/v1")
    async with running(settings) as srv:
        yield srv


async def _doctor(**kwargs: object) -> tuple[list[Check], str]:
    settings = DoctorSettings(**{"api_key": SECRET, "timeout": 3.0, **kwargs})
    checks = await diagnose(load_target(settings), settings.timeout)
    out = io.StringIO()
    report(load_target(settings), checks, False, out)
    assert SECRET not in out.getvalue()
    return checks, out.getvalue()


def _failed(checks: list[Check]) -> Check:
    failed = [c for c in checks if c.status == "fail"]
    assert len(failed) == 1, checks
    index = checks.index(failed[0])
    assert all(c.status == "ok" for c in checks[:index]) and all(c.status == "skip" for c in checks[index + 1 :])
    assert failed[0].fix
    return failed[0]


async def test_all_checks_pass_against_the_simulator(sim: SimRunning) -> None:
    checks, text = await _doctor(base_url=sim.base_url)
    assert [c.name for c in checks] == ["key", "network", "auth", "model", "stream"]
    assert all(c.status == "ok" for c in checks), text
    assert "usage-only chunk (empty choices) parsed" in checks[-1].detail and text.endswith("all checks passed\n")


async def test_key_missing_or_mangled(sim: SimRunning) -> None:
    failed = _failed((await _doctor(base_url=sim.base_url, api_key=None))[0])
    assert failed.name == "key" and "TAOTOKEN_API_KEY" in failed.fix
    failed = _failed((await _doctor(base_url=sim.base_url, api_key=f'"{SECRET}"'))[0])
    assert failed.name == "key" and "quotes" in failed.detail


@pytest.mark.parametrize(
    ("suffix", "words", "fix"),
    [
        ("", "a path is missing", "/v1"),
        ("/v1/v1", "a path is added", "/v1"),
        ("/v1/chat/completions", "endpoint path '/chat/completions'", "/v1"),
    ],
)
async def test_network_names_a_malformed_base_url(sim: SimRunning, suffix: str, words: str, fix: str) -> None:
    failed = _failed((await _doctor(base_url=sim.url + suffix))[0])
    assert failed.name == "network" and words in failed.detail
    assert failed.fix == f"use --base-url {sim.url}{fix}"


async def test_network_failures_dns_connect_tls_scheme(sim: SimRunning) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    cases = {
        "http://no-such-host.invalid/v1": "cannot resolve",
        f"http://127.0.0.1:{closed}/v1": "cannot connect",
        sim.base_url.replace("http://", "https://"): "TLS",
        sim.base_url.replace("http://", ""): "no http(s):// scheme",
    }
    for base_url, words in cases.items():
        failed = _failed((await _doctor(base_url=base_url))[0])
        assert failed.name == "network" and words in failed.detail, (base_url, failed)


async def test_auth_rejects_a_wrong_key(sim: SimRunning) -> None:
    failed = _failed((await _doctor(base_url=sim.base_url, api_key="sk-wrong"))[0])
    assert failed.name == "auth" and "401" in failed.detail


async def test_model_not_served_names_the_close_ones(sim: SimRunning) -> None:
    failed = _failed((await _doctor(base_url=sim.base_url, model="gpt4o"))[0])
    assert failed.name == "model" and "'gpt4o'" in failed.detail and "gpt-4o" in failed.detail
    assert failed.fix == "use --model gpt-4o"


def _scripted(frames: list[bytes]) -> FakeUpstream:
    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path.endswith("/models"):
            return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for frame in frames:
            await response.write(frame)
        await response.write_eof()
        return response

    return FakeUpstream(handler)


GOOD = [chat_chunk(role="assistant", content=""), chat_chunk("O"), chat_chunk("K"), chat_chunk(finish="stop")]


@pytest.mark.parametrize(
    ("frames", "status", "words"),
    [
        (sse(*GOOD, usage_chunk(5, 2)), "ok", "usage-only chunk (empty choices) parsed"),
        (sse(*GOOD), "ok", "no usage chunk"),
        (sse(*GOOD, done=False), "fail", "before `data: [DONE]`"),
        ([b"data: <html>oops</html>\n\n", *sse(*GOOD)], "fail", "not JSON"),
        (
            sse(
                chat_chunk(role="assistant", content=""),
                {"error": {"message": "boom", "type": "server_error"}},
                done=False,
            ),
            "fail",
            "boom",
        ),
        (sse(chat_chunk(role="assistant", content=""), chat_chunk(finish="stop")), "fail", "no tokens"),
    ],
)
async def test_stream_check_parses_every_chunk(frames: list[bytes], status: str, words: str) -> None:
    fake = await _scripted(frames).start()
    try:
        checks, _ = await _doctor(base_url=fake.url + "/v1", model="m")
    finally:
        await fake.close()
    stream = checks[-1]
    assert stream.name == "stream" and stream.status == status and words in stream.detail, checks


async def test_doctor_through_the_proxy(sim: SimRunning) -> None:
    async with proxy_running(Settings(upstream=sim.url, port=0, metrics_port=0)) as srv:
        checks, text = await _doctor(base_url=srv.proxy_url + "/v1")
    assert all(c.status == "ok" for c in checks), text


async def test_cli_exit_status_and_json(sim: SimRunning) -> None:
    async def cli(*args: str, key: str | None) -> tuple[int, bytes]:
        env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", **({"TAOTOKEN_API_KEY": key} if key else {})}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy", "doctor", "--base-url", sim.base_url, *args,
            env=env, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert SECRET.encode() not in out
        return proc.returncode or 0, out

    code, out = await cli("--json", key=SECRET)
    doc = json.loads(out)
    assert code == 0 and doc["ok"] is True and [c["status"] for c in doc["checks"]] == ["ok"] * 5
    code, out = await cli(key=None)
    assert code == 1 and b"FAIL  key" in out
