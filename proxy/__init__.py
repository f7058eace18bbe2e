"""taotrace: a transparent reverse proxy that times every LLM call's network, prefill and decode.

The public names are re-exported here; everything else is internal and may change. They load
lazily (PEP 562), so `import proxy.dialects.sse` or the CLI's `--help` does not pull in the server and
the OpenTelemetry SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "PhaseClock": "proxy.exchange.timing",
    "RequestInfo": "proxy.dialects",
    "RequestRecord": "proxy.exchange.record",
    "RequestTiming": "proxy.exchange.timing",
    "Running": "proxy.serve",
    "SSEDecoder": "proxy.dialects.sse",
    "SSEEvent": "proxy.dialects.sse",
    "Settings": "proxy.config.settings",
    "Usage": "proxy.dialects",
    "api_for_path": "proxy.dialects",
    "running": "proxy.serve",
}

__all__ = sorted([*_EXPORTS, "__version__"])

if TYPE_CHECKING:
    from proxy.config.settings import Settings as Settings
    from proxy.dialects import RequestInfo as RequestInfo
    from proxy.dialects import Usage as Usage
    from proxy.dialects import api_for_path as api_for_path
    from proxy.dialects.sse import SSEDecoder as SSEDecoder
    from proxy.dialects.sse import SSEEvent as SSEEvent
    from proxy.exchange.record import RequestRecord as RequestRecord
    from proxy.exchange.timing import PhaseClock as PhaseClock
    from proxy.exchange.timing import RequestTiming as RequestTiming
    from proxy.serve import Running as Running
    from proxy.serve import running as running


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'proxy' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return __all__
