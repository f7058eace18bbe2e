"""`--workers N`: worker processes on one port, one supervisor aggregating /metrics.

The supervisor runs in the test's process (`supervising`), the workers are real processes; the
forwarding and metrics suites also run against a group (`proxy_workers` in test_forwarding.py,
test_metrics.py), and the SIGTERM drain test in test_failures.py runs `taotrace serve --workers 2`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.config.settings import Settings, usable_cores
from proxy.server.lifecycle import Shutdown
from proxy.server.listen import CannotListen
from proxy.workers.supervisor import Group, instance_id, supervising
from tests.fakes import FakeUpstream, OTLPSink, chat_stream, stream_handler

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="--workers needs SO_REUSEPORT (Linux)")

SLOW = chat_stream(40)  # 40 tokens, 50 ms apart: ~2 s per stream


def settings(upstream: FakeUpstream, **overrides: object) -> Settings:
    base: dict[str, Any] = {
        "upstream": upstream.url,
        "port": 0,
        "metrics_port": 0,
        "drain_seconds": 2.0,
        "workers": 2,
    }
    return Settings(**{**base, **overrides})


UP = ("upstream", "127.0.0.1")  # the route's name: the upstream's host


async def scrape(group: Group) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with aiohttp.ClientSession() as s, s.get(group.metrics_url + "/metrics") as r:
        text = await r.text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def stream(url: str) -> bytes | None:
    """One streamed request on its own connection; None when the connection was cut."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        try:
            async with s.post(url + "/v1/chat/completions", json={"model": "m", "stream": True}) as r:
                return await r.read()
        except aiohttp.ClientPayloadError:
            return None


async def eventually(check, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


@pytest.fixture
async def slow_upstream() -> AsyncIterator[FakeUpstream]:
    fake = await FakeUpstream(stream_handler(SLOW, gap=0.05)).start()
    yield fake
    await fake.close()


async def test_requests_spread_over_workers_and_metrics_sum(slow_upstream: FakeUpstream) -> None:
    records: list[object] = []
    async with supervising(settings(slow_upstream), on_record=records.append) as group:
        assert group.readiness() == "ready" and len(group.pids()) == 2
        tasks = [asyncio.ensure_future(stream(group.proxy_url)) for _ in range(12)]

        async def all_in_flight() -> bool:  # the gauge is the sum of both workers' counts
            return (await scrape(group)).get(
                ("taotrace_in_flight_requests", (("api", "chat_completions"), ("upstream", "127.0.0.1")))
            ) == 12

        await eventually(all_in_flight)
        assert all(w.in_flight.get(("127.0.0.1", "chat_completions")) for w in group.workers), (
            "one worker got every connection"
        )
        bodies = await asyncio.gather(*tasks)
        assert all(b == b"".join(SLOW) for b in bodies)

        async def all_recorded() -> bool:
            return len(records) == 12

        await eventually(all_recorded)
        samples = await scrape(group)
        key = (("api", "chat_completions"), ("error_type", ""), ("model", "m"), ("status_code", "200"), UP)
        assert samples[("taotrace_requests_total", key)] == 12
        labels = (("api", "chat_completions"), ("model", "m"), UP)
        assert samples[("taotrace_time_to_first_token_seconds_count", labels)] == 12
        assert samples[("taotrace_inter_token_latency_seconds_count", labels)] == 12 * 39
        if sys.platform.startswith("linux"):  # TCP_INFO rides along in the records workers ship
            assert samples[("taotrace_upstream_rtt_seconds_count", labels)] == 12
        assert samples[("taotrace_in_flight_requests", (("api", "chat_completions"), ("upstream", "127.0.0.1")))] == 0
        assert samples[("taotrace_worker_restarts_total", ())] == 0


async def test_kill_9_cuts_only_that_workers_streams_counts_them_lost_and_it_is_restarted(
    slow_upstream: FakeUpstream,
) -> None:
    async with supervising(settings(slow_upstream)) as group:
        tasks = [asyncio.ensure_future(stream(group.proxy_url)) for _ in range(16)]

        async def both_busy() -> bool:
            await asyncio.sleep(0)
            return sum(sum(w.in_flight.values()) for w in group.workers) == 16 and all(
                w.in_flight for w in group.workers
            )

        await eventually(both_busy)
        victim = group.workers[0]
        assert victim.proc is not None
        on_victim = int(sum(victim.in_flight.values()))
        old_pid = victim.proc.pid
        os.kill(old_pid, signal.SIGKILL)
        bodies = await asyncio.gather(*tasks)
        cut = [b for b in bodies if b is None]
        whole = [b for b in bodies if b == b"".join(SLOW)]
        assert len(cut) == on_victim and len(whole) == 16 - on_victim, (len(cut), len(whole), on_victim)

        async def restarted() -> bool:
            await asyncio.sleep(0)
            return group.readiness() == "ready" and victim.proc is not None and victim.proc.pid != old_pid

        await eventually(restarted)
        samples = await scrape(group)
        assert samples[("taotrace_worker_restarts_total", ())] == 1
        # The requests the dead worker had in flight are counted, as its last report had them.
        lost = (
            ("api", "chat_completions"),
            ("error_type", "worker_lost"),
            ("model", "unknown"),
            ("status_code", "0"),
            UP,
        )
        assert samples[("taotrace_requests_total", lost)] == on_victim == len(cut)
        assert await stream(group.proxy_url) == b"".join(SLOW)  # the group serves again


@pytest.mark.parametrize("overrides", [{"workers": 2}, {"workers": 1, "telemetry_process": True}])
async def test_spans_leave_from_the_supervisor_under_each_workers_instance_id(
    slow_upstream: FakeUpstream, overrides: dict[str, Any]
) -> None:
    """Workers start the spans (the ids sent upstream), the supervisor finishes and exports them."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    slow_upstream.handler = stream_handler(chat_stream(3))
    sink = await OTLPSink().start()
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    try:
        async with supervising(settings(slow_upstream, **overrides), env=env) as group:
            await asyncio.gather(*(stream(group.proxy_url) for _ in range(20)))

            async def spans_in() -> bool:
                await asyncio.sleep(0)
                return len(sink.spans()) >= 20 * 4

            await eventually(spans_in)
        instances = set()
        spans: dict[str, list[Any]] = {}
        for payload in sink.payloads:
            req = ExportTraceServiceRequest()
            req.ParseFromString(payload)
            for rs in req.resource_spans:
                attrs = {a.key: a.value.string_value for a in rs.resource.attributes}
                instances.add(attrs["service.instance.id"])
                assert attrs["service.name"] == "taotrace"
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        spans.setdefault(span.trace_id.hex(), []).append(span)
        assert len(instances) == overrides["workers"], instances
        sent = {seen.headers["traceparent"].split("-")[1]: seen.headers["traceparent"].split("-")[2]
                for seen in slow_upstream.seen}  # fmt: skip
        assert set(spans) == set(sent) and len(sent) == 20
        for trace_id, trace in spans.items():  # the root the upstream was told of, and its three phases
            (root,) = [s for s in trace if not s.parent_span_id]
            assert root.span_id.hex() == sent[trace_id] and root.name == "chat m"
            children = sorted(
                (s for s in trace if s.parent_span_id == root.span_id), key=lambda s: s.start_time_unix_nano
            )
            assert [s.name for s in children] == ["network", "prefill_wait", "decode"]
            assert children[0].start_time_unix_nano == root.start_time_unix_nano  # one clock for the whole trace
            assert children[-1].end_time_unix_nano <= root.end_time_unix_nano
    finally:
        await sink.close()


async def test_access_log_lines_come_from_the_workers_as_from_one_process(
    slow_upstream: FakeUpstream, capfd: pytest.CaptureFixture[str]
) -> None:
    """Workers inherit the supervisor's stderr: the same access lines, one per request."""
    slow_upstream.handler = stream_handler(chat_stream(3))
    async with supervising(settings(slow_upstream, access_log=True)) as group:
        async with aiohttp.ClientSession() as s:
            for _ in range(6):
                url = group.proxy_url + "/v1/chat/completions?key=secret"
                async with s.post(url, json={"model": "m", "stream": True}) as r:
                    assert r.status == 200 and await r.read() == b"".join(chat_stream(3))
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if "taotrace.access" in line]
    assert len(lines) == 6, err[-2000:]
    assert all("POST /v1/chat/completions 200 api=chat_completions model=m" in line for line in lines)
    assert "secret" not in err  # no query strings, as in one process


async def test_a_worker_that_sends_what_cannot_be_read_is_restarted(
    slow_upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    """The edge faked: a "worker" process that writes a frame that is not a pickle."""
    garbage = (
        "import socket, sys, time; socket.socket(fileno=int(sys.argv[-1])).sendall(b'\\0\\0\\0\\3abc'); time.sleep(60)"
    )
    command = (sys.executable, "-c", garbage)
    async with supervising(settings(slow_upstream, workers=2), worker_command=command, ready_timeout=0.2) as group:

        async def restarted() -> bool:
            await asyncio.sleep(0)
            return group.metrics.worker_restarts.labels().get() >= 2

        await eventually(restarted)
        assert group.readiness() == "starting"
    assert "cannot read; restarting it" in caplog.text


async def test_each_worker_keeps_a_given_instance_id_apart(
    slow_upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resource a worker's spans leave under: the group's attributes, its own instance id."""
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,service.instance.id=pod-a")
    async with supervising(settings(slow_upstream), env=os.environ) as group:
        resources = [dict(w.resource.attributes) for w in group.workers if w.resource is not None]
    assert [(r["deployment.environment"], r["service.instance.id"]) for r in resources] == [
        ("prod", "pod-a-0"),
        ("prod", "pod-a-1"),
    ]
    generated = {instance_id(i, {}) for i in range(2)}
    assert len(generated) == 2 and all(str(uuid.UUID(g)) == g for g in generated)


def test_workers_setting() -> None:
    assert Settings(workers="auto").workers == usable_cores() >= 1
    assert Settings(workers="3").workers == 3
    with pytest.raises(ValueError):
        Settings(workers=0)
    with pytest.raises(ValueError):
        Settings(workers="many")


@pytest.mark.parametrize("taken", ["port", "metrics_port"])
async def test_a_taken_port_is_a_clear_error_before_any_worker_starts(
    slow_upstream: FakeUpstream, taken: str, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    import socket

    marker = tmp_path / "a-worker-started"
    start = (sys.executable, "-c", f"open({str(marker)!r}, 'w')")  # a worker would leave this behind
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(CannotListen) as raised:
            async with supervising(settings(slow_upstream, **{taken: port}), worker_command=start):
                pass
    flag = "--" + taken.replace("_", "-")
    assert str(raised.value) == (
        f"cannot listen on 127.0.0.1:{port}: address already in use (another taotrace running? "
        f"choose another port with {flag})"
    )
    await asyncio.sleep(0.5)
    assert not marker.exists()


async def test_a_first_signal_ends_the_wait_for_workers_that_never_get_ready(slow_upstream: FakeUpstream) -> None:
    shutdown = Shutdown()  # not installed: the test gives the signal
    never_ready = (sys.executable, "-c", "import time; time.sleep(120)")  # never says "ready"
    asyncio.get_running_loop().call_later(0.5, shutdown.signal)
    t0 = time.monotonic()
    async with supervising(
        settings(slow_upstream), worker_command=never_ready, ready_timeout=60.0, shutdown=shutdown
    ) as group:
        assert group.readiness() == "starting"
    assert time.monotonic() - t0 < 10.0  # not the 60 s ready_timeout


@pytest.mark.parametrize("workers", [1, 2])
def test_a_second_signal_cuts_the_drain_at_once(tmp_path, workers: int) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "cut_client.py"
    script.write_text(CUT_CLIENT)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    result = subprocess.run(
        [sys.executable, str(script), str(workers)], env=env, capture_output=True, text=True, timeout=90
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK" in result.stdout


CUT_CLIENT = r"""
import asyncio, os, signal, socket, sys, time, aiohttp
sys.path.insert(0, os.getcwd())
from tests.fakes import FakeUpstream, chat_stream, stream_handler

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

async def main(workers):
    up = await FakeUpstream(stream_handler(chat_stream(200), gap=0.05)).start()  # ~10 s streams
    port, mport = str(free_port()), str(free_port())
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "proxy", "serve", "--upstream", up.url,
        "--port", port, "--metrics-port", mport, "--drain-seconds", "30", "--workers", workers)
    async with aiohttp.ClientSession() as s:
        for _ in range(400):
            try:
                async with s.get(f"http://127.0.0.1:{mport}/readyz") as r:
                    if r.status == 200: break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
        async def one():
            try:
                async with aiohttp.ClientSession() as c:
                    async with c.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"model": "m", "stream": True}) as r:
                        await r.read()
                        return "whole"
            except aiohttp.ClientPayloadError:
                return "cut"
        tasks = [asyncio.ensure_future(one()) for _ in range(6)]
        await asyncio.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.5)
        t_second = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        results = await asyncio.gather(*tasks)
        assert results == ["cut"] * 6, results
        rc = await asyncio.wait_for(proc.wait(), 15)
        took = time.monotonic() - t_second
        assert rc == 0, rc
        assert took < 5, took  # far from the 30 s drain
    await up.close()
    print("OK")

asyncio.run(main(sys.argv[1]))
"""
