"""The simulator's aiohttp app: routes by path suffix, like the proxy's dialect table.

    POST …/chat/completions | …/completions | …/responses | …/messages   generate (stream or not)
    POST …/embeddings                                                    deterministic vectors
    GET  …/models, …/models/{id}                                         the catalogue
    GET  /healthz                                                        alive
    GET  /sim/stats, /sim/requests/{id}                                  KV cache and per-request truth

Any prefix works (`/v1/chat/completions`, `/chat/completions`, `/api/v1/...`); the canonical
base URL is `http://HOST:PORT/v1`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import asdict
from typing import Any

import orjson
from aiohttp import web

from proxy.sim.anthropic import MessagesWriter
from proxy.sim.catalogue import ModelSpec
from proxy.sim.embeddings import embeddings_body, parse_embeddings
from proxy.sim.engine import ADMITTED, Engine, Handle
from proxy.sim.errors import (
    SimError,
    bad_request,
    error_body,
    injected,
    model_not_found,
    over_budget,
    unauthorized,
)
from proxy.sim.openai_chat import ChatWriter, CompletionsWriter
from proxy.sim.openai_responses import ResponsesWriter
from proxy.sim.physics import Physics
from proxy.sim.ratelimit import Budgets, quota_headers
from proxy.sim.request import SimRequest, parse_request
from proxy.sim.settings import SimSettings
from proxy.sim.text import Output, plan_output
from proxy.sim.tokens import Tokenizer
from proxy.sim.wire import Meta, SimUsage, Writer, new_id

__all__ = ["SIMULATOR", "Simulator", "create_app"]

_WRITERS: dict[str, tuple[Callable[[Meta], Writer], str]] = {
    "chat_completions": (ChatWriter, "chatcmpl-"),
    "completions": (CompletionsWriter, "cmpl-"),
    "responses": (ResponsesWriter, "resp_"),
    "messages": (MessagesWriter, "msg_"),
}
_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
_MODEL_CREATED = 1_715_367_049


class Simulator:
    """The catalogue, one engine per model, the tokenizer, the key rules."""

    def __init__(self, settings: SimSettings, catalogue: tuple[ModelSpec, ...], tokenizer: Tokenizer) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.models = {spec.name: spec for spec in catalogue}
        physics = Physics(batch_slowdown=settings.batch_slowdown, cache_residual=settings.cache_residual)
        self.engines = {
            spec.name: Engine(
                spec,
                physics,
                time_scale=settings.time_scale,
                block_size=settings.block_size,
                max_batch=settings.max_batch,
            )
            for spec in catalogue
        }
        self.budgets = Budgets(settings.rate_limit_requests, settings.rate_limit_tokens, settings.rate_limit_window)

    def charge(self, api: str, headers: Mapping[str, str], tokens: int) -> dict[str, str]:
        """Spend the caller's budget: its rate-limit headers, or `SimError` 429 when it is spent."""
        if not self.budgets.enabled:
            return {}
        quota = self.budgets.charge(_key_of(headers), tokens)
        out = quota_headers(api, quota, time.time())
        if not quota.allowed:
            kind = "requests" if quota.requests and quota.remaining_requests == 0 else "tokens"
            raise over_budget(kind, out)
        return out

    def authorized(self, headers: Mapping[str, str]) -> bool:
        key = _key_of(headers)
        if key is not None and key in self.settings.bad_keys:
            return False
        if not self.settings.require_key:
            return True
        return bool(key) and (not self.settings.api_keys or key in self.settings.api_keys)

    def stats(self) -> dict[str, Any]:
        models = {}
        for name, engine in self.engines.items():
            kv = engine.kv_stats()
            per_block = kv.block_size * engine.spec.kv_bytes_per_token
            models[name] = {
                "running": engine.scheduler.running,
                "waiting": engine.scheduler.waiting,
                "kv": {
                    **asdict(kv),
                    "bytes_per_token": engine.spec.kv_bytes_per_token,
                    "capacity_bytes": kv.total_blocks * per_block,
                    "used_bytes": kv.used_blocks * per_block,
                    "cached_bytes": kv.cached_blocks * per_block,
                },
            }
        recent = [asdict(r) for engine in self.engines.values() for r in engine.recent]
        return {
            "time_scale": self.settings.time_scale,
            "tokenizer": self.tokenizer.name,
            "models": models,
            "requests": recent,
        }

    def request_stats(self, request_id: str) -> dict[str, Any] | None:
        for engine in self.engines.values():
            for r in engine.recent:
                if r.id == request_id:
                    return asdict(r)
        return None

    async def close(self) -> None:
        for engine in self.engines.values():
            await engine.close()


SIMULATOR = web.AppKey("simulator", Simulator)


def _key_of(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return headers.get("x-api-key") or None


def _json(obj: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json", headers=headers)


def _error(api: str, error: SimError) -> web.Response:
    headers = error.headers or ({"retry-after": "1"} if error.status == 429 else None)
    return _json(error_body(api, error), error.status_for(api), headers)


def _model_entry(spec: ModelSpec) -> dict[str, Any]:
    # OpenAI's fields and Anthropic's side by side: each SDK reads its own
    return {
        "id": spec.name,
        "object": "model",
        "type": "model",
        "created": _MODEL_CREATED,
        "created_at": "2024-05-10T00:00:00Z",
        "display_name": spec.name,
        "owned_by": spec.owned_by,
    }


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def _stats(request: web.Request) -> web.Response:
    return _json(request.app[SIMULATOR].stats())


async def _request_stats(request: web.Request) -> web.Response:
    found = request.app[SIMULATOR].request_stats(request.match_info["id"])
    return _json(found) if found is not None else _json({"error": "unknown or unfinished request"}, 404)


_ENDPOINTS = {"/chat/completions", "/completions", "/responses", "/messages", "/embeddings", "/models"}
# The sim's own routes (it is an upstream: it does not borrow the proxy's dialect table).
_APIS = (
    ("/chat/completions", "chat_completions"),
    ("/completions", "completions"),
    ("/responses", "responses"),
    ("/messages", "messages"),
    ("/embeddings", "embeddings"),
)


def _route(path: str, prefix: str) -> tuple[str, str | None] | None:
    """(api or "models", model id) for a path, or None. With a prefix, only `prefix + endpoint`."""
    if prefix:
        if not path.startswith(prefix + "/"):
            return None
        rest = path[len(prefix) :]
        if rest not in _ENDPOINTS and rest.rpartition("/")[0] != "/models":
            return None
    parts = path.split("/")
    if parts[-1] == "models":
        return "models", None
    if len(parts) > 2 and parts[-2] == "models":
        return "models", parts[-1]
    for suffix, api in _APIS:
        if path.endswith(suffix):
            return api, None
    return None


async def _dispatch(request: web.Request) -> web.StreamResponse:
    sim = request.app[SIMULATOR]
    route = _route(request.path.rstrip("/"), sim.settings.path_prefix.rstrip("/"))
    wanted = "GET" if route is not None and route[0] == "models" else "POST"
    if route is None or request.method != wanted:
        message = f"Unknown request URL: {request.method} {request.path}"
        return _json(
            {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": "unknown_url"}}, 404
        )
    kind, model = route
    if kind == "models":
        return _models(sim, request, model)
    try:
        if kind == "embeddings":
            return await _embeddings(sim, request)
        return await _generate(sim, request, kind)
    except SimError as error:
        return _error(kind, error)


def _models(sim: Simulator, request: web.Request, model: str | None) -> web.Response:
    api = "messages" if "anthropic-version" in request.headers else "chat_completions"
    if not sim.authorized(request.headers):
        return _error(api, unauthorized())
    if model is not None:
        spec = sim.models.get(model)
        return _json(_model_entry(spec)) if spec is not None else _error(api, model_not_found(model))
    data = [_model_entry(spec) for spec in sim.models.values()]
    return _json(
        {
            "object": "list",
            "data": data,
            "has_more": False,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
        }
    )


async def _generate(sim: Simulator, request: web.Request, api: str) -> web.StreamResponse:
    if not sim.authorized(request.headers):
        raise unauthorized()
    raw = await request.read()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise bad_request("We could not parse the JSON body of your request.") from None
    req = parse_request(api, body, request.headers)
    spec = sim.models.get(req.model)
    if spec is None:
        raise model_not_found(req.model)
    if req.failure in ("429", "500", "503"):
        raise injected(req.failure)
    prompt = sim.tokenizer.encode(req.prompt)
    output = plan_output(spec, max_tokens=req.max_tokens, effort=req.reasoning_effort, seed=req.prompt)
    engine = sim.engines[spec.name]
    if len(prompt) + output.total > spec.context_window or not engine.fits(len(prompt), output.total):
        raise bad_request(
            f"This model's maximum context length is {spec.context_window} tokens. However, you requested "
            f"{len(prompt) + output.total} tokens ({len(prompt)} in the messages, {output.total} in the completion).",
            "context_length_exceeded",
        )
    limits = sim.charge(api, request.headers, len(prompt) + output.total)
    writer_cls, prefix = _WRITERS[api]
    meta = Meta(new_id(prefix), spec.name, int(time.time()), output, req.include_usage, req.max_tokens)
    writer = writer_cls(meta)
    handle = engine.submit(meta.id, prompt, output.total)
    try:
        if req.stream:
            return await _stream(request, sim, req, writer, handle, output, len(prompt), limits)
        return await _whole(request, req, writer, handle, output, len(prompt), limits)
    finally:
        handle.cancel()  # a no-op once finished; frees the slot and blocks if the client left


def _usage(prompt_tokens: int, handle: Handle, output: Output, produced: int) -> SimUsage:
    reasoning = min(produced, len(output.reasoning))
    return SimUsage(prompt_tokens, handle.cached_tokens, produced, reasoning)


def _fail_at(req: SimRequest, output: Output) -> int | None:
    """Token count after which `midstream` / `cut` / `unfinished` strike: half-way, after at least one token."""
    if req.failure in ("midstream", "cut", "unfinished"):
        return max(1, output.total // 2)
    return None


async def _tokens(handle: Handle, total: int) -> AsyncIterator[int]:
    produced = 0
    while produced < total:
        produced = await handle.next()
        yield produced


async def _stream(
    request: web.Request,
    sim: Simulator,
    req: SimRequest,
    writer: Writer,
    handle: Handle,
    output: Output,
    prompt_tokens: int,
    limits: Mapping[str, str],
) -> web.StreamResponse:
    response = web.StreamResponse(headers={**_SSE_HEADERS, **limits, "x-request-id": writer.meta.id})
    await response.prepare(request)
    if await handle.next() != ADMITTED:  # pragma: no cover - the engine always admits first
        raise RuntimeError("engine protocol")
    try:
        if req.failure == "empty":  # an engine refusing a prompt over its context window this way: 200, no event
            await response.write_eof()
            return response
        await response.write(writer.start(_usage(prompt_tokens, handle, output, 0)))
        if req.failure == "stall":
            await asyncio.sleep(sim.settings.stall_seconds)
        fail_at = _fail_at(req, output)
        done = 0
        async for produced in _tokens(handle, output.total):
            chunk = b"".join(writer.token(i) for i in range(done, produced))
            done = produced
            if chunk:
                await response.write(chunk)
            if fail_at is not None and done >= fail_at:
                handle.cancel()
                if req.failure == "cut":
                    _cut(request)
                    return response
                if req.failure == "unfinished":
                    await response.write(writer.interrupted())
                    await response.write_eof()
                    return response
                await response.write(writer.error(injected("midstream")))
                await response.write_eof()
                return response
        await response.write(writer.end(_usage(prompt_tokens, handle, output, done)))
        await response.write_eof()
    except ConnectionError:
        # The client closed between two tokens and the next write found the connection closing
        # (before aiohttp cancelled this handler): the client left, nothing failed here.
        pass
    return response


def _cut(request: web.Request) -> None:
    """Drop the connection mid-body: no terminating chunk, so the client sees a truncated stream."""
    if request.transport is not None:
        request.transport.abort()


async def _whole(
    request: web.Request,
    req: SimRequest,
    writer: Writer,
    handle: Handle,
    output: Output,
    prompt_tokens: int,
    limits: Mapping[str, str],
) -> web.StreamResponse:
    if await handle.next() != ADMITTED:  # pragma: no cover
        raise RuntimeError("engine protocol")
    if req.failure == "empty":
        raise injected("500")
    fail_at = _fail_at(req, output)
    done = 0
    async for done in _tokens(handle, output.total):
        if fail_at is not None and done >= fail_at:
            handle.cancel()
            if req.failure == "cut":
                _cut(request)
                return web.StreamResponse()
            raise injected("500")
    body = writer.body(_usage(prompt_tokens, handle, output, done))
    return _json(body, headers={**limits, "x-request-id": writer.meta.id})


async def _embeddings(sim: Simulator, request: web.Request) -> web.Response:
    if not sim.authorized(request.headers):
        raise unauthorized()
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        raise bad_request("We could not parse the JSON body of your request.") from None
    req = parse_embeddings(body, sim.tokenizer)
    limits = sim.charge("embeddings", request.headers, req.tokens)
    return _json(embeddings_body(req), headers={**limits, "x-request-id": new_id("emb-")})


def create_app(settings: SimSettings, catalogue: tuple[ModelSpec, ...], tokenizer: Tokenizer) -> web.Application:
    """The simulator as an aiohttp application (its engines stop with the app)."""
    # Header lines as long as the proxy allows (proxy/server/app.py): what passes the proxy passes here.
    app = web.Application(client_max_size=32 * 1024 * 1024, handler_args={"max_field_size": 16384})
    app[SIMULATOR] = Simulator(settings, catalogue, tokenizer)

    async def lifetime(app: web.Application) -> AsyncIterator[None]:
        yield
        await app[SIMULATOR].close()

    app.cleanup_ctx.append(lifetime)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/sim/stats", _stats)
    app.router.add_get("/sim/requests/{id}", _request_stats)
    app.router.add_route("*", "/{tail:.*}", _dispatch)
    return app
