"""What every dialect's reader shares: the `StreamReader` base, `Usage`, and the JSON helpers.

A reader is pure: SSE events in (`feed`), or a whole JSON body (`read_body`), state out (usage,
finish reasons, response id and model, a mid-stream error, `done`). Nothing here raises on bad
input: a body that is not what the dialect promises degrades to "unknown", never to an error.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import orjson

from proxy.dialects.content import Output, bounded_json
from proxy.dialects.sse import SSEEvent

__all__ = [
    "ANSWER",
    "MAX_MODEL_LENGTH",
    "NOT_TOKEN",
    "REASONING",
    "StreamReader",
    "Usage",
    "is_chunk",
    "items",
    "loads",
    "model_name",
    "nonempty",
    "nonneg_int",
    "openai_output_type",
    "openai_usage",
]

MAX_MODEL_LENGTH = 256

# What `StreamReader.feed` answers for one event: no token (falsy), a token of the answer (text,
# refusal, tool-call arguments), or a token of the model's reasoning (streamed thinking). Plain
# ints, compared once per event; a reader returning a bool (a plug-in's) gives NOT_TOKEN or ANSWER.
NOT_TOKEN: Final = 0
ANSWER: Final = 1
REASONING: Final = 2


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage as the upstream reported it; None where it said nothing."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_input_tokens: int | None = None
    reasoning_tokens: int | None = None
    cache_creation_input_tokens: int | None = None  # written to the provider's cache (Anthropic)


def loads(data: bytes) -> Any:
    """The JSON value of `data`, or None when it is not JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def nonneg_int(value: object) -> int | None:
    """A token count: a non-negative int (never a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def model_name(value: object) -> str | None:
    """A model name fit for a label and a span: a short printable string, else None."""
    if isinstance(value, str) and 0 < len(value) <= MAX_MODEL_LENGTH and value.isprintable():
        return value
    return None


def items(value: object) -> list[Any]:
    """A JSON array, or nothing: `"choices": 5` must not raise (upstreams lie)."""
    return value if isinstance(value, list) else []


def nonempty(value: object) -> bool:
    return isinstance(value, str) and value != ""


def openai_usage(u: object) -> Usage | None:
    """Chat/completions (`prompt_tokens`…) and Responses (`input_tokens`…) usage objects."""
    if not isinstance(u, dict):
        return None
    in_details = u.get("prompt_tokens_details") or u.get("input_tokens_details") or {}
    out_details = u.get("completion_tokens_details") or u.get("output_tokens_details") or {}
    return Usage(
        input_tokens=nonneg_int(u.get("prompt_tokens", u.get("input_tokens"))),
        output_tokens=nonneg_int(u.get("completion_tokens", u.get("output_tokens"))),
        cached_input_tokens=nonneg_int(in_details.get("cached_tokens")) if isinstance(in_details, dict) else None,
        reasoning_tokens=nonneg_int(out_details.get("reasoning_tokens")) if isinstance(out_details, dict) else None,
    )


def openai_output_type(fmt: object) -> str | None:
    """`gen_ai.output.type` of an OpenAI format object (chat's `response_format`, Responses'
    `text.format`): `json` or `text`, None when it says neither."""
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind in ("json_object", "json_schema"):
        return "json"
    return "text" if kind == "text" else None


def is_chunk(event: SSEEvent) -> bool:
    """A streamed item as a client SDK yields it: an event with data, except `[DONE]` and `ping`.

    The OpenAI SDKs stop at `[DONE]`; the Anthropic SDK skips `ping`. Role-only deltas, usage-only
    chunks and `message_start` are chunks (not tokens): the spec's first chunk may precede the
    first token.
    """
    data = event.data
    return bool(data) and data != b"[DONE]" and event.event != "ping"


class StreamReader:
    """Reads one answer of one dialect: a stream's events (`feed`) or a whole body (`read_body`).

    A subclass gives `_read` (one parsed event) and `_read_whole` (one parsed body); it may
    override `feed` to skip the JSON parse of events it can tell apart by their type alone.
    """

    __slots__ = (
        "usage",
        "finish_reasons",
        "response_id",
        "response_model",
        "error_type",
        "done",
        "_capture",
        "out",
    )

    # Events whose type alone says they carry nothing we read: skip the JSON parse. Any container
    # of names (a plug-in may write a set, a tuple).
    SKIP: ClassVar[Container[str]] = frozenset()
    MAX_CAPTURE: ClassVar[int] = 64 * 1024  # characters of the answer kept, with capture on

    def __init__(self, capture_content: bool = False) -> None:
        self.usage: Usage | None = None
        self.finish_reasons: list[str] = []
        self.response_id: str | None = None
        self.response_model: str | None = None
        self.error_type: str | None = None
        self.done = False  # the terminal event was read: the client has the whole answer
        self._capture = capture_content
        # The answer's parts (text, reasoning, tool calls), only with capture on: None costs nothing.
        self.out: Output | None = Output(self.MAX_CAPTURE) if capture_content else None

    def feed(self, event: SSEEvent) -> int:
        """What the event carried: `ANSWER` or `REASONING` for a token event, else `NOT_TOKEN` (0)."""
        if event.event in self.SKIP or event.data == b"[DONE]":
            return NOT_TOKEN
        obj = loads(event.data)
        if not isinstance(obj, dict):
            return NOT_TOKEN
        return self._read(event.event, obj)

    def read_body(self, body: bytes) -> None:
        """Read a whole non-streaming JSON answer with the same rules as the stream's events."""
        obj = loads(body)
        if not isinstance(obj, dict):
            return
        if "error" in obj and obj["error"]:
            return  # the HTTP status already says what went wrong
        self._read_whole(obj)

    @property
    def complete(self) -> bool:
        """The answer reached its dialect's defined end. By default its terminal event (`done`); a
        dialect whose end is told elsewhere (chat's `finish_reason`) says so. A stream that ends
        without it did not complete, however cleanly its body ended (`stream_incomplete`)."""
        return self.done

    @property
    def text(self) -> str | None:
        """The generated text, when capture is on."""
        out = self.out
        if out is None:
            return None
        return "".join(p["content"] for m in out.messages() for p in m["parts"] if p["type"] == "text")

    @property
    def output_value(self) -> str | None:
        """`output.value`: the answer's text (`Output.answer`), when capture is on."""
        out = self.out
        return out.answer() if out is not None else None

    @property
    def output_messages(self) -> str | None:
        """`gen_ai.output.messages` as bounded JSON, when capture is on and anything was generated."""
        out = self.out
        if out is None or not out.choices:
            return None
        return bounded_json(out.messages(self.finish_reasons[0] if self.finish_reasons else None))

    def _keep(self, text: object, index: object = 0) -> None:
        out = self.out
        if out is not None:
            out.text(text, index)

    def _finish(self, reason: object) -> None:
        if isinstance(reason, str) and reason and reason not in self.finish_reasons:
            self.finish_reasons.append(reason)

    def _meta(self, obj: dict[str, Any]) -> None:
        if self.response_id is None and isinstance(obj.get("id"), str):
            self.response_id = obj["id"]
        if self.response_model is None:
            self.response_model = model_name(obj.get("model"))

    def _read(self, kind: str, obj: dict[str, Any]) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def _read_whole(self, obj: dict[str, Any]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError
