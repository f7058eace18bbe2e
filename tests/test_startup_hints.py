"""What `serve` says at start about an upstream URL that cannot be what was meant (proxy/server/hints.py)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from yarl import URL

from proxy.server.hints import endpoint_suffix


@pytest.mark.parametrize(
    ("upstream_url", "fixed"),
    [
        ("http://user:secret@127.0.0.1:9/api/v1/chat/completions", "--upstream http://127.0.0.1:9/api,"),
        ("http://127.0.0.1:9/v1/messages/", "--upstream http://127.0.0.1:9,"),
        (
            "http://127.0.0.1:9/v1beta/openai/chat/completions",
            "--upstream http://127.0.0.1:9/v1beta/openai,",
        ),
        ("http://127.0.0.1:9/embeddings", "--upstream http://127.0.0.1:9,"),
    ],
)
async def test_serve_says_at_start_that_the_upstream_has_an_endpoint_path_glued_on(
    upstream_url: str, fixed: str
) -> None:
    """`--upstream …/v1/chat/completions` (an endpoint copied whole) sends every request to a path
    that doubles it: `serve` says so in its first lines, without the URL's password."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "serve", "--upstream", upstream_url, "--port", "0", "--metrics-port", "0",
        cwd=Path(__file__).resolve().parent.parent, stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        while not any("taotrace proxy on" in line for line in lines):
            line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
            assert line, "".join(lines)
            lines.append(line)
    finally:
        proc.terminate()
        await proc.wait()
    said = [line for line in lines if "ends with the endpoint path" in line]
    assert len(said) == 1 and fixed in said[0] and "secret" not in "".join(lines), lines


def test_no_start_warning_for_an_upstream_base() -> None:
    for base in (
        "https://taotoken.net/api", "http://127.0.0.1:8000/v1", "http://h/v1/chat", "http://h/models-eu",
        "https://api-inference.huggingface.co/models",
    ):  # fmt: skip
        assert endpoint_suffix(URL(base)) is None, base
