"""Every `OTEL_*` variable of the environment, judged once at start: honoured, refused or warned
about, never silently ignored (pure, but for `installed_names`).

`check(env, installed)` returns a `Finding` for each variable taotrace cannot honour as set:

    refused   a value taotrace cannot honour (an unknown exporter, `http/json`, a number that
              is not one): the command says it in one line and exits 2
    warned    honoured by OpenTelemetry in general but not by taotrace (`OTEL_LOGS_EXPORTER`,
              `OTEL_BLRP_*`, ...), set but unused (OTLP settings with no OTLP exporter listed),
              or not an OpenTelemetry variable at all (with the closest known name)

Every other variable is honoured: `KNOWN` is the table (docs/settings.md shows it). Values are
quoted only where they are a choice from a list, cut short; never a header's, a resource's or an
unknown variable's (they may hold a key).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points

from proxy.telemetry.otlp_env import COMPRESSIONS, OWN_OTLP, PROTOCOLS, exporter_names, sdk_disabled

__all__ = ["KNOWN", "PREFIXES", "Finding", "Installed", "check", "installed_names"]

# Entry point group -> the names installed in it (`installed_names`, or a test's).
Installed = Callable[[str], Collection[str]]

TRACES_EXPORTERS = "opentelemetry_traces_exporter"
METRICS_EXPORTERS = "opentelemetry_metrics_exporter"
PROPAGATORS = "opentelemetry_propagator"
SAMPLERS = "opentelemetry_traces_sampler"
DETECTORS = "opentelemetry_resource_detector"
BUILTIN_SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
RATIO_SAMPLERS = ("traceidratio", "parentbased_traceidratio")
CLOSENESS = 0.75  # difflib's ratio for "did you mean" (names share `OTEL_`, so higher than TAOTRACE_*'s)
NO_LOGS = "taotrace sends no logs through OpenTelemetry (its log lines go to stderr)"


@dataclass(frozen=True)
class Finding:
    """One variable taotrace cannot honour as set: `refused` stops the start, else one warning."""

    variable: str
    refused: bool
    message: str


@dataclass(frozen=True)
class _Env:
    env: Mapping[str, str]
    installed: Installed


# A rule reads one variable's value (and, for some, the others') and says what is wrong, if anything.
Rule = Callable[[_Env, str, str], "Finding | None"]


def installed_names(group: str) -> frozenset[str]:
    """The names registered under an entry point group by the installed packages (as the SDK finds them)."""
    return frozenset(ep.name for ep in entry_points(group=group))


def _shown(value: str) -> str:
    text = value.strip()
    return text if len(text) <= 40 else text[:40] + "..."


def _refuse(name: str, message: str) -> Finding:
    return Finding(name, True, message)


def _warn(name: str, message: str) -> Finding:
    return Finding(name, False, message)


def _ok(ctx: _Env, name: str, value: str) -> Finding | None:
    return None


def _not_ours(why: str) -> Rule:
    """Honoured by OpenTelemetry in general, not by taotrace: one warning saying why."""

    def rule(ctx: _Env, name: str, value: str) -> Finding | None:
        return _warn(name, f"{name} is not honoured: {why}")

    return rule


def _integer(minimum: int) -> Rule:
    def rule(ctx: _Env, name: str, value: str) -> Finding | None:
        text = value.strip()
        if text and not (text.isdigit() and int(text) >= minimum):
            kind = "a positive integer" if minimum > 0 else "a non-negative integer"
            return _refuse(name, f"{name}={_shown(text)!r} is not {kind}")
        return None

    return rule


def _seconds(ctx: _Env, name: str, value: str) -> Finding | None:
    text = value.strip()
    try:
        good = not text or (math.isfinite(float(text)) and float(text) > 0)
    except ValueError:
        good = False
    return None if good else _refuse(name, f"{name}={_shown(text)!r} is not a positive number of seconds")


def _boolean(ctx: _Env, name: str, value: str) -> Finding | None:
    if value.strip().lower() in ("", "true", "false"):
        return None
    return _warn(name, f"{name}={_shown(value)!r} is neither true nor false, and is read as false")


def _choice(choices: tuple[str, ...]) -> Rule:
    def rule(ctx: _Env, name: str, value: str) -> Finding | None:
        text = value.strip().lower()
        if text and text not in choices:
            return _refuse(name, f"{name}={_shown(value)!r} is not one of {', '.join(choices)}")
        return None

    return rule


def _protocol(ctx: _Env, name: str, value: str) -> Finding | None:
    text = value.strip().lower()
    if text == "http/json":
        return _refuse(
            name,
            f"{name}=http/json is not supported (nor by OpenTelemetry's Python exporters): use {' or '.join(PROTOCOLS)}",
        )
    if text and text not in PROTOCOLS:
        return _refuse(
            name, f"{name}={_shown(value)!r} is not an OTLP protocol taotrace sends: use {' or '.join(PROTOCOLS)}"
        )
    return None


def _protocol_of(env: Mapping[str, str], signal: str) -> str:
    upper = signal.upper()
    chosen = (
        env.get(f"OTEL_EXPORTER_OTLP_{upper}_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    )
    return chosen.strip().lower()


def _endpoint(ctx: _Env, name: str, value: str) -> Finding | None:
    """A URL with http:// or https:// and a host; gRPC also takes a bare `host:port`. Never quoted
    (an endpoint may carry a password or a token)."""
    text = value.strip()
    if not text:
        return None
    signals = [s for s in ("traces", "metrics") if f"_{s.upper()}_" in name] or ["traces", "metrics"]
    if "://" in text:
        scheme, _, rest = text.partition("://")
        host = rest.split("/", 1)[0].rsplit("@", 1)[-1]
        if scheme.lower() in ("http", "https") and host and not host.startswith(":"):
            return None
        return _refuse(name, f"{name} is not a URL with http:// or https:// and a host")
    if all(_protocol_of(ctx.env, s) == "grpc" for s in signals):
        return None  # gRPC's bare host:port
    return _refuse(name, f"{name} needs http:// or https:// (it is sent over OTLP http/protobuf)")


def _exporters(variable: str, group: str, default: str, hint: Mapping[str, str]) -> Rule:
    """A comma list of exporters: `otlp` (ours), `console`, `none`, or an installed entry point's name."""

    def rule(ctx: _Env, name: str, value: str) -> Finding | None:
        try:
            names = exporter_names({variable: value}, variable, default)
        except ValueError as error:
            return _refuse(name, str(error))
        for exporter in names:
            if exporter in OWN_OTLP or exporter == "console" or exporter in ctx.installed(group):
                continue
            extra = f" ({hint[exporter]})" if exporter in hint else ""
            return _refuse(
                name,
                f"{name} names {_shown(exporter)!r}, which no installed package provides (an entry point in "
                f"{group}): install its exporter, or leave it out{extra}",
            )
        return None

    return rule


def _logs_exporter(ctx: _Env, name: str, value: str) -> Finding | None:
    if {v.strip().lower() for v in value.split(",")} <= {"", "none"}:
        return None
    return _warn(name, f"{name} is not honoured: {NO_LOGS}")


def _propagators(ctx: _Env, name: str, value: str) -> Finding | None:
    for propagator in (p.strip() for p in value.split(",")):
        if propagator and propagator != "none" and propagator not in ctx.installed(PROPAGATORS):
            return _refuse(
                name,
                f"{name} names {_shown(propagator)!r}, which no installed package provides (an entry point "
                f"in {PROPAGATORS}): install it (e.g. opentelemetry-propagator-b3), or leave it out",
            )
    return None


def _sampler(ctx: _Env, name: str, value: str) -> Finding | None:
    raw = value.strip()
    if not raw or raw.lower() in BUILTIN_SAMPLERS or raw in ctx.installed(SAMPLERS):
        return None
    return _refuse(
        name,
        f"{name}={_shown(raw)!r} is neither a built-in sampler ({', '.join(BUILTIN_SAMPLERS)}) nor an installed "
        f"plug-in (an entry point in {SAMPLERS})",
    )


def _sampler_arg(ctx: _Env, name: str, value: str) -> Finding | None:
    sampler = ctx.env.get("OTEL_TRACES_SAMPLER", "").strip()
    if sampler.lower() in RATIO_SAMPLERS:
        try:
            ratio = float(value) if value.strip() else 1.0
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            return _refuse(name, f"{name}={_shown(value)!r} is not a ratio between 0 and 1")
        return None
    if sampler.lower() in BUILTIN_SAMPLERS or not sampler:
        shown = sampler.lower() or "parentbased_always_on (the default)"
        return _warn(name, f"{name} is not used: OTEL_TRACES_SAMPLER={shown} takes no argument")
    return None  # a plug-in's: its factory receives it


def _detectors(ctx: _Env, name: str, value: str) -> Finding | None:
    for detector in (d.strip() for d in value.split(",")):
        if detector and detector != "*" and detector not in ctx.installed(DETECTORS):
            return _refuse(
                name,
                f"{name} names {_shown(detector)!r}, which no installed package provides (an entry point in "
                f"{DETECTORS}; the SDK has otel, process, os, host)",
            )
    return None


def _link_limit(ctx: _Env, name: str, value: str) -> Finding | None:
    bad = _integer(0)(ctx, name, value)
    if bad is not None or value.strip() != "0":
        return bad
    return _warn(name, f"{name}=0 is not applied: a span keeps its one link (--parent link, --mirror)")


def _histogram(ctx: _Env, name: str, value: str) -> Finding | None:
    text = value.strip().lower()
    if text in ("", "explicit_bucket_histogram"):
        return None
    if text == "base2_exponential_bucket_histogram":
        return _warn(
            name, f"{name} is not honoured: taotrace aggregates explicit buckets only (the GenAI conventions' own)"
        )
    return _refuse(
        name, f"{name}={_shown(value)!r} is not explicit_bucket_histogram or base2_exponential_bucket_histogram"
    )


def _semconv(ctx: _Env, name: str, value: str) -> Finding | None:
    ours = ("gen_ai_latest_experimental", "gen_ai_latest_experimental/dup", "http")
    other = [v.strip() for v in value.split(",") if v.strip() and v.strip() not in ours]
    if not other:
        return None
    return _warn(
        name,
        f"{name}: {', '.join(_shown(v) for v in other)} not honoured: taotrace emits the stable HTTP names and the "
        "GenAI ones (gen_ai_latest_experimental, gen_ai_latest_experimental/dup) only",
    )


def _otlp(field: str) -> Rule:
    return {
        "ENDPOINT": _endpoint,
        "PROTOCOL": _protocol,
        "COMPRESSION": _choice(COMPRESSIONS),
        "TIMEOUT": _seconds,
        "INSECURE": _boolean,
    }.get(field, _ok)


_OTLP_FIELDS = (
    "ENDPOINT",
    "HEADERS",
    "PROTOCOL",
    "COMPRESSION",
    "TIMEOUT",
    "CERTIFICATE",
    "CLIENT_KEY",
    "CLIENT_CERTIFICATE",
    "INSECURE",
)

# The variables taotrace knows, each with its rule (`_ok`: honoured, nothing to check).
KNOWN: dict[str, Rule] = {
    "OTEL_SDK_DISABLED": _boolean,
    "OTEL_SERVICE_NAME": _ok,
    "OTEL_RESOURCE_ATTRIBUTES": _ok,  # the SDK warns about a pair without `=` itself
    "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS": _detectors,
    "OTEL_TRACES_EXPORTER": _exporters("OTEL_TRACES_EXPORTER", TRACES_EXPORTERS, "otlp", {}),
    "OTEL_METRICS_EXPORTER": _exporters(
        "OTEL_METRICS_EXPORTER",
        METRICS_EXPORTERS,
        "none",
        {"prometheus": "taotrace serves Prometheus metrics itself, on /metrics"},
    ),
    "OTEL_LOGS_EXPORTER": _logs_exporter,
    "OTEL_PROPAGATORS": _propagators,
    "OTEL_TRACES_SAMPLER": _sampler,
    "OTEL_TRACES_SAMPLER_ARG": _sampler_arg,
    **{
        f"OTEL_BSP_{n}": _integer(1)
        for n in ("SCHEDULE_DELAY", "EXPORT_TIMEOUT", "MAX_QUEUE_SIZE", "MAX_EXPORT_BATCH_SIZE")
    },
    **{
        f"OTEL_{n}": _integer(0)
        for n in (
            "ATTRIBUTE_COUNT_LIMIT",
            "ATTRIBUTE_VALUE_LENGTH_LIMIT",
            "SPAN_ATTRIBUTE_COUNT_LIMIT",
            "SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT",
            "SPAN_EVENT_COUNT_LIMIT",  # honoured: the proxy's spans carry no events
            "EVENT_ATTRIBUTE_COUNT_LIMIT",
            "LINK_ATTRIBUTE_COUNT_LIMIT",  # honoured: its links carry no attributes
        )
    },
    "OTEL_SPAN_LINK_COUNT_LIMIT": _link_limit,
    **{f"OTEL_EXPORTER_OTLP_{s}{f}": _otlp(f) for s in ("", "TRACES_", "METRICS_") for f in _OTLP_FIELDS},
    "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": _choice(("cumulative", "delta", "lowmemory")),
    "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION": _histogram,
    "OTEL_METRIC_EXPORT_INTERVAL": _integer(1),
    "OTEL_METRIC_EXPORT_TIMEOUT": _integer(1),
    "OTEL_METRICS_EXEMPLAR_FILTER": _not_ours(
        "OTLP metrics carry no exemplars; /metrics links its buckets to sampled traces whatever it says"
    ),
    "OTEL_SEMCONV_STABILITY_OPT_IN": _semconv,
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": _not_ours(
        "prompts and completions are recorded with --capture-content (TAOTRACE_CAPTURE_CONTENT) only"
    ),
    "OTEL_LOG_LEVEL": _not_ours("taotrace's log level is --log-level (TAOTRACE_LOG_LEVEL)"),
    "OTEL_PYTHON_CONTEXT": _ok,  # read by the OpenTelemetry API itself
    "OTEL_PYTHON_ID_GENERATOR": _not_ours("taotrace makes its own random trace and span ids"),
    "OTEL_CONFIG_FILE": _not_ours("taotrace reads the OTEL_* variables, not a configuration file"),
    "OTEL_EXPERIMENTAL_CONFIG_FILE": _not_ours("taotrace reads the OTEL_* variables, not a configuration file"),
    **{f"OTEL_LOGRECORD_{n}": _not_ours(NO_LOGS) for n in ("ATTRIBUTE_COUNT_LIMIT", "ATTRIBUTE_VALUE_LENGTH_LIMIT")},
}

# Families known by their prefix, checked after `KNOWN`: each a warning, except an exporter's
# own settings (`OTEL_EXPORTER_ZIPKIN_*`), honoured by that exporter when it is listed.
PREFIXES: dict[str, str] = {
    "OTEL_BLRP_": NO_LOGS,
    "OTEL_EXPORTER_OTLP_LOGS_": NO_LOGS,
    "OTEL_PYTHON_": "it sets up OpenTelemetry's Python SDK or auto-instrumentation, which taotrace does not run",
    "OTEL_INSTRUMENTATION_": "it configures OpenTelemetry instrumentations; taotrace is not one",
    "OTEL_EXPORTER_": "",  # an exporter's own (below)
}


def _exporter_setting(ctx: _Env, name: str) -> Finding | None:
    """`OTEL_EXPORTER_<X>_*`: read by the exporter named x (zipkin, prometheus, ...) when a list names it."""
    family = name[len("OTEL_EXPORTER_") :].split("_", 1)[0].lower()
    listed: list[str] = []
    for variable, default in (("OTEL_TRACES_EXPORTER", "otlp"), ("OTEL_METRICS_EXPORTER", "none")):
        try:
            listed += exporter_names(ctx.env, variable, default)
        except ValueError:
            pass  # refused by its own rule
    if any(n.lower().startswith(family) for n in listed):
        return None
    return _warn(name, f"{name} is not used: neither OTEL_TRACES_EXPORTER nor OTEL_METRICS_EXPORTER lists {family}")


def _unused_otlp(ctx: _Env, name: str) -> Finding | None:
    """An OTLP setting no OTLP exporter reads: metrics go over OTLP only when asked (taotrace's
    default is none, the specification's otlp), spans not when OTEL_TRACES_EXPORTER leaves otlp out."""
    uses = {}
    for signal, variable, default in (
        ("traces", "OTEL_TRACES_EXPORTER", "otlp"),
        ("metrics", "OTEL_METRICS_EXPORTER", "none"),
    ):
        try:
            uses[signal] = any(n in OWN_OTLP for n in exporter_names(ctx.env, variable, default))
        except ValueError:
            uses[signal] = True  # refused by its own rule: say nothing more
    for signal, variable in (("traces", "OTEL_TRACES_EXPORTER"), ("metrics", "OTEL_METRICS_EXPORTER")):
        if name.startswith(f"OTEL_EXPORTER_OTLP_{signal.upper()}_") and not uses[signal]:
            return _warn(name, f"{name} is not used: {variable} does not list otlp")
    if name[len("OTEL_EXPORTER_OTLP_") :] in _OTLP_FIELDS and not (uses["traces"] or uses["metrics"]):
        return _warn(name, f"{name} is not used: neither OTEL_TRACES_EXPORTER nor OTEL_METRICS_EXPORTER lists otlp")
    return None


def check(env: Mapping[str, str], installed: Installed) -> list[Finding]:
    """A finding for each `OTEL_*` variable of `env` taotrace cannot honour as set, by name."""
    ctx = _Env(env, installed)
    disabled = sdk_disabled(env)
    found: list[Finding] = []
    for name in sorted(n for n in env if n.startswith("OTEL_")):
        value = env[name]
        rule = KNOWN.get(name)
        finding: Finding | None
        if rule is not None:
            finding = rule(ctx, name, value)
            if finding is None and not disabled and name.startswith("OTEL_EXPORTER_OTLP_"):
                finding = _unused_otlp(ctx, name)
        else:
            prefix = next((p for p in PREFIXES if name.startswith(p)), None)
            if prefix == "OTEL_EXPORTER_" and name.startswith("OTEL_EXPORTER_OTLP_"):
                prefix = None  # every OTLP name is in KNOWN: this one is misspelled
            if prefix == "OTEL_EXPORTER_":
                finding = _exporter_setting(ctx, name)
            elif prefix is not None:
                finding = _warn(name, f"{name} is not honoured: {PREFIXES[prefix]}")
            else:
                close = difflib.get_close_matches(name, list(KNOWN), n=1, cutoff=CLOSENESS)
                guess = f"; did you mean {close[0]}?" if close else ""
                finding = _warn(name, f"{name} is not an OpenTelemetry variable taotrace knows, and is ignored{guess}")
        if finding is not None:
            found.append(finding)
    return found
