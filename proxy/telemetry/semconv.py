"""Which GenAI semantic-convention names to emit: the released ones, the latest experimental
ones, or both, as `OTEL_SEMCONV_STABILITY_OPT_IN` asks.

The GenAI conventions left the core repository (core v1.42 deprecated every `gen_ai.*` name);
their first standalone release, semantic-conventions-genai v0.1.0, keeps the v1.41 span and
metric names. Names still being reworked upstream (the client metrics under
`gen_ai.client.inference.*`, token usage as a counter) are emitted only when asked for:

    OTEL_SEMCONV_STABILITY_OPT_IN     emitted
    (unset, or other values)          released names (v1.41 / genai v0.1.0)
    gen_ai_latest_experimental        latest experimental names only
    gen_ai_latest_experimental/dup    both, during a migration

Pure: the caller hands the environment in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "ENV",
    "SCHEMA_URL_LATEST",
    "SCHEMA_URL_RELEASED",
    "Conventions",
    "MetricNames",
]

ENV = "OTEL_SEMCONV_STABILITY_OPT_IN"
LATEST = "gen_ai_latest_experimental"
DUP = "gen_ai_latest_experimental/dup"

# A release of the GenAI conventions publishes its schema as /schemas/gen-ai/<version>.
SCHEMA_URL_RELEASED = "https://opentelemetry.io/schemas/gen-ai/0.1.0"
# What the conventions' development branch declares for its unreleased names.
SCHEMA_URL_LATEST = "https://opentelemetry.io/schemas/gen-ai-dev/1.42.0-dev"


@dataclass(frozen=True, slots=True)
class MetricNames:
    """The client metrics of one convention version; `tokens_counter`: token usage is a counter
    (latest) rather than a histogram (released)."""

    schema_url: str
    duration: str
    time_to_first_chunk: str
    time_per_output_chunk: str
    tokens: str
    tokens_counter: bool


RELEASED_METRICS = MetricNames(
    schema_url=SCHEMA_URL_RELEASED,
    duration="gen_ai.client.operation.duration",
    time_to_first_chunk="gen_ai.client.operation.time_to_first_chunk",
    time_per_output_chunk="gen_ai.client.operation.time_per_output_chunk",
    tokens="gen_ai.client.token.usage",
    tokens_counter=False,
)
LATEST_METRICS = MetricNames(
    schema_url=SCHEMA_URL_LATEST,
    duration="gen_ai.client.inference.duration",
    time_to_first_chunk="gen_ai.client.inference.time_to_first_chunk",
    time_per_output_chunk="gen_ai.client.inference.time_per_output_chunk",
    tokens="gen_ai.client.inference.tokens",
    tokens_counter=True,
)


@dataclass(frozen=True, slots=True)
class Conventions:
    """The convention versions to emit: `released`, `latest`, or both (never neither)."""

    released: bool = True
    latest: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Conventions:
        """From `OTEL_SEMCONV_STABILITY_OPT_IN`, a comma-separated list; values for other
        domains (`http`, `database/dup`, ...) are theirs and ignored here."""
        values = {v.strip() for v in env.get(ENV, "").split(",")}
        if DUP in values:
            return cls(released=True, latest=True)
        if LATEST in values:
            return cls(released=False, latest=True)
        return cls()

    @property
    def schema_url(self) -> str:
        """The span scope's schema: the released one unless only the latest names are emitted."""
        return SCHEMA_URL_RELEASED if self.released else SCHEMA_URL_LATEST

    @property
    def metrics(self) -> tuple[MetricNames, ...]:
        """The client metric sets to record, released first."""
        return (RELEASED_METRICS,) * self.released + (LATEST_METRICS,) * self.latest
