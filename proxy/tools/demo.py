"""`taotrace demo`: the embedded default. A simulated upstream and the proxy start in this
process; a streaming client runs the article's three experiments through the proxy and prints,
per run, what the client saw next to the proxy's network / prefill_wait / decode split; then the
article's reasoning model (and one that hides its reasoning), where the article's client TTFT
(first content) stands beside the proxy's first token, thinking and first answer token.

`--once` exits after the table; otherwise the proxy and simulator keep running for your own
tools. `--real` runs the same experiments against the real upstream (with TAOTOKEN_API_KEY; a
local one such as vLLM or Ollama may need no key: as `doctor`, the demo goes on without one and
names the variable to set when the upstream answers 401 or 403),
reached as `serve` reaches it: through the forward proxy `HTTPS_PROXY` / `HTTP_PROXY` names unless
`NO_PROXY` says direct (the client's own leg, to the proxy on loopback, is always direct).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import sys
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack, suppress
from pathlib import Path
from typing import Literal, TextIO

import aiohttp
from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from proxy.config.envproxy import forward_proxy_for
from proxy.config.routes import DEFAULT_UPSTREAM, upstream_url
from proxy.config.settings import Settings, check_upstream
from proxy.dialects import API_CHAT
from proxy.exchange.record import RequestRecord
from proxy.serve import configure_logging
from proxy.serve import running as proxy_running
from proxy.server.banner import live_view_warning
from proxy.server.lifecycle import Shutdown, run_loop
from proxy.server.listen import CannotListen
from proxy.sim import SimRunning, SimSettings
from proxy.sim import running as sim_running
from proxy.telemetry.tracing import TracingError
from proxy.tools.article import FirstContent
from proxy.tools.client import Call, api_name, auth_headers, measure
from proxy.tools.clientconfig import key_hint, key_places
from proxy.tools.command import taotrace_command
from proxy.tools.experiments import Run, RunResult, format_report, plan, plot_json, to_json
from proxy.tools.progress import Progress
from proxy.tools.stoppable import interrupted_status, unless_stopped

__all__ = ["AwaitedRecords", "DemoSettings", "demo", "experiments", "run"]

RECORD_WAIT_S = 5.0


class DemoSettings(BaseSettings):
    """Everything `taotrace demo` can be told."""

    model_config = SettingsConfigDict(env_prefix="TAOTRACE_DEMO_", extra="ignore", populate_by_name=True)

    once: bool = Field(False, description="run the experiments, print the table, exit")
    json_output: bool = Field(False, description="print the results as JSON", json_schema_extra={"flag": "--json"})
    real: bool = Field(
        False, description="run against the real upstream instead of the simulator (with a key, unless it needs none)"
    )
    upstream: str = Field(DEFAULT_UPSTREAM, description="the real upstream for --real")
    api_key: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("TAOTRACE_API_KEY", "TAOTOKEN_API_KEY"),
        description="key for --real (default: $TAOTRACE_API_KEY, then $TAOTOKEN_API_KEY); never printed",
    )
    host: str = Field("127.0.0.1", min_length=1, description="address the proxy, metrics and simulator listen on")
    port: int | None = Field(None, ge=0, le=65535, description="proxy port (default 8787; a free one with --once)")
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="metrics port (default 9464; a free one with --once)"
    )
    sim_port: int = Field(0, ge=0, le=65535, description="simulator port (default: a free one)")
    time_scale: float = Field(1.0, gt=0, description="simulator speed: 0.5 runs twice as fast, same ratios")
    api: Literal["chat", "completions", "responses", "messages"] = Field(
        "chat", description="dialect the client speaks"
    )
    small_model: str = Field("gpt-4o-mini", min_length=1, description="the fast model")
    large_model: str = Field("gpt-4o", min_length=1, description="the strong model (model_size experiment)")
    reasoning_model: str = Field(
        "o3-mini", description="the reasoning model, streaming its thinking (reasoning experiment; empty: left out)"
    )
    hidden_reasoning_model: str = Field(
        "o4-mini", description="a reasoning model that hides its thinking (reasoning experiment; empty: left out)"
    )
    max_tokens: int = Field(48, ge=2, description="output tokens per run")
    reasoning_max_tokens: int = Field(
        128, ge=2, description="output tokens per reasoning run, its reasoning included (max_completion_tokens)"
    )
    base_tokens: int = Field(1000, ge=50, description="input tokens of the shortest input_length run (then 2x, 4x)")
    cache_tokens: int = Field(4000, ge=50, description="input tokens of the prefix_cache prompt")

    _check_upstream = field_validator("upstream")(check_upstream)


class AwaitedRecords:
    """The proxy's records, matched to the client's runs by trace id (the demo sends a traceparent)."""

    def __init__(self) -> None:
        self._expected: dict[str, asyncio.Future[RequestRecord]] = {}

    def expect(self, trace_id: str) -> asyncio.Future[RequestRecord]:
        """Call before sending: the record may land before the client has read the last byte."""
        future: asyncio.Future[RequestRecord] = asyncio.get_running_loop().create_future()
        self._expected[trace_id] = future
        return future

    def add(self, record: RequestRecord) -> None:
        future = self._expected.pop(record.trace_id or "", None)
        if future is not None and not future.done():
            future.set_result(record)

    async def wait(self, future: asyncio.Future[RequestRecord], timeout: float = RECORD_WAIT_S) -> RequestRecord | None:
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            return None


def _no_kv(response_id: str | None) -> None:
    return None


async def _one(
    session: aiohttp.ClientSession,
    base_url: str,
    run: Run,
    settings: DemoSettings,
    records: AwaitedRecords,
    api_key: str | None,
    kv_bytes: Callable[[str | None], int | None],
) -> RunResult:
    trace_id = secrets.token_hex(16)
    headers = {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"}
    api = api_name(settings.api)
    call = Call(api, run.model, run.prompt, settings.max_tokens)
    if run.reasoning:  # room for its thinking; the o-series take the cap as max_completion_tokens
        params = {"max_completion_tokens": settings.reasoning_max_tokens} if api == API_CHAT else {}
        call = Call(api, run.model, run.prompt, settings.reasoning_max_tokens, params)
    article = FirstContent(api)  # the article's client code, on the same bytes
    expected = records.expect(trace_id)
    measured = await measure(session, base_url, call, api_key=api_key, headers=headers, also=article)
    record = await records.wait(expected)
    return RunResult(run, measured, record, kv_bytes(measured.response_id), article.ttft_s)


async def _warm_up(session: aiohttp.ClientSession, base_url: str, headers: dict[str, str]) -> None:
    """Open the pooled connection first: otherwise the first run's client TTFT alone includes the
    TCP handshake to the proxy, which the proxy's clock (started at the request head) never sees."""
    with suppress(aiohttp.ClientError, TimeoutError):
        async with session.get(base_url + "/models", headers=headers) as response:
            await response.read()


async def experiments(
    base_url: str,
    settings: DemoSettings,
    records: AwaitedRecords,
    *,
    api_key: str | None = None,
    kv_bytes: Callable[[str | None], int | None] = _no_kv,
    progress: Callable[[str], None] = lambda _: None,
) -> list[RunResult]:
    """Run every experiment through `base_url` (the proxy), one request at a time."""
    results: list[RunResult] = []
    runs = [
        r
        for e in plan(
            settings.small_model,
            settings.large_model,
            base_tokens=settings.base_tokens,
            cache_tokens=settings.cache_tokens,
            reasoning_models=tuple(m for m in (settings.reasoning_model, settings.hidden_reasoning_model) if m),
        )
        for r in e.runs
    ]
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await _warm_up(session, base_url, auth_headers(api_name(settings.api), api_key))
        for run in runs:
            progress(f"{run.experiment} {run.label}")
            result = await _one(session, base_url, run, settings, records, api_key, kv_bytes)
            results.append(result)
            if not result.client.ok:
                break
    return results


def _failure(failed: RunResult, key: str | None) -> str:
    """Why the demo stopped; an upstream that wants a key when none is set is told as doctor tells it."""
    status = failed.client.status
    if status in (401, 403) and not key:
        return f"the upstream wants a key (it answered {status}) and none is set: {key_hint()}"
    return f"{failed.run.experiment} {failed.run.label} failed: {failed.client.error}"


def _sim_kv(sim: SimRunning) -> Callable[[str | None], int | None]:
    def lookup(response_id: str | None) -> int | None:
        found = sim.simulator.request_stats(response_id) if response_id else None
        return int(found["kv_bytes_peak"]) if found else None

    return lookup


def _how_to(proxy_url: str, metrics_url: str, upstream: str, live: bool, command: str) -> str:
    return (
        f"\nThe proxy keeps running: {proxy_url} -> {upstream}\n"
        + (f"  live view:      {metrics_url}/#demo   (requests, waterfalls, the plots)\n" if live else "")
        + f"  metrics:        {metrics_url}/metrics\n"
        f"  OpenAI tools:   OPENAI_BASE_URL={proxy_url}/v1 OPENAI_API_KEY=anything\n"
        f"  Anthropic SDK:  ANTHROPIC_BASE_URL={proxy_url}\n"
        f"  measure:        {command} probe --base-url {proxy_url}/v1 --prompt-repeat 40\n"
        "Ctrl-C to stop.\n"
    )


async def demo(
    settings: DemoSettings,
    out: TextIO,
    *,
    until: Callable[[], Awaitable[None]] | None = None,
    shutdown: Shutdown | None = None,
    command: str = "taotrace",
) -> tuple[int, list[RunResult]]:
    """Start what is needed, run the experiments, print; then wait for `until` unless `--once`.

    `shutdown`: a first signal stops the experiments (exit 130 for SIGINT, 143
    for SIGTERM) or, after the table, the demo;
    a second cuts what the proxy and the simulator still serve. `command`: how the hints name
    `taotrace` (`proxy.tools.command`).
    """
    key = settings.api_key.get_secret_value() if settings.api_key is not None else None
    if settings.real and not key:  # as doctor: a local upstream (vLLM, Ollama) may need none
        print(f"demo: no key set (looked in {key_places()}); going on without one", file=sys.stderr)
    via = ""
    if settings.real:
        try:  # the proxy's pool reads the same variables: a bad one is named here, not in a traceback
            forward = forward_proxy_for(upstream_url(settings.upstream), os.environ)
        except ValueError as exc:
            print(f"demo: {exc}", file=sys.stderr)
            return 2, []
        via = f" through the {forward.where}" if forward is not None else ""
    port = settings.port if settings.port is not None else (0 if settings.once else 8787)
    metrics_port = settings.metrics_port if settings.metrics_port is not None else (0 if settings.once else 9464)
    records = AwaitedRecords()
    stop_now = shutdown.now if shutdown is not None else None
    async with AsyncExitStack() as stack:
        kv: Callable[[str | None], int | None] = _no_kv
        if settings.real:
            upstream = settings.upstream
        else:
            try:
                sim = await stack.enter_async_context(
                    sim_running(
                        SimSettings(host=settings.host, port=settings.sim_port, time_scale=settings.time_scale),
                        stop_now=stop_now,
                    )
                )
            except CannotListen as exc:  # named by demo's flags
                raise exc.named(port_flag="--sim-port") from None
            upstream, kv = sim.url, _sim_kv(sim)
        proxy_settings = Settings(
            upstream=upstream, host=settings.host, port=port, metrics_host=settings.host, metrics_port=metrics_port
        )
        try:
            srv = await stack.enter_async_context(
                proxy_running(proxy_settings, on_record=records.add, stop_now=stop_now)
            )
        except CannotListen as exc:
            raise exc.named(host_flag="--host") from None
        warning = live_view_warning(
            srv.metrics_url,
            srv.metrics_addresses,
            ui=srv.live is not None,
            token=proxy_settings.ui_token is not None,
            capture_content=proxy_settings.capture_content,
            listen_flag="--host",
            off_flag=None,  # demo has no --no-ui: the view is what it shows
        )
        if warning is not None:
            print(f"demo: warning: {warning}", file=sys.stderr)
        shown = Progress(sys.stderr, tty=sys.stderr.isatty() and not settings.json_output)

        def progress(label: str) -> None:
            shown.running(f"running {label}")

        results = await unless_stopped(
            experiments(srv.proxy_url + "/v1", settings, records, api_key=key, kv_bytes=kv, progress=progress),
            shutdown,
        )
        shown.clear()
        if results is None:
            print("demo: interrupted", file=sys.stderr)
            return interrupted_status(shutdown), []
        failed = next((r for r in results if not r.client.ok), None)
        if settings.json_output:
            out.write(json.dumps(to_json(results), indent=2) + "\n")
        else:
            where = (
                f"the real upstream {upstream}{via}"
                if settings.real
                else f"the simulator (time_scale {settings.time_scale})"
            )
            out.write(f"taotrace demo: {len(results)} streaming runs through the proxy to {where}\n\n")
            out.write(format_report(results) + "\n")
        if srv.live is not None:
            srv.live.publish_experiments(plot_json(results, format_report(results)))
        if failed is not None:
            print(f"demo: {_failure(failed, key)}", file=sys.stderr)
            return 1, results
        if not settings.once:
            out.write(_how_to(srv.proxy_url, srv.metrics_url, upstream, srv.live is not None, command))
            out.flush()
            if until is not None:
                await until()
    return 0, results


def run(settings: DemoSettings, out: TextIO = sys.stdout) -> int:
    """The `taotrace demo` command."""
    configure_logging("warning" if settings.once else "info")  # the proxy's warnings, and its drain

    async def main() -> tuple[int, list[RunResult]]:
        shutdown = Shutdown().install()
        command = taotrace_command(sys.executable, os.environ.get("PATH"), Path.cwd())
        return await demo(settings, out, until=shutdown.wait, shutdown=shutdown, command=command)

    try:
        code, _ = run_loop(main())
    except (CannotListen, TracingError) as exc:  # the same line as serve and sim say
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"demo: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return int(code)
