"""`Dialect`: everything the proxy knows about one API, in one object; `RequestInfo`, what a
request body says.

A dialect names its path suffix, its `api` label, its GenAI operation and provider, the request
parameters it records, and the reader class of its answers (streamed or whole). The registry
(`proxy/dialects/registry.py`) picks one per request, by path, once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

import orjson

from proxy.dialects.content import Message, Part, bounded_json, last_user_text, no_messages
from proxy.dialects.reader import MAX_MODEL_LENGTH, StreamReader, loads, model_name

__all__ = [
    "API_OTHER",
    "COMMON_PARAMS",
    "Dialect",
    "Param",
    "ParamValue",
    "RequestInfo",
    "no_output_type",
    "request_info",
    "user_field",
]

API_OTHER = "other"  # the label of every path no dialect claims: forwarded and counted, not parsed

# A GenAI request parameter as a span attribute value (`gen_ai.request.stop_sequences` is the tuple).
ParamValue: TypeAlias = "int | float | str | tuple[str, ...]"
# (body key, attribute, kind): `kind` is int, float or list (a string or a list of strings)
Param: TypeAlias = "tuple[str, str, type]"

_MAX_STOP = 16  # stop sequences kept (each at most MAX_MODEL_LENGTH characters)
COMMON_PARAMS: tuple[Param, ...] = (
    ("temperature", "gen_ai.request.temperature", float),
    ("top_p", "gen_ai.request.top_p", float),
    ("frequency_penalty", "gen_ai.request.frequency_penalty", float),
    ("presence_penalty", "gen_ai.request.presence_penalty", float),
    ("seed", "gen_ai.request.seed", int),
)
_CONTENT_KEYS = ("system", "messages", "input", "prompt")


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """What the proxy learned from a request: dialect, operation, provider, model, streaming."""

    api: str
    operation: str | None
    provider: str | None
    model: str | None
    stream: bool
    content: str | None = None  # the request's messages as JSON, only when capture is on (the live view's)
    # GenAI request parameters as span attributes (`gen_ai.request.temperature`, ...), validated
    params: tuple[tuple[str, ParamValue], ...] = ()
    end_user: str | None = None  # OpenAI `user` / Anthropic `metadata.user_id`, only when asked for
    # The same in the conventions' shape, bounded (proxy/dialects/content.py), only when capture is on
    input_messages: str | None = None  # gen_ai.input.messages
    system_instructions: str | None = None  # gen_ai.system_instructions
    # The last user message's text, bounded, only with capture and --capture-io-values: input.value
    input_value: str | None = None


def no_output_type(obj: dict[str, Any]) -> str | None:
    """A dialect without structured output: `gen_ai.output.type` is not recorded."""
    return None


def user_field(obj: dict[str, Any]) -> str | None:
    """The caller's own user id as the OpenAI APIs carry it: `user`."""
    value = obj.get("user")
    return value if isinstance(value, str) and value else None


@dataclass(frozen=True, slots=True)
class Dialect:
    """One API: where it is served, its names, what its requests say and how its answers read."""

    api: str  # the `api` label
    path_suffix: str  # a request path ending with it (trailing `/` aside) speaks this dialect
    operation: str  # `gen_ai.operation.name`
    provider: str  # `gen_ai.provider.name`
    reader: type[StreamReader]  # reads one answer: a stream's events, or a whole JSON body
    params: tuple[Param, ...] = ()  # the first body key present wins for one attribute
    output_type: Callable[[dict[str, Any]], str | None] = no_output_type  # `gen_ai.output.type`
    end_user: Callable[[dict[str, Any]], str | None] = user_field  # the caller's own user id
    # The request's messages and system instructions as the GenAI conventions shape them
    input_messages: Callable[[dict[str, Any]], tuple[list[Message], list[Part] | None]] = no_messages

    def inspect(
        self, body: bytes, *, capture_content: bool = False, end_user: bool = False, io_values: bool = False
    ) -> RequestInfo:
        """Read model and `stream` (and, when asked, content and end user) from a JSON body;
        anything unexpected yields model None. `io_values` (with `capture_content`): the last
        user message's text too."""
        obj = loads(body) if body else None
        if not isinstance(obj, dict):
            return self.unread()
        content = messages = system = value = None
        if capture_content:
            if any(key in obj for key in _CONTENT_KEYS):
                content = orjson.dumps({k: obj[k] for k in _CONTENT_KEYS if k in obj}).decode()
            shaped, instructions = self.input_messages(obj)
            messages = bounded_json(shaped) if shaped else None
            system = bounded_json(instructions) if instructions else None
            if io_values:
                value = last_user_text(shaped)
        return RequestInfo(
            self.api,
            self.operation,
            self.provider,
            model_name(obj.get("model")),
            obj.get("stream") is True,
            content,
            self.request_params(obj),
            end_user=self.end_user(obj) if end_user else None,
            input_messages=messages,
            system_instructions=system,
            input_value=value,
        )

    def unread(self) -> RequestInfo:
        """What a request of this dialect says when its body is not read (not JSON, or unreadable)."""
        return RequestInfo(self.api, self.operation, self.provider, None, False)

    def request_params(self, obj: dict[str, Any]) -> tuple[tuple[str, ParamValue], ...]:
        """The GenAI `gen_ai.request.*` attributes a request body sets, validated and typed."""
        found: dict[str, ParamValue] = {}
        for key, attribute, kind in self.params:
            if key not in obj or attribute in found:  # most keys are absent: one lookup
                continue
            value = _param(obj[key], kind)
            if value is not None:
                found[attribute] = value
        if found.get("gen_ai.request.choice.count") == 1:
            del found["gen_ai.request.choice.count"]  # the spec records it only when it is not 1
        output = self.output_type(obj)
        if output is not None:
            found["gen_ai.output.type"] = output
        return tuple(found.items())

    def stream_reader(self, capture_content: bool = False) -> StreamReader:
        """A fresh reader for one streamed answer."""
        return self.reader(capture_content)

    def read_body(self, body: bytes, capture_content: bool = False) -> StreamReader:
        """A reader that has read one whole non-streaming answer."""
        reader = self.reader(capture_content)
        reader.read_body(body)
        return reader


def request_info(
    dialect: Dialect | None,
    body: bytes,
    *,
    capture_content: bool = False,
    end_user: bool = False,
    io_values: bool = False,
) -> RequestInfo:
    """What a request says, for its dialect; a path no dialect claims (None) is `other`, unread."""
    if dialect is None:
        return RequestInfo(API_OTHER, None, None, None, False)
    return dialect.inspect(body, capture_content=capture_content, end_user=end_user, io_values=io_values)


def _param(value: object, kind: type) -> ParamValue | None:
    """The value as the spec's type, or None when it is not one (upstreams reject those anyway)."""
    if isinstance(value, bool):
        return None
    if kind is int:
        return value if isinstance(value, int) and -(1 << 63) <= value < (1 << 63) else None
    if kind is float:
        return float(value) if isinstance(value, (int, float)) and abs(value) < 1e300 else None
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list) and 0 < len(value) <= _MAX_STOP:
        if all(isinstance(v, str) and len(v) <= MAX_MODEL_LENGTH for v in value):
            return tuple(value)
    return None
