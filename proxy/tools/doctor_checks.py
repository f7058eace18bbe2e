"""The checks of `taotrace doctor`: the article's troubleshooting order, one check at a time.

    key      a key is present (flag, $TAOTRACE_API_KEY, $TAOTOKEN_API_KEY, or the config's
             `api_key_env`) and has no stray whitespace or quotes; the key itself is never
             printed. No key is not a failure here: an endpoint that wants one says so at auth
             (then the fix names the variable to set); one that needs none (the simulator) passes
    network  the base URL is well formed (http(s), no endpoint path glued on), its host
             resolves, a TCP connection opens, TLS completes, and `GET {base}/models` is routed
             (a 404 there means a path is added or missing: the right base URL is named; a
             taotrace metrics port is named as such, with the proxy's port to use). A base URL
             without a version segment that works only because the server also takes it (the
             simulator does; `{base}/v1` answers too) passes with a warning: providers serve
             the API under `/v1`.
             Behind a corporate proxy (`HTTPS_PROXY` / `HTTP_PROXY`, unless `NO_PROXY` says
             direct: `serve`'s rules) it says which way it went, and steps through the forward
             proxy instead: its name, TCP to it, CONNECT, TLS through the tunnel; a proxy that is
             down or refuses (407, 403, 502) is told apart from a target that is unreachable
    auth     `GET {base}/models` accepts the key (401/403 say so); a taotrace proxy's own 502/504
             is told as the proxy failing to reach its upstream, not as the endpoint's trouble
    model    `--model` is in that list (close names are suggested)
    stream   a tiny streaming chat request parses chunk by chunk: tokens, the usage-only chunk
             with empty `choices`, `data: [DONE]`; and how much of its TTFT is the network
             (opening the connection + one round trip, from the kernel's TCP_INFO on Linux)

They run in order and stop at the first failure, with a one-line cause and a concrete fix
(`diagnose`); the report and the command are `doctor.py`'s.
"""

from __future__ import annotations

import difflib
import os
import re
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import aiohttp
import orjson
from yarl import URL

from proxy.dialects import API_CHAT
from proxy.tools.client import Call, ConnectTimer, auth_headers, error_message, measure, network_share, tls_context
from proxy.tools.clientconfig import (
    DEFAULT_BASE_URL,
    BaseURLError,
    Target,
    key_hint,
    key_places,
    parse_base_url,
    shown_url,
)
from proxy.tools.reach import Unreachable, reach
from proxy.tools.route import BAD_VARIABLE_FIX, DIRECT, ToolRoute, os_reason, route_for

__all__ = ["CHECKS", "Caution", "Check", "Failed", "diagnose"]

STREAM_PROMPT = "Say OK."
PROXY_ERROR_PREFIX = "taotrace: "  # how the proxy's own error bodies start (proxy/errors.py)
VERSIONED = re.compile(r"/v\d+[a-z0-9]*(/|$)")  # /v1, /v1beta, /v2/...: a path with an API version
METRICS_PEEK = 256 * 1024  # how much of a /metrics page is read to recognise taotrace's


@dataclass(frozen=True)
class Check:
    """The outcome of one step: ok / warn / fail / skip, what was seen, and the fix when it failed
    or warned (`warning`: what works here but not elsewhere)."""

    name: str
    status: str
    detail: str
    fix: str | None = None
    warning: str | None = None


@dataclass(frozen=True)
class Caution:
    """A check that passed with a warning: what it saw, the warning, and the fix."""

    detail: str
    warning: str
    fix: str


class Failed(Exception):
    """A check found the problem: its cause and the fix."""

    def __init__(self, cause: str, fix: str) -> None:
        super().__init__(cause)
        self.cause = cause
        self.fix = fix


@dataclass
class _State:
    """What earlier checks learned that later ones read."""

    target: Target
    timeout: float
    environ: Mapping[str, str]
    tls: ssl.SSLContext
    route: ToolRoute = DIRECT
    models_status: int | None = None
    models_body: bytes = b""
    model_ids: list[str] = field(default_factory=list)


_shown = shown_url


# --- key -----------------------------------------------------------------------------------


async def check_key(state: _State) -> str:
    key = state.target.api_key
    if not key:  # not a failure yet: some endpoints (taotrace sim, a local vLLM) need none; auth tells
        return f"none set (looked in {key_places(state.target.key_env)}); going on without one"
    if key != key.strip() or any(c in key for c in "\"' \t\r\n"):
        raise Failed(
            "the key contains whitespace or quotes (copied with them?)",
            "set it again without quotes, spaces or a trailing newline",
        )
    return f"present (from {state.target.key_source})"


def _no_key(state: _State, status: int) -> Failed:
    return Failed(
        f"the endpoint wants a key (it answered {status}) and none is set: looked in {key_places(state.target.key_env)}",
        key_hint(state.target.key_env),
    )


def _proxy_trouble(status: int, message: str) -> Failed | None:
    """A taotrace proxy's own 502/504 (its upstream failed, not this endpoint): say so."""
    if status not in (502, 503, 504) or not message.startswith(PROXY_ERROR_PREFIX):
        return None
    cause = message.removeprefix(PROXY_ERROR_PREFIX)
    if status == 504:
        what = "timed out reaching its upstream"
    elif "shutting down" in cause:
        what = "is shutting down"
    else:
        what = "cannot reach its upstream"
    return Failed(
        f"the taotrace proxy answered {status}: it {what} ({cause})",
        "check the proxy's --upstream (its start-up log line names it) and that the upstream is up; "
        "`taotrace doctor --base-url <the upstream's base URL>` checks the upstream directly",
    )


# --- network -------------------------------------------------------------------------------


def _parse_base(base: str) -> URL:
    try:
        return parse_base_url(base)
    except BaseURLError as exc:
        raise Failed(exc.cause, exc.fix) from None


async def _get_models(
    session: aiohttp.ClientSession, base: str, key: str | None, route: ToolRoute
) -> tuple[int, bytes, str]:
    async with session.get(base.rstrip("/") + "/models", **route.options(auth_headers(API_CHAT, key))) as response:
        return response.status, await response.read(), response.headers.get("Content-Type", "")


def _alternatives(url: URL) -> list[str]:
    base = str(url.with_query(None)).rstrip("/")
    path = url.path.rstrip("/")
    out = []
    if not path.endswith("/v1"):
        out.append(base + "/v1")
    if path not in ("", "/"):
        out.append(str(url.with_path(path.rsplit("/", 1)[0] or "/").with_query(None)).rstrip("/"))
    return out


def _route(url: URL, environ: Mapping[str, str]) -> ToolRoute:
    try:
        return route_for(url, environ)
    except ValueError as exc:  # a bad HTTPS_PROXY: named, never with its credentials
        raise Failed(str(exc), BAD_VARIABLE_FIX) from None


def _routed(status: int, kind: str) -> bool:
    """The path reached an API: not a 404, nor a web page."""
    return status != 404 and not (status == 200 and "html" in kind)


async def _head(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body's first `limit` bytes (a big /metrics page is not read whole)."""
    data = b""
    while len(data) < limit:
        chunk = await response.content.read(limit - len(data))
        if not chunk:
            break
        data += chunk
    return data


async def _metrics_port(session: aiohttp.ClientSession, url: URL, route: ToolRoute) -> bool:
    """Whether `url`'s host and port serve taotrace's metrics (`/healthz` "ok", `/metrics` with
    taotrace_ series): a base URL given the metrics port instead of the proxy's."""
    origin = str(url.origin())
    try:
        async with session.get(origin + "/healthz", **route.options({})) as response:
            if response.status != 200 or (await _head(response, 64)).strip() != b"ok":
                return False
        async with session.get(origin + "/metrics", **route.options({})) as response:
            return response.status == 200 and b"# TYPE taotrace_" in await _head(response, METRICS_PEEK)
    except (aiohttp.ClientError, TimeoutError):
        return False


async def _shape(session: aiohttp.ClientSession, state: _State, url: URL) -> tuple[str, str] | None:
    """The warning and fix when a base URL with no version segment works here only because this
    server (the simulator, a proxy in front of it) also answers without one: `{base}/v1` does too."""
    if VERSIONED.search(url.path):
        return None
    candidate = state.target.base_url.rstrip("/") + "/v1"
    try:
        status, _, kind = await _get_models(session, candidate, state.target.api_key, state.route)
    except (aiohttp.ClientError, TimeoutError):
        return None
    if not _routed(status, kind):
        return None
    base = _shown(state.target.base_url)
    return (
        f"{base}/models answers and so does {base}/v1/models: this server takes either, but providers "
        f"(OpenAI, vLLM, Ollama) serve only the /v1 form, e.g. {base}/v1/chat/completions for the chat call",
        f"use --base-url {base}/v1, the form that works elsewhere too",
    )


async def check_network(state: _State) -> str | Caution:
    url = _parse_base(state.target.base_url)
    state.route = route = _route(url, state.environ)
    try:
        notes = await reach(url, route, state.timeout, state.tls)
    except Unreachable as exc:
        raise Failed(exc.cause, exc.fix) from None
    timeout = aiohttp.ClientTimeout(total=state.timeout * 3, sock_connect=state.timeout, sock_read=state.timeout)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=state.tls), timeout=timeout) as session:
        try:
            status, body, kind = await _get_models(session, state.target.base_url, state.target.api_key, route)
        except aiohttp.ClientHttpProxyError as exc:  # the forward proxy answered CONNECT without a tunnel
            raise Failed(*route.refused(exc.status, exc.message)) from None
        except aiohttp.ClientProxyConnectionError as exc:
            raise Failed(*route.unreachable(os_reason(exc.os_error))) from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise Failed(
                f"GET {_shown(state.target.base_url)}/models failed ({type(exc).__name__})",
                "the host answers TCP but not HTTP here: check the scheme (http vs https) and port",
            ) from None
        if status == 407 and route.forward is not None:  # only a proxy sends 407 (RFC 9110)
            raise Failed(*route.wants_credentials())
        if not _routed(status, kind):
            for candidate in _alternatives(url):
                try:
                    alt_status, _, alt_kind = await _get_models(session, candidate, state.target.api_key, route)
                except (aiohttp.ClientError, TimeoutError):
                    continue
                if _routed(alt_status, alt_kind):
                    missing = len(candidate) > len(state.target.base_url)
                    raise Failed(
                        f"base URL path is wrong: {_shown(state.target.base_url)}/models is {status}, "
                        f"{_shown(candidate)}/models answers ({'a path is missing' if missing else 'a path is added'})",
                        f"use --base-url {_shown(candidate)}",
                    )
            if await _metrics_port(session, url, route):
                raise Failed(
                    f"{_shown(str(url.origin()))} is taotrace's metrics port (/metrics, /healthz, the live view); "
                    "the proxy is on serve's --port",
                    f"use --base-url {_shown(str(url.with_port(8787).with_path('/v1')))} "
                    "(the proxy's --port: 8787 unless it was set)",
                )
            raise Failed(
                f"{_shown(state.target.base_url)}/models is {'a web page' if status == 200 else 'not found (404)'}: "
                "this is not an OpenAI-compatible base URL",
                f"use the API base URL, e.g. {DEFAULT_BASE_URL}",
            )
        shape = await _shape(session, state, url)
    state.models_status, state.models_body = status, body
    detail = ", ".join(notes) + f"; GET /models answered {status}"
    return detail if shape is None else Caution(detail, *shape)


# --- auth, model ---------------------------------------------------------------------------


def _maybe_proxy(state: _State) -> str:
    """An http target through a forward proxy: any answer may be the proxy's own (no tunnel)."""
    if state.route.forward is None or state.route.tunnel:
        return ""
    return f" (through the {state.route.forward.where}: the answer may be the forward proxy's own)"


async def check_auth(state: _State) -> str:
    status = state.models_status
    if status in (401, 403) and not state.target.api_key:
        raise _no_key(state, status)
    if status in (401, 403):
        raise Failed(
            f"the key was rejected: GET /models answered {status}: {error_message(state.models_body)}{_maybe_proxy(state)}",
            "check the key belongs to this endpoint, is not revoked, and was copied whole",
        )
    if status == 429:
        raise Failed("rate limited (429) already on GET /models", "wait and retry; check the account's quota")
    if status != 200:
        raise _proxy_trouble(status or 0, error_message(state.models_body)) or Failed(
            f"GET /models answered {status}: {error_message(state.models_body)}{_maybe_proxy(state)}",
            "the endpoint is having trouble: retry later, or check its status page",
        )
    try:
        doc = orjson.loads(state.models_body)
        data = doc.get("data") if isinstance(doc, dict) else doc
        data = data if isinstance(data, list) else []
        state.model_ids = [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
    except (orjson.JSONDecodeError, TypeError):
        state.model_ids = []
    count = len(state.model_ids)
    listed = f"GET /models: {count} model{'' if count == 1 else 's'}"
    return f"no key needed ({listed})" if not state.target.api_key else f"key accepted ({listed})"


async def check_model(state: _State) -> str:
    model = state.target.model
    if not state.model_ids:
        return f"{model} (the endpoint lists no models: not checked)"
    if model in state.model_ids:
        return f"{model} is served"
    close = difflib.get_close_matches(model, state.model_ids, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else f"served: {', '.join(state.model_ids[:8])}"
    raise Failed(
        f"model {model!r} is not in the {len(state.model_ids)} models this endpoint serves ({hint})",
        f"use --model {close[0] if close else state.model_ids[0]}",
    )


# --- stream --------------------------------------------------------------------------------


async def check_stream(state: _State) -> str:
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=state.timeout, sock_read=state.timeout * 6)
    call = Call(API_CHAT, state.target.model, STREAM_PROMPT, 8, dict(state.target.params))
    timer = ConnectTimer()
    connector = aiohttp.TCPConnector(ssl=state.tls)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, trace_configs=[timer.config]) as session:
        m = await measure(
            session, state.target.base_url, call, api_key=state.target.api_key, connect_timer=timer, route=state.route
        )
    if m.status in (401, 403) and not state.target.api_key:
        raise _no_key(state, m.status)
    if m.status in (401, 403):
        raise Failed(f"the streaming request was refused ({m.error})", "the key may lack access to this model or API")
    if m.status != 200:
        raise _proxy_trouble(m.status, (m.error or "").removeprefix(f"HTTP {m.status}: ")) or Failed(
            f"the streaming request failed: {m.error}", "check the model's parameters and the endpoint's status"
        )
    if m.unparsed:
        raise Failed(
            f"{m.unparsed} of {m.events} stream chunks were not JSON",
            "something between you and the API rewrites the stream (a proxy buffering or compressing it?)",
        )
    if m.error and m.error.startswith("error in stream"):
        raise Failed(f"the upstream sent an {m.error}", "retry; if it persists, the model or provider is failing")
    if not m.ended:
        raise Failed(
            f"the stream ended without its end ({'no event at all' if not m.events else 'no finish_reason'})",
            "a proxy or load balancer cut the stream (check its timeouts and buffering), or the server "
            "interrupted the generation (an engine answers a prompt over its context window this way)",
        )
    if not m.token_events:
        raise Failed("the stream parsed but carried no tokens", "check max_tokens and the model's output")
    usage = (
        "usage-only chunk (empty choices) parsed"
        if m.usage_reported
        else "no usage chunk (stream_options.include_usage ignored: tokens counted from chunks)"
    )
    ttft = f"TTFT {m.ttft_s * 1000:.0f} ms, " if m.ttft_s is not None else ""
    share = network_share(m, state.route)
    network = f"\n{'':<15}{share}" if share else ""  # its own line under the check
    return f"{m.events} chunks parsed, {m.token_events} tokens, {ttft}{usage}, [DONE] seen{network}"


CHECKS: tuple[tuple[str, Callable[[_State], Awaitable[str | Caution]]], ...] = (
    ("key", check_key),
    ("network", check_network),
    ("auth", check_auth),
    ("model", check_model),
    ("stream", check_stream),
)


def _no_progress(_name: str, _check: Check | None) -> None:
    return None


async def diagnose(
    target: Target,
    timeout: float = 10.0,
    *,
    environ: Mapping[str, str] = os.environ,
    tls: ssl.SSLContext | None = None,
    results: list[Check] | None = None,
    progress: Callable[[str, Check | None], None] = _no_progress,
) -> list[Check]:
    """Run the checks in order; stop at the first failure (the rest are `skip`).
    `environ`: where `HTTPS_PROXY` / `HTTP_PROXY` / `NO_PROXY` are read; `tls`: the trust to
    check certificates with (default: the system's, as it is now). Each outcome is appended to
    `results` as it is known (an interrupted run keeps them); `progress(name, None)` is called as
    a check starts, `progress(name, check)` as its outcome is known."""
    state = _State(target, timeout, environ, tls if tls is not None else tls_context())
    results = [] if results is None else results
    failed = False
    for name, check in CHECKS:
        if failed:
            results.append(Check(name, "skip", "not run"))
            progress(name, results[-1])
            continue
        progress(name, None)
        try:
            outcome = await check(state)
        except Failed as exc:
            results.append(Check(name, "fail", exc.cause, exc.fix))
            failed = True
        else:
            if isinstance(outcome, Caution):
                results.append(Check(name, "warn", outcome.detail, outcome.fix, outcome.warning))
            else:
                results.append(Check(name, "ok", outcome))
        progress(name, results[-1])
    return results
