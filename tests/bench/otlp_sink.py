"""An OTLP/HTTP sink: accepts exports, counts them, discards them.

`POST /v1/traces` (and /v1/metrics, /v1/logs), protobuf or JSON, gzip or not, answers 200 with
an empty export response, as a collector does. Spans are counted by decoding the protobuf, in all
(`spans`) and per `service.name` (`spans:<name>`), so the benchmark can prove that each
"telemetry on" arm really exported. `GET /stats` returns the counts.
"""

from __future__ import annotations

import argparse
import gzip
import os
import zlib

from aiohttp import web
from payload import run

STATS: web.AppKey[dict[str, int]] = web.AppKey("stats", dict)


def _count_spans(body: bytes) -> dict[str, int]:
    """Spans per service.name."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    out: dict[str, int] = {}
    for rs in req.resource_spans:
        name = next((a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), "")
        out[name] = out.get(name, 0) + sum(len(ss.spans) for ss in rs.scope_spans)
    return out


async def export(request: web.Request) -> web.Response:
    stats = request.app[STATS]
    body = await request.read()
    enc = request.headers.get("Content-Encoding", "")
    if enc == "gzip":
        body = gzip.decompress(body)
    elif enc == "deflate":
        body = zlib.decompress(body)
    signal = request.match_info["signal"]
    stats[f"{signal}_requests"] = stats.get(f"{signal}_requests", 0) + 1
    stats[f"{signal}_bytes"] = stats.get(f"{signal}_bytes", 0) + len(body)
    if signal == "traces" and request.content_type == "application/x-protobuf":
        for name, n in _count_spans(body).items():
            stats["spans"] = stats.get("spans", 0) + n
            stats[f"spans:{name}"] = stats.get(f"spans:{name}", 0) + n
    if request.content_type == "application/json":
        return web.json_response({})
    return web.Response(body=b"", content_type="application/x-protobuf")


async def stats_handler(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATS])


def make_app() -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[STATS] = {}
    app.router.add_post("/v1/{signal:traces|metrics|logs}", export)
    app.router.add_get("/stats", stats_handler)
    return app


async def serve(host: str, port: int) -> None:
    runner = web.AppRunner(make_app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    print(f"otlp sink on http://{host}:{port} pid={os.getpid()}", flush=True)
    try:
        import asyncio

        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    try:
        run(serve(args.host, args.port))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
