"""`taotrace probe` and its streaming client: what counts as a token, usage-only chunks, the
config file, the key never shown, and agreement with the proxy's own TTFT."""

from __future__ import annotations

import asyncio
import io
import json
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from proxy.config.settings import Settings
from proxy.exchange.record import RequestRecord
from proxy.serve import running as proxy_running
from proxy.sim import SimRunning, SimSettings, running
from proxy.tools.client import Call, measure
from proxy.tools.clientconfig import load_target
from proxy.tools.probe import ProbeSettings, probe, report
from proxy.tools.progress import Progress
from tests.fakes import FakeUpstream, chat_chunk, sse, stream_handler, usage_chunk

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
async def sim() -> AsyncIterator[SimRunning]:
    async with running(SimSettings(port=0, time_scale=0.25)) as srv:
        yield srv


async def _probe(settings: ProbeSettings) -> tuple[int, str]:
    target = load_target(settings)
    out = io.StringIO()
    code = report(settings, target, await probe(settings, target), out)
    return code, out.getvalue()


# --- the client's token rules --------------------------------------------------------------


async def test_role_empty_comment_and_usage_only_chunks_are_not_tokens() -> None:
    """The article's `KeyError: 'choices'` trap: a usage chunk has `choices: []`."""
    frames = [
        b": keep-alive\n\n",
        *sse(chat_chunk(role="assistant", content=""), done=False),
        *sse(chat_chunk(content=""), done=False),
        *sse({"id": "x", "object": "chat.completion.chunk", "choices": []}, done=False),  # empty, no usage
        *sse(
            chat_chunk("Hel"),
            chat_chunk("lo"),
            chat_chunk("!"),
            chat_chunk(finish="stop"),
            usage_chunk(9, 3, cached=4),
            done=True,
        ),
    ]
    fake = await FakeUpstream(stream_handler(frames, first_delay=0.0, gap=0.03)).start()
    try:
        async with aiohttp.ClientSession() as session:
            m = await measure(session, fake.url + "/v1", Call("chat_completions", "m", "hi", 5))
    finally:
        await fake.close()
    assert m.ok and m.ended and m.unparsed == 0
    assert m.token_events == 3 and m.output_tokens == 3 and m.usage_source == "reported"
    assert (m.input_tokens, m.cached_tokens) == (9, 4)
    assert m.ttfb_s is not None and m.ttft_s is not None
    assert m.ttft_s - m.ttfb_s >= 0.08  # 4 non-token frames 30 ms apart came first
    assert m.tpot_s is not None and 0.02 < m.tpot_s < 0.1


async def test_without_a_usage_chunk_tokens_are_counted() -> None:
    frames = sse(chat_chunk(role="assistant", content=""), chat_chunk("a"), chat_chunk("b"), chat_chunk(finish="stop"))
    fake = await FakeUpstream(stream_handler(frames)).start()
    try:
        async with aiohttp.ClientSession() as session:
            m = await measure(session, fake.url, Call("chat_completions", "m", "hi", 5))
    finally:
        await fake.close()
    assert m.ok and m.output_tokens == 2 and m.usage_source == "counted" and not m.usage_reported


@pytest.mark.parametrize(
    ("frames", "error"),
    [
        (sse(chat_chunk("a"), done=False), "the stream ended without its end"),
        (sse(chat_chunk("a")), "the stream ended without its end"),  # [DONE] without a finish_reason
        ([], "an empty event stream"),
        (sse(chat_chunk("a"), chat_chunk(finish="stop"), done=False), None),  # [DONE] is optional
    ],
)
async def test_a_stream_without_its_end_is_an_error(frames: list[bytes], error: str | None) -> None:
    fake = await FakeUpstream(stream_handler(frames)).start()
    try:
        async with aiohttp.ClientSession() as session:
            m = await measure(session, fake.url, Call("chat_completions", "m", "hi", 5))
    finally:
        await fake.close()
    assert m.error == error and m.ok is (error is None)


# --- probe against the simulator -----------------------------------------------------------


@pytest.mark.parametrize("api", ["chat", "completions", "responses", "messages"])
async def test_probe_prints_the_article_numbers_as_json(sim: SimRunning, api: str) -> None:
    code, text = await _probe(ProbeSettings(base_url=sim.base_url, api=api, max_tokens=12, json_output=True))
    doc = json.loads(text)
    assert code == 0 and doc["output_tokens"] == 12 and doc["api"] != "chat"
    assert set(doc) >= {"ttft_s", "total_s", "output_tokens", "tpot_s", "tokens_per_s"}
    assert 0 < doc["ttft_s"] < doc["total_s"] and doc["tpot_s"] > 0 and doc["tokens_per_s"] > 0


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
async def test_probe_reports_both_first_tokens_and_the_thinking(sim: SimRunning, api: str) -> None:
    """o3-mini streams 64 tokens of thinking first: its TTFT is the first thought, the answer
    comes after the thinking; o4-mini hides the same thinking: one first token, an estimate."""
    settings = ProbeSettings(base_url=sim.base_url, api=api, model="o3-mini", max_tokens=72, json_output=True)
    streamed = json.loads((await _probe(settings))[1])
    assert streamed["answer_ttft_s"] == pytest.approx(streamed["ttft_s"] + streamed["thinking_s"], abs=1e-9)
    assert streamed["thinking_s"] > 32 * 0.015 * 0.25  # 64 reasoning tokens at 15 ms (time_scale 0.25): ~0.24 s
    assert streamed["thinking_estimated_s"] is None and streamed["reasoning_tokens_per_s"] > 0
    hidden = json.loads((await _probe(settings.model_copy(update={"model": "o4-mini"})))[1])
    assert hidden["answer_ttft_s"] == hidden["ttft_s"] and hidden["thinking_s"] is None
    if api == "messages":  # Anthropic reports no reasoning count: nothing to estimate from
        assert hidden["thinking_estimated_s"] is None and hidden["reasoning_tokens"] is None
        return
    assert hidden["reasoning_tokens"] == 64
    assert hidden["thinking_estimated_s"] == pytest.approx(streamed["thinking_s"], rel=0.3)
    assert hidden["answer_tokens_per_s"] == pytest.approx(streamed["answer_tokens_per_s"], rel=0.3)
    code, text = await _probe(settings.model_copy(update={"json_output": False, "model": "o4-mini", "runs": 2}))
    lines = text.splitlines()
    assert code == 0 and lines[1].split()[:4] == ["run", "TTFT", "answer", "thinking"]
    assert lines[2].split()[5].startswith("~")  # hidden: estimated, never shown as measured
    assert any(line.startswith("hidden reasoning tokens count as output") for line in lines)
    assert "first answer token" in next(line for line in lines if line.startswith("median:"))


async def test_a_plain_model_s_table_has_no_reasoning_columns(sim: SimRunning) -> None:
    code, text = await _probe(ProbeSettings(base_url=sim.base_url, max_tokens=4))
    assert code == 0 and "answer" not in text.splitlines()[1] and "thinking" not in text


async def test_runs_give_a_runs_list_and_show_the_prefix_cache(sim: SimRunning) -> None:
    settings = ProbeSettings(base_url=sim.base_url, runs=3, prompt_repeat=60, max_tokens=8)
    code, text = await _probe(settings)
    assert code == 0
    lines = text.splitlines()
    assert lines[1].split()[:5] == ["run", "TTFT", "network", "RTT", "total"] and lines[5].startswith("median:")
    if sys.platform.startswith("linux"):  # then the network's share of the last run's TTFT
        assert len(lines) == 7 and lines[6].startswith("network (run 3): your network adds ")
    fresh = settings.model_copy(update={"json_output": True, "prompt": "a prompt not seen before"})
    doc = json.loads((await _probe(fresh))[1])
    assert len(doc["runs"]) == 3 and doc["output_tokens"] == 8
    assert doc["runs"][1]["ttft_s"] < doc["runs"][0]["ttft_s"]  # the repeat hits the prefix cache


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="TCP_INFO is read on Linux only")
async def test_probe_splits_ttft_into_network_and_server(sim: SimRunning) -> None:
    settings = ProbeSettings(base_url=sim.base_url, max_tokens=4, json_output=True)
    doc = json.loads((await _probe(settings))[1])
    # A new connection: opening it (TCP on loopback) plus one round trip, all well inside the TTFT.
    assert 0 < doc["rtt_s"] < 0.05 and 0 < doc["connect_s"] < doc["ttft_s"]
    assert doc["network_s"] == pytest.approx(doc["connect_s"] + doc["rtt_s"]) and doc["network_s"] < doc["ttft_s"]
    code, text = await _probe(settings.model_copy(update={"json_output": False}))
    line = text.splitlines()[-1]
    assert code == 0 and line.startswith("network (run 1): your network adds "), text
    assert " ms opening the connection + " in line and line.endswith(" ms round trip; the rest is the server)")


async def test_config_file_aliases_and_default_params(sim: SimRunning, tmp_path: Path) -> None:
    config = tmp_path / "taotoken.json"
    config.write_text(
        json.dumps(
            {
                "base_url": sim.base_url,
                "models": {"fast": "gpt-4o-mini", "strong": {"model": "gpt-4o", "max_tokens": 5}},
                "default_params": {"temperature": 0.2, "max_tokens": 7},
            }
        )
    )
    doc = json.loads((await _probe(ProbeSettings(config=str(config), model="fast", json_output=True)))[1])
    assert (doc["model"], doc["base_url"], doc["output_tokens"]) == ("gpt-4o-mini", sim.base_url, 7)
    doc = json.loads((await _probe(ProbeSettings(config=str(config), model="strong", json_output=True)))[1])
    assert (doc["model"], doc["output_tokens"]) == ("gpt-4o", 5)
    doc = json.loads((await _probe(ProbeSettings(config=str(config), model="fast", max_tokens=3, json_output=True)))[1])
    assert doc["output_tokens"] == 3  # a flag beats the file


async def test_errors_are_reported_and_the_key_never_printed() -> None:
    secret = "sk-probe-secret-0123456789"
    async with running(SimSettings(port=0, time_scale=0.25, require_key=True, api_keys=["other"])) as sim:
        for as_json in (False, True):
            code, text = await _probe(ProbeSettings(base_url=sim.base_url, api_key=secret, json_output=as_json))
            assert code == 1 and "401" in text and secret not in text
        code, text = await _probe(ProbeSettings(base_url=sim.base_url, api_key="other", model="nope"))
        assert code == 1 and "model_not_found" in text
    assert secret not in repr(ProbeSettings(api_key=secret)) and secret not in repr(
        load_target(ProbeSettings(api_key=secret))
    )


# --- through the proxy ---------------------------------------------------------------------


async def test_client_and_proxy_agree_on_ttft(sim: SimRunning) -> None:
    records: list[RequestRecord] = []
    settings = Settings(upstream=sim.url, port=0, metrics_port=0)
    async with proxy_running(settings, on_record=records.append) as srv, aiohttp.ClientSession() as session:
        results = [
            await measure(session, srv.proxy_url + "/v1", Call("chat_completions", "gpt-4o-mini", "x " * n, 10))
            for n in (50, 800)
        ]
        for _ in range(50):
            if len(records) == 2:
                break
            await asyncio.sleep(0.01)
    assert all(m.ok for m in results) and len(records) == 2
    for m, record in zip(results, records, strict=False):
        assert record.timing.ttft is not None and m.ttft_s is not None
        assert abs(m.ttft_s - record.timing.ttft) < 0.010
        assert record.usage.output_tokens == m.output_tokens == 10


# --- the command line ----------------------------------------------------------------------


async def test_cli_reads_the_key_from_taotoken_api_key_and_prints_json(sim: SimRunning) -> None:
    env = {"TAOTOKEN_API_KEY": "k-cli", "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "probe", "--base-url", sim.base_url, "--max-tokens", "4", "--json",
        env=env, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert json.loads(out)["output_tokens"] == 4 and b"k-cli" not in out + err
    seen = sim.simulator.stats()["requests"]
    assert seen and seen[-1]["output_tokens"] == 4


@pytest.mark.parametrize(
    ("base_url", "fix"),
    [
        ("notaurl", "use --base-url https://notaurl"),
        ("localhost:8787/v1", "use --base-url http://localhost:8787/v1"),
        ("http://127.0.0.1:8787/v1/chat/completions", "use --base-url http://127.0.0.1:8787/v1"),
    ],
)
async def test_a_bad_base_url_is_told_as_doctor_tells_it(
    base_url: str, fix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from proxy.tools.doctor import DoctorSettings, diagnose
    from proxy.tools.probe import run

    assert run(ProbeSettings(base_url=base_url, api_key="k")) == 2
    said = capsys.readouterr().err
    network = (await diagnose(load_target(DoctorSettings(base_url=base_url, api_key="k"))))[1]
    assert network.status == "fail" and network.fix == fix
    assert said == f"probe: {network.detail}; {fix}\n"


# --- progress and Ctrl-C -------------------------------------------------------------------


def test_progress_rewrites_one_line_on_a_terminal_and_logs_lines_elsewhere() -> None:
    terminal, log = io.StringIO(), io.StringIO()
    for stream, tty in ((terminal, True), (log, False)):
        shown = Progress(stream, tty=tty)
        shown.running("probe: run 1/2")
        shown.done("probe: run 1/2: TTFT 10.0 ms")
        shown.running("probe: run 2/2")
        shown.clear()
        shown.clear()  # nothing left to wipe
    assert terminal.getvalue() == "\r\033[K  probe: run 1/2 ...\r\033[K  probe: run 2/2 ...\r\033[K"
    assert log.getvalue() == "probe: run 1/2: TTFT 10.0 ms\n"


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("as_json", "sig", "status"),
    [(False, signal.SIGINT, 130), (True, signal.SIGTERM, 143)],
    ids=["table-sigint", "json-sigterm"],
)
async def test_runs_show_as_they_finish_and_ctrl_c_prints_those_finished(
    sim: SimRunning, as_json: bool, sig: signal.Signals, status: int
) -> None:
    """A real process and a real SIGINT (or SIGTERM): the finished runs were on stderr as they
    ended, and after the signal stdout holds them (a table, or pure JSON), with exit 130 (143 for
    SIGTERM: the shell's 128 + the signal) and no traceback."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "probe", "--base-url", sim.base_url, "--runs", "50", "--max-tokens", "200",
        *(["--json"] if as_json else []),
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        shown = [(await asyncio.wait_for(proc.stderr.readline(), 30)).decode() for _ in range(2)]
        assert proc.returncode is None  # still running: each run was shown as it ended
        proc.send_signal(sig)
        out, err = await asyncio.wait_for(proc.communicate(), 15)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    for n, line in enumerate(shown, 1):
        assert re.fullmatch(rf"probe: run {n}/50: TTFT [\d.]+ ms, total [\d.]+ ms, 200 tokens, [\d.]+ tok/s\n", line)
    said = err.decode()
    found = re.search(r"probe: interrupted during run (\d+) of 50; the (\d+) finished are below\n", said)
    assert proc.returncode == status and found is not None, said
    finished = int(found[2])
    assert int(found[1]) == finished + 1 and finished >= 2 and "Traceback" not in said
    if as_json:
        doc = json.loads(out)
        assert doc["interrupted"] is True and len(doc["runs"]) == finished
        assert all(run["output_tokens"] == 200 for run in doc["runs"])
    else:
        rows = [line for line in out.decode().splitlines() if re.match(r"\d+ ", line)]
        assert [row.split()[0] for row in rows] == [str(n) for n in range(1, finished + 1)]
        assert "median: TTFT" in out.decode()
