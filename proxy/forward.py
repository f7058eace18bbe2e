"""The only upstream I/O: send the client's request on, stream the answer back, time it.

Bytes go to the client first; timestamps are taken as they arrive; parsing works on the same
immutable bytes afterwards and can never fail the request. The client going away cancels the
handler (aiohttp `handler_cancellation=True`) and we close the upstream response, so the
upstream sees the connection drop; the upstream dying mid-body closes the client's connection
without the terminating chunk, so a cut stream never looks complete.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import aiohttp
from aiohttp import web
from opentelemetry.trace import INVALID_SPAN
from yarl import URL

from proxy.dialects import API_OTHER, StreamReader, Usage, api_for_path, inspect_request, read_body, reader_for
from proxy.errors import (
    BadTarget,
    BodyTooLarge,
    ProxyError,
    UpstreamBroken,
    UpstreamTimeout,
    UpstreamUnreachable,
    error_type_for_status,
)
from proxy.headers import request_headers, response_headers
from proxy.metrics import Metrics
from proxy.sse import SSEDecoder
from proxy.telemetry import Telemetry
from proxy.timing import PhaseClock, RequestRecord

__all__ = ["Forwarder", "phase_trace_config"]

log = logging.getLogger("taotrace")

Clock = Callable[[], float]
Observer = Callable[[RequestRecord], None]

MAX_BODY_COPY = 4 << 20  # a non-streaming body is kept (for its usage) up to this size
MAX_ERROR_COPY = 64 << 10


def phase_trace_config(clock: Clock = time.perf_counter) -> aiohttp.TraceConfig:
    """aiohttp signals -> the request's PhaseClock (passed as `trace_request_ctx`)."""
    tc = aiohttp.TraceConfig()

    def _phase(ctx: SimpleNamespace) -> PhaseClock | None:
        phase = ctx.trace_request_ctx
        return phase if isinstance(phase, PhaseClock) else None

    async def mark(_s: object, ctx: SimpleNamespace, _p: object) -> None:
        if (p := _phase(ctx)) is not None:
            p.mark(clock())

    async def queued_end(_s: object, ctx: SimpleNamespace, _p: object) -> None:
        if (p := _phase(ctx)) is not None:
            p.pool_wait = p.since_mark(clock())

    async def dns_end(_s: object, ctx: SimpleNamespace, _p: object) -> None:
        if (p := _phase(ctx)) is not None:
            p.dns = p.since_mark(clock())

    async def create_end(_s: object, ctx: SimpleNamespace, _p: object) -> None:
        if (p := _phase(ctx)) is not None:
            p.connect = p.since_mark(clock())
            p.reused = False

    async def reuse(_s: object, ctx: SimpleNamespace, _p: object) -> None:
        if (p := _phase(ctx)) is not None:
            p.reused = True

    async def sent(_s: object, ctx: SimpleNamespace, _p: object) -> None:
        if (p := _phase(ctx)) is not None:
            p.sent(clock())

    tc.on_connection_queued_start.append(mark)
    tc.on_connection_queued_end.append(queued_end)
    tc.on_dns_resolvehost_start.append(mark)
    tc.on_dns_resolvehost_end.append(dns_end)
    tc.on_connection_create_start.append(mark)
    tc.on_connection_create_end.append(create_end)
    tc.on_connection_reuseconn.append(reuse)
    tc.on_request_headers_sent.append(sent)
    tc.on_request_chunk_sent.append(sent)
    tc.freeze()
    return tc


def _upstream_error(exc: BaseException, base: URL, connect_timeout: float) -> ProxyError:
    """Our own message for an exception raised before the response headers."""
    where = f"{base.host}:{base.port}"
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return UpstreamTimeout(f"connecting to upstream {where} timed out after {connect_timeout:g}s")
    if isinstance(exc, aiohttp.ServerTimeoutError | asyncio.TimeoutError):
        return UpstreamTimeout(f"upstream {where} sent no response headers within the idle read timeout")
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return UpstreamUnreachable(f"cannot resolve upstream host {base.host}")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return UpstreamUnreachable(f"cannot connect to upstream {where} ({type(exc).__name__})")
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return UpstreamBroken(f"upstream {where} closed the connection before responding")
    if isinstance(exc, aiohttp.ClientResponseError):
        return UpstreamBroken(f"upstream {where} sent an invalid HTTP response")
    return UpstreamBroken(f"upstream {where} failed before responding ({type(exc).__name__})")


def _cut_client(request: web.BaseRequest) -> None:
    """End the client's connection without the final chunk: a cut stream must look cut."""
    transport = request.transport
    if transport is not None:
        transport.close()  # flushes what was written, then FIN; write_eof then fails quietly


class Forwarder:
    """The aiohttp handler for every path of the proxy port."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        upstream: URL,
        telemetry: Telemetry,
        metrics: Metrics,
        *,
        connect_timeout: float,
        max_body_bytes: int,
        capture_content: bool = False,
        observers: Sequence[Observer] = (),
        is_draining: Callable[[], bool] = lambda: False,
        clock: Clock = time.perf_counter,
    ) -> None:
        self.session = session
        self.upstream = upstream
        self.base = str(upstream).rstrip("/")
        self.telemetry = telemetry
        self.metrics = metrics
        self.connect_timeout = connect_timeout
        self.max_body_bytes = max_body_bytes
        self.capture_content = capture_content
        self.observers = tuple(observers)
        self.is_draining = is_draining
        self.clock = clock

    def _target(self, request: web.BaseRequest) -> str:
        """Path and query as the client wrote them. Never anything that could change the host."""
        raw = request.raw_path
        if raw[:1] != "/":
            # Absolute-form target (`GET http://other/x`): keep only its path and query. Since the
            # result always follows the upstream's authority, nothing can change the host.
            raw = request.rel_url.raw_path_qs
            if raw[:1] != "/":
                raise BadTarget("the request target must be a path starting with '/'")
        return raw

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        t0 = self.clock()
        method = request.method
        try:
            target = self._target(request)
            body = await self._read_body(request)
        except ProxyError as exc:
            path = request.rel_url.raw_path
            self._record_early(api_for_path(path), method, path, exc, t0)
            return exc.response()
        path, _, query = target.partition("?")
        api = api_for_path(path)
        info = inspect_request(api, body, capture_content=self.capture_content)
        phase = PhaseClock(t0)
        gauge = self.metrics.in_flight.labels(api)
        gauge.inc()
        try:
            span = self.telemetry.start(info, method, path, query, request.headers, t0)
        except Exception:  # noqa: BLE001 - telemetry must never break a request
            log.exception("could not start the request span")
            span = INVALID_SPAN
        status = 502
        error_type = ""
        reader: StreamReader | None = None
        copy: bytearray | None = None
        upstream_resp: aiohttp.ClientResponse | None = None
        try:
            headers = request_headers(request.headers.items(), request.remote)
            self.telemetry.inject(span, headers)
            try:
                upstream_resp = await self.session.request(
                    method,
                    URL(self.base + target, encoded=True),
                    data=body or None,
                    headers=headers,
                    allow_redirects=False,
                    trace_request_ctx=phase,
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - every failure becomes our own 502/504
                error = _upstream_error(exc, self.upstream, self.connect_timeout)
                status, error_type = error.status, error.error_type
                log.debug("upstream request failed: %s (%s)", error.message, type(exc).__name__)
                return error.response()
            phase.headers(self.clock())
            status = upstream_resp.status
            response = web.StreamResponse(
                status=status, reason=upstream_resp.reason, headers=response_headers(upstream_resp.headers.items())
            )
            await response.prepare(request)
            decoder, reader, copy = self._parsers(api, upstream_resp, info.stream, status)
            error_type = await self._pump(upstream_resp, request, response, phase, decoder, reader, copy)
            return response
        except asyncio.CancelledError:
            error_type = "shutdown" if self.is_draining() else "client_abort"
            raise
        finally:
            if upstream_resp is not None:
                upstream_resp.close()  # no-op after a full read; drops the connection otherwise
            gauge.dec()
            try:
                self._finish(span, info, method, path, status, error_type, phase, reader, copy)
            except Exception:  # noqa: BLE001 - telemetry must never break a request
                log.exception("telemetry failed for one request")

    async def _read_body(self, request: web.BaseRequest) -> bytes:
        limit = self.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise BodyTooLarge(f"request body of {request.content_length} bytes exceeds the proxy's limit of {limit} bytes (TAOTRACE_MAX_BODY_BYTES)")
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise BodyTooLarge(f"request body exceeds the proxy's limit of {limit} bytes (TAOTRACE_MAX_BODY_BYTES)") from None

    def _parsers(
        self, api: str, resp: aiohttp.ClientResponse, stream: bool, status: int
    ) -> tuple[SSEDecoder | None, StreamReader | None, bytearray | None]:
        """What to run on the copy: an SSE decoder + dialect reader, or a bounded body copy."""
        encoding = resp.headers.get("Content-Encoding", "identity").lower()
        if encoding != "identity":
            return None, None, None  # compressed: forwarded untouched, not parsed
        ctype = resp.headers.get("Content-Type", "").lower()
        if ctype.startswith("text/event-stream") and api != API_OTHER:
            return SSEDecoder(), reader_for(api, self.capture_content), None
        if status >= 400 or (api != API_OTHER and "json" in ctype):
            return None, None, bytearray()
        return None, None, None

    async def _pump(
        self,
        upstream: aiohttp.ClientResponse,
        request: web.BaseRequest,
        response: web.StreamResponse,
        phase: PhaseClock,
        decoder: SSEDecoder | None,
        reader: StreamReader | None,
        copy: bytearray | None,
    ) -> str:
        """Forward the body chunk by chunk; returns the error type of a failed body ("" if none)."""
        clock = self.clock
        write = response.write
        readany = upstream.content.readany  # iter_any() minus an iterator frame per chunk
        cap = MAX_BODY_COPY if upstream.status < 400 else MAX_ERROR_COPY
        try:
            while chunk := await readany():
                t = clock()
                await write(chunk)
                if phase.t_first_byte is None:
                    phase.body_bytes(t)
                if reader is not None:
                    try:
                        for event in decoder.feed(chunk):  # type: ignore[union-attr]
                            if reader.feed(event):
                                phase.token(t)
                    except Exception:  # noqa: BLE001 - parsing is best effort, forwarding is not
                        log.debug("stream parse failed; timing for this request is partial", exc_info=True)
                        reader = None
                elif copy is not None and len(copy) < cap:
                    copy += chunk
        except aiohttp.ClientPayloadError:
            _cut_client(request)
            return "stream_cut"
        except (aiohttp.ServerTimeoutError, asyncio.TimeoutError):
            _cut_client(request)
            return "timeout"
        except ConnectionResetError:
            transport = request.transport
            if transport is None or transport.is_closing():
                return "client_abort"  # writing to a client that went away; the caller closes upstream
            _cut_client(request)
            return "stream_cut"
        except aiohttp.ClientConnectionError:
            _cut_client(request)
            return "stream_cut"
        await response.write_eof()
        return ""

    def _finish(
        self,
        span: Any,
        info: Any,
        method: str,
        path: str,
        status: int,
        error_type: str,
        phase: PhaseClock,
        reader: StreamReader | None,
        copy: bytearray | None,
    ) -> None:
        t_end = self.clock()
        if copy is not None and not error_type:
            if status >= 400:
                error_type = error_type_for_status(status, bytes(copy[:4096]))
            elif len(copy) < MAX_BODY_COPY:
                reader = read_body(info.api, bytes(copy), self.capture_content)
        elif not error_type and status >= 400:
            error_type = error_type_for_status(status)
        if not error_type and reader is not None and reader.error_type:
            error_type = reader.error_type
        usage = reader.usage if reader is not None and reader.usage is not None else Usage()
        streaming = info.stream or phase.tokens > 0
        if usage.output_tokens is not None:
            source = "reported"
        elif streaming and reader is not None:
            source = "counted"
            usage = Usage(usage.input_tokens, phase.tokens, usage.cached_input_tokens, usage.reasoning_tokens)
        else:
            source = "none"
        timing = phase.finish(t_end, usage.output_tokens, streaming=streaming)
        record = RequestRecord(
            trace_id=self.telemetry.trace_id(span),
            api=info.api,
            operation=info.operation,
            model=info.model,
            response_model=reader.response_model if reader is not None else None,
            stream=streaming,
            method=method,
            path=path,
            status_code=status,
            error_type=error_type,
            timing=timing,
            usage=usage,
            usage_source=source,
            finish_reasons=tuple(reader.finish_reasons) if reader is not None else (),
            response_id=reader.response_id if reader is not None else None,
        )
        self.metrics.record(record)
        self.telemetry.finish(span, record, reader.text if reader is not None else None)
        for observe in self.observers:
            observe(record)

    def _record_early(self, api: str, method: str, path: str, exc: ProxyError, t0: float) -> None:
        """A request refused before forwarding still counts (and is timed) in the metrics."""
        timing = PhaseClock(t0).finish(self.clock(), streaming=False)
        record = RequestRecord(
            None, api, None, None, None, False, method, path, exc.status, exc.error_type,
            timing, Usage(), "none", (), None,
        )  # fmt: skip
        self.metrics.record(record)
        for observe in self.observers:
            observe(record)
