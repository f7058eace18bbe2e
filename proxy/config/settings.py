"""Settings for `taotrace serve`: flags, `TAOTRACE_*` environment variables, defaults.

Tests construct `Settings(...)` with arguments; the environment is read only when the CLI
builds one. OpenTelemetry's own `OTEL_*` variables are left to the SDK.
"""

from __future__ import annotations

import os
import re
from typing import Annotated, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from proxy.config.routes import DEFAULT_UPSTREAM, routes_for, upstream_url

DEFAULT_MIRROR_PATHS = ("/chat/completions", "/responses", "/messages")
# What a request sent upstream carries of the client's address (`proxy/exchange/headers.py`).
ForwardedFor = Literal["append", "forwarded", "off"]


def check_upstream(value: str) -> str:
    upstream_url(value)
    return value


_THRESHOLD = re.compile(r"^(?:(ttft|duration)\s*=\s*)?([0-9]*\.?[0-9]+)\s*(ms|s)?$")


def parse_thresholds(text: str) -> tuple[float | None, float | None]:
    """`ttft=2.5,duration=60` (seconds; an `ms` or `s` suffix allowed; a bare number is TTFT) ->
    (ttft, duration) in seconds. Raises ValueError naming the accepted form."""
    ttft = duration = None
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        m = _THRESHOLD.match(part.lower())
        if m is None or float(m.group(2)) <= 0:
            raise ValueError(f"not a threshold: {part[:40]!r}; expected e.g. ttft=2.5, duration=60s, ttft=800ms")
        seconds = float(m.group(2)) / (1000.0 if m.group(3) == "ms" else 1.0)
        if m.group(1) == "duration":
            duration = seconds
        else:
            ttft = seconds
    return ttft, duration


def check_thresholds(value: str) -> str:
    parse_thresholds(value)
    return value


def check_trace_url(value: str) -> str:
    """A trace link template: http(s), with `{trace_id}` where the id goes."""
    if value and (not value.startswith(("http://", "https://")) or "{trace_id}" not in value):
        raise ValueError(
            "trace_url must be an http(s) URL containing {trace_id}, e.g. http://localhost:16686/trace/{trace_id}"
        )
    return value


def empty_is_none(value: SecretStr | None) -> SecretStr | None:
    """An empty `TAOTRACE_UI_TOKEN=` means no token, not an empty one."""
    return None if value is not None and not value.get_secret_value().strip() else value


def lower(value: object) -> object:
    return value.lower() if isinstance(value, str) else value


def split_csv(value: object) -> object:
    """Accept `a,b,c` from flags and the environment, and a list of such (a repeated flag)."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return [part.strip() for item in value for part in item.split(",") if part.strip()]
    return value


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity mask, which a container's cpuset narrows)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # pragma: no cover - macOS, Windows


def workers_count(value: object) -> object:
    """`auto` means one worker per usable core."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return usable_cores()
    return value


class Settings(BaseSettings):
    """Everything `taotrace serve` can be told."""

    model_config = SettingsConfigDict(env_prefix="TAOTRACE_", extra="ignore")

    upstream: str = Field(
        DEFAULT_UPSTREAM, description="base URL every request is forwarded to (every path no route claims)"
    )
    routes: Annotated[list[str], NoDecode] = Field(
        [],
        description="[NAME:]/PREFIX=URL: requests under PREFIX go to URL, the prefix stripped; the longest prefix "
        "wins; NAME (default: the URL's host, or host:port when routes share a host) is the upstream label "
        "(repeatable; env: comma separated)",
        json_schema_extra={"flag": "--route", "metavar": "[NAME:]/PREFIX=URL"},
    )
    host: str = Field("127.0.0.1", min_length=1, description="address the proxy listens on")
    port: int = Field(8787, ge=0, le=65535, description="proxy port")
    metrics_host: str = Field("127.0.0.1", min_length=1, description="address of /metrics, /healthz, /readyz")
    metrics_port: int = Field(9464, ge=0, le=65535, description="port of /metrics, /healthz, /readyz")
    connect_timeout: float = Field(10.0, gt=0, description="seconds to open a connection upstream (then 504)")
    read_timeout: float = Field(
        300.0, gt=0, description="idle seconds allowed between upstream reads (no total timeout)"
    )
    max_body_bytes: int = Field(32 * 1024 * 1024, gt=0, description="largest request body (413 beyond)")
    drain_seconds: float = Field(30.0, ge=0, description="on SIGTERM, how long in-flight requests may finish")
    upstream_keepalive: float = Field(
        4.0, gt=0, description="seconds an idle upstream connection is kept (below the upstream's own)"
    )
    upstream_discard_seconds: float = Field(
        1.0,
        ge=0,
        description="a client that closes after a stream's terminal event: seconds the upstream's rest of the body "
        "is read (and discarded) to keep its connection; then it is closed (0: close at once)",
    )
    upstream_discard_bytes: int = Field(
        64 * 1024, ge=0, description="the same, at most this many body bytes; beyond, the connection is closed"
    )
    client_keepalive: float = Field(
        75.0,
        gt=0,
        description="seconds a client connection may sit idle, or take to send a request head, before it is closed",
    )
    max_connections: int = Field(0, ge=0, description="upstream connection cap (0 = unlimited)")
    model_allowlist: Annotated[list[str], NoDecode] = Field(
        [], description="model label values kept as-is (comma separated); others become 'other'"
    )
    max_models: int = Field(100, ge=1, description="without an allow-list: distinct model labels before 'other'")
    capture_content: bool = Field(False, description="record prompt and completion text on spans (off: never recorded)")
    capture_io_values: bool = Field(
        False,
        description="with --capture-content: also set input.value and output.value on the request span (the last "
        "user message's text and the answer's text, OpenInference's names), which the trace lists of viewers "
        "such as Arize Phoenix show",
    )
    parent: Literal["child", "link", "none"] = Field(
        "child",
        description="a caller's traceparent: child (the proxy's span joins the caller's trace), link (a new "
        "trace whose root links to the caller's span; the caller's traceparent goes upstream unchanged), none "
        "(a new trace, no link; the caller's traceparent goes upstream unchanged)",
    )
    forwarded_for: ForwardedFor = Field(
        "append",
        description="what a request sent upstream carries of the client's address: append (added to the "
        "client's X-Forwarded-For), forwarded (this hop added to the RFC 7239 Forwarded header; X-Forwarded-For "
        "passes as the client sent it), off (nothing added)",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="how much the proxy logs")
    access_log: bool = Field(False, description="one log line per request (no keys, no query strings)")
    server_timing: bool = Field(
        False,
        description="add a Server-Timing response header (network, proxy, upstream ms); off: the head is the upstream's",
    )

    sample_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        description="share of traces exported, decided when each request ends on its trace id as TraceIdRatioBased "
        "does; errors and slow requests are kept besides (1: every trace, no decision)",
    )
    keep_errors: bool = Field(True, description="with --sample-ratio below 1: keep every trace that ended in an error")
    keep_slower_than: str = Field(
        "",
        description="with --sample-ratio below 1: keep every trace slower than these, e.g. ttft=2.5,duration=60 "
        "(seconds; a bare number is TTFT)",
    )
    workers: int = Field(
        1,
        ge=1,
        le=256,
        description="serving processes sharing the proxy port (auto: one per usable core); 1: a single process",
        json_schema_extra={"metavar": "N|auto", "allowed": "auto, or an integer from 1 to 256"},
    )

    attribute_header: Annotated[list[str], NoDecode] = Field(
        [],
        description="NAME=attr: copy request header NAME onto the span as attribute attr (repeatable; env: comma "
        "separated); values cut at 256 chars; headers that carry credentials are refused",
    )
    attribute_body_user: bool = Field(
        False, description="record the body's OpenAI `user` / Anthropic `metadata.user_id` as span attribute user.id"
    )
    key_salt: SecretStr | None = Field(
        None,
        min_length=16,
        max_length=1024,
        description="salt of taotrace.key.id, the HMAC-SHA256 fingerprint of the API key (set it, via "
        "TAOTRACE_KEY_SALT, for ids that stay the same across restarts and replicas; unset: random at start, one for all workers)",
    )
    metric_label: Annotated[list[str], NoDecode] = Field(
        [],
        description="attribution attributes (e.g. user.id, taotrace.key.id) to add as labels to the "
        "taotrace_attributed_* metrics (comma separated; none: those metrics are not exported)",
    )
    metric_label_values: int = Field(
        20, ge=1, le=1000, description="distinct values kept per metric label before the rest become 'other'"
    )
    prices: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        description="price table (TOML or YAML, per million tokens) for taotrace.cost and taotrace_cost_total",
    )

    mirror: str | None = Field(
        None,
        min_length=1,
        description="paired comparison: also send a sampled share of requests to this route's upstream (a route's "
        "name), read its answer to the end and discard it; the client only ever sees the primary's. Needs the "
        "ratio and the per-minute cap below",
        json_schema_extra={"metavar": "ROUTE"},
    )
    mirror_ratio: float | None = Field(None, gt=0, le=1, description="with --mirror: the share of requests copied")
    mirror_max_per_minute: int | None = Field(
        None, ge=1, description="with --mirror: at most this many copies started per minute (beyond: dropped, counted)"
    )
    mirror_concurrency: int = Field(
        4, ge=1, le=1000, description="with --mirror: copies running at once (beyond: dropped, counted)"
    )
    mirror_paths: Annotated[list[str], NoDecode] = Field(
        list(DEFAULT_MIRROR_PATHS),
        description="with --mirror: request paths ending with one of these are copied, nothing else",
    )
    mirror_key_env: str | None = Field(
        None,
        min_length=1,
        description="with --mirror: the environment variable holding the mirror's API key (the client's "
        "Authorization, x-api-key and cookies never go to the mirror)",
        json_schema_extra={"metavar": "NAME"},
    )

    ui: bool = Field(True, description="serve the live view (/, /api/*) on the metrics port; --no-ui turns it off")
    ui_token: SecretStr | None = Field(
        None,
        description="bearer token the live view and its API require (/metrics, /healthz, /readyz never do); "
        "prefer TAOTRACE_UI_TOKEN over the flag, which other local users can see in the process list",
    )
    ui_requests: int = Field(1000, ge=1, le=100_000, description="finished requests the live view keeps (a ring)")
    trace_url: str = Field(
        "",
        max_length=2048,
        description="link each request to its trace: a URL template with {trace_id}, e.g. http://localhost:16686/trace/{trace_id}",
    )

    _split_allowlist = field_validator("model_allowlist", "attribute_header", "metric_label", mode="before")(split_csv)
    _check_thresholds = field_validator("keep_slower_than")(check_thresholds)
    _check_upstream = field_validator("upstream")(check_upstream)
    _split_routes = field_validator("routes", mode="before")(split_csv)
    _split_mirror_paths = field_validator("mirror_paths", mode="before")(split_csv)

    @field_validator("mirror_paths")
    @classmethod
    def _valid_mirror_paths(cls, value: list[str]) -> list[str]:
        for path in value:
            if not path.startswith("/") or len(path) < 2:
                raise ValueError(f"mirror path {path[:60]!r} must be a path ending such as /chat/completions")
        return value

    @model_validator(mode="after")
    def _valid_mirror(self) -> Settings:
        if self.mirror is None:
            return self
        if self.mirror_ratio is None or self.mirror_max_per_minute is None:
            raise ValueError(
                "--mirror doubles token spend on the requests it copies: give --mirror-ratio (e.g. 0.05) "
                "and --mirror-max-per-minute (e.g. 10) too"
            )
        return self  # the route it names is checked with the routes (`proxy.config.config.load`)

    @field_validator("routes")
    @classmethod
    def _valid_routes(cls, value: list[str]) -> list[str]:
        routes_for(DEFAULT_UPSTREAM, value)  # each route's form, and no prefix or name twice
        return value

    @field_validator("capture_io_values")
    @classmethod
    def _io_values_need_capture(cls, value: bool, info: ValidationInfo) -> bool:
        # Never silently ignored: without capture there is no text to set.
        if value and not info.data.get("capture_content", False):
            raise ValueError(
                "needs --capture-content (TAOTRACE_CAPTURE_CONTENT): it sets the prompt's and the answer's text on spans"
            )
        return value

    _lower_level = field_validator("log_level", "forwarded_for", mode="before")(lower)
    _check_trace_url = field_validator("trace_url")(check_trace_url)
    _empty_token = field_validator("ui_token")(empty_is_none)

    @field_validator("attribute_header")
    @classmethod
    def _valid_attribute_headers(cls, value: list[str]) -> list[str]:
        from proxy.accounting.attribution import parse_header_attributes

        parse_header_attributes(value)  # refuses credential headers with a message saying why
        return value

    _auto_workers = field_validator("workers", mode="before")(workers_count)
