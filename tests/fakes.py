"""The network edge, faked for real: an upstream HTTP server on port 0 with scripted answers.

Tests never mock our own code; they point the proxy at one of these and talk to the proxy
over real sockets.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from multidict import CIMultiDictProxy

from proxy.dialects import Usage
from proxy.exchange.record import RequestRecord
from proxy.exchange.timing import RequestTiming

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class SeenRequest:
    """What the upstream received."""

    method: str
    path_qs: str
    headers: CIMultiDictProxy[str]
    body: bytes


@dataclass
class FakeUpstream:
    """An aiohttp server whose every path is answered by `handler` (replaceable per test)."""

    handler: Handler
    seen: list[SeenRequest] = field(default_factory=list)
    url: str = ""
    disconnected: list[float] = field(default_factory=list)  # loop times at which a handler was cancelled
    completed: list[float] = field(default_factory=list)  # loop times at which a handler returned
    _runner: web.AppRunner | None = None

    async def start(self) -> FakeUpstream:
        async def entry(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            self.seen.append(SeenRequest(request.method, request.path_qs, request.headers, body))
            try:
                resp = await self.handler(request)
                self.completed.append(asyncio.get_running_loop().time())
                return resp
            except asyncio.CancelledError:
                self.disconnected.append(asyncio.get_running_loop().time())
                raise

        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", entry)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def sse(*objs: object, done: bool = True, sep: bytes = b"\n") -> list[bytes]:
    """`data: {json}` frames for chat-style streams."""
    frames = [b"data: " + json.dumps(o).encode() + sep + sep for o in objs]
    if done:
        frames.append(b"data: [DONE]" + sep + sep)
    return frames


def named(event: str, obj: object) -> bytes:
    """An `event:` + `data:` frame (Responses, Anthropic)."""
    return f"event: {event}\ndata: {json.dumps(obj)}\n\n".encode()


def stream_handler(
    frames: Sequence[bytes],
    *,
    first_delay: float = 0.0,
    gap: float = 0.0,
    content_type: str = "text/event-stream",
    status: int = 200,
    headers: dict[str, str] | None = None,
    linger: float = 0.0,
) -> Handler:
    """Send each frame as its own write: `first_delay` before the first, `gap` between the rest,
    `linger` between the last and the end of the body (the terminating zero-length chunk)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=status, headers={"Content-Type": content_type, **(headers or {})})
        await resp.prepare(request)
        for i, frame in enumerate(frames):
            await asyncio.sleep(first_delay if i == 0 else gap)
            await resp.write(frame)
        if linger:
            await asyncio.sleep(linger)
        await resp.write_eof()
        return resp

    return handler


def json_handler(obj: object, status: int = 200, headers: dict[str, str] | None = None) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response(obj, status=status, headers=headers)

    return handler


def chat_chunk(
    content: str | None = None, *, role: str | None = None, finish: str | None = None, **delta: object
) -> dict[str, object]:
    d: dict[str, object] = dict(delta)
    if role is not None:
        d["role"] = role
    if content is not None:
        d["content"] = content
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "delta": d, "finish_reason": finish}],
    }


def usage_chunk(prompt: int, completion: int, cached: int = 0, reasoning: int = 0) -> dict[str, object]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": reasoning},
        },
    }


def chat_stream(n_tokens: int, *, usage: bool = True, sep: bytes = b"\n") -> list[bytes]:
    """A realistic chat stream: role-only first chunk, n content chunks, finish, usage, [DONE]."""
    objs: list[object] = [chat_chunk(role="assistant", content="")]
    objs += [chat_chunk(f"tok{i} ") for i in range(n_tokens)]
    objs.append(chat_chunk(finish="stop"))
    if usage:
        objs.append(usage_chunk(12, n_tokens))
    return sse(*objs, sep=sep)


def responses_stream() -> list[bytes]:
    """A Responses API stream, as OpenAI sends it: created, the text in four deltas, completed."""
    base = {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "model": "gpt-4o-mini",
        "output": [],
        "status": "in_progress",
    }
    item = {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    words = ["Hello", " from", " the", " proxy"]
    done_item = {
        **item,
        "status": "completed",
        "content": [{"type": "output_text", "text": "".join(words), "annotations": []}],
    }
    frames = [
        named("response.created", {"type": "response.created", "sequence_number": 0, "response": base}),
        named("response.in_progress", {"type": "response.in_progress", "sequence_number": 1, "response": base}),
        named(
            "response.output_item.added",
            {"type": "response.output_item.added", "sequence_number": 2, "output_index": 0, "item": item},
        ),
        named(
            "response.content_part.added",
            {
                "type": "response.content_part.added",
                "sequence_number": 3,
                "item_id": "msg_1",
                "output_index": 0,
                "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []},
            },
        ),
    ]
    for i, w in enumerate(words):
        frames.append(
            named(
                "response.output_text.delta",
                {
                    "type": "response.output_text.delta",
                    "sequence_number": 4 + i,
                    "item_id": "msg_1",
                    "output_index": 0,
                    "content_index": 0,
                    "delta": w,
                    "logprobs": [],
                },
            )
        )
    completed = {
        **base,
        "status": "completed",
        "output": [done_item],
        "usage": {
            "input_tokens": 9,
            "output_tokens": 4,
            "total_tokens": 13,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }
    frames.append(
        named(
            "response.output_item.done",
            {"type": "response.output_item.done", "sequence_number": 9, "output_index": 0, "item": done_item},
        )
    )
    frames.append(
        named("response.completed", {"type": "response.completed", "sequence_number": 10, "response": completed})
    )
    return frames


def messages_stream() -> list[bytes]:
    """A Messages API stream, as Anthropic sends it: message_start, a ping, three deltas, message_stop."""
    message: dict[str, Any] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 20, "output_tokens": 1, "cache_read_input_tokens": 8},
    }
    frames = [
        named("message_start", {"type": "message_start", "message": message}),
        named(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        named("ping", {"type": "ping"}),
    ]
    for w in ["Hello", " there", "!"]:
        frames.append(
            named(
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": w}},
            )
        )
    frames += [
        named("content_block_stop", {"type": "content_block_stop", "index": 0}),
        named(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 3},
            },
        ),
        named("message_stop", {"type": "message_stop"}),
    ]
    return frames


def decode_spans(payloads: Sequence[bytes]) -> list[object]:
    """The spans in OTLP/HTTP protobuf export bodies."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    found: list[object] = []
    for payload in payloads:
        req = ExportTraceServiceRequest()
        req.ParseFromString(payload)
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                found.extend(ss.spans)
    return found


def decode_metrics(payloads: Sequence[bytes]) -> list[object]:
    """The metrics in OTLP protobuf `ExportMetricsServiceRequest` bodies."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    found: list[object] = []
    for payload in payloads:
        req = ExportMetricsServiceRequest()
        req.ParseFromString(payload)
        for rm in req.resource_metrics:
            for sm in rm.scope_metrics:
                found.extend(sm.metrics)
    return found


@dataclass
class OTLPSink:
    """A real OTLP/HTTP receiver on port 0 (traces and metrics); keeps the protobuf payloads
    (aiohttp's server decompresses gzip and deflate bodies, as a collector does) and the
    `Content-Encoding` each came with."""

    payloads: list[bytes] = field(default_factory=list)
    metric_payloads: list[bytes] = field(default_factory=list)
    encodings: list[str] = field(default_factory=list)
    url: str = ""
    status: int = 200
    _runner: web.AppRunner | None = None

    async def start(self) -> OTLPSink:
        async def read(request: web.Request) -> bytes:
            self.encodings.append(request.headers.get("Content-Encoding", ""))
            return await request.read()

        async def traces(request: web.Request) -> web.StreamResponse:
            self.payloads.append(await read(request))
            return web.Response(status=self.status, body=b"", content_type="application/x-protobuf")

        async def metrics(request: web.Request) -> web.StreamResponse:
            self.metric_payloads.append(await read(request))
            return web.Response(status=self.status, body=b"", content_type="application/x-protobuf")

        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/traces", traces)
        app.router.add_post("/v1/metrics", metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    def spans(self) -> list[object]:
        """Decoded spans of every payload received so far."""
        return decode_spans(self.payloads)

    def metrics(self) -> list[object]:
        """Decoded metrics of every metrics payload received so far."""
        return decode_metrics(self.metric_payloads)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class OTLPGrpcMetricsSink:
    """A real OTLP/gRPC metrics receiver (grpcio server) on a free port; keeps the requests' bytes."""

    def __init__(self) -> None:
        import grpc  # type: ignore[import-untyped]  # grpcio ships no type information
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc

        payloads: list[bytes] = []
        self.payloads = payloads

        class Service(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request: object, context: object) -> object:
                payloads.append(request.SerializeToString())  # type: ignore[attr-defined]
                return metrics_service_pb2.ExportMetricsServiceResponse()

        from concurrent.futures import ThreadPoolExecutor

        self._server = grpc.server(ThreadPoolExecutor(max_workers=2))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Service(), self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        self.url = f"http://127.0.0.1:{port}"

    def metrics(self) -> list[object]:
        return decode_metrics(self.payloads)

    def close(self) -> None:
        self._server.stop(None)


def record_for(api: str, model: str, status: int, rnd: random.Random, tokens: int = 20) -> RequestRecord:
    """A finished streamed request as the forwarder would record it, with random phase times."""
    itl = tuple(rnd.uniform(0.003, 0.03) for _ in range(tokens - 1))
    timing = RequestTiming(
        start=0.0, end=1.0, duration=rnd.uniform(0.1, 5), network=rnd.uniform(0.0005, 0.01),
        time_to_headers=0.01, ttfb=0.02, ttft=rnd.uniform(0.02, 2), prefill_wait=rnd.uniform(0.01, 2),
        decode=rnd.uniform(0.1, 3), tpot=rnd.uniform(0.005, 0.05), itl=itl, token_events=tokens,
        sent=0.0, first_token=0.0, last_token=0.0, connection_reused=True,
    )  # fmt: skip
    return RequestRecord(
        trace_id=f"{rnd.getrandbits(128):032x}", api=api, operation="chat", model=model, response_model=model,
        stream=True, method="POST", path="/v1/chat/completions", status_code=status,
        error_type="" if status == 200 else "rate_limited", timing=timing,
        usage=Usage(100, tokens, 10, 5), usage_source="reported", finish_reasons=("stop",), response_id=None,
    )  # fmt: skip
