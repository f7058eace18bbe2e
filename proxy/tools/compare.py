"""`taotrace compare`: which of two upstreams is faster for my prompts?

Sends the same prompts (built in, `--prompts FILE.jsonl`, or `--from-live URL`: requests a
running proxy captured) to two base URLs, round after round, each prompt to both targets back to
back in alternating (or random) order, and measures every stream as `probe` does
(`proxy.tools.client.measure`: TTFT, TPOT, tokens/s, the network's share from the kernel's
round trip). Then it prints both sides' p50/p95 next to each other, the difference of medians
with a bootstrap interval paired by prompt and round (`compare_stats`), a verdict that also
asks whether the difference is large enough to matter (`compare_verdict`), and the medians per
prompt; `--json` prints the same as one JSON document, `--plot FILE.svg` draws every request.

Progress goes to stderr: one line redrawn on a terminal, a line per request otherwise. Ctrl-C
stops at once and prints what was measured so far (exit 130; 143 for SIGTERM), as probe and
doctor do (`proxy.tools.stoppable`). Keys come from environment
variables (`--key-env NAME`, one for both targets or one each) and are never printed.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, TextIO, TypeVar

import aiohttp
from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from proxy.tools.client import Call, ConnectTimer, Measurement, api_name, measure, ms, tls_context
from proxy.tools.clientconfig import KEY_VARIABLES, parse_base_url, shown_url
from proxy.tools.compare_live import LiveError, live_prompts
from proxy.tools.compare_plan import LABELS, Sample, schedule
from proxy.tools.compare_plot import svg
from proxy.tools.compare_prompts import BUILTIN_PROMPTS, Prompt, PromptError, call_for, parse_jsonl
from proxy.tools.compare_report import TargetInfo, result, text
from proxy.tools.compare_verdict import Thresholds
from proxy.tools.route import ToolRoute, route_for
from proxy.tools.stoppable import interrupted_status, signals, unless_stopped

__all__ = ["CompareProgress", "CompareSettings", "Side", "compare", "load_prompts", "report", "run", "sides_from"]

T = TypeVar("T")
WARMUP_PROMPT = Prompt("warm-up", ({"role": "user", "content": "Say OK."},))


def _split_csv(value: object) -> object:
    """`a,b` from a flag or the environment, and a list of such (a repeated flag)."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return [part.strip() for item in value for part in item.split(",") if part.strip()]
    return value


class CompareSettings(BaseSettings):
    """Everything `taotrace compare` can be told."""

    model_config = SettingsConfigDict(env_prefix="TAOTRACE_", extra="ignore", populate_by_name=True)

    base_url: Annotated[list[str], NoDecode] = Field(
        [],
        description="a target's OpenAI-style base URL; give it twice: target A, then target B",
        json_schema_extra={"allowed": "two base URLs"},
    )
    model: str = Field("gpt-4o-mini", min_length=1, description="model name for both targets")
    model_a: str | None = Field(None, min_length=1, description="model for target A (default: --model)")
    model_b: str | None = Field(None, min_length=1, description="model for target B (default: --model)")
    key_env: Annotated[list[str], NoDecode] = Field(
        [],
        description="environment variable holding the API key: one for both targets, or two (A, then B); "
        "default $TAOTRACE_API_KEY, then $TAOTOKEN_API_KEY; never printed",
    )
    prompts: str | None = Field(None, description="JSONL file of prompts (default: a built-in set of short and long)")
    from_live: str | None = Field(
        None,
        description="take the prompts of recent requests from a running proxy's metrics URL (needs --capture-content there)",
    )
    ui_token: SecretStr | None = Field(None, description="the live view's token for --from-live; never printed")
    live_prompts: int = Field(10, ge=1, le=1000, description="how many distinct recent prompts --from-live takes")
    runs: int = Field(5, ge=1, le=1000, description="rounds: each prompt is sent this many times to each target")
    max_tokens: int = Field(64, ge=1, description="output cap per request (a prompt's own max_tokens wins)")
    api: Literal["chat", "completions", "responses", "messages"] = Field(
        "chat", description="dialect: chat (/chat/completions), completions, responses, messages"
    )
    order: Literal["alternate", "random"] = Field(
        "alternate", description="which target goes first for each prompt: alternate (A B, B A, ...) or random"
    )
    seed: int = Field(0, ge=0, description="seed of the random order and of the bootstrap")
    warmup: int = Field(1, ge=0, le=10, description="unmeasured requests per target first (opens the connection)")
    timeout: float = Field(60.0, gt=0, description="seconds allowed for connecting and between reads")
    json_output: bool = Field(False, description="print the result as JSON", json_schema_extra={"flag": "--json"})
    plot: str | None = Field(None, description="write a dot plot of TTFT and TPOT per prompt to this SVG file")
    min_diff_ms: float = Field(
        5.0,
        ge=0,
        allow_inf_nan=False,
        description="smallest difference of TTFT, network, server wait or total that matters, in ms "
        "(smaller ones, however certain, are no difference that matters; 0: no absolute threshold)",
    )
    min_tpot_diff_ms: float = Field(
        0.5,
        ge=0,
        allow_inf_nan=False,
        description="smallest difference per token that matters, in ms: TPOT, and tok/s as 1000/rate",
    )
    min_diff_percent: float = Field(
        5.0,
        ge=0,
        lt=100,
        allow_inf_nan=False,
        description="smallest difference that matters, in % of the slower side (|B - A| / the larger median); "
        "a difference matters when it reaches this and the absolute threshold",
    )

    _split = field_validator("base_url", "key_env", mode="before")(_split_csv)

    def thresholds(self) -> Thresholds:
        """The practical thresholds, in seconds and as a fraction."""
        return Thresholds(self.min_diff_ms / 1000.0, self.min_tpot_diff_ms / 1000.0, self.min_diff_percent / 100.0)


@dataclass(frozen=True)
class Side:
    """One target, resolved: where, which model, its key (never shown) and the way there."""

    base_url: str
    model: str
    api_key: str | None = field(repr=False)
    route: ToolRoute


def _key(names: Sequence[str], environ: Mapping[str, str], flag: bool) -> str | None:
    for name in names:
        if environ.get(name):
            return environ[name]
    if flag:
        raise ValueError(f"--key-env {names[0]}: ${names[0]} is not set")
    return None


def sides_from(settings: CompareSettings, environ: Mapping[str, str]) -> tuple[Side, Side]:
    """The two targets from the settings and the environment. Raises ValueError."""
    if len(settings.base_url) != 2:
        raise ValueError(f"give two targets, --base-url A --base-url B (got {len(settings.base_url)})")
    if len(settings.key_env) > 2:
        raise ValueError("--key-env takes one variable for both targets, or two: A's, then B's")
    models = (settings.model_a or settings.model, settings.model_b or settings.model)
    sides = []
    for i, base in enumerate(settings.base_url):
        url = parse_base_url(base)
        if settings.key_env:
            key = _key([settings.key_env[min(i, len(settings.key_env) - 1)]], environ, True)
        else:
            key = _key(KEY_VARIABLES, environ, False)
        sides.append(Side(base.rstrip("/"), models[i], key, route_for(url, environ)))
    return sides[0], sides[1]


def load_prompts(settings: CompareSettings) -> list[Prompt] | None:
    """The prompts from `--prompts` or the built-in set; None when `--from-live` gives them. Raises ValueError."""
    if settings.prompts and settings.from_live:
        raise ValueError("--prompts and --from-live both name the prompts: give one")
    if settings.from_live:
        return None
    if not settings.prompts:
        return list(BUILTIN_PROMPTS)
    try:
        content = Path(settings.prompts).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise PromptError(f"cannot read --prompts {settings.prompts}: {reason}") from None
    return parse_jsonl(content, settings.prompts)


class CompareProgress:
    """Where the run stands, on stderr: one line redrawn on a terminal, plain lines otherwise."""

    def __init__(self, stream: TextIO, tty: bool) -> None:
        self.stream = stream
        self.tty = tty

    def __call__(self, done: int, total: int, sample: Sample, prompt: str) -> None:
        m = sample.measurement
        what = f"TTFT {ms(m.ttft_s)}" if m.ok and m.ttft_s is not None else f"failed: {m.error}"
        line = f"compare {done}/{total}: {LABELS[sample.step.target]} {prompt} round {sample.step.round + 1}: {what}"
        if self.tty:
            self.stream.write("\r\x1b[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


Reporter = Callable[[int, int, Sample, str], None]


async def compare(
    settings: CompareSettings,
    sides: Sequence[Side],
    prompts: Sequence[Prompt],
    samples: list[Sample],
    progress: Reporter | None = None,
) -> str | None:
    """Measure the plan, appending to `samples` as it goes (so an interruption keeps them).
    Returns None, or why it stopped early (a target failing its warm-up)."""
    api = api_name(settings.api)
    steps = schedule(len(prompts), settings.runs, settings.order, random.Random(settings.seed))
    calls = [[call_for(p, api, side.model, settings.max_tokens, {}) for p in prompts] for side in sides]
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=settings.timeout, sock_read=settings.timeout)
    timers = [ConnectTimer() for _ in sides]
    sessions = [
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=tls_context()), timeout=timeout, trace_configs=[timer.config]
        )
        for timer in timers
    ]
    try:

        async def one(target: int, call: Call) -> Measurement:
            side = sides[target]
            return await measure(
                sessions[target],
                side.base_url,
                call,
                api_key=side.api_key,
                connect_timer=timers[target],
                route=side.route,
            )

        for target, side in enumerate(sides):
            for _ in range(settings.warmup):
                m = await one(target, call_for(WARMUP_PROMPT, api, side.model, 1, {}))
                if not m.ok:
                    return f"{LABELS[target]} ({shown_url(side.base_url)}) failed its warm-up request: {m.error}"
        for step in steps:
            sample = Sample(step, await one(step.target, calls[step.target][step.prompt]))
            samples.append(sample)
            if progress is not None:
                progress(len(samples), len(steps), sample, prompts[step.prompt].name)
    finally:
        for session in sessions:
            await session.close()
    return None


def report(
    settings: CompareSettings,
    sides: Sequence[Side],
    prompts: Sequence[Prompt],
    samples: Sequence[Sample],
    interrupted: bool,
    out: TextIO,
) -> dict[str, Any]:
    """Print the result (table or JSON) and return it."""
    doc = result(
        targets=[TargetInfo(shown_url(s.base_url), s.model) for s in sides],
        api=api_name(settings.api),
        prompts=prompts,
        rounds=settings.runs,
        order=settings.order,
        samples=samples,
        planned=2 * len(prompts) * settings.runs,
        interrupted=interrupted,
        rng=random.Random(settings.seed),
        thresholds=settings.thresholds(),
    )
    out.write(json.dumps(doc, indent=2) + "\n" if settings.json_output else text(doc))
    return doc


async def _live(settings: CompareSettings) -> list[Prompt]:
    timeout = aiohttp.ClientTimeout(total=settings.timeout)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        token = settings.ui_token.get_secret_value() if settings.ui_token is not None else None
        return await live_prompts(session, str(settings.from_live), token, settings.live_prompts)


async def _stoppable(work: Awaitable[T]) -> tuple[T] | int:
    """`work`'s result (boxed: it may be None), or the exit status of the signal that stopped it."""

    async def boxed() -> tuple[T]:
        return (await work,)

    shutdown = signals()
    ended = await unless_stopped(boxed(), shutdown)
    return interrupted_status(shutdown) if ended is None else ended


def run(settings: CompareSettings, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """The `taotrace compare` command (stdout and stderr unless told otherwise)."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        sides = sides_from(settings, os.environ)
        prompts = load_prompts(settings)
        if prompts is None:
            live = asyncio.run(_stoppable(_live(settings)))
            if isinstance(live, int):
                print("taotrace compare: interrupted while reading prompts from --from-live", file=err)
                return live
            prompts = live[0]
    except (ValueError, LiveError) as exc:
        print(f"taotrace compare: error: {exc}", file=err)
        return 2
    samples: list[Sample] = []
    progress = CompareProgress(err, err.isatty())
    ended = asyncio.run(_stoppable(compare(settings, sides, prompts, samples, progress)))
    progress.done()
    interrupted = isinstance(ended, int)
    stopped = None if isinstance(ended, int) else ended[0]
    if interrupted:
        planned = 2 * len(prompts) * settings.runs
        print(f"taotrace compare: interrupted after {len(samples)} of {planned} requests", file=err)
    if stopped is not None:
        print(f"taotrace compare: {stopped}", file=err)
        return 1
    doc = report(settings, sides, prompts, samples, interrupted, out)
    if settings.plot:
        try:
            Path(settings.plot).write_text(svg(doc), encoding="utf-8")
        except OSError as exc:
            print(f"taotrace compare: cannot write --plot {settings.plot}: {exc.strerror or exc}", file=err)
            return 1
        if not settings.json_output:
            out.write(f"plot: {settings.plot}\n")
    if isinstance(ended, int):
        return ended
    failed = doc["failed"]["A"] + doc["failed"]["B"]
    return 1 if failed or not samples else 0
