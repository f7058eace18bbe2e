"""The stack, live: a real Prometheus (Debian's package) scrapes a real proxy carrying real
traffic, and every dashboard query, variable and rule is evaluated through its HTTP API.

    taotrace sim  <-  taotrace serve  <-  deploy/loadgen.py (all four dialects, failures, 404s)
                          ^ /metrics (OpenMetrics, exemplars)
                      prometheus --enable-feature=exemplar-storage, scrape + rule evaluation 1 s,
                      loading deploy/prometheus/rules/*.yml and the shipped `taotrace` job

Passes when: every query runs without error, every panel returns data (a finite sample), every
recording and alerting rule is healthy, the Grafana-managed alert queries return data, and
exemplars carrying a trace_id are stored. About 25 s; skips when Prometheus or the proxy and
simulator are not there.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PROM_DIR = ROOT / "deploy" / "prometheus"
DASHBOARDS = sorted((ROOT / "grafana" / "dashboards").glob("*.json"))
TRAFFIC_SECONDS = 12
RATE_INTERVAL = "20s"  # > 4 x the 1 s scrape interval, and covers the whole traffic window
APIS = {"chat_completions", "completions", "responses", "messages"}

pytestmark = pytest.mark.timeout(150)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_for(url: str, proc: subprocess.Popen[bytes], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited with {proc.returncode}: {read_log(proc)}")
        try:
            if http_get(url, timeout=1.0)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{what} did not answer {url} within {timeout:g}s: {read_log(proc)}")


def read_log(proc: subprocess.Popen[bytes]) -> str:
    log = getattr(proc, "log_path", None)
    return Path(log).read_text(errors="replace")[-3000:] if log else ""


@dataclass
class Stack:
    prometheus: str
    proxy: str
    started: float
    evaluated_at: float

    def api(self, path: str, **params: Any) -> Any:
        url = f"{self.prometheus}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}"
        status, body = http_get(url, timeout=10)
        doc = json.loads(body)
        assert status == 200 and doc["status"] == "success", f"{path} {params}: {doc}"
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr, time=f"{self.evaluated_at:.3f}")
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])


def finite(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(sample["value"][1])) for sample in result)


def spawn(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("wb") as handle:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    proc.log_path = str(log)  # type: ignore[attr-defined]
    return proc


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def prometheus_config(metrics_port: int) -> dict[str, Any]:
    """The shipped prometheus.yml, pointed at this test's proxy: same job, same rule files."""
    config: dict[str, Any] = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config.pop("alerting", None)
    config["rule_files"] = [str(PROM_DIR / pattern) for pattern in config["rule_files"]]
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "taotrace")
    for key in ("dns_sd_configs", "relabel_configs"):
        job.pop(key, None)
    job["scrape_interval"] = "1s"
    job["static_configs"] = [{"targets": [f"127.0.0.1:{metrics_port}"]}]
    config["scrape_configs"] = [job]
    return config


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("prometheus is not installed (`make test` installs Debian's package as root)")
    for module in ("proxy.serve", "proxy.sim"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not importable yet: the live stack test needs the proxy and the simulator")

    tmp = tmp_path_factory.mktemp("stack")
    sim_port, proxy_port, metrics_port, prom_port = (free_port() for _ in range(4))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_TRACES_EXPORTER"] = "none"  # spans are not what this test is about
    # deploy/loadgen.py imports the proxy's request builder: this checkout's, installed or not.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        # A per-key budget the traffic never spends (rate-limit headers on every answer), and a price
        # table with one of the sim's models left out (the unpriced panel has data too).
        sim = spawn(
            [sys.executable, "-m", "proxy", "sim", "--host", "127.0.0.1", "--port", str(sim_port), "--time-scale", "0.2",
             "--rate-limit-requests", "1000000", "--rate-limit-tokens", "1000000000"],
            tmp / "sim.log", env,
        )  # fmt: skip
        prices = tmp / "prices.yaml"
        prices.write_text(
            "currency: USD\nmodels:\n"
            "  gpt-4o-mini: {input: 0.15, cached_input: 0.075, output: 0.60}\n"
            "  gpt-4o: {input: 2.50, cached_input: 1.25, output: 10.00}\n"
        )
        procs.append(sim)
        proxy = spawn(
            [sys.executable, "-m", "proxy", "serve", "--upstream", f"http://127.0.0.1:{sim_port}",
             "--host", "127.0.0.1", "--port", str(proxy_port),
             "--metrics-host", "127.0.0.1", "--metrics-port", str(metrics_port), "--prices", str(prices)],
            tmp / "proxy.log", env,
        )  # fmt: skip
        procs.append(proxy)
        config = tmp / "prometheus.yml"
        config.write_text(yaml.safe_dump(prometheus_config(metrics_port)))
        prom = spawn(
            [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}", "--enable-feature=exemplar-storage",
             "--log.level=warn"],
            tmp / "prometheus.log",
        )  # fmt: skip
        procs.append(prom)
        wait_for(f"http://127.0.0.1:{sim_port}/v1/models", sim, "taotrace sim")
        wait_for(f"http://127.0.0.1:{metrics_port}/readyz", proxy, "taotrace serve")
        wait_for(f"http://127.0.0.1:{prom_port}/-/ready", prom, "prometheus")

        started = time.time()
        loadgen = subprocess.run(
            [sys.executable, str(ROOT / "deploy" / "loadgen.py"), "--base-url", f"http://127.0.0.1:{proxy_port}",
             "--duration", str(TRAFFIC_SECONDS), "--concurrency", "4", "--pause", "0.05", "--error-share", "0.15"],
            capture_output=True, text=True, timeout=TRAFFIC_SECONDS + 60, env=env,
        )  # fmt: skip
        assert loadgen.returncode == 0, loadgen.stderr
        summary = json.loads(loadgen.stdout.strip().splitlines()[-1])
        assert summary["requests"] >= 50, summary
        assert summary["outcomes"].get("200", 0) >= summary["requests"] // 2, summary
        # Two more scrapes and rule evaluations see the last requests.
        time.sleep(3)
        yield Stack(f"http://127.0.0.1:{prom_port}", f"http://127.0.0.1:{proxy_port}", started, time.time())
    finally:
        stop(procs)


def substitute(expr: str, api: str = ".*", model: str = ".*", upstream: str = ".*") -> str:
    return (
        expr.replace("$__rate_interval", RATE_INTERVAL)
        .replace("$__range", "60s")
        .replace("$upstream", upstream)
        .replace("$api", api)
        .replace("$model", model)
    )


def dashboard_targets() -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                out.append((path.name, panel["title"], target))
    return out


def test_prometheus_scrapes_the_proxy(stack: Stack) -> None:
    targets = stack.api("targets")["activeTargets"]
    assert [t["health"] for t in targets] == ["up"], targets
    assert targets[0]["labels"]["job"] == "taotrace"
    assert stack.query('up{job="taotrace"} == 1')
    apis = set(stack.api("label/api/values", **{"match[]": "taotrace_requests_total"}))
    assert APIS <= apis


def test_traffic_exercises_every_signal(stack: Stack) -> None:
    # The load generator (the compose demo's) fills every panel with something real: streams in
    # each dialect, cached and reasoning tokens, and each kind of failure the simulator injects.
    streamed = stack.query("sum by (api) (taotrace_time_to_first_token_seconds_count) > 0")
    assert {s["metric"]["api"] for s in streamed} == APIS
    errors = stack.query('sum by (error_type) (taotrace_requests_total{error_type!=""})')
    assert {s["metric"]["error_type"] for s in errors} >= {
        "rate_limited", "upstream_error", "stream_cut", "stream_error", "model_not_found"
    }  # fmt: skip
    for kind in ("cached_input", "reasoning"):
        assert stack.query(f'sum(taotrace_tokens_total{{type="{kind}"}}) > 0'), f"no {kind} tokens"
    phases = stack.query("sum by (phase) (taotrace_phase_duration_seconds_count) > 0")
    assert {s["metric"]["phase"] for s in phases} == {"network", "prefill_wait", "decode"}


def test_every_panel_returns_data(stack: Stack) -> None:
    targets = dashboard_targets()
    assert len(targets) >= 30
    empty = []
    for dashboard, title, target in targets:
        result = stack.query(substitute(target["expr"]))  # raises on a query error
        # "offset 1d" compares with yesterday: no data in a Prometheus that is 20 s old.
        if "offset 1d" not in target["expr"] and not finite(result):
            empty.append(f"{dashboard}: {title} [{target['refId']}] {target['expr']}")
    assert empty == [], "panels without data:\n" + "\n".join(empty)


@pytest.mark.parametrize(
    ("api", "model", "upstream"),
    [("chat_completions", "o3-mini", ".*"), ("messages|responses", "gpt-4o", "127.0.0.1")],
)
def test_panels_accept_variable_values(stack: Stack, api: str, model: str, upstream: str) -> None:
    # A chosen upstream/api/model (and a multi-value regex) still makes valid PromQL everywhere;
    # the proxy's one route is named after its upstream's host.
    for _, _, target in dashboard_targets():
        stack.query(substitute(target["expr"], api=api, model=model, upstream=upstream))
    ttft = next(t for _, title, t in dashboard_targets() if title == "TTFT percentiles")
    assert finite(stack.query(substitute(ttft["expr"], api=api, model=model, upstream=upstream)))


def test_dashboard_variables_resolve(stack: Stack) -> None:
    for path in DASHBOARDS:
        for var in json.loads(path.read_text())["templating"]["list"]:
            if var["type"] != "query":
                continue
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["definition"])
            assert match, var["definition"]
            selector, label = substitute(match.group(1)), match.group(2)
            values = stack.api(f"label/{label}/values", **{"match[]": selector})
            assert values, f"variable {var['name']} has no values"
            if label == "api":
                assert APIS <= set(values)


def test_every_rule_is_healthy_and_evaluates(stack: Stack) -> None:
    groups = stack.api("rules")["groups"]
    shipped = {g["name"] for p in (PROM_DIR / "rules").glob("*.yml") for g in yaml.safe_load(p.read_text())["groups"]}
    assert {g["name"] for g in groups} == shipped
    no_data = []
    for group in groups:
        for rule in group["rules"]:
            assert rule["health"] == "ok", f"{rule['name']}: {rule.get('lastError')}"
            result = stack.query(rule["query"])
            if rule["type"] == "recording" and not result:
                no_data.append(rule["name"])
    assert no_data == [], f"recording rules without data: {no_data}"


def test_grafana_alert_queries_return_data(stack: Stack) -> None:
    path = ROOT / "grafana" / "provisioning" / "alerting" / "rules.yaml"
    for group in yaml.safe_load(path.read_text())["groups"]:
        for rule in group["rules"]:
            query = next(d for d in rule["data"] if d["refId"] == "A")["model"]["expr"]
            assert stack.query(query), f"{rule['title']}: no data"


def test_proxy_down_alerts_stay_quiet(stack: Stack) -> None:
    firing = {a["labels"]["alertname"] for a in stack.api("alerts")["alerts"]}
    assert not firing & {"TaotraceProxyDown", "TaotraceProxyAbsent"}


@pytest.mark.parametrize(
    "metric", ["taotrace_time_to_first_token_seconds_bucket", "taotrace_request_duration_seconds_bucket"]
)
def test_exemplars_with_trace_ids_are_stored(stack: Stack, metric: str) -> None:
    data = stack.api("query_exemplars", query=metric, start=f"{stack.started - 5:.3f}", end=f"{stack.evaluated_at:.3f}")
    exemplars = [e for series in data for e in series["exemplars"]]
    assert exemplars, f"no exemplars stored for {metric}"
    for exemplar in exemplars:
        assert re.fullmatch(r"[0-9a-f]{32}", exemplar["labels"]["trace_id"]), exemplar
