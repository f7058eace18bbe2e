"""taotrace: a transparent reverse proxy that times every LLM call's network, prefill and decode.

The public names are re-exported here; everything else is internal and may change. They load
lazily (PEP 562), so `import proxy.sse` or the CLI's `--help` does not pull in the server and
the OpenTelemetry SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "PhaseClock": "proxy.timing",
    "RequestInfo": "proxy.dialects",
    "RequestRecord": "proxy.record",
    "RequestTiming": "proxy.timing",
    "Running": "proxy.serve",
    "SSEDecoder": "proxy.sse",
    "SSEEvent": "proxy.sse",
    "Settings": "proxy.settings",
    "Usage": "proxy.dialects",
    "api_for_path": "proxy.dialects",
    "running": "proxy.serve",
}

__all__ = sorted([*_EXPORTS, "__version__"])

if TYPE_CHECKING:
    from proxy.dialects import RequestInfo as RequestInfo
    from proxy.dialects import Usage as Usage
    from proxy.dialects import api_for_path as api_for_path
    from proxy.record import RequestRecord as RequestRecord
    from proxy.serve import Running as Running
    from proxy.serve import running as running
    from proxy.settings import Settings as Settings
    from proxy.sse import SSEDecoder as SSEDecoder
    from proxy.sse import SSEEvent as SSEEvent
    from proxy.timing import PhaseClock as PhaseClock
    from proxy.timing import RequestTiming as RequestTiming


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'proxy' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return __all__
