"""A failing collector as one line of ours, instead of the exporters' own warnings.

With the OTLP collector down, the exporters log each export given up ("Failed to export spans
to ..."), and the batch processor that its queue is full ("Queue full", at most once a second).
`CollectorLog` is a `logging.Filter` on those loggers (`LOGGERS`): their records about
exporting are kept from every handler and reported as rate-limited lines of ours
(`proxy.logs.ratelimited`) naming the endpoint by its origin (never userinfo, path or query: an
endpoint URL may carry a key) and a cause:

    connection refused, connection reset, DNS lookup failed, TLS handshake failed,
    TLS certificate not trusted, timeout, HTTP <code> <reason>, gRPC <STATUS>,
    gave up after retries, export failed

The cause is read from the exceptions in the record, then from its arguments' text (only to
classify it: the text itself is never printed), then from an HTTP or gRPC status; a record that
carries none ("... due to timeout, max retries or shutdown") takes the signal's last cause.
Other records pass untouched (configuration warnings, say).

Logger names are the exporting modules' own; tests/test_collector_log.py checks each is a
module logging under that name.
"""

from __future__ import annotations

import contextlib
import http
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Iterator, Mapping

from proxy.logs.origin import origin
from proxy.logs.ratelimited import RateLimitedLog, flushing
from proxy.telemetry.otlp_env import otlp_target

__all__ = ["LOGGERS", "CollectorLog", "collector_warnings", "record_cause"]

# logger name -> the signal its records are about (None: read from the record).
LOGGERS: dict[str, str | None] = {
    "proxy.telemetry.span_exporter": "traces",  # ours: a batch it cannot encode
    "proxy.telemetry.otlp_delivery": None,  # ours: one record per export given up; "spans"/"metrics" in args
    "proxy.telemetry.batch_processor": "traces",  # ours: queue full, an export that raised
    "proxy.telemetry.span_pipeline": "traces",  # ours: the simple processor's export failures
    "proxy.telemetry.metric_pipeline": "metrics",  # ours: an exporter that raised
    "opentelemetry.exporter.otlp.proto.http.metric_exporter": "metrics",  # the SDK's OTLP/HTTP metrics exporter
    "opentelemetry.exporter.otlp.proto.grpc.exporter": None,  # the SDK's OTLP/gRPC exporters; "metrics" in args
}
_SIGNAL_WORDS = {"traces": "traces", "spans": "traces", "span": "traces", "metrics": "metrics"}
_PHRASES = {s.phrase.lower(): f"HTTP {s.value} {s.phrase}" for s in http.HTTPStatus}
_TEXT_CAUSES = (  # lower-case fragments of library and OS messages -> cause
    ("connection refused", "connection refused"),
    ("connection reset", "connection reset"),
    ("name resolution", "DNS lookup failed"),
    ("name or service not known", "DNS lookup failed"),
    ("nodename nor servname", "DNS lookup failed"),
    ("dns resolution failed", "DNS lookup failed"),
    ("errors resolving", "DNS lookup failed"),  # gRPC's
    ("certificate verify failed", "TLS certificate not trusted"),
    ("[ssl", "TLS handshake failed"),
    ("sslerror", "TLS handshake failed"),
    ("handshake", "TLS handshake failed"),
    ("deadline_exceeded", "timeout"),
    ("deadline exceeded", "timeout"),
    ("timed out", "timeout"),
)


def _args(record: logging.LogRecord) -> tuple[object, ...]:
    return record.args if isinstance(record.args, tuple) else ()


def _exceptions(record: logging.LogRecord) -> Iterator[BaseException]:
    """The record's exceptions and those they wrap (`__cause__`, `__context__`, urllib3's
    `reason`, requests' first argument), a bounded walk."""
    todo = [a for a in _args(record) if isinstance(a, BaseException)]
    if record.exc_info and record.exc_info[1] is not None:
        todo.append(record.exc_info[1])
    seen: set[int] = set()
    while todo and len(seen) < 32:
        exc = todo.pop(0)
        if id(exc) in seen:
            continue
        seen.add(id(exc))
        yield exc
        more = [exc.__cause__, exc.__context__, getattr(exc, "reason", None), *exc.args]
        todo.extend(m for m in more if isinstance(m, BaseException))


def _exception_cause(exc: BaseException) -> str | None:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return "TLS certificate not trusted"
    if isinstance(exc, ssl.SSLError):
        return "TLS handshake failed"
    names = {cls.__name__ for cls in type(exc).__mro__}
    if isinstance(exc, socket.gaierror) or "NameResolutionError" in names:
        return "DNS lookup failed"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ConnectionResetError):
        return "connection reset"
    return None


def _is_timeout(exc: BaseException) -> bool:
    # By name too: urllib3's and requests' timeouts are not TimeoutError. Checked after every
    # other cause, since urllib3's NewConnectionError (refused, unreachable) is a ConnectTimeoutError.
    return isinstance(exc, TimeoutError) or any("Timeout" in cls.__name__ for cls in type(exc).__mro__)


def record_cause(record: logging.LogRecord) -> str | None:
    """The cause a record carries, in the vocabulary above; None when it carries none."""
    exceptions = list(_exceptions(record))
    for exc in exceptions:
        found = _exception_cause(exc)
        if found is not None:
            return found
    if any(_is_timeout(exc) for exc in exceptions):
        return "timeout"
    args = _args(record)
    texts = [str(a).lower() for a in args if isinstance(a, (str, BaseException))]
    for fragment, cause in _TEXT_CAUSES:
        if any(fragment in text for text in texts):
            return cause
    for a in args:
        if type(a) is int and 100 <= a <= 599:
            try:
                status = http.HTTPStatus(a)
            except ValueError:
                return f"HTTP {a}"
            return f"HTTP {status.value} {status.phrase}"
        name = getattr(a, "name", None)
        if type(a).__name__ == "StatusCode" and isinstance(name, str):  # gRPC's
            return f"gRPC {name}"
        if isinstance(a, str) and a.lower() in _PHRASES:  # the HTTP exporter's retry line has the reason only
            return _PHRASES[a.lower()]
    return None


def _signal(record: logging.LogRecord) -> str | None:
    fixed = LOGGERS.get(record.name)
    if fixed is not None:
        return fixed
    for a in _args(record):
        if isinstance(a, str) and a.lower() in _SIGNAL_WORDS:
            return _SIGNAL_WORDS[a.lower()]
    return None


class CollectorLog(logging.Filter):
    """Holds back the exporters' records about exporting and reports them through `log`."""

    def __init__(self, endpoints: Mapping[str, str], log: RateLimitedLog) -> None:
        super().__init__()
        self.endpoints = dict(endpoints)  # signal -> origin
        self.log = log
        self._last: dict[str, str] = {}  # signal -> the last cause seen

    def _where(self, signal: str | None) -> str:
        if signal is not None and signal in self.endpoints:
            return self.endpoints[signal]
        shown = sorted(set(self.endpoints.values()))
        return " and ".join(shown) if shown else "the collector"

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        template = str(record.msg)
        try:
            if template.startswith("Shutdown in progress"):
                return False  # at exit with the collector down: our own exit line says what was lost
            if template.startswith("Queue full"):
                self.log.warning(
                    f"the span queue is full: spans are dropped (the collector {self._where('traces')} "
                    "is not keeping up); requests are not affected"
                )
                return False
            if not (
                "Transient error" in template
                or template.startswith(("Failed to export", "Exception while exporting", "Retrying"))
            ):
                return True
            signal = _signal(record)
            cause = record_cause(record)
            if cause is None and template.startswith("Exception while exporting"):
                return True  # not a connection problem: an exporter's bug, whose traceback is wanted
            key = signal or ""
            if cause is None:
                cause = self._last.get(key, "gave up after retries" if "max retries" in template else "export failed")
            else:
                self._last[key] = cause
            self.log.warning(
                f"OTLP export to {self._where(signal)} failed: {cause}; requests are not affected, "
                "telemetry that cannot be sent is dropped"
            )
        except Exception:  # noqa: BLE001 - a filter that raises would lose the record's handling
            return True
        return False


class _Late(logging.Filter):
    """After the last flush at exit: a library exporter's thread that was given up on (a dead
    collector outlasts the bounded shutdown) may still log its retries; those records are
    dropped, as the exit line already said what was lost. On the library's loggers only (ours
    log nothing once shut down); stateless, so one serves every logger and start."""

    def filter(self, record: logging.LogRecord) -> bool:
        template = str(record.msg)
        return record.levelno < logging.WARNING or not (
            "Transient error" in template
            or template.startswith(("Shutdown in progress", "Failed to export", "Retrying", "Queue full"))
        )


_LATE = _Late()


def endpoints_from(env: Mapping[str, str]) -> dict[str, str]:
    """signal -> the origin of its OTLP endpoint, for the signals with one."""
    out = {}
    for signal in ("traces", "metrics"):
        target = otlp_target(env, signal)
        if target is not None:
            out[signal] = origin(target[1])
    return out


@contextlib.asynccontextmanager
async def collector_warnings(env: Mapping[str, str], logger: logging.Logger) -> AsyncIterator[None]:
    """While open, the exporters' records about exporting become rate-limited lines on `logger`
    (nothing is installed when `env` configures no OTLP endpoint)."""
    endpoints = endpoints_from(env)
    if not endpoints:
        yield
        return
    log = RateLimitedLog(logger)
    quiet = CollectorLog(endpoints, log)
    loggers = [logging.getLogger(name) for name in LOGGERS]
    for logger in loggers:
        logger.removeFilter(_LATE)  # a start before this one's, in this process: its turn is over
        logger.addFilter(quiet)
    try:
        async with flushing(log):
            yield
    finally:
        for logger in loggers:
            logger.removeFilter(quiet)
            if logger.name.startswith("opentelemetry."):
                logger.addFilter(_LATE)  # once per logger: the same object is never added twice
