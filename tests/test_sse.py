"""The SSE decoder against the WHATWG spec's rules and examples, at every split of the input."""

from __future__ import annotations

import pytest

from proxy.dialects.sse import SSEDecoder, SSEEvent


def decode_all(data: bytes, **kw: int) -> list[SSEEvent]:
    decoder = SSEDecoder(**kw)
    return decoder.feed(data) + decoder.flush()


def decode_split(data: bytes, cut: int) -> list[SSEEvent]:
    decoder = SSEDecoder()
    return decoder.feed(data[:cut]) + decoder.feed(data[cut:]) + decoder.flush()


SPEC_STREAM = (
    b"\xef\xbb\xbf: this is a test stream\r\n\r\n"
    b"data: some text\r\n\r\n"
    b"data: another message\rdata: with two lines \r\r"
    b"event: add\ndata: 73857293\n\n"
    b"id: 7\nretry: 10\nfoo: bar\ndata:no space\n\n"
    b"data\n\ndata:\n\n"
)
EXPECTED = [
    SSEEvent("message", b"some text"),
    SSEEvent("message", b"another message\nwith two lines "),
    SSEEvent("add", b"73857293"),
    SSEEvent("message", b"no space", "7"),
    SSEEvent("message", b"", "7"),
    SSEEvent("message", b"", "7"),
]


def test_spec_rules_in_one_read() -> None:
    assert decode_all(SPEC_STREAM) == EXPECTED


@pytest.mark.parametrize("cut", range(len(SPEC_STREAM) + 1))
def test_every_split_offset_gives_the_same_events(cut: int) -> None:
    assert decode_split(SPEC_STREAM, cut) == EXPECTED


def test_one_byte_reads() -> None:
    decoder = SSEDecoder()
    events = [e for i in range(len(SPEC_STREAM)) for e in decoder.feed(SPEC_STREAM[i : i + 1])]
    assert events == EXPECTED


def test_cr_at_end_of_read_pairs_with_lf_at_start_of_next() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    # the LF belongs to the CR: it must not count as a blank line
    assert decoder.feed(b"\ndata: b\r\n\r\n") == [SSEEvent("message", b"a\nb")]


def test_spec_example_two_events_and_a_comment() -> None:
    # WHATWG example: "data: first event / data: second event / id / data:  third event"
    stream = b"data: first event\nid: 1\n\ndata:second event\nid\n\ndata:  third event\n\n"
    assert decode_all(stream) == [
        SSEEvent("message", b"first event", "1"),
        SSEEvent("message", b"second event", ""),
        SSEEvent("message", b" third event", ""),
    ]


def test_event_without_terminating_blank_line_is_discarded() -> None:
    assert decode_all(b"data: complete\n\ndata: cut off") == [SSEEvent("message", b"complete")]


def test_event_type_resets_after_dispatch() -> None:
    events = decode_all(b"event: ping\ndata: {}\n\ndata: x\n\n")
    assert [e.event for e in events] == ["ping", "message"]


def test_oversized_event_is_dropped_and_parsing_recovers() -> None:
    big = b"data: " + b"x" * 5000 + b"\n\n"
    assert decode_all(big + b"data: ok\n\n", max_event_bytes=1024) == [SSEEvent("message", b"ok")]


def test_endless_line_keeps_memory_bounded() -> None:
    decoder = SSEDecoder(max_event_bytes=4096)
    for _ in range(1000):
        assert decoder.feed(b"y" * 1000) == []
    assert len(decoder._tail) <= 4096 + 1000
    assert decoder.feed(b"\n\ndata: after\n\n") == [SSEEvent("message", b"after")]


def test_arbitrary_garbage_never_raises() -> None:
    data = bytes(range(256)) * 4 + b"\r\r\n\n:\x00data\xff: \x80\n\n"
    for cut in range(0, len(data), 7):
        decode_split(data, cut)
