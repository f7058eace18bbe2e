"""The bench upstream's streams (tests/bench/payload.py) read by the proxy's own dialect readers:
each dialect's tokens are exactly the events the benchmark stamps as first and last token."""

from __future__ import annotations

import pytest

from proxy.dialects import DIALECTS
from proxy.dialects.sse import SSEDecoder
from tests.bench.payload import APIS, PATHS, api_for_path, stream_parts


@pytest.mark.parametrize("api", APIS)
def test_each_dialects_tokens_are_the_events_stamped(api: str) -> None:
    n = 5
    head, tokens, tail = stream_parts(api, "bench-model", n)
    assert api_for_path(PATHS[api]) == api
    dialect = DIALECTS.for_path(PATHS[api])
    assert dialect is not None and dialect.api == api
    reader, decoder = dialect.stream_reader(False), SSEDecoder()
    is_token = [any(reader.feed(e) for e in decoder.feed(event)) for event in (*head, *tokens, *tail)]
    assert is_token == [False] * len(head) + [True] * n + [False] * len(tail)
    assert reader.done  # the tail ends with the dialect's terminal event
    assert reader.usage is not None and reader.usage.output_tokens == n  # reported, as the upstream says
