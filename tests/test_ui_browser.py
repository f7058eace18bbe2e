"""The live view in a real browser: Debian's chromium, headless, driven by Playwright, against
`taotrace demo` (simulator + proxy) and `taotrace serve`, started as a user would start them.

One screenshot per view lands in the test's tmp dir; with UI_SCREENSHOTS=<dir> (`make
screenshots` uses docs/) the four of docs/live-view.md are written there too. They are taken of
a realistic session, the demo's traffic and a few requests beside it (a long stream still
running, a rate limit, a cut stream, an answer that is not streamed), before the test sends its
hostile model name.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
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

    def post(self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> int:
        """The response's status; 0 when its body was cut (the client sees the cut, as it should)."""
        request = urllib.request.Request(
            self.proxy_url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                response.read()
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except http.client.IncompleteRead:
            return 0


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
    return list(page.eval_on_selector_all("#finished tr", "rows => rows.map(r => r.dataset.id)"))


def _wait_for_ids(page: Any, want: list[str]) -> None:
    deadline = time.monotonic() + 10
    while _ids(page) != want:
        assert time.monotonic() < deadline, (_ids(page), want)
        page.wait_for_timeout(100)


def _chat(
    model: str, tokens: int, *, stream: bool = True, prompt: str = "Summarise the design review."
) -> dict[str, Any]:
    return {"model": model, "max_tokens": tokens, "stream": stream, "messages": [{"role": "user", "content": prompt}]}


def _browser(pw: Any, tmp_path: Path, problems: list[str], width: int = 1400) -> tuple[Any, Any]:
    browser = pw.chromium.launch_persistent_context(  # a fresh profile: --user-data-dir
        str(tmp_path / f"profile-{width}"),
        executable_path=CHROMIUM,
        args=LAUNCH_ARGS,
        viewport={"width": width, "height": 900},
    )
    page = browser.new_page()
    page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    return browser, page


def _overflow(page: Any) -> int:
    """How far the page is wider than the window (a table scrolls inside its own box instead)."""
    return int(page.evaluate("document.documentElement.scrollWidth - window.innerWidth"))


def test_the_live_view_in_a_browser(demo: Demo, tmp_path: Path) -> None:
    # Beside the demo's runs, what a real session has: another dialect, an answer that is not
    # streamed, a rate limit, a stream cut mid-way, and (below) a long stream still running.
    assert demo.post("/v1/messages", _chat("gpt-4o-mini", 8)) == 200
    assert demo.post("/v1/chat/completions", _chat("gpt-4o-mini", 24, stream=False)) == 200
    assert demo.post("/v1/chat/completions", _chat("gpt-4o", 16), {"x-sim-fail": "429"}) == 429
    assert demo.post("/v1/chat/completions", _chat("gpt-4o-mini", 64), {"x-sim-fail": "cut"}) == 0
    rows = demo.api("/api/requests")["requests"]
    assert len(rows) == 15  # the demo's warm-up GET, 10 runs, and the four above
    cut = next(r for r in rows if r["error_type"] == "stream_cut")
    plain = next(r for r in rows if r["api"] == "chat_completions" and not r["stream"])
    # gpt-4o at the demo's time scale: ~6 ms a token, so 1,200 tokens run for about 7 s.
    statuses: list[int] = []
    long = threading.Thread(
        target=lambda: statuses.append(
            demo.post("/v1/chat/completions", _chat("gpt-4o", 1200, prompt="Draft the report."))
        )
    )
    long.start()

    problems: list[str] = []
    try:
        with sync_api.sync_playwright() as pw:
            browser, page = _browser(pw, tmp_path, problems)

            # Requests: the running stream on top with the phase it reached, then every finished row.
            page.goto(demo.view_url + "/#requests")
            _wait_for_ids(page, [r["id"] for r in rows])
            page.wait_for_selector('#running tr[data-phase="decode"]', timeout=15_000)
            running = page.text_content("#running tr td.phase") or ""
            assert running.startswith("running · decode, ") and running.endswith(" tokens"), running
            (live,) = demo.api("/api/requests")["in_flight"]
            assert live["model"] == "gpt-4o" and live["phase"] == "decode"
            assert page.get_attribute("#running tr", "data-id") == live["id"]
            headers = page.eval_on_selector_all("#requests thead th", "ths => ths.map(t => t.textContent)")
            for unit in ("TTFT (ms)", "TPOT (ms)", "out (tokens)", "cached in (tokens)", "duration (ms)"):
                assert unit in headers
            assert page.locator("#finished .phasebar .seg.decode").count() == 12  # the 10 runs, messages, the cut one
            unknown = page.text_content(f'#finished tr[data-id="{rows[-1]["id"]}"] td.model')
            assert unknown == "unknown"  # the warm-up GET names no model, as the overview says
            _shoot(page, "requests", tmp_path)
            # Its waterfall so far, growing; it becomes a finished row when it ends.
            page.click("#running tr")
            page.wait_for_selector('.wf-row[data-span="decode"] .wf-bar.open')
            assert page.is_visible("#trace-running")
            page.go_back()
            page.wait_for_selector(f'#finished tr[data-id="{live["id"]}"]', timeout=30_000)
            assert page.locator("#running tr").count() == 0
            long.join(30)
            assert statuses == [200]
            rows = demo.api("/api/requests")["requests"]
            _wait_for_ids(page, [r["id"] for r in rows])

            # Bars on one time scale: the longest fills its cell, the rest are shorter.
            page.check("#f-scale")
            widths = page.eval_on_selector_all(
                "#finished .phasebar", "bars => bars.map(b => b.getBoundingClientRect().width)"
            )
            assert max(widths) > 5 * min(widths)
            page.uncheck("#f-scale")

            # Filters: the page shows exactly what the API selects.
            page.select_option("#f-api", "messages")
            _wait_for_ids(page, [r["id"] for r in demo.api("/api/requests?api=messages")["requests"]])
            assert len(_ids(page)) == 1
            page.select_option("#f-api", "")
            page.check("#f-errors")
            _wait_for_ids(page, [r["id"] for r in demo.api("/api/requests?errors=1")["requests"]])
            assert page.locator("#finished tr.error").count() == 2
            page.uncheck("#f-errors")
            page.select_option("#f-model", "gpt-4o")
            _wait_for_ids(page, [r["id"] for r in demo.api("/api/requests?model=gpt-4o")["requests"]])
            page.select_option("#f-model", "")
            page.fill("#f-slow-ms", "50")
            page.check("#f-slow")
            slow = [r["id"] for r in demo.api("/api/requests?slow=0.05")["requests"]]
            assert 0 < len(slow) < len(rows)
            _wait_for_ids(page, slow)
            page.uncheck("#f-slow")
            _wait_for_ids(page, [r["id"] for r in rows])

            # One request, reached with the keyboard: the gpt-4o run's waterfall carries the record's phases.
            big = next(r for r in rows if r["model"] == "gpt-4o" and r["output_tokens"] == 48)
            page.focus(f'#finished tr[data-id="{big["id"]}"]')
            page.keyboard.press("Enter")
            # The running request's waterfall opened above may still be drawn: wait for this one's.
            assert big["trace_id"]
            page.wait_for_function(
                "id => document.getElementById('trace-title').textContent.includes(id)", arg=big["trace_id"]
            )
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
            attrs = dict(
                page.eval_on_selector_all("#attrs tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))")
            )
            assert attrs["timing.ttft"] == f"{big['ttft'] * 1000:.1f} ms"  # ms, as everywhere on the page
            assert attrs["cost"] == "–" and attrs["error_type"] == "–"  # one symbol for "empty"
            _shoot(page, "waterfall", tmp_path)

            # A reasoning model: its streamed thinking inside decode, the answer's first token marked.
            streamed = next(r for r in rows if r["model"] == "o3-mini")
            page.goto(f"{demo.view_url}/#trace/{streamed['id']}")
            bar = page.wait_for_selector('.wf-row[data-span="thinking"] .wf-bar.thinking')
            assert "estimated" not in (bar.get_attribute("class") or "")
            shown = float(page.get_attribute('.wf-row[data-span="thinking"] .wf-dur', "data-seconds") or "nan")
            assert shown == pytest.approx(streamed["thinking"], abs=1e-9)
            names = page.eval_on_selector_all(".wf-row .wf-name", "ns => ns.map(n => n.textContent)")
            assert names[1:] == ["network", "prefill_wait", "decode", "thinking", "marks"]  # inside decode, under it
            assert page.locator(".wf-name.inner").count() == 1
            marks = page.eval_on_selector_all(".wf-mark", "ms => ms.map(m => m.textContent)")
            assert any(m.startswith("first answer token ") for m in marks)
            conn = dict(
                page.eval_on_selector_all("#conn tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))")
            )
            assert conn["thinking (streamed reasoning, measured)"] == f"{streamed['thinking'] * 1000:.1f} ms"
            assert "answer pace" in conn and "reasoning pace" in conn
            _shoot(page, "thinking", tmp_path)
            # A model that hid its thinking: the estimate inside prefill_wait, drawn as one.
            hidden = next(r for r in rows if r["model"] == "o4-mini")
            page.goto(f"{demo.view_url}/#trace/{hidden['id']}")
            row = page.wait_for_selector('.wf-row[data-estimated="true"]')
            assert (row.text_content() or "").startswith("thinking (estimated)")
            assert page.locator(".wf-bar.thinking.estimated").count() == 1
            assert page.locator(".wf-bar.thinking:not(.estimated)").count() == 0  # nothing measured
            assert "estimated, not measured" in (page.get_attribute(".wf-bar.thinking.estimated", "title") or "")
            names = page.eval_on_selector_all(".wf-row .wf-name", "ns => ns.map(n => n.textContent)")
            assert names[1:] == ["network", "prefill_wait", "thinking (estimated)", "decode", "marks"]
            conn = dict(
                page.eval_on_selector_all("#conn tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))")
            )
            assert conn["hidden thinking (estimated, not measured)"] == f"{hidden['thinking_estimated'] * 1000:.1f} ms"
            assert "thinking (streamed reasoning, measured)" not in conn
            _shoot(page, "thinking-hidden", tmp_path)

            # A stream cut mid-way: marked where it broke, with its error type.
            page.goto(f"{demo.view_url}/#trace/{cut['id']}")
            mark = page.wait_for_selector(".wf-mark.broke")
            assert mark.text_content().startswith("✕ stream_cut · last byte ")
            page.screenshot(path=str(tmp_path / "ui-cut.png"), full_page=True)
            # An answer that is not streamed: the wait for it has a row of its own.
            page.goto(f"{demo.view_url}/#trace/{plain['id']}")
            page.wait_for_selector('.wf-row[data-span="response"]')
            assert "waiting for the response" in (page.text_content('.wf-row[data-span="response"]') or "")

            # Overview: charts drawn from /api/summary, their time labels inside the chart.
            page.goto(demo.view_url + "/#overview")
            page.wait_for_selector("#chart-ttft circle.point")
            assert page.locator("#chart-tpot circle.point").count() >= 2  # gpt-4o-mini and gpt-4o
            assert page.locator("#per-model tbody tr").count() >= 3
            assert page.text_content("#c-requests") == str(len(rows))
            clipped = page.eval_on_selector_all(
                ".chart-svg",
                """svgs => svgs.flatMap(svg => {
                    const box = svg.getBoundingClientRect();
                    return [...svg.querySelectorAll("text")].filter(t => {
                        const r = t.getBoundingClientRect();
                        return r.left < box.left - 0.5 || r.right > box.right + 0.5;
                    }).map(t => t.textContent);
                })""",
            )
            assert clipped == []
            _shoot(page, "overview", tmp_path)

            # Demo: the experiments as plots, and the table the demo printed, whole at 1400 px.
            page.goto(demo.view_url + "/#demo")
            page.wait_for_selector("#chart-input circle")
            assert page.locator("#chart-input circle").count() == 3
            assert page.locator("#chart-input line.fit").count() == 1
            assert page.locator("#chart-cache rect").count() == 3
            assert page.locator("#chart-models rect").count() == 4
            assert "prefix_cache" in (page.text_content("#demo-report") or "")
            assert page.evaluate("(e => e.scrollWidth <= e.clientWidth)(document.getElementById('demo-report'))")
            assert page.is_hidden("#demo-empty")
            _shoot(page, "demo", tmp_path)
            page.click("#chart-cache rect >> nth=0")  # a bar opens its request's waterfall
            page.wait_for_selector('.wf-row[data-span="prefill_wait"]')

            # Last, and not in the screenshots: a model name that is markup is shown as text, never run.
            xss = _chat(XSS, 8)
            assert demo.post("/v1/chat/completions", xss) == 404
            page.goto(demo.view_url + "/#requests")
            page.wait_for_selector("#finished tr.error td.model")
            cells = page.eval_on_selector_all("#finished td.model", "tds => tds.map(t => t.textContent)")
            assert XSS in cells
            assert page.evaluate("window.__xss") is None
            assert page.locator("#requests tbody img, #requests tbody script").count() == 0
            browser.close()

            # A phone's width: nothing wider than the window but the tables, which scroll in their box.
            narrow, page = _browser(pw, tmp_path, problems, width=420)
            for view in ("requests", "overview", "demo", f"trace/{big['id']}"):
                page.goto(f"{demo.view_url}/#{view}")
                page.wait_for_selector({"requests": "#finished tr", "overview": "#chart-ttft svg",
                                        "demo": "#chart-input svg"}.get(view, ".wf-row"))  # fmt: skip
                assert _overflow(page) <= 0, view
                page.screenshot(path=str(tmp_path / f"ui-420-{view.split('/')[0]}.png"), full_page=True)
            assert (
                page.evaluate("getComputedStyle(document.querySelector('.two')).gridTemplateColumns.split(' ').length")
                == 1
            )
            narrow.close()
    finally:
        long.join(60)
    assert problems == []


def test_a_plain_serve_explains_the_demo_tab_and_asks_a_browser_for_its_token(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--port", "0", "--metrics-port", "0",
             "--upstream", "http://127.0.0.1:9/"],
            stdout=sink, stderr=subprocess.STDOUT,
            env={**os.environ, "TAOTRACE_UI_TOKEN": "view-token-1"},
        )  # fmt: skip
    problems: list[str] = []
    try:
        deadline = time.monotonic() + 30
        while "live view on " not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        url = log.read_text().split("live view on ", 1)[1].split()[0].rstrip("/")
        with sync_api.sync_playwright() as pw:
            browser, page = _browser(pw, tmp_path, problems)
            # Without the token a browser gets a page saying how to log in, and logs in from it.
            response = page.goto(url + "/#demo")
            assert response is not None and response.status == 401
            assert "TAOTRACE_UI_TOKEN" in (page.text_content("body") or "")
            page.fill("input[name=token]", "view-token-1")
            page.click("button[type=submit]")
            page.wait_for_selector("#view-requests")
            assert "view-token-1" not in page.url  # traded for a cookie
            page.goto(url + "/#demo")
            page.wait_for_selector("#demo-empty", state="visible")
            assert "taotrace demo" in (page.text_content("#demo-empty") or "")
            assert page.is_hidden("#demo-body") and page.is_hidden("#demo-tab")
            browser.close()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    # The 401 of the login page is the browser's one console error; nothing else went wrong.
    assert [p for p in problems if "401" not in p] == []


def _started(args: list[str], log: Path, says: str) -> tuple[subprocess.Popen[bytes], str]:
    """A `taotrace` command in the background, once its log says `says`; and that line."""
    with log.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "proxy", *args], stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while says not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(log.read_text())
        time.sleep(0.1)
    return proc, next(line for line in log.read_text().splitlines() if says in line)


def test_a_mirrored_request_shows_beside_its_copy(tmp_path: Path) -> None:
    # Two simulators of different physics: the request's upstream four times faster than the
    # mirror's, so in every pair the mirror (the right-hand side) is the slower one.
    procs: list[subprocess.Popen[bytes]] = []
    problems: list[str] = []
    try:
        roots = []
        for name, scale in (("fast", "0.25"), ("slow", "1")):
            proc, line = _started(["sim", "--port", "0", "--time-scale", scale], tmp_path / f"{name}.log", "/v1")
            procs.append(proc)
            roots.append(line.split()[2].removesuffix("/v1"))
        proc, line = _started(
            ["serve", "--port", "0", "--metrics-port", "0", "--upstream", roots[0], "--route", f"slow:/slow={roots[1]}",
             "--mirror", "slow", "--mirror-ratio", "1", "--mirror-max-per-minute", "100"],
            tmp_path / "serve.log", "live view on ",
        )  # fmt: skip
        procs.append(proc)
        proxy_url = line.split("taotrace proxy on ", 1)[1].split()[0]
        view = Demo(proc, proxy_url, line.split("live view on ", 1)[1].split()[0].rstrip("/"))
        for tokens in (24, 40):
            assert view.post("/v1/chat/completions", _chat("gpt-4o-mini", tokens)) == 200
        deadline = time.monotonic() + 30
        while len(rows := view.api("/api/requests")["requests"]) < 4:
            assert time.monotonic() < deadline, rows
            time.sleep(0.1)
        primary = next(r for r in rows if not r["mirror"] and r["output_tokens"] == 40)
        copy = next(r for r in rows if r["mirror"] and r["pair_id"] == primary["pair_id"])
        assert copy["upstream"] == "slow" and copy["ttft"] > primary["ttft"]

        with sync_api.sync_playwright() as pw:
            browser, page = _browser(pw, tmp_path, problems)
            page.goto(view.view_url + "/#requests")
            _wait_for_ids(page, [r["id"] for r in rows])
            # The list marks the copies, and both halves of a pair link to it.
            assert page.locator("#finished tr.mirror .badge.mirror").count() == 2
            assert page.locator("#finished tr:not(.mirror) .badge").count() == 0
            assert page.locator("#finished a.pair-link").count() == 4
            page.screenshot(path=str(tmp_path / "ui-pair-requests.png"), full_page=True)
            page.click(f'#finished tr[data-id="{primary["id"]}"] a.pair-link')
            page.wait_for_selector("#pair-wf-mirror .wf-row")
            assert page.url.endswith(f"#pair/{primary['pair_id']}")
            assert page.text_content("#pair-h-request") == "request · 127.0.0.1"
            assert page.text_content("#pair-h-mirror") == "mirror copy · slow"
            cells = page.eval_on_selector_all(
                "#pair-table tbody tr", "rows => Object.fromEntries(rows.map(r => [r.dataset.key, [...r.cells].map(c => c.textContent)]))"
            )  # fmt: skip
            shown = [float(text.removesuffix(" ms")) / 1000 for text in cells["ttft"][1:3]]
            assert shown == [pytest.approx(primary["ttft"], abs=6e-5), pytest.approx(copy["ttft"], abs=6e-5)]
            assert cells["output_tokens"] == ["output tokens", "40", "40", "±0"]
            assert cells["outcome"] == ["outcome", "200 ok", "200 ok", "same"]
            # The right-hand side is the slower one: its differences are marked so, its bars longer.
            for key in ("ttft", "duration"):
                diff = page.locator(f'#pair-table tr[data-key="{key}"] td.diff')
                assert diff.get_attribute("class") == "num diff mirror-slower"
                assert (diff.text_content() or "").startswith("+")
            assert float(page.get_attribute('#pair-table tr[data-key="ttft"] td.diff', "data-seconds") or "nan") == (
                pytest.approx(copy["ttft"] - primary["ttft"], abs=1e-9)
            )
            # One time scale: each root bar is as long as its duration against the longer of the two.
            widths = {
                side: page.eval_on_selector(
                    f'#pair-wf-{side} .wf-row[data-span="root"] .wf-bar', "b => b.getBoundingClientRect().width"
                )
                for side in ("request", "mirror")
            }
            assert widths["request"] / widths["mirror"] == pytest.approx(
                primary["duration"] / copy["duration"], rel=0.05
            )
            _shoot(page, "pair", tmp_path)
            # The copy's own waterfall, and back to the pair from it; then from the copy's row.
            page.click("#pair-open-mirror")
            page.wait_for_selector('.wf-row[data-span="decode"]')
            assert page.url.endswith(f"#trace/{copy['id']}")
            page.click("#trace-pair")
            page.wait_for_selector("#pair-wf-request .wf-row")
            page.goto(view.view_url + "/#requests")
            page.wait_for_selector(f'#finished tr[data-id="{copy["id"]}"] a.pair-link')
            page.focus(f'#finished tr[data-id="{copy["id"]}"] a.pair-link')
            page.keyboard.press("Enter")  # the link opens the pair, not the row's waterfall
            page.wait_for_selector("#pair-wf-mirror .wf-row")
            assert page.url.endswith(f"#pair/{primary['pair_id']}")
            # The overview counts the clients' requests only, and the pairs apart.
            page.goto(view.view_url + "/#overview")
            page.wait_for_selector("#pairs tbody tr")
            assert page.text_content("#c-requests") == "2"
            pair_row = page.eval_on_selector("#pairs tbody tr", "r => [...r.cells].map(c => c.textContent)")
            assert pair_row[:4] == ["127.0.0.1", "slow", "2", "2"] and pair_row[5].startswith("+")
            assert pair_row[7] == "0 of 2"  # the mirror's first token never came first
            page.screenshot(path=str(tmp_path / "ui-pair-overview.png"), full_page=True)
            browser.close()
            narrow, page = _browser(pw, tmp_path, problems, width=420)
            page.goto(f"{view.view_url}/#pair/{primary['pair_id']}")
            page.wait_for_selector("#pair-wf-mirror .wf-row")
            assert _overflow(page) <= 0  # the table scrolls in its box, the waterfalls stack
            page.screenshot(path=str(tmp_path / "ui-420-pair.png"), full_page=True)
            narrow.close()
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGINT)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert problems == []
