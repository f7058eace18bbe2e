"""`taotrace demo`: the experiments through the real proxy in front of the simulator, the
`--json` schema, the effects the article promises, client/proxy TTFT agreement, and the
reasoning rows: the article's client TTFT (first content) is the proxy's first answer token."""

from __future__ import annotations

import asyncio
import io
import json
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pydantic import SecretStr

from proxy.config.settings import Settings
from proxy.exchange.record import RequestRecord
from proxy.serve import running as proxy_running
from proxy.sim import SimSettings, running
from proxy.tools.command import taotrace_command
from proxy.tools.demo import DemoSettings, demo
from proxy.tools.experiments import COLUMNS, REASONING_COLUMNS

ROOT = Path(__file__).resolve().parents[1]
RUN_KEYS = {
    "label", "model", "input_tokens", "cached_tokens", "ttft_s", "total_s", "output_tokens", "tpot_s",
    "tokens_per_s", "proxy_ttft_s", "network_s", "prefill_wait_s", "decode_s", "kv_bytes",
}  # fmt: skip
REASONING_KEYS = {
    "article_ttft_s", "answer_ttft_s", "proxy_answer_ttft_s", "thinking_s", "thinking_estimated_s",
    "reasoning_tokens", "reasoning_tokens_per_s", "answer_tokens_per_s",
}  # fmt: skip
# The simulator's reasoning models think 64 tokens first: 72 leaves an answer of 8
QUICK: dict[str, Any] = {
    "once": True, "port": 0, "metrics_port": 0, "time_scale": 0.5, "max_tokens": 24, "reasoning_max_tokens": 72,
}  # fmt: skip


def _runs(doc: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return next(e["runs"] for e in doc["experiments"] if e["name"] == name)


@pytest.fixture(scope="module")
def demo_json() -> dict[str, Any]:
    """One `taotrace demo --once --json` run, from the command line, shared by the checks below."""
    proc = subprocess.run(
        [sys.executable, "-m", "proxy", "demo", "--once", "--json", "--time-scale", "0.5", "--max-tokens", "24",
         "--reasoning-max-tokens", "72"],
        cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, capture_output=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def test_json_schema_is_exactly_the_issues(demo_json: dict[str, Any]) -> None:
    assert list(demo_json) == ["experiments"]
    names = [e["name"] for e in demo_json["experiments"]]
    assert names == ["input_length", "prefix_cache", "model_size", "reasoning"]
    for experiment in demo_json["experiments"]:
        assert set(experiment) == {"name", "runs"} and len(experiment["runs"]) >= 2
        reasoning = experiment["name"] == "reasoning"
        for run in experiment["runs"]:
            assert set(run) == (RUN_KEYS | REASONING_KEYS if reasoning else RUN_KEYS)
            assert all(run[k] is not None for k in RUN_KEYS), run
            assert run["output_tokens"] == (72 if reasoning else 24)


def test_every_table_column_is_in_the_json(demo_json: dict[str, Any]) -> None:
    """The table and the JSON tell the same things: each column is a run key (or the group's name)."""
    assert {key for _, key in COLUMNS} - {"experiment"} <= RUN_KEYS
    assert {key for _, key in REASONING_COLUMNS} <= RUN_KEYS | REASONING_KEYS
    for experiment in demo_json["experiments"]:
        for run in experiment["runs"]:
            # the article's prompts are long; the reasoning runs ask one short question
            assert run["input_tokens"] > (20 if experiment["name"] == "reasoning" else run["output_tokens"])
            assert run["cached_tokens"] >= 0
            assert run["kv_bytes"] > 0
    first, *repeats = _runs(demo_json, "prefix_cache")
    assert first["cached_tokens"] < repeats[0]["cached_tokens"] <= repeats[0]["input_tokens"]


def test_input_length_raises_ttft_not_tpot(demo_json: dict[str, Any]) -> None:
    runs = _runs(demo_json, "input_length")
    assert [r["label"] for r in runs] == ["1x", "2x", "4x"]
    ttft = [r["ttft_s"] for r in runs]
    assert ttft[0] < ttft[1] < ttft[2] and ttft[2] > 2.0 * ttft[0]
    assert 0.7 < runs[2]["tpot_s"] / runs[0]["tpot_s"] < 1.4


def test_prefix_cache_repeats_skip_most_of_the_prefill(demo_json: dict[str, Any]) -> None:
    first, *repeats = _runs(demo_json, "prefix_cache")
    assert len(repeats) == 2
    assert all(r["ttft_s"] < 0.5 * first["ttft_s"] for r in repeats)
    assert all(r["prefill_wait_s"] < 0.5 * first["prefill_wait_s"] for r in repeats)


def test_model_size_raises_ttft_and_tpot(demo_json: dict[str, Any]) -> None:
    small, large = _runs(demo_json, "model_size")
    assert (small["label"], large["label"]) == ("gpt-4o-mini", "gpt-4o")
    assert large["ttft_s"] > 1.5 * small["ttft_s"] and large["tpot_s"] > 1.8 * small["tpot_s"]


def test_client_and_proxy_agree_and_the_split_adds_up(demo_json: dict[str, Any]) -> None:
    runs = [run for experiment in demo_json["experiments"] for run in experiment["runs"]]
    # Client and proxy time the same request: in one process, on one clock, the proxy's interval
    # lies inside the client's (the client starts before sending and sees the first token only
    # after the proxy relayed it), whatever the load. How far apart they are (loopback, event
    # loop) is load, typically < 1 ms: the demo's own report prints it ("client vs proxy TTFT:
    # max |difference|"); here only a bound a busy 2-core machine keeps.
    assert all(run["proxy_ttft_s"] <= run["ttft_s"] for run in runs)
    gaps = sorted(run["ttft_s"] - run["proxy_ttft_s"] for run in runs)
    assert gaps[len(gaps) // 2] < 0.05
    for run in runs:
        assert run["network_s"] + run["prefill_wait_s"] == pytest.approx(run["proxy_ttft_s"], abs=1e-6)
        assert run["decode_s"] < run["total_s"]


def test_the_reasoning_rows_agree_with_the_article_s_client(demo_json: dict[str, Any]) -> None:
    """The article's client code (TTFT at the first content) through the proxy: for a model that
    streams its thinking it measures the answer's first token, which the proxy has as its own
    number beside its first token (the first thought); a model that hides its thinking has its
    first token the answer's, and the thinking estimated inside prefill_wait."""
    streamed, hidden = _runs(demo_json, "reasoning")
    assert (streamed["model"], hidden["model"]) == ("o3-mini", "o4-mini")
    for run in (streamed, hidden):
        # One request, two clocks on one machine: the proxy's instant lies inside the client's
        # interval; loopback and a busy event loop apart (< 1 ms on a quiet machine).
        assert run["proxy_answer_ttft_s"] <= run["article_ttft_s"] < run["proxy_answer_ttft_s"] + 0.1
        assert run["answer_ttft_s"] == pytest.approx(run["article_ttft_s"], abs=0.01)  # the same bytes, read twice
        assert run["reasoning_tokens"] == 64
    # Streamed: the proxy's TTFT is the first thought, ~64 tokens of thinking before the article's
    assert streamed["article_ttft_s"] - streamed["proxy_ttft_s"] > 0.3
    assert streamed["thinking_s"] == pytest.approx(streamed["proxy_answer_ttft_s"] - streamed["proxy_ttft_s"], abs=1e-6)
    assert streamed["thinking_estimated_s"] is None
    # Hidden: nothing before the answer; the estimate is the same model's measured thinking, about
    assert hidden["proxy_answer_ttft_s"] == hidden["proxy_ttft_s"] and hidden["thinking_s"] is None
    assert 0.5 * hidden["prefill_wait_s"] < hidden["thinking_estimated_s"] <= hidden["prefill_wait_s"]
    assert hidden["thinking_estimated_s"] == pytest.approx(streamed["thinking_s"], rel=0.25)
    assert hidden["answer_tokens_per_s"] == pytest.approx(streamed["answer_tokens_per_s"], rel=0.25)


async def test_the_article_s_sdk_loop_through_the_proxy_times_the_answer() -> None:
    """The article's client code itself, with the OpenAI SDK, through the proxy to the simulator's
    reasoning model: its TTFT (first `delta.content`) is the proxy's time to first answer token."""
    import openai

    records: list[RequestRecord] = []
    async with running(SimSettings(port=0, time_scale=0.5)) as sim:
        settings = Settings(upstream=sim.url, port=0, metrics_port=0, ui=False)
        async with proxy_running(settings, on_record=records.append) as srv:
            client = openai.AsyncOpenAI(base_url=srv.proxy_url + "/v1", api_key="k", max_retries=0)
            for _ in range(2):  # the first opens the connection: the second is the one compared
                start = time.perf_counter()
                stream = await client.chat.completions.create(
                    model="o3-mini", messages=[{"role": "user", "content": "Why is my TTFT slow?"}], stream=True
                )
                ttft = None
                async for chunk in stream:
                    if ttft is None and chunk.choices and chunk.choices[0].delta.content:
                        ttft = time.perf_counter() - start
            await client.close()
            deadline = time.monotonic() + 5
            while len(records) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
    t = records[-1].timing
    assert ttft is not None and t.time_to_first_answer_token is not None and t.ttft is not None
    assert t.time_to_first_answer_token <= ttft < t.time_to_first_answer_token + 0.1
    assert ttft - t.ttft > 0.3  # not the proxy's TTFT: that is the first thought


async def test_table_then_the_proxy_stays_up_for_other_tools() -> None:
    out = io.StringIO()
    seen: dict[str, Any] = {}

    async def meanwhile() -> None:
        text = out.getvalue()
        proxy_url = text.split("The proxy keeps running: ")[1].split()[0]
        metrics_url = text.split("metrics:")[1].split()[0]
        async with aiohttp.ClientSession() as session:
            async with session.get(metrics_url) as r:
                seen["metrics"] = (r.status, await r.text())
            body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            async with session.post(proxy_url + "/v1/chat/completions", json=body) as r:
                seen["chat"] = r.status

    settings = DemoSettings(**{**QUICK, "once": False, "base_tokens": 200, "cache_tokens": 800, "max_tokens": 8})
    code, results = await demo(settings, out, until=meanwhile)
    text = out.getvalue()
    assert code == 0 and len(results) == 10
    header = text.splitlines()[2]
    assert header.split() == " ".join(h for h, _ in COLUMNS).split()
    assert (
        "input_length: input x" in text
        and "prefix_cache: repeats' TTFT" in text
        and "model_size: gpt-4o vs gpt-4o-mini" in text
    )
    assert "client vs proxy TTFT: max |difference|" in text and "who ate the GPU memory" in text
    assert "reasoning: o3-mini's article TTFT " in text and "reasoning: o4-mini hid its thinking" in text
    assert max(len(line) for line in text.split("The proxy keeps running")[0].splitlines()) <= 140  # fits the page
    headers = [line for line in text.splitlines() if line.startswith("run ")]
    assert [h.split() for h in headers] == [" ".join(h for h, _ in REASONING_COLUMNS).split()]  # its own table
    assert seen["chat"] == 200 and seen["metrics"][0] == 200
    assert "taotrace_time_to_first_token_seconds" in seen["metrics"][1]


async def test_real_mode_sends_the_key_upstream_and_goes_on_without_one(capsys: pytest.CaptureFixture[str]) -> None:
    quick = {**QUICK, "base_tokens": 100, "cache_tokens": 200, "max_tokens": 4}
    async with running(SimSettings(port=0, time_scale=0.5, require_key=True, api_keys=["k-real"])) as upstream:
        settings = DemoSettings(**quick, real=True, upstream=upstream.url, api_key="k-real")
        out = io.StringIO()
        code, results = await demo(settings, out)
        assert code == 0 and all(r.client.ok and r.record is not None for r in results)
        assert "k-real" not in out.getvalue() + capsys.readouterr().err
        bad = settings.model_copy(update={"api_key": SecretStr("wrong")})
        code, results = await demo(bad, io.StringIO())
        assert code == 1 and results[0].client.status == 401
        capsys.readouterr()
        # No key for an upstream that wants one: told as doctor tells it, the variable named.
        code, results = await demo(settings.model_copy(update={"api_key": None}), io.StringIO())
        err = capsys.readouterr().err
        assert code == 1 and len(results) == 1 and results[0].client.status == 401
        assert err.splitlines() == [
            "demo: no key set (looked in --api-key, $TAOTRACE_API_KEY, $TAOTOKEN_API_KEY); going on without one",
            "demo: the upstream wants a key (it answered 401) and none is set: "
            "export TAOTOKEN_API_KEY=<your key>  (or pass --api-key)",
        ]
    # A local upstream without auth (vLLM, Ollama): the demo runs, as doctor passes it.
    async with running(SimSettings(port=0, time_scale=0.5)) as keyless:
        settings = DemoSettings(**quick, real=True, upstream=keyless.url, api_key=None)
        code, results = await demo(settings, io.StringIO())
    assert code == 0 and results and all(r.client.ok for r in results)


async def test_demo_speaks_the_other_dialects() -> None:
    for api in ("responses", "messages"):
        settings = DemoSettings(
            **{**QUICK, "base_tokens": 100, "cache_tokens": 200, "max_tokens": 4, "json_output": True}, api=api
        )
        out = io.StringIO()
        code, _ = await demo(settings, out)
        doc = json.loads(out.getvalue())
        assert code == 0 and all(r["proxy_ttft_s"] is not None for e in doc["experiments"] for r in e["runs"])


# --- the hint's command runs as printed ------------------------------------------------------


def _script(path: Path, python: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{python}\nimport sys\n")
    path.chmod(0o755)
    return path


def test_the_command_is_named_as_it_runs_here(tmp_path: Path) -> None:
    venv_bin = tmp_path / "project" / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    python = venv_bin / "python"
    python.symlink_to(sys.executable)
    _script(venv_bin / "taotrace", python)
    project, elsewhere = tmp_path / "project", tmp_path
    # `make demo`: the venv is not on PATH
    assert taotrace_command(str(python), "/usr/bin:/bin", project) == ".venv/bin/taotrace"
    assert taotrace_command(str(python), "/usr/bin:/bin", elsewhere / "x") == str(venv_bin / "taotrace")
    # activated, or installed with pipx (a link on PATH) or pip --user (a script naming this python)
    assert taotrace_command(str(python), f"/usr/bin:{venv_bin}", elsewhere) == "taotrace"
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "taotrace").symlink_to(venv_bin / "taotrace")
    assert taotrace_command(str(python), str(tmp_path / "links"), elsewhere) == "taotrace"
    _script(tmp_path / "user" / "taotrace", python)
    assert taotrace_command(str(python), str(tmp_path / "user"), elsewhere) == "taotrace"
    # another installation's taotrace on PATH (its python a link to the same interpreter) is not ours
    other = tmp_path / "other" / "bin"
    other.mkdir(parents=True)
    (other / "python").symlink_to(sys.executable)
    _script(other / "taotrace", other / "python")
    assert taotrace_command(str(python), str(other), project) == ".venv/bin/taotrace"
    # from a source tree, not installed: the running python with -m
    (venv_bin / "taotrace").unlink()
    assert taotrace_command(str(python), "/usr/bin:/bin", project) == ".venv/bin/python -m proxy"


@pytest.mark.timeout(120)
def test_the_demos_probe_hint_runs_as_printed(tmp_path: Path) -> None:
    """The hint `make demo` prints works in the same shell, where the venv is not on PATH."""
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    log = tmp_path / "demo.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "demo", "--port", "0", "--metrics-port", "0", "--time-scale", "0.05",
             "--max-tokens", "4", "--base-tokens", "100", "--cache-tokens", "200"],
            cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 90
            while "Ctrl-C to stop" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            hint = re.search(r"measure: +(.+ probe --base-url \S+)", log.read_text())
            assert hint is not None, log.read_text()
            assert not hint[1].startswith("taotrace ")  # not on this PATH
            probe = subprocess.run(
                [*shlex.split(hint[1]), "--max-tokens", "3", "--json"],
                cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout)["output_tokens"] == 3
