"""A small, bounded load generator for the taotrace demo stack.

Sends a steady mix of requests through the proxy so the dashboards fill up with no API key:
all four dialects (chat completions, legacy completions, responses, Anthropic messages),
mostly streamed, across the simulator's models, with a shared long preamble (so the
upstream's prefix cache produces cached input tokens), plus a small share of failures that
`taotrace sim` injects on request (`x-sim-fail`: 429, 500, 503, midstream error, cut) and of
unknown models (404). The first round sends one of every kind, so every panel has data at once.
Requests come from three users (the body's `user` / `metadata.user_id`) on two API keys
(`--api-key` with `-team-a` / `-team-b` appended), so spans show who sent what.

    python deploy/loadgen.py --base-url http://localhost:8787 --concurrency 4 --duration 0

`--duration 0` runs until stopped (SIGTERM / Ctrl-C); `--requests N` stops after N requests.
Every flag also reads from the environment as LOADGEN_<FLAG> (e.g. LOADGEN_BASE_URL).
Needs the taotrace package (its request builder) and aiohttp: the taotrace image has both.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass

import aiohttp

from proxy.tools.client import Call, auth_headers, request_for

APIS = ("chat_completions", "completions", "responses", "messages")
MODELS = ("gpt-4o-mini", "gpt-4o", "o3-mini")
FAILURES = ("429", "500", "503", "midstream", "cut")
UNKNOWN_MODEL = "no-such-model"
USERS = ("alice", "bob", "carol")  # alice and bob share team-a's key, carol has team-b's
TEAMS = {"alice": "team-a", "bob": "team-a", "carol": "team-b"}
MAX_TOKENS = 48

# Long enough to fill several KV-cache blocks: every prompt starts with it, so repeated
# requests hit the upstream's prefix cache.
PREAMBLE = (
    "You are a concise assistant for an operations team. Answer in plain sentences, cite the "
    "metric names you rely on, and never invent numbers. " * 12
).strip()
QUESTIONS = (
    "Why would time to first token grow while decode speed stays the same?",
    "Explain the difference between TTFT and TPOT in two sentences.",
    "What does a rising prefill_wait share tell an operator?",
    "List three reasons a stream can be cut in the middle.",
    "How does a prefix cache reduce the cost of a long system prompt?",
)


@dataclass(frozen=True)
class Shot:
    """One request to send."""

    api: str
    model: str
    stream: bool
    failure: str | None = None


def body_for(shot: Shot, question: str, user: str | None = None) -> tuple[str, dict[str, object]]:
    """The path (under /v1) and JSON body of a request in the shot's dialect: the proxy's own
    client builds it (so the four dialects look as `taotrace probe` sends them); the shared
    preamble leads the prompt, where the upstream's prefix cache can serve it. `user` goes where
    each provider takes the caller's own user id."""
    path, body = request_for(Call(shot.api, shot.model, f"{PREAMBLE}\n\n{question}", MAX_TOKENS))
    if not shot.stream:
        body["stream"] = False
        body.pop("stream_options", None)
    if user is not None:
        if shot.api == "messages":
            body["metadata"] = {"user_id": user}
        else:
            body["user"] = user
    return path, body


def first_round() -> list[Shot]:
    """One of every kind: each dialect streamed and not, each model, each failure, a 404."""
    shots = [Shot(api, MODELS[i % len(MODELS)], stream=True) for i, api in enumerate(APIS)]
    shots += [Shot(api, "gpt-4o-mini", stream=False) for api in APIS]
    shots += [Shot("chat_completions", model, stream=True) for model in MODELS]
    shots += [Shot(APIS[i % len(APIS)], "gpt-4o-mini", stream=True, failure=f) for i, f in enumerate(FAILURES)]
    shots.append(Shot("chat_completions", UNKNOWN_MODEL, stream=True))
    return shots


def random_shot(rng: random.Random, error_share: float) -> Shot:
    api = rng.choice(APIS)
    roll = rng.random()
    if roll < error_share * 0.8:
        return Shot(api, rng.choice(MODELS), stream=True, failure=rng.choice(FAILURES))
    if roll < error_share:
        return Shot(api, UNKNOWN_MODEL, stream=True)
    return Shot(api, rng.choice(MODELS), stream=rng.random() < 0.85)


async def send(
    session: aiohttp.ClientSession, base_url: str, shot: Shot, question: str, api_key: str, user: str | None = None
) -> str:
    """Send one request (as `user`, on that user's team key) and read the whole answer; returns
    an outcome word for the summary."""
    path, body = body_for(shot, question, user)
    headers = auth_headers(shot.api, f"{api_key}-{TEAMS[user]}" if user is not None else api_key)
    if shot.failure:
        headers["x-sim-fail"] = shot.failure
    try:
        async with session.post(base_url.rstrip("/") + "/v1" + path, json=body, headers=headers) as resp:
            await resp.read()
            return str(resp.status)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return type(exc).__name__


async def run(args: argparse.Namespace) -> Counter[str]:
    rng = random.Random(args.seed)
    queue: list[Shot] = first_round()
    outcomes: Counter[str] = Counter()
    sent = 0
    stop = asyncio.Event()
    deadline = time.monotonic() + args.duration if args.duration > 0 else None

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - not on this platform
            pass

    def next_shot() -> Shot | None:
        nonlocal sent
        if stop.is_set() or (deadline is not None and time.monotonic() >= deadline):
            return None
        if args.requests and sent >= args.requests:
            return None
        sent += 1
        return queue.pop(0) if queue else random_shot(rng, args.error_share)

    async def worker(session: aiohttp.ClientSession) -> None:
        while (shot := next_shot()) is not None:
            question, user = rng.choice(QUESTIONS), rng.choice(USERS)
            outcomes[await send(session, args.base_url, shot, question, args.api_key, user)] += 1
            if args.pause > 0:
                try:
                    await asyncio.wait_for(stop.wait(), timeout=rng.uniform(0, 2 * args.pause))
                except asyncio.TimeoutError:
                    pass

    async def reporter() -> None:
        # A line now and then, so `docker compose logs loadgen` shows it is alive.
        while args.report_every > 0:
            try:
                await asyncio.wait_for(stop.wait(), timeout=args.report_every)
                return
            except asyncio.TimeoutError:
                print(json.dumps({"requests": sum(outcomes.values()), "outcomes": dict(outcomes)}), flush=True)

    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=args.read_timeout)
    # The proxy may still be starting (compose starts both at once): wait for it, bounded.
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for _ in range(60):
            try:
                async with session.get(args.base_url.rstrip("/") + "/v1/models") as resp:
                    await resp.read()
                    break
            except aiohttp.ClientError:
                await asyncio.sleep(1)
        report = asyncio.create_task(reporter())
        await asyncio.gather(*(worker(session) for _ in range(args.concurrency)))
        report.cancel()
    return outcomes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--base-url",
        default=env("LOADGEN_BASE_URL", "http://localhost:8787"),
        help="the proxy (requests go to BASE/v1/...)",
    )
    p.add_argument("--concurrency", type=int, default=int(env("LOADGEN_CONCURRENCY", "4")))
    p.add_argument(
        "--duration", type=float, default=float(env("LOADGEN_DURATION", "0")), help="seconds to run; 0 = until stopped"
    )
    p.add_argument(
        "--requests",
        type=int,
        default=int(env("LOADGEN_REQUESTS", "0")),
        help="stop after this many requests; 0 = no limit",
    )
    p.add_argument(
        "--pause",
        type=float,
        default=float(env("LOADGEN_PAUSE", "0.5")),
        help="mean seconds a worker waits between requests",
    )
    p.add_argument(
        "--error-share",
        type=float,
        default=float(env("LOADGEN_ERROR_SHARE", "0.05")),
        help="share of requests that ask the simulator for a failure or name no model",
    )
    p.add_argument("--read-timeout", type=float, default=float(env("LOADGEN_READ_TIMEOUT", "60")))
    p.add_argument("--api-key", default=env("LOADGEN_API_KEY", "sk-demo"))
    p.add_argument("--seed", type=int, default=int(env("LOADGEN_SEED", "7")))
    p.add_argument(
        "--report-every",
        type=float,
        default=float(env("LOADGEN_REPORT_EVERY", "60")),
        help="seconds between progress lines; 0 = only the final summary",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    outcomes = asyncio.run(run(args))
    total = sum(outcomes.values())
    print(json.dumps({"requests": total, "seconds": round(time.monotonic() - started, 1), "outcomes": dict(outcomes)}))
    return 0 if total else 1


if __name__ == "__main__":
    sys.exit(main())
