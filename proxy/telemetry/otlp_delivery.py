"""One encoded OTLP export request delivered as the spec asks: sent, and retried while retryable.

The span exporter (`span_exporter.py`) hands it its encoded bodies. An export is retried while the spec calls
the failure retryable (HTTP 429/502/503/504, a lost connection, gRPC UNAVAILABLE and kin), waiting
what the collector's `Retry-After` asks on 429/503, else an exponential back-off with jitter, and
never past the export's timeout (`OTEL_EXPORTER_OTLP_TIMEOUT`). A body that cannot be sent is the
caller's to count; the failure is logged as one WARNING record naming the signal, which
`collector_log.CollectorLog` turns into our rate-limited line.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from proxy.telemetry.otlp_env import ExportSettings, shown_endpoint
from proxy.telemetry.otlp_transport import Sent, Transport, transport_for

__all__ = ["Delivery", "backoff"]

_logger = logging.getLogger(__name__)  # collector_log.LOGGERS lists it
_NOUNS = {"traces": "spans", "metrics": "metrics"}  # what the log lines call each signal's data


def backoff(attempt: int, jitter: float) -> float:
    """Seconds before retry `attempt` (0, 1, ...): 1, 2, 4 ... capped at 32, times `jitter` in [0.8, 1.2)."""
    return float(min(1 << min(attempt, 5), 32)) * jitter


class Delivery:
    """Sends bodies of one signal ("traces" or "metrics") to `settings.endpoint`, one at a time."""

    def __init__(
        self,
        settings: ExportSettings,
        signal: str,
        transport: Transport | None = None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = lambda: random.uniform(0.8, 1.2),
    ) -> None:
        self.settings = settings
        self.signal = signal
        self._transport = transport if transport is not None else transport_for(settings, signal, time.time)
        self._monotonic = monotonic
        self._jitter = jitter
        self._stopped = threading.Event()  # set by shutdown: ends a back-off wait at once
        self._where = shown_endpoint(settings.endpoint)
        self._noun = _NOUNS.get(signal, signal)

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def send(self, body: bytes, timeout: float | None = None) -> bool:
        """True once the collector took `body`; False when it failed for good (logged once).

        Retries end by the settings' timeout, or `timeout` seconds when that is shorter.
        """
        limit = self.settings.timeout if timeout is None else min(timeout, self.settings.timeout)
        deadline = self._monotonic() + limit
        attempt = 0
        while True:
            remaining = deadline - self._monotonic()
            sent = self._transport.send(body, max(remaining, 0.001))
            if sent.ok:
                return True
            delay = backoff(attempt, self._jitter())
            if sent.retry_after is not None:  # the collector's wait, but never less than ours (`Retry-After: 0`)
                delay = max(sent.retry_after, delay)
            if not sent.retryable or self._stopped.is_set() or self._monotonic() + delay >= deadline:
                self._failed(sent)
                return False
            _logger.debug("Retrying the %s export to %s in %.2fs", self._noun, self._where, delay)
            if self._stopped.wait(delay):
                self._failed(sent)
                return False
            attempt += 1

    def _failed(self, sent: Sent) -> None:
        # The noun, status and exception go in the arguments: CollectorLog reads the signal and
        # the cause from them. After `shutdown` the failure is the exit's own (its line says what
        # was lost), and the last export can end after CollectorLog is gone: DEBUG, or a raw
        # line with the exception's repr would reach stderr.
        level = logging.DEBUG if self._stopped.is_set() else logging.WARNING
        _logger.log(level, "Failed to export %s to %s: %s %s", self._noun, self._where, sent.status, sent.error)

    def shutdown(self) -> None:
        """Ends a back-off wait at once; later sends fail after one attempt at most."""
        self._stopped.set()
        self._transport.close()
