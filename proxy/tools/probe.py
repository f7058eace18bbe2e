"""`taotrace probe`: the article's measurement script as a tool.

Streams one request (or `--runs N`) to any base URL and prints TTFT, total time, output tokens,
TPOT and tokens/s as the client sees them (definitions in `proxy.tools.client`), and how much of
the TTFT is the network: opening the connection plus one round trip, from the kernel's
`TCP_INFO` of the connection that carried the request (Linux). For a reasoning model it prints
both first-token times, the first token (a thought, when it streams its thinking) and the
answer's, and the thinking between (measured) or hidden in the TTFT (estimated, `~`). `--json`
prints `{"ttft_s", "total_s", "output_tokens", "tpot_s", "tokens_per_s", "rtt_s", "connect_s",
"network_s", "answer_ttft_s", "thinking_s", "thinking_estimated_s", "forward_proxy", ...}`;
with `--runs` > 1 the top-level numbers are medians and `runs` lists each one.

Runs are shown as they finish (`proxy.tools.progress`, on stderr: stdout keeps only the result,
so `--json` stays JSON). Ctrl-C stops the run under way and prints the runs already finished
(with `"interrupted": true` in `--json`); the exit status is then 130 (143 for SIGTERM).

Behind a corporate proxy the request goes the way `HTTPS_PROXY` / `HTTP_PROXY` / `NO_PROXY` say,
by `serve`'s rules (`proxy.tools.route`); then "opening the connection" is to the forward proxy
(+ CONNECT + TLS through the tunnel) and the round trip is to the forward proxy, and the output
says so.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any, Literal, TextIO

import aiohttp
from pydantic import Field

from proxy.tools.client import Call, ConnectTimer, Measurement, api_name, measure, ms, network_share, tls_context
from proxy.tools.clientconfig import ClientSettings, Target, load_target, parse_base_url
from proxy.tools.progress import Progress
from proxy.tools.route import BAD_VARIABLE_FIX, DIRECT, ToolRoute, route_for
from proxy.tools.stoppable import interrupted_status, signals, unless_stopped
from proxy.tools.table import align, cell

__all__ = ["ProbeSettings", "format_table", "probe", "report", "run"]

DEFAULT_PROMPT = "In three sentences, explain what happens between sending a prompt to an LLM and its first token."


class ProbeSettings(ClientSettings):
    """Everything `taotrace probe` can be told."""

    prompt: str = Field(DEFAULT_PROMPT, min_length=1, description="the prompt to send")
    prompt_repeat: int = Field(1, ge=1, description="repeat the prompt N times (a longer input: watch TTFT grow)")
    max_tokens: int | None = Field(None, ge=1, description="output cap (default: config default_params, else 128)")
    runs: int = Field(1, ge=1, le=1000, description="how many requests, one after another")
    api: Literal["chat", "completions", "responses", "messages"] = Field(
        "chat", description="dialect: chat (/chat/completions), completions, responses, messages"
    )


def _call(settings: ProbeSettings, target: Target) -> Call:
    params = dict(target.params)
    from_file = params.pop("max_tokens", None)
    max_tokens = settings.max_tokens or from_file or 128
    prompt = " ".join([settings.prompt] * settings.prompt_repeat)
    return Call(api_name(settings.api), target.model, prompt, int(max_tokens), params)


def _no_progress(_run: int, _result: Measurement | None) -> None:
    return None


async def probe(
    settings: ProbeSettings,
    target: Target,
    route: ToolRoute = DIRECT,
    *,
    results: list[Measurement] | None = None,
    progress: Callable[[int, Measurement | None], None] = _no_progress,
) -> list[Measurement]:
    """Run the requests one after another on one connection pool, on `route`, appending each to
    `results` as it finishes (so an interrupted probe keeps them). `progress(n, None)` is called
    as run n starts, `progress(n, measurement)` as it ends."""
    call = _call(settings, target)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=settings.timeout, sock_read=settings.timeout)
    results = [] if results is None else results
    timer = ConnectTimer()
    connector = aiohttp.TCPConnector(ssl=tls_context())
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, trace_configs=[timer.config]) as session:
        for n in range(1, settings.runs + 1):
            progress(n, None)
            m = await measure(session, target.base_url, call, api_key=target.api_key, connect_timer=timer, route=route)
            results.append(m)
            progress(n, m)
            if not m.ok:
                break
    return results


def _ms(value: float | None) -> str:
    return cell(value, 1, 1000, " ms")


def _fine_ms(value: float | None) -> str:
    return "-" if value is None else ms(value)


def _reasoned(m: Measurement) -> bool:
    """A reasoning model's run: it streamed its thinking, or reported reasoning tokens."""
    return m.thinking_s is not None or bool(m.reasoning_tokens)


def _thinking(m: Measurement) -> str:
    """Measured thinking, or hidden reasoning's estimate marked `~` (never measured)."""
    if m.thinking_s is None and m.thinking_estimated_s is not None:
        return "~" + _ms(m.thinking_estimated_s)
    return _ms(m.thinking_s)


def format_table(results: Sequence[Measurement]) -> str:
    """One row a run; a reasoning model's runs get the answer's first token and the thinking beside the TTFT."""
    reasoning = any(_reasoned(m) for m in results)
    extra = ("answer", "thinking") if reasoning else ()
    rows = [("run", "TTFT", *extra, "network", "RTT", "total", "out tok", "TPOT", "tok/s", "in tok", "cached", "usage")]
    for i, m in enumerate(results, 1):
        answer = (_ms(m.answer_ttft_s), _thinking(m)) if reasoning else ()
        rows.append(
            (str(i), _ms(m.ttft_s), *answer, _fine_ms(m.network_s), _fine_ms(m.rtt_s), _ms(m.total_s),
             str(m.output_tokens), _ms(m.tpot_s), cell(m.tokens_per_s, 1), cell(m.input_tokens), cell(m.cached_tokens),
             m.usage_source)
        )  # fmt: skip
    lines = align(rows)
    if reasoning:
        lines.append(
            "answer = the first answer token (TTFT = the first token: a thought when the model streams its thinking); "
            "thinking: measured; ~: hidden, estimated, inside the TTFT"
        )
    hidden = [m for m in results if m.thinking_estimated_s is not None and m.answer_tokens_per_s is not None]
    if hidden:
        lines.append(
            f"hidden reasoning tokens count as output: TPOT and tok/s are not the answer's pace "
            f"({cell(hidden[-1].answer_tokens_per_s, 1)} tok/s)"
        )
    return "\n".join(lines)


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _fields(m: Measurement) -> dict[str, Any]:
    return {**m.summary(), "rtt_s": m.rtt_s, "connect_s": m.connect_s, "network_s": m.network_s, **m.reasoning()}


def summary(results: Sequence[Measurement], many: bool) -> dict[str, Any]:
    """One run's fields, or (`many`) the medians of the runs plus the `runs` list."""
    if not many:
        return _fields(results[0]) if results else {}
    runs = [_fields(m) for m in results]
    keys = ("ttft_s", "total_s", "tpot_s", "tokens_per_s", "rtt_s", "network_s", "answer_ttft_s", "thinking_s",
            "thinking_estimated_s")  # fmt: skip
    out: dict[str, Any] = {k: _median([r[k] for r in runs]) for k in keys}
    out["output_tokens"] = statistics.median_low([r["output_tokens"] for r in runs]) if runs else None
    out["runs"] = runs
    return out


def report(
    settings: ProbeSettings,
    target: Target,
    results: Sequence[Measurement],
    out: TextIO,
    route: ToolRoute = DIRECT,
    interrupted: bool = False,
) -> int:
    """Print the runs (a table, or JSON); the exit status: 0 when every run succeeded, 1 when one
    failed, 130 when `interrupted` (what finished is printed all the same; `run` gives 143 when
    SIGTERM did the interrupting)."""
    failed = next((m for m in results if not m.ok), None)
    good = [m for m in results if m.ok]
    if settings.json_output:
        doc: dict[str, Any] = {"base_url": target.base_url, "model": target.model, "api": api_name(settings.api)}
        doc["forward_proxy"] = route.forward.shown if route.forward is not None else None
        doc.update(summary(good, settings.runs > 1))
        if failed is not None:
            doc["error"] = failed.error
        if interrupted:
            doc["interrupted"] = True
        out.write(json.dumps(doc, indent=2) + "\n")
    else:
        out.write(f"probe {target.model} via {api_name(settings.api)} at {target.base_url}\n")
        if route.forward is not None or route.bypass:
            out.write(_route_line(route) + "\n")
        if good:
            out.write(format_table(good) + "\n")
        if len(good) > 1:
            med = summary(good, True)
            answer = ""
            if any(_reasoned(m) for m in good):
                answer = f", first answer token {_ms(med['answer_ttft_s'])}"
                if med["thinking_s"] is not None:
                    answer += f" after {_ms(med['thinking_s'])} thinking"
                elif med["thinking_estimated_s"] is not None:
                    answer += f" (~{_ms(med['thinking_estimated_s'])} hidden thinking, estimated)"
            out.write(
                f"median: TTFT {_ms(med['ttft_s'])}{answer}, TPOT {_ms(med['tpot_s'])}, "
                f"{cell(med['tokens_per_s'], 1)} tok/s\n"
            )
        line = network_share(good[-1], route) if good else None  # the last run: on a warm connection when runs > 1
        if line is not None:
            out.write(f"network (run {len(good)}): {line}\n")
        if failed is not None:
            out.write(f"error: {failed.error}\n")
    if interrupted:
        return 130
    return 0 if failed is None and results else 1


def _run_line(n: int, runs: int, m: Measurement) -> str:
    """One finished run, for the progress line or log."""
    if not m.ok:
        return f"run {n}/{runs}: error: {m.error}"
    return (
        f"run {n}/{runs}: TTFT {_ms(m.ttft_s)}, total {_ms(m.total_s)}, {m.output_tokens} tokens, "
        f"{cell(m.tokens_per_s, 1)} tok/s"
    )


def _show(progress: Progress, runs: int) -> Callable[[int, Measurement | None], None]:
    """probe's progress: on a terminal, the run under way and the last one's TTFT (short: a line
    wider than the terminal would wrap and not be wiped); in a log, each finished run as a line
    (when there are several: one run's line would repeat the table)."""
    last = [""]

    def show(n: int, m: Measurement | None) -> None:
        if m is None:
            progress.running(f"probe: run {n}/{runs}{last[0]}")
            return
        last[0] = f" (last: TTFT {_ms(m.ttft_s)}, {cell(m.tokens_per_s, 1)} tok/s)" if m.ok else ""
        if runs > 1:
            progress.done(f"probe: {_run_line(n, runs, m)}")

    return show


def _route_line(route: ToolRoute) -> str:
    if route.forward is None:
        return f"route: {route.described}"
    return (
        f"route: {route.described}; network = opening the connection ({route.connect_means}) "
        "+ one round trip to the forward proxy"
    )


def run(settings: ProbeSettings, out: TextIO = sys.stdout) -> int:
    """The `taotrace probe` command."""
    try:
        target = load_target(settings)
        url = parse_base_url(target.base_url)  # the same check, and the same words, as doctor's
        api_name(settings.api)
    except ValueError as exc:
        print(f"probe: {exc}", file=sys.stderr)
        return 2
    try:
        route = route_for(url, os.environ)  # a bad HTTPS_PROXY: one line, as `serve` says it
    except ValueError as exc:
        print(f"probe: {exc}; {BAD_VARIABLE_FIX}", file=sys.stderr)
        return 2
    results: list[Measurement] = []
    progress = Progress(sys.stderr)

    async def main() -> int | None:
        """None when the runs all ended, else the exit status of the signal that stopped them."""
        shutdown = signals()
        work = probe(settings, target, route, results=results, progress=_show(progress, settings.runs))
        return None if await unless_stopped(work, shutdown) is not None else interrupted_status(shutdown)

    stopped = asyncio.run(main())
    progress.clear()
    if stopped is not None:
        done = f"the {len(results)} finished are below" if results else "no run had finished"
        print(f"probe: interrupted during run {len(results) + 1} of {settings.runs}; {done}", file=sys.stderr)
    code = report(settings, target, results, out, route, interrupted=stopped is not None)
    return code if stopped is None else stopped
