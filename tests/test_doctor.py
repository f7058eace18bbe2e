"""`taotrace doctor`: each check's failure, in order, against the simulator, a scripted upstream
and the proxy; the key is never printed."""

from __future__ import annotations

import asyncio
import io
import json
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from proxy.config.settings import Settings
from proxy.serve import running as proxy_running
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
    args: dict[str, Any] = {"api_key": SECRET, "timeout": 3.0, **kwargs}
    settings = DoctorSettings(**args)
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
    if sys.platform.startswith("linux"):  # the kernel's round trip, and the network's share of the TTFT
        assert re.search(r"connected \(\d+ ms, round trip \d+\.\d+ ms\)", checks[1].detail), checks[1].detail
        assert re.search(r"\n +your network adds [\d.]+ ms of the [\d.]+ ms TTFT \(", checks[-1].detail), text


async def test_key_missing_or_mangled(sim: SimRunning) -> None:
    checks, _ = await _doctor(base_url=sim.base_url, api_key=None)
    failed = _failed(checks)
    assert checks[0].detail.startswith("none set") and failed.name == "auth"  # the endpoint said it wants one
    assert "wants a key (it answered 401) and none is set" in failed.detail
    assert failed.fix == "export TAOTOKEN_API_KEY=<your key>  (or pass --api-key)"
    failed = _failed((await _doctor(base_url=sim.base_url, api_key=f'"{SECRET}"'))[0])
    assert failed.name == "key" and "quotes" in failed.detail


async def test_a_missing_key_is_named_as_the_config_file_names_it(
    sim: SimRunning, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("TAOTRACE_API_KEY", "TAOTOKEN_API_KEY", "MY_KEY"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "llm.json"
    config.write_text(json.dumps({"base_url": sim.base_url, "api_key_env": "MY_KEY"}))
    checks, text = await _doctor(config=str(config), api_key=None)
    failed = _failed(checks)
    assert "$MY_KEY (api_key_env in --config)" in checks[0].detail and "$MY_KEY" in failed.detail
    assert failed.fix == "export MY_KEY=<your key>  (or pass --api-key)"
    monkeypatch.setenv("MY_KEY", SECRET)
    checks, text = await _doctor(config=str(config), api_key=None)
    assert all(c.status == "ok" for c in checks) and "present (from $MY_KEY)" in text


async def test_an_endpoint_that_needs_no_key_passes_without_one() -> None:
    async with running(SimSettings(port=0, time_scale=0.25)) as open_sim:
        checks, text = await _doctor(base_url=open_sim.base_url, api_key=None)
    assert all(c.status == "ok" for c in checks), text
    assert checks[0].detail.startswith("none set") and checks[2].detail.startswith("no key needed")


async def test_a_proxy_that_cannot_reach_its_upstream_is_told_as_such(sim: SimRunning) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    settings = Settings(upstream=f"http://127.0.0.1:{closed}", port=0, metrics_port=0, connect_timeout=2)
    async with proxy_running(settings) as srv:
        failed = _failed((await _doctor(base_url=srv.proxy_url + "/v1"))[0])
    assert failed.name == "auth" and "the taotrace proxy answered 502: it cannot reach its upstream" in failed.detail
    assert failed.fix is not None and "having trouble" not in failed.fix and "--upstream" in failed.fix


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


async def test_a_base_url_without_v1_that_works_only_here_passes_with_a_warning() -> None:
    """The simulator (and a proxy in front of it) takes /models and /v1/models; providers only the
    second: the doctor passes the first with a warning naming the form that works elsewhere."""
    async with running(SimSettings(port=0, time_scale=0.25)) as open_sim:
        checks, text = await _doctor(base_url=open_sim.url, api_key=None)
        network = checks[1]
        assert [c.status for c in checks] == ["ok", "warn", "ok", "ok", "ok"], text
        assert network.warning is not None and network.warning.startswith(
            f"{open_sim.url}/models answers and so does {open_sim.url}/v1/models: this server takes either"
        )
        assert f"{open_sim.url}/v1/chat/completions for the chat call" in network.warning
        assert network.fix == f"use --base-url {open_sim.url}/v1, the form that works elsewhere too"
        assert f"\n                 warning: {network.warning}\n                 fix: " in text
        assert text.endswith("all checks passed (1 warning)\n")
        assert report(load_target(DoctorSettings(base_url=open_sim.url)), checks, True, io.StringIO()) == 0
        checks, text = await _doctor(base_url=open_sim.base_url, api_key=None)  # with /v1: nothing to say
        assert all(c.status == "ok" and c.warning is None for c in checks) and text.endswith("all checks passed\n")


async def test_the_metrics_port_is_named_with_the_proxys(sim: SimRunning) -> None:
    async with proxy_running(Settings(upstream=sim.url, port=0, metrics_port=0)) as srv:
        for base_url in (srv.metrics_url, srv.metrics_url + "/v1"):
            failed = _failed((await _doctor(base_url=base_url))[0])
            assert failed.name == "network", failed
            assert failed.detail == (
                f"{srv.metrics_url} is taotrace's metrics port (/metrics, /healthz, the live view); "
                "the proxy is on serve's --port"
            )
            assert failed.fix == "use --base-url http://127.0.0.1:8787/v1 (the proxy's --port: 8787 unless it was set)"
    failed = _failed((await _doctor(base_url=sim.url))[0])  # a 404 elsewhere is still told as before
    assert "taotrace's metrics port" not in failed.detail


def test_a_bad_proxy_variable_is_exit_2_and_one_line_as_for_probe(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from proxy.tools import doctor, probe

    monkeypatch.setenv("HTTPS_PROXY", "socks5://me:hush-0123@127.0.0.1:1080")
    monkeypatch.delenv("https_proxy", raising=False)
    flags: dict[str, Any] = {"base_url": "https://api.example.com/v1", "api_key": SECRET, "json_output": True}
    for name in ("doctor", "probe"):
        if name == "doctor":
            code = doctor.run(DoctorSettings(**flags), io.StringIO())
        else:
            code = probe.run(probe.ProbeSettings(**flags), io.StringIO())
        err = capsys.readouterr().err
        assert code == 2 and "hush-0123" not in err and SECRET not in err
        assert err == (
            f"{name}: HTTPS_PROXY uses a socks5:// proxy; only http:// forward proxies "
            "are supported (for an https upstream the tunnel to it is still TLS end to end); "
            "give it as http://[USER:PASSWORD@]host:port, or unset it to connect directly\n"
        )


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
    failed = _failed((await _doctor(base_url=sim.base_url.replace("http://", "")))[0])
    assert failed.fix == f"use --base-url {sim.base_url}"  # the user's own host, with the scheme it lacked


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
        (sse(*GOOD, done=False), "ok", "no usage chunk"),  # some servers never send [DONE]
        (sse(*GOOD[:-1]), "fail", "the stream ended without its end (no finish_reason)"),  # [DONE] alone
        ([], "fail", "the stream ended without its end (no event at all)"),
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
    assert checks[2].detail == "key accepted (GET /models: 1 model)"  # the scripted upstream lists one


async def test_doctor_through_the_proxy(sim: SimRunning) -> None:
    async with proxy_running(Settings(upstream=sim.url, port=0, metrics_port=0)) as srv:
        checks, text = await _doctor(base_url=srv.proxy_url + "/v1")
    assert all(c.status == "ok" for c in checks), text


async def test_cli_exit_status_and_json(sim: SimRunning) -> None:
    async def cli(*args: str, key: str | None) -> tuple[int, bytes, bytes]:
        env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", **({"TAOTOKEN_API_KEY": key} if key else {})}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy", "doctor", "--base-url", sim.base_url, *args,
            env=env, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert SECRET.encode() not in out + err
        return proc.returncode or 0, out, err

    code, out, err = await cli("--json", key=SECRET)
    doc = json.loads(out)  # stdout is only the JSON; the checks as they ended are on stderr (not a terminal)
    assert code == 0 and doc["ok"] is True and [c["status"] for c in doc["checks"]] == ["ok"] * 5
    assert [line.split(":")[1] for line in err.decode().splitlines()] == [
        f" {name} ok" for name in ("key", "network", "auth", "model", "stream")
    ]
    code, out, err = await cli(key=None)
    assert code == 1 and b"FAIL  auth" in out and b"export TAOTOKEN_API_KEY" in out and err == b""


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("as_json", "sig", "status"),
    [(False, signal.SIGINT, 130), (True, signal.SIGTERM, 143)],
    ids=["text-sigint", "json-sigterm"],
)
async def test_checks_show_as_they_end_and_ctrl_c_keeps_them(as_json: bool, sig: signal.Signals, status: int) -> None:
    """A real process and a real SIGINT (or SIGTERM), against an endpoint whose stream never comes:
    the four checks before it were printed as each ended; the signal ends the fifth, exit 130 (143
    for SIGTERM), no traceback."""

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path.endswith("/models"):
            return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(3600)  # the stream stalls (a cancelled handler when the client leaves)
        return response

    fake = await FakeUpstream(handler).start()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "doctor", "--base-url", fake.url + "/v1", "--model", "m",
        *(["--json"] if as_json else []),
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    shown = proc.stderr if as_json else proc.stdout  # --json: stdout is the JSON, at the end
    assert shown is not None
    try:
        lines = [(await asyncio.wait_for(shown.readline(), 30)).decode() for _ in range(4 if as_json else 5)]
        assert proc.returncode is None  # the stream check is under way: the others were shown as they ended
        await asyncio.sleep(0.2)
        proc.send_signal(sig)
        out, err = await asyncio.wait_for(proc.communicate(), 15)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await fake.close()
    said = err.decode()
    assert proc.returncode == status and "doctor: interrupted during the stream check\n" in said, said
    assert "Traceback" not in said
    if as_json:
        assert [line.split(":")[1] for line in lines] == [" key ok", " network ok", " auth ok", " model ok"]
        doc = json.loads(out)
        assert doc["interrupted"] is True and doc["ok"] is False
        assert [(c["name"], c["status"]) for c in doc["checks"]][3:] == [("model", "ok"), ("stream", "skip")]
        assert doc["checks"][-1]["detail"] == "interrupted"
    else:
        assert lines[0] == f"taotrace doctor: {fake.url}/v1, model m\n"
        assert [line.split()[:2] for line in lines[1:]] == [["ok", n] for n in ("key", "network", "auth", "model")]
        assert out == b""  # nothing after them: no "all checks passed"
