"""One OTLP export request, already encoded, sent once over HTTP/protobuf or gRPC.

A transport answers each attempt with a `Sent`: delivered, or failed with whether the spec lets
it be retried, how long the collector asked to wait (`Retry-After`), and the status or exception
that says why (for the log: never a header, a body or a URL's userinfo or query). Retrying is
the caller's (`span_exporter.py`); a transport never sleeps and never raises.
"""

from __future__ import annotations

import email.utils
import gzip
import http.client
import ssl
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from proxy import __version__
from proxy.telemetry.otlp_env import ExportSettings

__all__ = ["GrpcTransport", "HttpTransport", "Sent", "Transport", "retry_after_seconds", "transport_for"]

# The statuses the OTLP spec calls retryable (the rest are final): HTTP, then gRPC by name.
RETRYABLE_HTTP = frozenset({429, 502, 503, 504})
RETRYABLE_GRPC = frozenset(
    {"CANCELLED", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED", "OUT_OF_RANGE", "UNAVAILABLE", "DATA_LOSS"}
)
_USER_AGENT = f"taotrace/{__version__}"
_GRPC_METHODS = {"traces": "/opentelemetry.proto.collector.trace.v1.TraceService/Export"}


@dataclass(frozen=True)
class Sent:
    """The outcome of one attempt."""

    ok: bool
    retryable: bool = False
    retry_after: float | None = None  # seconds the collector asked us to wait
    status: object = None  # the HTTP status (int) or gRPC StatusCode of a failure
    error: BaseException | None = None  # what failed (gRPC: the call's error, whose details say why)


class Transport(Protocol):
    def send(self, body: bytes, timeout: float) -> Sent: ...

    def close(self) -> None: ...


def retry_after_seconds(value: str | None, now: float) -> float | None:
    """`Retry-After` (delay-seconds or an HTTP date) as seconds from `now` (a Unix time); None when unreadable."""
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)


def _compressed(body: bytes, compression: str) -> bytes:
    """The body as `Content-Encoding: compression` says (the SDK's HTTP exporter's levels: gzip 6,
    deflate zlib's default, a zlib stream as HTTP's `deflate` is)."""
    if compression == "gzip":
        return gzip.compress(body, 6)
    if compression == "deflate":
        return zlib.compress(body)
    return body


def _ssl_context(settings: ExportSettings) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=settings.certificate)
    if settings.client_certificate:
        context.load_cert_chain(settings.client_certificate, settings.client_key)
    return context


class HttpTransport:
    """POSTs to the endpoint on one kept-alive connection (opened again after any failure).

    Used from the batch processor's one export thread; the lock only guards a shutdown racing it.
    """

    def __init__(self, settings: ExportSettings, clock: Callable[[], float]) -> None:
        parts = urlsplit(settings.endpoint)
        self._https = parts.scheme.lower() == "https"
        self._host = parts.hostname or "localhost"
        self._port = parts.port or (443 if self._https else 80)
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._context = _ssl_context(settings) if self._https else None
        self._compression = settings.compression
        self._headers = {
            "Content-Type": "application/x-protobuf",
            "User-Agent": _USER_AGENT,
            **({"Content-Encoding": settings.compression} if settings.compression else {}),
            **dict(settings.headers),
        }
        self._now = clock  # Unix time, for an HTTP-date Retry-After
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        conn = self._conn
        if conn is None:
            if self._https:
                conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._context)
            else:
                conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
            self._conn = conn
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def send(self, body: bytes, timeout: float) -> Sent:
        data = _compressed(body, self._compression)
        with self._lock:
            try:
                conn = self._connection(timeout)
                conn.request("POST", self._path, body=data, headers=self._headers)
                response = conn.getresponse()
                response.read()  # the whole answer, so the connection can carry the next request
                status = response.status
                wait = response.getheader("Retry-After")
                if response.will_close:
                    self._drop()
            except Exception as error:  # noqa: BLE001 - every failure is an outcome, never a raise
                self._drop()
                return Sent(False, retryable=True, error=error)
        if 200 <= status < 300:
            return Sent(True)
        return Sent(
            False,
            retryable=status in RETRYABLE_HTTP,
            retry_after=retry_after_seconds(wait, self._now()) if status in (429, 503) else None,
            status=status,
        )

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        with self._lock:
            self._drop()


class GrpcTransport:
    """A unary call of the collector service's `Export` with our bytes as the request (no stub, no proto classes)."""

    def __init__(self, settings: ExportSettings, signal: str) -> None:
        import grpc  # type: ignore[import-untyped]  # grpcio ships no type information; imported by gRPC exporters only

        self._grpc = grpc
        endpoint = settings.endpoint
        target = urlsplit(endpoint).netloc if "://" in endpoint else endpoint
        options = [("grpc.primary_user_agent", _USER_AGENT)]
        if settings.insecure:
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            root = client_key = client_cert = None
            if settings.certificate:
                with open(settings.certificate, "rb") as f:
                    root = f.read()
            if settings.client_certificate and settings.client_key:
                with open(settings.client_key, "rb") as f:
                    client_key = f.read()
                with open(settings.client_certificate, "rb") as f:
                    client_cert = f.read()
            credentials = grpc.ssl_channel_credentials(root, client_key, client_cert)
            self._channel = grpc.secure_channel(target, credentials, options=options)
        # No serialisers: the request goes as the bytes given, the response comes back as bytes.
        self._call = self._channel.unary_unary(_GRPC_METHODS[signal])
        self._metadata = settings.headers
        self._compression = {"gzip": grpc.Compression.Gzip, "deflate": grpc.Compression.Deflate}.get(
            settings.compression
        )

    def send(self, body: bytes, timeout: float) -> Sent:
        try:
            self._call(body, timeout=timeout, metadata=self._metadata, compression=self._compression)
        except self._grpc.RpcError as error:
            code = error.code() if callable(getattr(error, "code", None)) else None
            name = getattr(code, "name", "UNKNOWN")
            return Sent(False, retryable=name in RETRYABLE_GRPC, status=code, error=error)
        except Exception as error:  # noqa: BLE001 - every failure is an outcome, never a raise
            return Sent(False, retryable=False, error=error)
        return Sent(True)

    def close(self) -> None:
        self._channel.close()


def transport_for(settings: ExportSettings, signal: str, clock: Callable[[], float]) -> Transport:
    """The transport `settings.protocol` names; `clock` gives Unix time (for Retry-After dates)."""
    if settings.protocol == "grpc":
        return GrpcTransport(settings, signal)
    return HttpTransport(settings, clock)
