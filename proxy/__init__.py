"""taotrace: a transparent reverse proxy that times every LLM call's network, prefill and decode.

The public names are re-exported here; everything else is internal and may change.
"""

from __future__ import annotations

__version__ = "0.1.0"

from proxy.dialects import RequestInfo, Usage, api_for_path
from proxy.serve import Running, running
from proxy.settings import Settings
from proxy.sse import SSEDecoder, SSEEvent
from proxy.timing import PhaseClock, RequestRecord, RequestTiming

__all__ = [
    "PhaseClock",
    "RequestInfo",
    "RequestRecord",
    "RequestTiming",
    "Running",
    "SSEDecoder",
    "SSEEvent",
    "Settings",
    "Usage",
    "__version__",
    "api_for_path",
    "running",
]
