"""Every OTEL_* variable is honoured, refused or warned about at start (proxy/telemetry/otel_variables.py)."""

from __future__ import annotations

from collections.abc import Collection

import pytest

from proxy.telemetry.otel_variables import KNOWN, PREFIXES, Finding, check, installed_names

# What a machine with the SDK, the OTLP exporter and one zipkin exporter installed registers.
INSTALLED: dict[str, frozenset[str]] = {
    "opentelemetry_traces_exporter": frozenset({"console", "otlp", "otlp_proto_grpc", "otlp_proto_http", "zipkin"}),
    "opentelemetry_metrics_exporter": frozenset({"console", "otlp", "otlp_proto_grpc", "otlp_proto_http"}),
    "opentelemetry_propagator": frozenset({"tracecontext", "baggage"}),
    "opentelemetry_traces_sampler": frozenset({"always_on", "my_sampler"}),
    "opentelemetry_resource_detector": frozenset({"otel", "process", "os", "host", "service_instance"}),
}


def installed(group: str) -> Collection[str]:
    return INSTALLED.get(group, frozenset())


def found(env: dict[str, str]) -> list[tuple[str, bool, str]]:
    return [(f.variable, f.refused, f.message) for f in check(env, installed)]


# Honoured as set: no finding at all.
HONOURED = [
    {},
    {"PATH": "/bin", "TAOTRACE_PORT": "1"},  # not OpenTelemetry's
    {"OTEL_SDK_DISABLED": "true"},
    {"OTEL_SDK_DISABLED": "False"},
    {"OTEL_SERVICE_NAME": "llm-proxy", "OTEL_RESOURCE_ATTRIBUTES": "a=b,c=d%20e"},
    {"OTEL_EXPERIMENTAL_RESOURCE_DETECTORS": "process, os,host"},
    {"OTEL_EXPERIMENTAL_RESOURCE_DETECTORS": "*"},
    {"OTEL_TRACES_EXPORTER": "otlp,console,zipkin", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
    {"OTEL_TRACES_EXPORTER": "OTLP"},
    {"OTEL_TRACES_EXPORTER": "none"},
    {"OTEL_TRACES_EXPORTER": "otlp_proto_http", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c/v1/traces"},
    {"OTEL_METRICS_EXPORTER": "otlp,console", "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "Delta"},
    {
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION": "explicit_bucket_histogram",
    },
    {"OTEL_METRIC_EXPORT_INTERVAL": "15000", "OTEL_METRIC_EXPORT_TIMEOUT": "5000"},
    {"OTEL_LOGS_EXPORTER": "none"},
    {"OTEL_PROPAGATORS": "tracecontext,baggage"},
    {"OTEL_PROPAGATORS": "none"},
    {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"},
    {"OTEL_TRACES_SAMPLER": "my_sampler", "OTEL_TRACES_SAMPLER_ARG": "anything: the plug-in's"},
    {"OTEL_TRACES_SAMPLER": "ALWAYS_OFF"},
    {"OTEL_BSP_SCHEDULE_DELAY": "500", "OTEL_BSP_MAX_QUEUE_SIZE": "4096", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "256"},
    {"OTEL_BSP_EXPORT_TIMEOUT": "1000"},
    {
        "OTEL_ATTRIBUTE_COUNT_LIMIT": "0",
        "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "256",
        "OTEL_SPAN_EVENT_COUNT_LIMIT": "0",
    },
    {"OTEL_SPAN_LINK_COUNT_LIMIT": "128", "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT": "0"},
    {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20k",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2.5",
        "OTEL_EXPORTER_OTLP_COMPRESSION": "deflate",
        "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "none",
        "OTEL_EXPORTER_OTLP_CERTIFICATE": "/etc/ca.pem",
        "OTEL_EXPORTER_OTLP_CLIENT_KEY": "/etc/k.pem",
        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": "/etc/c.pem",
    },
    {"OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental/dup,http"},
    {"OTEL_PYTHON_CONTEXT": "contextvars_context"},
    {"OTEL_TRACES_EXPORTER": "zipkin", "OTEL_EXPORTER_ZIPKIN_ENDPOINT": "http://z:9411/api/v2/spans"},
]


@pytest.mark.parametrize("env", HONOURED)
def test_honoured_as_set(env: dict[str, str]) -> None:
    assert found(env) == []


REFUSED = [
    (
        {"OTEL_TRACES_EXPORTER": "otlp,jaeger"},
        "OTEL_TRACES_EXPORTER names 'jaeger', which no installed package provides (an entry point in "
        "opentelemetry_traces_exporter): install its exporter, or leave it out",
    ),
    (
        {"OTEL_TRACES_EXPORTER": "none,console"},
        "OTEL_TRACES_EXPORTER lists none with other exporters: name the exporters, or none alone",
    ),
    (
        {"OTEL_METRICS_EXPORTER": "prometheus"},
        "OTEL_METRICS_EXPORTER names 'prometheus', which no installed package provides (an entry point in "
        "opentelemetry_metrics_exporter): install its exporter, or leave it out (taotrace serves Prometheus "
        "metrics itself, on /metrics)",
    ),
    (
        {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
        "OTEL_EXPORTER_OTLP_PROTOCOL=http/json is not supported (nor by OpenTelemetry's Python exporters): use grpc or http/protobuf",
    ),
    (
        {"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "HTTP/JSON", "OTEL_METRICS_EXPORTER": "otlp"},
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL=http/json is not supported (nor by OpenTelemetry's Python exporters): use grpc or http/protobuf",
    ),
    (
        {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "udp"},
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='udp' is not an OTLP protocol taotrace sends: use grpc or http/protobuf",
    ),
    ({"OTEL_EXPORTER_OTLP_COMPRESSION": "br"}, "OTEL_EXPORTER_OTLP_COMPRESSION='br' is not one of gzip, deflate, none"),
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "10s"}, "OTEL_EXPORTER_OTLP_TIMEOUT='10s' is not a positive number of seconds"),
    (
        {"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "inf"},
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT='inf' is not a positive number of seconds",
    ),
    (
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"},
        "OTEL_EXPORTER_OTLP_ENDPOINT needs http:// or https:// (it is sent over OTLP http/protobuf)",
    ),
    (
        {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ftp://u:secret@c:21"},
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is not a URL with http:// or https:// and a host",
    ),
    ({"OTEL_BSP_SCHEDULE_DELAY": "5s"}, "OTEL_BSP_SCHEDULE_DELAY='5s' is not a positive integer"),
    ({"OTEL_BSP_MAX_QUEUE_SIZE": "0"}, "OTEL_BSP_MAX_QUEUE_SIZE='0' is not a positive integer"),
    ({"OTEL_METRIC_EXPORT_INTERVAL": "1e3"}, "OTEL_METRIC_EXPORT_INTERVAL='1e3' is not a positive integer"),
    ({"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "-1"}, "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT='-1' is not a non-negative integer"),
    (
        {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "25%"},
        "OTEL_TRACES_SAMPLER_ARG='25%' is not a ratio between 0 and 1",
    ),
    (
        {"OTEL_TRACES_SAMPLER": "sometimes"},
        "OTEL_TRACES_SAMPLER='sometimes' is neither a built-in sampler (always_on, always_off, traceidratio, "
        "parentbased_always_on, parentbased_always_off, parentbased_traceidratio) nor an installed plug-in (an "
        "entry point in opentelemetry_traces_sampler)",
    ),
    (
        {"OTEL_PROPAGATORS": "tracecontext,b3"},
        "OTEL_PROPAGATORS names 'b3', which no installed package provides (an entry point in "
        "opentelemetry_propagator): install it (e.g. opentelemetry-propagator-b3), or leave it out",
    ),
    (
        {"OTEL_EXPERIMENTAL_RESOURCE_DETECTORS": "process,gcp"},
        "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS names 'gcp', which no installed package provides (an entry point "
        "in opentelemetry_resource_detector; the SDK has otel, process, os, host)",
    ),
    (
        {"OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "sometimes", "OTEL_METRICS_EXPORTER": "otlp"},
        "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE='sometimes' is not one of cumulative, delta, lowmemory",
    ),
    (
        {"OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION": "linear", "OTEL_METRICS_EXPORTER": "otlp"},
        "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION='linear' is not explicit_bucket_histogram or "
        "base2_exponential_bucket_histogram",
    ),
]


@pytest.mark.parametrize("env,said", REFUSED)
def test_refused_in_one_line(env: dict[str, str], said: str) -> None:
    assert [(f[1], f[2]) for f in found(env)] == [(True, said)]


WARNED = [
    ({"OTEL_LOGS_EXPORTER": "otlp"}, "OTEL_LOGS_EXPORTER is not honoured: taotrace sends no logs through OpenTelemetry (its log lines go to stderr)"),
    ({"OTEL_BLRP_SCHEDULE_DELAY": "100"}, "OTEL_BLRP_SCHEDULE_DELAY is not honoured: taotrace sends no logs through OpenTelemetry (its log lines go to stderr)"),
    ({"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://c"}, "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT is not honoured: taotrace sends no logs through OpenTelemetry (its log lines go to stderr)"),
    ({"OTEL_METRICS_EXEMPLAR_FILTER": "always_on"}, "OTEL_METRICS_EXEMPLAR_FILTER is not honoured: OTLP metrics carry no exemplars; /metrics links its buckets to sampled traces whatever it says"),
    ({"OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION": "base2_exponential_bucket_histogram", "OTEL_METRICS_EXPORTER": "otlp"}, "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION is not honoured: taotrace aggregates explicit buckets only (the GenAI conventions' own)"),
    ({"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"}, "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT is not honoured: prompts and completions are recorded with --capture-content (TAOTRACE_CAPTURE_CONTENT) only"),
    ({"OTEL_LOG_LEVEL": "debug"}, "OTEL_LOG_LEVEL is not honoured: taotrace's log level is --log-level (TAOTRACE_LOG_LEVEL)"),
    ({"OTEL_PYTHON_ID_GENERATOR": "xray"}, "OTEL_PYTHON_ID_GENERATOR is not honoured: taotrace makes its own random trace and span ids"),
    ({"OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "x"}, "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS is not honoured: it sets up OpenTelemetry's Python SDK or auto-instrumentation, which taotrace does not run"),
    ({"OTEL_SDK_DISABLED": "yes"}, "OTEL_SDK_DISABLED='yes' is neither true nor false, and is read as false"),
    ({"OTEL_TRACES_SAMPLER_ARG": "0.5"}, "OTEL_TRACES_SAMPLER_ARG is not used: OTEL_TRACES_SAMPLER=parentbased_always_on (the default) takes no argument"),
    ({"OTEL_SPAN_LINK_COUNT_LIMIT": "0"}, "OTEL_SPAN_LINK_COUNT_LIMIT=0 is not applied: a span keeps its one link (--parent link, --mirror)"),
    ({"OTEL_SEMCONV_STABILITY_OPT_IN": "http/dup,database"}, "OTEL_SEMCONV_STABILITY_OPT_IN: http/dup, database not honoured: taotrace emits the stable HTTP names and the GenAI ones (gen_ai_latest_experimental, gen_ai_latest_experimental/dup) only"),
    ({"OTEL_CONFIG_FILE": "/etc/otel.yaml"}, "OTEL_CONFIG_FILE is not honoured: taotrace reads the OTEL_* variables, not a configuration file"),
    # Set, but nothing reads it.
    ({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c:4318/v1/metrics"}, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is not used: OTEL_METRICS_EXPORTER does not list otlp"),
    ({"OTEL_TRACES_EXPORTER": "console", "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "k=secret"}, "OTEL_EXPORTER_OTLP_TRACES_HEADERS is not used: OTEL_TRACES_EXPORTER does not list otlp"),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT is not used: neither OTEL_TRACES_EXPORTER nor OTEL_METRICS_EXPORTER lists otlp"),
    ({"OTEL_EXPORTER_ZIPKIN_ENDPOINT": "http://z:9411"}, "OTEL_EXPORTER_ZIPKIN_ENDPOINT is not used: neither OTEL_TRACES_EXPORTER nor OTEL_METRICS_EXPORTER lists zipkin"),
    # Not OpenTelemetry's: the name meant, never the value.
    ({"OTEL_EXPORTER_OTLP_ENDPIONT": "http://u:secret@c"}, "OTEL_EXPORTER_OTLP_ENDPIONT is not an OpenTelemetry variable taotrace knows, and is ignored; did you mean OTEL_EXPORTER_OTLP_ENDPOINT?"),
    ({"OTEL_TRACE_EXPORTER": "console"}, "OTEL_TRACE_EXPORTER is not an OpenTelemetry variable taotrace knows, and is ignored; did you mean OTEL_TRACES_EXPORTER?"),
    ({"OTEL_SERVCE_NAME": "x"}, "OTEL_SERVCE_NAME is not an OpenTelemetry variable taotrace knows, and is ignored; did you mean OTEL_SERVICE_NAME?"),
    ({"OTEL_ZZZ": "x"}, "OTEL_ZZZ is not an OpenTelemetry variable taotrace knows, and is ignored"),
]  # fmt: skip


@pytest.mark.parametrize("env,said", WARNED)
def test_warned_about_once(env: dict[str, str], said: str) -> None:
    assert [(f[1], f[2]) for f in found(env)] == [(False, said)]


def test_values_that_may_be_secrets_are_never_quoted() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "ftp://user:s3cret@collector",
        "OTEL_EXPORTER_OTLP_HEADRS": "authorization=s3cret",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "authorization=s3cret",
        "OTEL_RESOURCE_ATTRIBUTES": "token=s3cret",
    }
    lines = [f.message for f in check(env, installed)]
    assert len(lines) == 2 and not any("s3cret" in line for line in lines)


def test_disabled_sdk_says_nothing_of_unused_otlp_settings_but_still_refuses_bad_values() -> None:
    """OTEL_SDK_DISABLED=true turns every exporter off (the start-up line says so); a malformed
    value is still a mistake to fix."""
    env = {
        "OTEL_SDK_DISABLED": "true",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c",
        "OTEL_BSP_SCHEDULE_DELAY": "x",
    }
    assert check(env, installed) == [
        Finding("OTEL_BSP_SCHEDULE_DELAY", True, "OTEL_BSP_SCHEDULE_DELAY='x' is not a positive integer")
    ]


def test_findings_come_in_the_variables_order_one_each() -> None:
    env = {"OTEL_ZZZ": "x", "OTEL_LOGS_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "x", "OTEL_SERVICE_NAME": "s"}
    assert [(f.variable, f.refused) for f in check(env, installed)] == [
        ("OTEL_BSP_SCHEDULE_DELAY", True),
        ("OTEL_LOGS_EXPORTER", False),
        ("OTEL_ZZZ", False),
    ]


def test_the_installed_names_are_the_entry_points_the_sdk_finds() -> None:
    """On this machine: the SDK's console exporter, the OTLP package's, the API's propagators."""
    assert {"console", "otlp", "otlp_proto_grpc", "otlp_proto_http"} <= installed_names("opentelemetry_traces_exporter")
    assert {"tracecontext", "baggage"} <= installed_names("opentelemetry_propagator")
    assert {"otel", "process", "os", "host"} <= installed_names("opentelemetry_resource_detector")


def test_every_known_variable_is_in_the_settings_table() -> None:
    """docs/settings.md lists each variable (or family) and what taotrace does with it."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "settings.md").read_text()
    generic = {n for n in KNOWN if n.startswith("OTEL_EXPORTER_OTLP_") and n.split("_")[3] in ("TRACES", "METRICS")}
    missing = [n for n in [*KNOWN, *PREFIXES] if f"`{n}" not in text and n not in generic]
    assert missing == []
