"""One log line per finished request, built only from the record: no headers, no query, no text."""

from __future__ import annotations

import logging

from proxy.exchange.record import RequestRecord

__all__ = ["AccessLog", "access_line"]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}ms"


def access_line(rec: RequestRecord) -> str:
    t = rec.timing
    return (
        f"{rec.method} {rec.path} {rec.status_code} api={rec.api} model={rec.model or '-'} "
        f"error={rec.error_type or '-'} duration={_ms(t.duration)} network={_ms(t.network)} "
        f"ttft={_ms(t.ttft)} tpot={_ms(t.tpot)} out_tokens={rec.usage.output_tokens if rec.usage.output_tokens is not None else '-'} "
        f"trace_id={rec.trace_id or '-'}"
    )


class AccessLog:
    """An observer for `running(on_record=...)` that logs each request at INFO."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def __call__(self, rec: RequestRecord) -> None:
        self.logger.info("%s", access_line(rec))
