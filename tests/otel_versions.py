"""What the installed OpenTelemetry packages do, where releases in pyproject.toml's range differ.

`make test-otel-range` runs the telemetry tests against the oldest and the newest release the
range allows; a test that compares our output with the library's reads these flags instead of
assuming the newest library's behaviour.
"""

from __future__ import annotations

import importlib.metadata


def release(distribution: str) -> tuple[int, ...]:
    """The installed release of `distribution` as numbers: (1, 45, 2)."""
    return tuple(int(p) for p in importlib.metadata.version(distribution).split(".")[:3] if p.isdigit())


# The OTLP encoder writes a scope's schema_url (ScopeSpans, ScopeMetrics) and attributes from 1.31 on.
ENCODER_WRITES_SCOPE_FIELDS = release("opentelemetry-exporter-otlp-proto-common") >= (1, 31)
# The OTLP encoder sends an attribute whose value is None as an empty value from 1.43 on (as ours
# does); before, it dropped the attribute (and logged the exception).
ENCODER_WRITES_NONE = release("opentelemetry-exporter-otlp-proto-common") >= (1, 43)
# The SDK's counters and histograms ignore NaN and infinities from 1.44 on (as ours do); before,
# it aggregated them.
SDK_REFUSES_NON_FINITE = release("opentelemetry-sdk") >= (1, 44)
