"""`taotrace sim`: a simulated OpenAI/Anthropic-compatible upstream with prefill/decode physics,
a prefix cache, continuous batching and a KV cache of fixed size per model.

See `catalogue` (models and constants), `physics` (the timing model), `kvcache`, `scheduler`,
`engine` (the clock), `tokens`, `request`, the writers (`openai_chat`, `openai_responses`,
`anthropic`) and `app` (routes and failure triggers).
"""

from __future__ import annotations

from proxy.sim.app import SIMULATOR, Simulator, create_app
from proxy.sim.catalogue import DEFAULT_CATALOGUE, ModelSpec
from proxy.sim.physics import Physics
from proxy.sim.server import SimRunning, build_app, run, running
from proxy.sim.settings import SimSettings

__all__ = [
    "DEFAULT_CATALOGUE",
    "SIMULATOR",
    "ModelSpec",
    "Physics",
    "SimRunning",
    "SimSettings",
    "Simulator",
    "build_app",
    "create_app",
    "run",
    "running",
]
