"""`taotrace compare --from-live URL`: the prompts of recent requests, read from a running proxy.

The proxy must run with `--capture-content`: then its live view (on the metrics port) keeps each
request's input, and `/api/requests/{id}` returns it. With `--ui-token` set there, the same token
goes here as `Authorization: Bearer`; it is never printed. Only successful requests of the four
parsed dialects are taken, newest first, each distinct input once.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from proxy.tools.compare_prompts import Prompt, PromptError, prompt_from

__all__ = ["LiveError", "live_prompts"]

_DIALECTS = ("chat_completions", "completions", "responses", "messages")


class LiveError(ValueError):
    """The live view could not give prompts; the message says why and what to do."""


async def _get(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> Any:
    try:
        async with session.get(url, headers=headers) as response:
            if response.status == 401:
                raise LiveError(
                    "the live view wants its token: pass --ui-token (or set TAOTRACE_UI_TOKEN) as given to serve"
                )
            if response.status == 404 and "/api/requests/" not in url:
                raise LiveError("no live view there: give the proxy's metrics URL (e.g. http://127.0.0.1:9464)")
            if response.status != 200:
                raise LiveError(f"the live view answered HTTP {response.status}")
            return await response.json(content_type=None)
    except aiohttp.ClientConnectorError as exc:
        raise LiveError(f"cannot connect to {exc.host}:{exc.port}: {exc.os_error.strerror or exc.os_error}") from None
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
        raise LiveError(f"cannot read the live view ({type(exc).__name__})") from None


def _captured(detail: Any) -> str | None:
    """The captured input of one request's detail, wherever this proxy keeps it."""
    record = detail.get("record") if isinstance(detail, dict) else None
    if not isinstance(record, dict):
        return None
    content = record.get("input_content")
    return content if isinstance(content, str) else None


async def live_prompts(session: aiohttp.ClientSession, metrics_url: str, token: str | None, want: int) -> list[Prompt]:
    """Up to `want` distinct prompts from the newest successful requests. Raises LiveError."""
    base = metrics_url.rstrip("/")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    page = await _get(session, f"{base}/api/requests", headers)
    rows = page.get("requests") if isinstance(page, dict) else None
    if not isinstance(rows, list):
        raise LiveError("no live view there: give the proxy's metrics URL (e.g. http://127.0.0.1:9464)")
    capacity = page.get("capacity")
    if isinstance(capacity, int) and len(rows) < min(want * 4, capacity) and len(rows) < page.get("size", 0):
        page = await _get(session, f"{base}/api/requests?limit={min(want * 4, capacity)}", headers)
        rows = page.get("requests", [])
    prompts: list[Prompt] = []
    seen: set[str] = set()
    candidates = [r for r in rows if isinstance(r, dict) and r.get("status") == 200 and r.get("api") in _DIALECTS]
    for row in candidates:
        if len(prompts) >= want:
            break
        content = _captured(await _get(session, f"{base}/api/requests/{row.get('id')}", headers))
        if content is None or content in seen:
            continue
        seen.add(content)
        try:
            prompts.append(prompt_from(json.loads(content), f"live-{row.get('seq')}"))
        except (PromptError, json.JSONDecodeError):
            continue  # e.g. a completions prompt given as token ids: nothing to replay
    if not prompts:
        why = "no successful requests yet" if not candidates else "no captured input"
        raise LiveError(
            f"the live view has {why}: run serve with --capture-content, send some requests through it, then retry"
        )
    return prompts
