"""The live view in a real browser: Debian's chromium, headless, driven by Playwright, against
`taotrace demo` (simulator + proxy) started as a user would start it.

One screenshot per view lands in the test's tmp dir; with UI_SCREENSHOTS=<dir> (`make
screenshots` uses docs/) they are written there too, for the README.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sync_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed (make system-deps)"
)

TRACE_URL = "http://localhost:16686/trace/{trace_id}"
XSS = '<script>window.__xss=1</script><img src=x onerror="window.__xss=2">'
LAUNCH_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run",
]  # fmt: skip


class Demo:
    """`taotrace demo` running in the background, with the URLs it printed."""

    def __init__(self, proc: subprocess.Popen[bytes], proxy_url: str, view_url: str) -> None:
        self.proc = proc
        self.proxy_url = proxy_url
        self.view_url = view_url

    def api(self, path: str) -> Any:
        with urllib.request.urlopen(self.view_url + path, timeout=10) as response:
            return json.loads(response.read())

    def post(self, path: str, body: dict[str, Any]) -> int:
        request = urllib.request.Request(
            self.proxy_url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    out = tmp_path_factory.mktemp("demo") / "stdout.txt"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "demo", "--port", "0", "--metrics-port", "0", "--time-scale", "0.2"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TAOTRACE_TRACE_URL": TRACE_URL},  # the demo's proxy reads TAOTRACE_* too
        )
    try:
        deadline = time.monotonic() + 60
        text = ""
        while "Ctrl-C to stop." not in text:
            assert proc.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.1)
            text = out.read_text()
        lines = {line.split(":", 1)[0].strip(): line for line in text.splitlines() if ":" in line}
        proxy_url = lines["The proxy keeps running"].split()[4]
        view_url = lines["live view"].split()[2].removesuffix("/#demo")
        yield Demo(proc, proxy_url, view_url)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _shoot(page: Any, name: str, tmp_path: Path) -> None:
    page.screenshot(path=str(tmp_path / f"ui-{name}.png"), full_page=True)
    target = os.environ.get("UI_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(target) / f"ui-{name}.png"), full_page=True)


def _ids(page: Any) -> list[str]:
    return list(page.eval_on_selector_all("#requests tbody tr", "rows => rows.map(r => r.dataset.id)"))


def _wait_for_ids(page: Any, want: list[str]) -> None:
    deadline = time.monotonic() + 10
    while _ids(page) != want:
        assert time.monotonic() < deadline, (_ids(page), want)
        page.wait_for_timeout(100)


def test_the_live_view_in_a_browser(demo: Demo, tmp_path: Path) -> None:
    # Beside the demo's runs: an error whose model name is markup, and another dialect.
    assert (
        demo.post(
            "/v1/chat/completions", {"model": XSS, "stream": True, "messages": [{"role": "user", "content": "x"}]}
        )
        == 404
    )
    body = {"model": "gpt-4o-mini", "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    assert demo.post("/v1/messages", body) == 200
    rows = demo.api("/api/requests")["requests"]
    assert len(rows) == 11  # the demo's warm-up GET, 8 runs, and the two above

    problems: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(  # a fresh profile: --user-data-dir
            str(tmp_path / "profile"),
            executable_path=CHROMIUM,
            args=LAUNCH_ARGS,
            viewport={"width": 1400, "height": 900},
        )
        page = browser.new_page()
        page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(str(e)))

        # Requests: every row, newest first, the markup shown as text and never run.
        page.goto(demo.view_url + "/#requests")
        _wait_for_ids(page, [r["id"] for r in rows])
        cells = page.eval_on_selector_all("#requests tbody td.model", "tds => tds.map(t => t.textContent)")
        assert XSS in cells
        assert page.evaluate("window.__xss") is None
        assert page.locator("#requests tbody img, #requests tbody script").count() == 0
        assert page.locator("#requests tbody .phasebar .seg.decode").count() == 9  # the streams that decoded
        _shoot(page, "requests", tmp_path)

        # Filters: the page shows exactly what the API selects.
        page.select_option("#f-api", "messages")
        _wait_for_ids(page, [r["id"] for r in demo.api("/api/requests?api=messages")["requests"]])
        assert len(_ids(page)) == 1
        page.select_option("#f-api", "")
        page.check("#f-errors")
        _wait_for_ids(page, [r["id"] for r in demo.api("/api/requests?errors=1")["requests"]])
        assert page.locator("#requests tbody tr.error").count() == 1
        page.uncheck("#f-errors")
        page.select_option("#f-model", "gpt-4o")
        _wait_for_ids(page, [r["id"] for r in demo.api("/api/requests?model=gpt-4o")["requests"]])
        page.select_option("#f-model", "")
        page.fill("#f-slow-ms", "50")
        page.check("#f-slow")
        slow = [r["id"] for r in demo.api("/api/requests?slow=0.05")["requests"]]
        assert 0 < len(slow) < 11
        _wait_for_ids(page, slow)
        page.uncheck("#f-slow")
        _wait_for_ids(page, [r["id"] for r in rows])

        # One request: the gpt-4o run's waterfall carries the record's phase durations.
        big = next(r for r in rows if r["model"] == "gpt-4o")
        page.click(f'#requests tbody tr[data-id="{big["id"]}"]')
        page.wait_for_selector('.wf-row[data-span="decode"]')
        detail = demo.api(f"/api/requests/{big['id']}")
        spans = {s["name"]: s["end"] - s["start"] for s in detail["spans"]}
        for name, seconds in (
            ("network", big["network"]),
            ("prefill_wait", big["prefill_wait"]),
            ("decode", big["decode"]),
        ):
            shown = float(page.get_attribute(f'.wf-row[data-span="{name}"] .wf-dur', "data-seconds") or "nan")
            assert shown == pytest.approx(seconds, abs=1e-9) and spans[name] == pytest.approx(seconds, abs=1e-9)
        prefill = next(s for s in detail["spans"] if s["name"] == "prefill_wait")
        if sys.platform.startswith("linux"):  # the round trip drawn inside prefill_wait (TCP_INFO)
            assert page.locator('.wf-row[data-span="prefill_wait"] .wf-rtt').count() == 2
            rtt = page.get_attribute('.wf-row[data-span="prefill_wait"] .wf-bar', "data-rtt")
            assert float(rtt or "nan") == prefill["rtt"] > 0
        assert page.locator("#gaps rect").count() == 47  # 48 tokens
        assert "gpt-4o" in (page.text_content("#trace-title") or "")
        assert page.get_attribute("#trace-link", "href") == TRACE_URL.replace("{trace_id}", big["trace_id"])
        _shoot(page, "waterfall", tmp_path)

        # Overview: charts drawn from /api/summary.
        page.goto(demo.view_url + "/#overview")
        page.wait_for_selector("#chart-ttft circle.point")
        assert page.locator("#chart-tpot circle.point").count() >= 2  # gpt-4o-mini and gpt-4o
        assert page.locator("#per-model tbody tr").count() >= 3
        assert page.text_content("#c-requests") == "11"
        _shoot(page, "overview", tmp_path)

        # Demo: the experiments as plots, beside the table the demo printed.
        page.goto(demo.view_url + "/#demo")
        page.wait_for_selector("#chart-input circle")
        assert page.locator("#chart-input circle").count() == 3
        assert page.locator("#chart-input line.fit").count() == 1
        assert page.locator("#chart-cache rect").count() == 3
        assert page.locator("#chart-models rect").count() == 4
        assert "prefix_cache" in (page.text_content("#demo-report") or "")
        _shoot(page, "demo", tmp_path)
        page.click("#chart-cache rect >> nth=0")  # a bar opens its request's waterfall
        page.wait_for_selector('.wf-row[data-span="prefill_wait"]')
        browser.close()
    assert problems == []
