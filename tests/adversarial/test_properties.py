"""Property-based tests (hypothesis): the SSE decoder against a reference reading of the spec,
and the header rules against any header set."""

from __future__ import annotations

import time
from typing import get_args

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.dialects.sse import SSEDecoder, SSEEvent
from proxy.exchange.headers import HOP_BY_HOP, ForwardedFor, request_headers, response_headers

# --- SSE ------------------------------------------------------------------------------------

_EOL = st.sampled_from([b"\n", b"\r\n", b"\r"])
_text = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=["Cs"]), max_size=30)
_field = st.sampled_from([b"data", b"event", b"id", b"retry", b"x-unknown", b""])


@st.composite
def _line(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["field", "comment", "bare"]))
    value = draw(_text).encode()
    if kind == "comment":
        return b":" + value
    if kind == "bare":
        return draw(_field) or b"data"
    space = draw(st.sampled_from([b"", b" ", b"  "]))
    return draw(_field) + b":" + space + value


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    """Valid event streams: lines with mixed line endings, blank lines between events, maybe a BOM."""
    out = [b"\xef\xbb\xbf"] if draw(st.booleans()) else []
    for _ in range(draw(st.integers(0, 12))):
        for line in draw(st.lists(_line(), max_size=5)):
            out += [line, draw(_EOL)]
        out.append(draw(_EOL))
    return b"".join(out)


def reference(stream: bytes) -> list[SSEEvent]:
    """The WHATWG algorithm, read literally, on the whole stream at once."""
    if stream.startswith(b"\xef\xbb\xbf"):
        stream = stream[3:]
    lines = stream.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    lines.pop()  # an unfinished last line is never processed
    events: list[SSEEvent] = []
    data: list[bytes] = []
    event, last_id = "", None
    for line in lines:
        if not line:
            if data:
                events.append(SSEEvent(event or "message", b"\n".join(data), last_id))
            data, event = [], ""
            continue
        if line.startswith(b":"):
            continue
        name, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            data.append(value)
        elif name == b"event":
            event = value.decode("utf-8", "replace")
        elif name == b"id" and b"\x00" not in value:
            last_id = value.decode("utf-8", "replace")
    return events


def _feed(stream: bytes, cuts: list[int], decoder: SSEDecoder | None = None) -> list[SSEEvent]:
    decoder = decoder or SSEDecoder()
    events: list[SSEEvent] = []
    prev = 0
    for cut in [*sorted(set(cuts)), len(stream)]:
        events += decoder.feed(stream[prev:cut])
        prev = cut
    return events


@settings(max_examples=200, deadline=None)
@given(stream=streams(), data=st.data())
def test_any_split_of_a_valid_stream_gives_the_spec_events(stream: bytes, data: st.DataObject) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=len(stream) // 2 + 1))
    assert _feed(stream, cuts) == reference(stream)


@settings(max_examples=100, deadline=None)
@given(stream=streams())
def test_byte_by_byte_equals_all_at_once(stream: bytes) -> None:
    assert _feed(stream, list(range(len(stream)))) == _feed(stream, []) == reference(stream)


@settings(max_examples=400, deadline=None)
@given(chunks=st.lists(st.binary(max_size=200), max_size=30))
def test_arbitrary_bytes_never_raise_and_memory_is_capped(chunks: list[bytes]) -> None:
    decoder = SSEDecoder(max_event_bytes=256)
    for chunk in chunks:
        for event in decoder.feed(chunk):
            assert len(event.data) <= 256
        assert decoder._held <= 256  # the unfinished-line buffer never outgrows the cap
        assert decoder._size <= 256 + 1
    decoder.flush()


@settings(max_examples=100, deadline=None)
@given(size=st.integers(300, 5000), piece=st.integers(1, 97), data=st.data())
def test_oversize_events_are_dropped_whole_and_parsing_resumes(size: int, piece: int, data: st.DataObject) -> None:
    eol = data.draw(_EOL)
    big = b"event: big" + eol + b"data: " + b"x" * size + eol + eol
    small = b"data: after" + eol + eol
    stream = b"data: before" + eol + eol + big + small
    events = _feed(stream, list(range(0, len(stream), piece)), SSEDecoder(max_event_bytes=256))
    assert [e.data for e in events] == [b"before", b"after"]
    assert all(e.event == "message" for e in events)


def test_a_long_line_in_small_reads_costs_linear_time() -> None:
    decoder = SSEDecoder()
    piece = b"y" * 100
    t = time.process_time()  # CPU time: what the decoder costs, not how busy the machine is
    decoder.feed(b"data: ")
    for _ in range(40_000):  # 4 MB of one line, 100 bytes per read
        decoder.feed(piece)
    assert decoder.feed(b"\n\ndata: ok\n\n") == [SSEEvent("message", b"ok")]
    assert time.process_time() - t < 1.0  # was 10 s when each read re-copied the held line


# --- headers --------------------------------------------------------------------------------

_TOKEN = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_names = st.one_of(
    st.sampled_from(
        sorted(HOP_BY_HOP)
        + [
            "Connection",
            "Host",
            "Content-Length",
            "Expect",
            "Authorization",
            "X-Api-Key",
            "Cookie",
            "traceparent",
            "X-Forwarded-For",
            "Forwarded",
            "Content-Type",
            "Keep-Alive",
            "TE",
            "x-custom",
        ]
    ).map(lambda n: "".join(c.upper() if i % 2 else c for i, c in enumerate(n))),  # any letter case
    st.text(_TOKEN, min_size=1, max_size=12),
)
_values = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    headers=st.lists(st.tuples(_names, _values), max_size=20),
    peer=st.one_of(st.none(), st.just("10.0.0.7"), st.just("2001:db8::1")),
    mode=st.sampled_from(get_args(ForwardedFor)),
)
def test_header_rules_hold_for_any_header_set(
    headers: list[tuple[str, str]], peer: str | None, mode: ForwardedFor
) -> None:
    named = {
        token.strip().lower()
        for k, v in headers
        if k.lower() == "connection"
        for token in v.split(",")
        if token.strip()
    }
    never = HOP_BY_HOP | named | {"host", "content-length", "expect"}
    added = {"append": "x-forwarded-for", "forwarded": "forwarded", "off": ""}[mode]
    for out in (request_headers(headers, peer, mode), response_headers(headers)):
        for key, value in out.items():
            assert key.lower() not in never or key.lower() == added
            assert "\r" not in value and "\n" not in value
    if peer and mode != "off":  # the proxy's hop: one header, last
        names = [k.lower() for k in request_headers(headers, peer, mode)]
        assert names.count(added) == 1 and names[-1] == added
    # Everything end-to-end passes, in order, untouched.
    sent = request_headers(headers, None)
    kept = [(k, v) for k, v in headers if k.lower() not in never]
    assert list(sent.items()) == kept


# --- dialect readers ------------------------------------------------------------------------

from proxy.dialects import (
    API_CHAT,
    API_COMPLETIONS,
    API_MESSAGES,
    API_RESPONSES,
    Usage,
    inspect_request,
    read_body,
    reader_for,
)

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["choices", "delta", "content", "text", "tool_calls", "function", "arguments", "usage",
                         "prompt_tokens", "completion_tokens", "input_tokens", "output_tokens", "prompt_tokens_details",
                         "cached_tokens", "type", "response", "message", "error", "id", "model", "finish_reason",
                         "stop_reason", "status", "incomplete_details", "reason", "cache_read_input_tokens",
                         "thinking", "partial_json", "reasoning_content", "refusal", "output_tokens_details"]),
        inner, max_size=5),
    max_leaves=25,
)  # fmt: skip
_KEYS = st.sampled_from(
    ["choices", "delta", "content", "text", "tool_calls", "function", "usage", "type", "response", "message",
     "error", "id", "model", "finish_reason", "stop_reason", "status", "incomplete_details"]
)  # fmt: skip
# Top-level objects whose known keys hold anything at all, two levels deep.
_objects = st.dictionaries(_KEYS, st.one_of(_json, st.dictionaries(_KEYS, _json, max_size=4)), max_size=5)
_kinds = st.sampled_from(
    ["message", "message_start", "message_delta", "content_block_delta", "error", "ping", "response.created",
     "response.completed", "response.failed", "response.output_text.delta", "response.incomplete"]
)  # fmt: skip
_APIS = [API_CHAT, API_COMPLETIONS, API_RESPONSES, API_MESSAGES]


@settings(max_examples=200, deadline=None)
@given(api=st.sampled_from(_APIS), events=st.lists(st.tuples(_kinds, st.one_of(_json, _objects)), max_size=6))
def test_dialect_readers_never_raise_on_any_json(api: str, events: list[tuple[str, object]]) -> None:
    import orjson

    reader = reader_for(api, capture_content=True)
    assert reader is not None
    for kind, obj in events:
        try:
            data = orjson.dumps(obj)
        except TypeError:  # ints beyond 64 bits: orjson will not write them; json will
            import json

            data = json.dumps(obj).encode()
        reader.feed(SSEEvent(kind, data))
        read_body(api, data, capture_content=True)
        inspect_request(api, data, capture_content=True)
    assert reader.usage is None or all(v is None or (isinstance(v, int) and v >= 0) for v in vars_of(reader.usage))


def vars_of(usage: Usage) -> list[int | None]:
    return [usage.input_tokens, usage.output_tokens, usage.cached_input_tokens, usage.reasoning_tokens]


# --- headers, end to end --------------------------------------------------------------------

from tests.adversarial.util import raw_request

_wire_names = st.one_of(
    st.sampled_from(sorted(HOP_BY_HOP) + ["Connection", "Host", "Content-Length", "Expect", "X-Forwarded-For"]),
    st.text(_TOKEN, min_size=1, max_size=12),
)
_wire_values = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30).map(str.strip)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(headers=st.lists(st.tuples(_wire_names, _wire_values), max_size=12))
async def test_any_header_set_through_the_proxy(proxy, upstream, headers: list[tuple[str, str]]) -> None:
    """Whatever headers a client sends: never a 500, never a hop-by-hop header upstream."""
    framing = {"content-length", "transfer-encoding", "host", "expect"}
    lines = [f"{k}: {v}" for k, v in headers if k.lower() not in framing]
    data = ("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n" + "".join(
        line + "\r\n" for line in lines) + "Connection: close\r\n\r\n{}").encode()  # fmt: skip
    before = len(upstream.seen)
    out = await raw_request(proxy.url, data, timeout=3)
    assert out.startswith(b"HTTP/1.")
    status = int(out.split(b" ", 2)[1])
    assert status != 500 and status < 600
    if len(upstream.seen) > before:
        seen = upstream.seen[-1].headers
        named = {t.strip().lower() for k, v in headers if k.lower() == "connection" for t in v.split(",")}
        # aiohttp sets Host and Content-Length itself; the proxy adds X-Forwarded-For and traceparent.
        forbidden = (HOP_BY_HOP | named) - {"content-length", "host", "x-forwarded-for", "traceparent"}
        assert not [key for key in seen if key.lower() in forbidden]
        assert seen.get("Host") == upstream.url.removeprefix("http://")
