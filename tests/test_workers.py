"""`--workers N`: worker processes on one port, each exporting its own telemetry, one supervisor
merging their metrics for /metrics and asking their live views.

The supervisor runs in the test's process (`supervising`), the workers are real processes; the
forwarding and metrics suites also run against a group (`proxy_workers` in test_forwarding.py,
test_metrics.py), and the SIGTERM drain test in test_failures.py runs `taotrace serve --workers 2`.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.config.settings import Settings, usable_cores
from proxy.server.lifecycle import Shutdown
from proxy.server.listen import CannotListen
from proxy.workers.supervisor import Group, instance_id, supervising
from tests.fakes import FakeUpstream, OTLPSink, chat_stream, stream_handler
from tests.grouped import records_of

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


async def test_at_rest_every_count_is_the_requests_served_to_the_request(slow_upstream: FakeUpstream) -> None:
    """Three workers, streams of several lengths at once: while they run the in-flight gauge is
    the sum of the workers'; at rest every count on /metrics is exactly what was served."""
    lengths = [3, 8, 21, 40] * 6  # 24 streams
    frames = {n: chat_stream(n) for n in set(lengths)}

    async def one(n: int) -> bytes | None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
            async with s.post(group.proxy_url + "/v1/chat/completions", json={"model": f"m{n}", "stream": True}) as r:
                return await r.read()

    async def route(request: Any) -> Any:
        n = int((await request.json())["model"][1:])
        return await stream_handler(frames[n], gap=0.05)(request)

    slow_upstream.handler = route
    async with supervising(settings(slow_upstream, workers=3)) as group:
        assert group.readiness() == "ready" and len(group.pids()) == 3
        tasks = [asyncio.ensure_future(one(n)) for n in lengths]

        async def all_in_flight() -> bool:  # the gauge is the sum of the workers' counts
            return (await scrape(group)).get(
                ("taotrace_in_flight_requests", (("api", "chat_completions"), ("upstream", "127.0.0.1")))
            ) == len(lengths)

        await eventually(all_in_flight)
        assert sum(1 for w in group.workers if w.in_flight) >= 2, "one worker got every connection"
        bodies = await asyncio.gather(*tasks)
        assert bodies == [b"".join(frames[n]) for n in lengths]

        async def at_rest() -> bool:
            return (await scrape(group)).get(("taotrace_requests_total", _ok("m40"))) == 6

        await eventually(at_rest)
        samples = await scrape(group)
        await asyncio.sleep(1.2)  # another report period: nothing is added twice
        assert await scrape(group) == samples
    for n in set(lengths):
        labels = (("api", "chat_completions"), ("model", f"m{n}"), UP)
        assert samples[("taotrace_requests_total", _ok(f"m{n}"))] == 6
        for family in ("request_duration", "time_to_first_token", "time_per_output_token"):
            assert samples[(f"taotrace_{family}_seconds_count", labels)] == 6, family
        assert samples[("taotrace_inter_token_latency_seconds_count", labels)] == 6 * (n - 1)
        assert samples[
            ("taotrace_inter_token_latency_seconds_bucket", tuple(sorted((*labels, ("le", "+Inf")))))
        ] == 6 * (n - 1)
        for phase in ("network", "prefill_wait", "decode"):
            assert samples[("taotrace_phase_duration_seconds_count", (*labels[:2], ("phase", phase), UP))] == 6
        assert samples[("taotrace_tokens_total", (*labels[:2], ("type", "output"), UP))] == 6 * n
        if sys.platform.startswith("linux"):  # TCP_INFO, read in the worker
            assert samples[("taotrace_upstream_rtt_seconds_count", labels)] == 6
    assert samples[("taotrace_in_flight_requests", (("api", "chat_completions"), ("upstream", "127.0.0.1")))] == 0
    assert samples[("taotrace_worker_restarts_total", ())] == 0
    relays = sum(v for (name, _), v in samples.items() if name == "taotrace_proxy_overhead_seconds_count")
    assert relays >= len(lengths) + sum(lengths)  # a request stage each, a relay per upstream read at least


def _ok(model: str) -> tuple[tuple[str, str], ...]:
    return (("api", "chat_completions"), ("error_type", ""), ("model", model), ("status_code", "200"), UP)


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

        async def counted() -> bool:
            return (await scrape(group)).get(("taotrace_requests_total", _ok("m"))) == len(whole) + 1

        await eventually(counted)  # what the dead worker served before is not counted again by its successor
        after = await scrape(group)
        assert after[("taotrace_requests_total", lost)] == on_victim
        labels = (("api", "chat_completions"), ("model", "m"), UP)
        assert after[("taotrace_time_to_first_token_seconds_count", labels)] == len(whole) + 1


async def test_each_worker_exports_its_spans_under_its_instance_id_and_exemplars_point_at_them(
    slow_upstream: FakeUpstream,
) -> None:
    """Each worker starts, ends and exports its requests' spans itself (the ids it sent upstream),
    under the group's resource with its own `service.instance.id`; the exemplars on the group's
    /metrics name traces the workers exported."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    slow_upstream.handler = stream_handler(chat_stream(3))
    sink = await OTLPSink().start()
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    try:
        async with supervising(settings(slow_upstream), env=env) as group:
            await asyncio.gather(*(stream(group.proxy_url) for _ in range(20)))
            ours = {w.instance for w in group.workers}

            async def spans_in() -> bool:
                await asyncio.sleep(0)
                return len(sink.spans()) >= 20 * 4

            await eventually(spans_in)
            async with aiohttp.ClientSession() as s:
                headers = {"Accept": "application/openmetrics-text"}
                async with s.get(group.metrics_url + "/metrics", headers=headers) as r:
                    page = await r.text()
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
        assert instances == ours and len(ours) == 2, (instances, ours)  # both served, each under its own id
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
        exemplars = set(re.findall(r'# \{trace_id="([0-9a-f]{32})"\}', page))
        assert exemplars and exemplars <= set(spans), exemplars - set(spans)
    finally:
        await sink.close()


async def test_the_live_view_of_a_group_shows_every_workers_requests_once(slow_upstream: FakeUpstream) -> None:
    """Rows from both workers, newest first, each once across incremental polls; details by id
    (an untraced request's too); the 15-minute percentiles read from the workers' merged
    histograms: with few requests, exactly the requests' own values."""
    slow_upstream.handler = stream_handler(chat_stream(4), gap=0.02)
    async with supervising(settings(slow_upstream, sample_ratio=0.5)) as group:
        async with aiohttp.ClientSession() as s:

            async def kept(n: int) -> bool:  # a request is kept once its bookkeeping ran, just after its answer
                async with s.get(group.metrics_url + "/api/requests", params={"limit": "1"}) as r:
                    return bool((await r.json())["size"] == n)

            first = await asyncio.gather(*(stream(group.proxy_url) for _ in range(10)))
            await eventually(lambda: kept(10))
            async with s.get(group.metrics_url + "/api/requests") as r:
                body = await r.json()
            assert all(b == b"".join(chat_stream(4)) for b in first)
            assert len(body["requests"]) == body["size"] == 10
            cursor = body["last_seq"]
            await asyncio.gather(*(stream(group.proxy_url) for _ in range(6)))
            await eventually(lambda: kept(16))
            async with s.get(group.metrics_url + "/api/requests", params={"since": str(cursor)}) as r:
                newer = await r.json()
            assert len(newer["requests"]) == 6 and newer["size"] == 16  # only the new ones, each once
            async with s.get(group.metrics_url + "/api/requests", params={"since": str(newer["last_seq"])}) as r:
                assert (await r.json())["requests"] == []
            records = await records_of(group.metrics_url, s)  # every row's detail, by its id
            ids = [r["id"] for r in body["requests"] + newer["requests"]]
            assert len(set(ids)) == 16
            assert any(i.startswith("w") for i in ids)  # an untraced request: its worker's index in its id
            async with s.get(group.metrics_url + "/api/summary") as r:
                summary = await r.json()
    assert len(records) == 16 and len({r.timing.ttft for r in records}) == 16
    assert {rec.trace_id for rec in records if rec.trace_id} == {i for i in ids if not i.startswith("w")}
    assert summary["requests"] == 16 and summary["models"]["m"]["requests"] == 16
    ttfts = sorted(rec.timing.ttft for rec in records if rec.timing.ttft is not None)
    for key, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):  # nearest rank over all 16
        assert summary["models"]["m"]["ttft"][key] == ttfts[max(0, math.ceil(q * 16) - 1)], key


async def test_a_worker_that_stops_answering_makes_the_group_unready_until_it_is_heard_again(
    slow_upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    """A stopped worker (SIGSTOP: as a stuck event loop looks) still gets its share of new
    connections from the kernel: /readyz says `stalled` (503) so a balancer stops sending, and
    the supervisor says so once; when it runs again, ready again."""
    async with supervising(settings(slow_upstream)) as group, aiohttp.ClientSession() as s:

        async def readyz() -> tuple[int, str]:
            async with s.get(group.metrics_url + "/readyz") as r:
                return r.status, await r.text()

        assert (await readyz())[0] == 200
        stopped = group.workers[0].proc
        assert stopped is not None
        stopped.send_signal(signal.SIGSTOP)
        try:
            await eventually(lambda: _is(readyz(), 503), timeout=15.0)
            assert "stalled" in (await readyz())[1]
            await eventually(lambda: _said(caplog), timeout=5.0)
        finally:
            stopped.send_signal(signal.SIGCONT)
        await eventually(lambda: _is(readyz(), 200), timeout=15.0)
    said = [r.getMessage() for r in caplog.records if "has sent nothing" in r.getMessage()]
    assert len(said) == 1 and f"worker 0 (pid {stopped.pid})" in said[0], said


async def _is(answer: Awaitable[tuple[int, str]], status: int) -> bool:
    return (await answer)[0] == status


async def _said(caplog: pytest.LogCaptureFixture) -> bool:
    return any("has sent nothing" in r.getMessage() for r in caplog.records)


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
    """The instance id a worker's spans and OTLP metrics leave under: the group's, with its index."""
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,service.instance.id=pod-a")
    async with supervising(settings(slow_upstream), env=os.environ) as group:
        instances = [w.instance for w in group.workers]
    assert instances == ["pod-a-0", "pod-a-1"]
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
