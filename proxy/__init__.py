"""taotrace: a transparent reverse proxy that times every LLM call's network, prefill and decode."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
