"""`taotrace serve` as a real subprocess (signals, OTLP export from the environment, stderr),
and OTLP/HTTP collectors that work, fail, or never answer."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.fakes import decode_spans

ROOT = Path(__file__).resolve().parents[2]
_LISTEN = re.compile(rb"taotrace proxy on (http://\S+) -> .*; metrics on (http://\S+)/metrics")


class ProxyProcess:
    """`python -m tests.adversarial.serve_probe serve-flags...` with stderr captured to a file."""

    def __init__(self, *flags: str, env: dict[str, str] | None = None) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="taotrace-adv-")
        self.stderr_path = Path(self._dir.name) / "stderr.log"
        self.report_path = Path(self._dir.name) / "probe.json"
        base = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TAOTRACE_"))}
        base.update({"OTEL_TRACES_EXPORTER": "otlp", "PROBE_REPORT": str(self.report_path), "PYTHONPATH": str(ROOT)})
        base.update(env or {})
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.adversarial.serve_probe", "--port", "0", "--metrics-port", "0", *flags],
            cwd=ROOT,
            env=base,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
        )
        self.url = ""
        self.metrics_url = ""

    async def started(self, timeout: float = 15.0) -> ProxyProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = _LISTEN.search(self.stderr_path.read_bytes())
            if m:
                self.url, self.metrics_url = m.group(1).decode(), m.group(2).decode()
                return self
            if self.proc.poll() is not None:
                break
            await asyncio.sleep(0.05)
        raise RuntimeError(f"taotrace did not start:\n{self.stderr()}")

    def terminate(self) -> float:
        """SIGTERM; returns the monotonic time it was sent."""
        t = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        return t

    async def exited(self, timeout: float) -> float:
        """Wait for the process to end; returns the monotonic time it did."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"still running after {timeout}s")
            await asyncio.sleep(0.01)
        return time.monotonic()

    def stderr(self) -> str:
        return self.stderr_path.read_bytes().decode("utf-8", "replace")

    def report(self) -> dict[str, Any]:
        report: dict[str, Any] = json.loads(self.report_path.read_text())
        return report

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._stderr.close()
        self._dir.cleanup()


@dataclass
class OtlpSink:
    """An OTLP/HTTP endpoint on port 0. mode: ok | 503 | slow (answers after `delay`) |
    blackhole (accepts, never answers) | refused (nothing listens).

    `holds`: for slow and blackhole, each export held as [since, until] on `time.perf_counter`
    (until: the answer, or the exporter giving up on the connection; inf while still held)."""

    mode: str = "ok"
    delay: float = 5.0
    bodies: list[bytes] = field(default_factory=list)
    holds: list[list[float]] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None
    _server: asyncio.Server | None = None
    _held: list[asyncio.StreamWriter] = field(default_factory=list)

    async def start(self) -> OtlpSink:
        if self.mode == "refused":
            import socket

            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            self.url = "http://127.0.0.1:%d" % s.getsockname()[1]
            s.close()  # nothing listens there now: connects are refused
            return self
        if self.mode == "blackhole":

            async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                self._held.append(writer)  # answer nothing, close nothing
                held = [time.perf_counter(), math.inf]
                self.holds.append(held)
                with contextlib.suppress(ConnectionError):
                    while await reader.read(65536):
                        pass
                held[1] = time.perf_counter()  # the exporter gave up and closed

            self._server = await asyncio.start_server(hold, "127.0.0.1", 0)
            self.url = "http://127.0.0.1:%d" % self._server.sockets[0].getsockname()[1]
            return self

        async def traces(request: web.Request) -> web.Response:
            body = await request.read()
            if request.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.mode == "503":
                return web.Response(status=503)
            if self.mode == "slow":
                held = [time.perf_counter(), math.inf]
                self.holds.append(held)
                await asyncio.sleep(self.delay)
                held[1] = time.perf_counter()
            self.bodies.append(body)
            return web.Response(body=b"", content_type="application/x-protobuf")

        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/traces", traces)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = "http://127.0.0.1:%d" % self._runner.addresses[0][1]
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._server is not None:
            self._server.close()
            for w in self._held:
                w.transport.abort()

    def env(self, **extra: str) -> dict[str, str]:
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.url,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            **extra,
        }

    def spans(self) -> list[Any]:
        """Every span received, decoded from the OTLP protobuf bodies."""
        return decode_spans(self.bodies)
