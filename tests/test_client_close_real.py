"""Real third-party clients that close the connection right after `data: [DONE]`, unmodified,
against an upstream that lingers before its end of body: the request is a success and the
upstream connection is reused by the next one.

Each test proves the client really leaves early: the proxy records its first request while the
upstream is still lingering (a client that waited for the end of body could not be recorded
before the upstream's handler returned). The linger is long (a CPU-starved client process may
take a while to close) and the discard bound longer still.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import openai
import pytest

from tests.conftest import Proxied, ProxyFactory
from tests.fakes import FakeUpstream, chat_stream, stream_handler

KEY = "sk-test-not-a-real-key"
LINGER = 2.0  # seconds between [DONE] and the end of the body, in the first request
DISCARD = 4.0  # the proxy's bound on reading the rest (--upstream-discard-seconds)
TEXT = "".join(f"tok{i} " for i in range(6))


async def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.01)


async def assert_early_close_then_reuse(p: Proxied, upstream: FakeUpstream, n: int) -> None:
    """Request `n` is a success; the first was recorded while the upstream still lingered. Then
    the upstream ended its body normally (no disconnect), the connection went back to the pool,
    and the next request gets an upstream that does not linger (the test need not wait again)."""
    await eventually(lambda: len(p.records) >= n)
    done = len(upstream.completed)
    rec = p.records[n - 1]
    if n == 1:
        assert done == 0, "the client waited for the end of the body: it did not close early"
    assert (rec.status_code, rec.error_type) == (200, "")
    assert rec.usage.output_tokens == 6 and rec.timing.tpot is not None
    await eventually(lambda: len(upstream.completed) == n)
    assert upstream.disconnected == []  # read to its end by the proxy, not cut
    await asyncio.sleep(0.1)  # the end of body reaches the proxy; the connection returns to the pool
    upstream.handler = stream_handler(chat_stream(6), gap=0.005)


@pytest.fixture
def lingering(upstream: FakeUpstream) -> FakeUpstream:
    upstream.handler = stream_handler(chat_stream(6), gap=0.005, linger=LINGER)
    return upstream


def sync_sdk_stream(base_url: str) -> str:
    """The sync OpenAI SDK exactly as its README shows it: a plain `for chunk in stream`."""
    client = openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0)
    stream = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text = ""
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    client.close()
    return text


async def test_openai_sync_sdk_closes_after_done(start_proxy: ProxyFactory, lingering: FakeUpstream) -> None:
    async with start_proxy(upstream_discard_seconds=DISCARD) as p:
        for n in (1, 2):
            assert await asyncio.to_thread(sync_sdk_stream, p.url + "/v1") == TEXT
            await assert_early_close_then_reuse(p, lingering, n)
        assert p.records[0].timing.connection_reused is False
        assert p.records[1].timing.connection_reused is True


def _llm_env(tmp_path: Path, base_url: str) -> dict[str, str]:
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: proxied\n  model_name: gpt-4o-mini\n  api_base: {base_url}\n  api_key_name: proxied\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "LLM_"))}
    env["LLM_USER_PATH"] = str(tmp_path)
    return env


async def test_llm_cli_closes_after_done(start_proxy: ProxyFactory, lingering: FakeUpstream, tmp_path: Path) -> None:
    """Simon Willison's `llm` CLI (PyPI `llm`), as a separate process, configured only through
    its own `extra-openai-models.yaml`."""
    llm = shutil.which("llm", path=str(Path(sys.executable).parent))
    assert llm is not None, "the `llm` CLI is part of the dev extra"
    async with start_proxy(upstream_discard_seconds=DISCARD) as p:
        env = _llm_env(tmp_path, p.url + "/v1")
        for n in (1, 2):
            proc = await asyncio.create_subprocess_exec(
                llm, "-m", "proxied", "--key", KEY, "--no-log", "hi",
                env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, err.decode()
            assert out.decode().strip() == TEXT.strip()
            await assert_early_close_then_reuse(p, lingering, n)
        assert p.records[1].timing.connection_reused is True


async def test_langchain_chat_openai_stream_closes_after_done(
    start_proxy: ProxyFactory, lingering: FakeUpstream
) -> None:
    """LangChain's `ChatOpenAI` (`langchain-openai`), streaming with its sync `.stream()`."""
    from langchain_openai import ChatOpenAI

    async with start_proxy(upstream_discard_seconds=DISCARD) as p:

        def stream() -> str:
            # `model`, `base_url` and `api_key` are aliases of LangChain's pydantic fields, which
            # the pydantic mypy plugin does not resolve for a third-party model.
            chat = ChatOpenAI(  # type: ignore[call-arg]
                model="gpt-4o-mini", base_url=p.url + "/v1", api_key=KEY, max_retries=0, stream_usage=True
            )
            return "".join(str(chunk.content) for chunk in chat.stream("hi"))

        for n in (1, 2):
            assert await asyncio.to_thread(stream) == TEXT
            await assert_early_close_then_reuse(p, lingering, n)
        assert p.records[1].timing.connection_reused is True
