"""What each API dialect sends, and which of it is a token: pure functions over parsed events.

`api_for_path` names the dialect; `inspect_request` reads the model and `stream` flag of a
request body; a `StreamReader` is fed SSE events and answers "was that a token?" while it
gathers usage, finish reasons, the response id and model, and mid-stream errors, and sets
`done` once the dialect's terminal event has gone by (`[DONE]`, `message_stop`,
`response.completed` / `incomplete` / `failed`: after it the answer is whole, whatever the
connection does next); `read_body` does the same for a whole non-streaming JSON body. Nothing
here raises on bad input: a body that is not what the dialect promises degrades to "unknown",
never to an error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, TypeAlias

import orjson

from proxy.sse import SSEEvent

__all__ = [
    "API_CHAT",
    "API_COMPLETIONS",
    "API_EMBEDDINGS",
    "API_MESSAGES",
    "API_OTHER",
    "API_RESPONSES",
    "EMBEDDINGS_FULL_PARSE",
    "RequestInfo",
    "StreamReader",
    "Usage",
    "api_for_path",
    "inspect_request",
    "is_chunk",
    "read_body",
    "reader_for",
]

API_CHAT = "chat_completions"
API_COMPLETIONS = "completions"
API_RESPONSES = "responses"
API_MESSAGES = "messages"
API_EMBEDDINGS = "embeddings"
API_OTHER = "other"

# (path suffix, api, gen_ai.operation.name, gen_ai.provider.name); longest suffix first.
_DIALECTS: tuple[tuple[str, str, str, str], ...] = (
    ("/chat/completions", API_CHAT, "chat", "openai"),
    ("/completions", API_COMPLETIONS, "text_completion", "openai"),
    ("/responses", API_RESPONSES, "chat", "openai"),
    ("/messages", API_MESSAGES, "chat", "anthropic"),
    ("/embeddings", API_EMBEDDINGS, "embeddings", "openai"),
)
MAX_MODEL_LENGTH = 256


# A GenAI request parameter as a span attribute value (`gen_ai.request.stop_sequences` is the tuple).
ParamValue: TypeAlias = "int | float | str | tuple[str, ...]"


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """What the proxy learned from a request: dialect, operation, provider, model, streaming."""

    api: str
    operation: str | None
    provider: str | None
    model: str | None
    stream: bool
    content: str | None = None  # the request's messages as JSON, only when capture is on
    # GenAI request parameters as span attributes (`gen_ai.request.temperature`, ...), validated
    params: tuple[tuple[str, ParamValue], ...] = ()
    end_user: str | None = None  # OpenAI `user` / Anthropic `metadata.user_id`, only when asked for


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage as the upstream reported it; None where it said nothing."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_input_tokens: int | None = None
    reasoning_tokens: int | None = None
    cache_creation_input_tokens: int | None = None  # written to the provider's cache (Anthropic)


def api_for_path(path: str) -> str:
    """The `api` label for a request path (query string excluded)."""
    path = path.rstrip("/")
    for suffix, api, _, _ in _DIALECTS:
        if path.endswith(suffix):
            return api
    return API_OTHER


def _loads(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _model(value: object) -> str | None:
    if isinstance(value, str) and 0 < len(value) <= MAX_MODEL_LENGTH and value.isprintable():
        return value
    return None


def is_chunk(event: SSEEvent) -> bool:
    """A streamed item as a client SDK yields it: an event with data, except `[DONE]` and `ping`.

    The OpenAI SDKs stop at `[DONE]`; the Anthropic SDK skips `ping`. Role-only deltas, usage-only
    chunks and `message_start` are chunks (not tokens): the spec's first chunk may precede the
    first token.
    """
    data = event.data
    return bool(data) and data != b"[DONE]" and event.event != "ping"


_MAX_STOP = 16  # stop sequences kept (each at most MAX_MODEL_LENGTH characters)
# (body key, attribute, kind) per dialect; the first key present wins for one attribute.
_COMMON_PARAMS = (
    ("temperature", "gen_ai.request.temperature", float),
    ("top_p", "gen_ai.request.top_p", float),
    ("frequency_penalty", "gen_ai.request.frequency_penalty", float),
    ("presence_penalty", "gen_ai.request.presence_penalty", float),
    ("seed", "gen_ai.request.seed", int),
)
_PARAMS: dict[str, tuple[tuple[str, str, type], ...]] = {
    API_CHAT: (
        *_COMMON_PARAMS,
        ("max_completion_tokens", "gen_ai.request.max_tokens", int),
        ("max_tokens", "gen_ai.request.max_tokens", int),
        ("stop", "gen_ai.request.stop_sequences", list),
        ("n", "gen_ai.request.choice.count", int),
    ),
    API_COMPLETIONS: (
        *_COMMON_PARAMS,
        ("max_tokens", "gen_ai.request.max_tokens", int),
        ("stop", "gen_ai.request.stop_sequences", list),
        ("n", "gen_ai.request.choice.count", int),
    ),
    API_RESPONSES: (
        ("temperature", "gen_ai.request.temperature", float),
        ("top_p", "gen_ai.request.top_p", float),
        ("max_output_tokens", "gen_ai.request.max_tokens", int),
    ),
    API_MESSAGES: (
        ("temperature", "gen_ai.request.temperature", float),
        ("top_p", "gen_ai.request.top_p", float),
        ("top_k", "gen_ai.request.top_k", float),
        ("max_tokens", "gen_ai.request.max_tokens", int),
        ("stop_sequences", "gen_ai.request.stop_sequences", list),
    ),
}


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


def _output_type(api: str, obj: dict[str, Any]) -> str | None:
    """`gen_ai.output.type` from an OpenAI structured-output request: `json` or `text`."""
    fmt = obj.get("response_format") if api == API_CHAT else None
    if api == API_RESPONSES:
        text = obj.get("text")
        fmt = text.get("format") if isinstance(text, dict) else None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind in ("json_object", "json_schema"):
        return "json"
    return "text" if kind == "text" else None


def request_params(api: str, obj: dict[str, Any]) -> tuple[tuple[str, ParamValue], ...]:
    """The GenAI `gen_ai.request.*` attributes a request body sets, validated and typed."""
    found: dict[str, ParamValue] = {}
    for key, attribute, kind in _PARAMS.get(api, ()):
        if attribute in found or key not in obj:
            continue
        value = _param(obj[key], kind)
        if value is not None:
            found[attribute] = value
    if found.get("gen_ai.request.choice.count") == 1:
        del found["gen_ai.request.choice.count"]  # the spec records it only when it is not 1
    output = _output_type(api, obj)
    if output is not None:
        found["gen_ai.output.type"] = output
    return tuple(found.items())


def _end_user(api: str, obj: dict[str, Any]) -> str | None:
    """The caller's own user id: OpenAI's `user`, Anthropic's `metadata.user_id`."""
    if api == API_MESSAGES:
        metadata = obj.get("metadata")
        value = metadata.get("user_id") if isinstance(metadata, dict) else None
    else:
        value = obj.get("user")
    return value if isinstance(value, str) and value else None


def inspect_request(api: str, body: bytes, *, capture_content: bool = False, end_user: bool = False) -> RequestInfo:
    """Read model and `stream` (and, when asked, the end user) from a JSON body; anything
    unexpected yields model None."""
    operation = provider = None
    for _, name, op, prov in _DIALECTS:
        if name == api:
            operation, provider = op, prov
    if api == API_OTHER or not body:
        return RequestInfo(api, operation, provider, None, False)
    obj = _loads(body)
    if not isinstance(obj, dict):
        return RequestInfo(api, operation, provider, None, False)
    content = None
    if capture_content:
        for key in ("messages", "input", "prompt", "system"):
            if key in obj:
                content = orjson.dumps(
                    {k: obj[k] for k in ("system", "messages", "input", "prompt") if k in obj}
                ).decode()
                break
    user = _end_user(api, obj) if end_user else None
    return RequestInfo(
        api,
        operation,
        provider,
        _model(obj.get("model")),
        obj.get("stream") is True,
        content,
        request_params(api, obj),
        end_user=user,
    )


def _openai_usage(u: object) -> Usage | None:
    """Chat/completions (`prompt_tokens`…) and Responses (`input_tokens`…) usage objects."""
    if not isinstance(u, dict):
        return None
    in_details = u.get("prompt_tokens_details") or u.get("input_tokens_details") or {}
    out_details = u.get("completion_tokens_details") or u.get("output_tokens_details") or {}
    return Usage(
        input_tokens=_int(u.get("prompt_tokens", u.get("input_tokens"))),
        output_tokens=_int(u.get("completion_tokens", u.get("output_tokens"))),
        cached_input_tokens=_int(in_details.get("cached_tokens")) if isinstance(in_details, dict) else None,
        reasoning_tokens=_int(out_details.get("reasoning_tokens")) if isinstance(out_details, dict) else None,
    )


def _anthropic_usage(u: object, previous: Usage | None) -> Usage | None:
    """Anthropic counts cache reads and writes apart from `input_tokens`; GenAI input includes them."""
    if not isinstance(u, dict):
        return previous
    prev = previous or Usage()
    base = _int(u.get("input_tokens"))
    read = _int(u.get("cache_read_input_tokens"))
    write = _int(u.get("cache_creation_input_tokens"))
    total = None if base is None and read is None and write is None else (base or 0) + (read or 0) + (write or 0)
    output = _int(u.get("output_tokens"))
    return Usage(
        input_tokens=total if total is not None else prev.input_tokens,
        output_tokens=output if output is not None else prev.output_tokens,
        cached_input_tokens=read if read is not None else prev.cached_input_tokens,
        reasoning_tokens=prev.reasoning_tokens,
        cache_creation_input_tokens=write if write is not None else prev.cache_creation_input_tokens,
    )


def _items(value: object) -> list[Any]:
    """A JSON array, or nothing: `"choices": 5` must not raise (upstreams lie)."""
    return value if isinstance(value, list) else []


def _nonempty(value: object) -> bool:
    return isinstance(value, str) and value != ""


class StreamReader:
    """Reads one response stream's events. Subclasses know one dialect each."""

    __slots__ = (
        "usage",
        "finish_reasons",
        "response_id",
        "response_model",
        "error_type",
        "done",
        "_capture",
        "_text",
        "_text_len",
    )

    # events whose type alone says they carry nothing we read: skip the JSON parse
    SKIP: frozenset[str] = frozenset()
    MAX_CAPTURE = 64 * 1024

    def __init__(self, capture_content: bool = False) -> None:
        self.usage: Usage | None = None
        self.finish_reasons: list[str] = []
        self.response_id: str | None = None
        self.response_model: str | None = None
        self.error_type: str | None = None
        self.done = False  # the terminal event was read: the client has the whole answer
        self._capture = capture_content
        self._text: list[str] = []
        self._text_len = 0

    def feed(self, event: SSEEvent) -> bool:
        """True when the event carried generated output (a token event)."""
        if event.event in self.SKIP or event.data == b"[DONE]":
            return False
        obj = _loads(event.data)
        if not isinstance(obj, dict):
            return False
        return self._read(event.event, obj)

    @property
    def text(self) -> str | None:
        """The generated text, when capture is on."""
        return "".join(self._text) if self._capture else None

    def _keep(self, text: object) -> None:
        if self._capture and isinstance(text, str) and self._text_len < self.MAX_CAPTURE:
            self._text.append(text)
            self._text_len += len(text)

    def _finish(self, reason: object) -> None:
        if isinstance(reason, str) and reason and reason not in self.finish_reasons:
            self.finish_reasons.append(reason)

    def _meta(self, obj: dict[str, Any]) -> None:
        if self.response_id is None and isinstance(obj.get("id"), str):
            self.response_id = obj["id"]
        if self.response_model is None:
            self.response_model = _model(obj.get("model"))

    def _read(self, kind: str, obj: dict[str, Any]) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError


class ChatReader(StreamReader):
    """`data: {chat.completion.chunk}` … `data: [DONE]`; legacy completions share the framing."""

    __slots__ = ()

    def feed(self, event: SSEEvent) -> bool:
        data = event.data
        if data == b"[DONE]":  # the comparison the base class made anyway: the terminal check is free
            self.done = True
            return False
        obj = _loads(data)
        if not isinstance(obj, dict):
            return False
        return self._read(event.event, obj)

    def _read(self, kind: str, obj: dict[str, Any]) -> bool:
        if "error" in obj and obj["error"]:
            self.error_type = "stream_error"
            return False
        # This runs once per chunk: the calls below are skipped when they could change nothing.
        if self.response_id is None or self.response_model is None:
            self._meta(obj)
        usage = obj.get("usage")
        if usage:
            self.usage = _openai_usage(usage) or self.usage
        token = False
        for choice in _items(obj.get("choices")):
            if not isinstance(choice, dict):
                continue
            reason = choice.get("finish_reason")
            if reason:
                self._finish(reason)
            if self._choice_has_token(choice):
                token = True
        return token

    def _choice_has_token(self, choice: dict[str, Any]) -> bool:
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return False
        content = delta.get("content")
        if isinstance(content, str) and content:
            self._keep(content)
            return True  # the common chunk: the other fields cannot change the answer or the capture
        found = False
        for key in ("reasoning_content", "reasoning", "refusal"):
            if _nonempty(delta.get(key)):
                found = True
        for call in _items(delta.get("tool_calls")):
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and _nonempty(fn.get("arguments")):
                found = True
        return found


class CompletionsReader(ChatReader):
    """Legacy `/completions`: `choices[].text`."""

    __slots__ = ()

    def _choice_has_token(self, choice: dict[str, Any]) -> bool:
        text = choice.get("text")
        self._keep(text)
        return _nonempty(text)


_RESPONSES_TOKENS = frozenset(
    {
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.refusal.delta",
        "response.function_call_arguments.delta",
        "response.custom_tool_call_input.delta",
        "response.audio.transcript.delta",
    }
)
_RESPONSES_END = frozenset({"response.completed", "response.failed", "response.incomplete"})


class ResponsesReader(StreamReader):
    """OpenAI Responses: `event: response.*`; usage in the final `response.completed`."""

    __slots__ = ()

    def feed(self, event: SSEEvent) -> bool:
        kind = event.event
        # Only deltas, the start, the end and errors carry anything we read.
        if kind != "message" and not (
            kind in _RESPONSES_TOKENS or kind in _RESPONSES_END or kind == "response.created" or kind == "error"
        ):
            return False
        return super().feed(event)

    def _read(self, kind: str, obj: dict[str, Any]) -> bool:
        typ = obj.get("type")
        if isinstance(typ, str):
            kind = typ
        if kind in _RESPONSES_TOKENS:
            delta = obj.get("delta")
            if kind == "response.output_text.delta":
                self._keep(delta)
            return _nonempty(delta)
        if kind == "error":
            self.error_type = "stream_error"
            return False
        if kind in _RESPONSES_END:
            self.done = True
            if kind == "response.failed":
                self.error_type = "stream_error"
        response = obj.get("response")
        if not isinstance(response, dict):
            return False
        self._meta(response)
        if kind in _RESPONSES_END:
            self.usage = _openai_usage(response.get("usage")) or self.usage
            status = response.get("status")
            details = response.get("incomplete_details")
            reason = details.get("reason") if isinstance(details, dict) else None
            self._finish(reason or status)
        return False


class MessagesReader(StreamReader):
    """Anthropic Messages: usage in `message_start` and (cumulative) `message_delta`."""

    __slots__ = ()
    SKIP = frozenset({"ping", "content_block_start", "content_block_stop", "message_stop"})

    def feed(self, event: SSEEvent) -> bool:
        kind = event.event
        if kind in self.SKIP:
            if kind == "message_stop":  # checked only among the skipped events: free for the deltas
                self.done = True
            return False
        obj = _loads(event.data)
        if not isinstance(obj, dict):
            return False
        return self._read(kind, obj)

    def _read(self, kind: str, obj: dict[str, Any]) -> bool:
        typ = obj.get("type")
        if isinstance(typ, str):
            kind = typ
        if kind == "content_block_delta":
            delta = obj.get("delta")
            if not isinstance(delta, dict):
                return False
            for key in ("text", "thinking", "partial_json"):
                value = delta.get(key)
                if _nonempty(value):
                    if key == "text":
                        self._keep(value)
                    return True
            return False
        if kind == "message_start":
            message = obj.get("message")
            if isinstance(message, dict):
                self._meta(message)
                self.usage = _anthropic_usage(message.get("usage"), self.usage)
        elif kind == "message_delta":
            self.usage = _anthropic_usage(obj.get("usage"), self.usage)
            delta = obj.get("delta")
            if isinstance(delta, dict):
                self._finish(delta.get("stop_reason"))
        elif kind == "message_stop":  # a stream without `event:` lines names it only in the data
            self.done = True
        elif kind == "error":
            self.error_type = "stream_error"
        return False


class EmbeddingsReader(StreamReader):
    """OpenAI `/embeddings`: one JSON body (never a stream); only usage and identity are read."""

    __slots__ = ()

    def _read(self, kind: str, obj: dict[str, Any]) -> bool:
        return False  # an SSE body here is not the embeddings API: read nothing, count no token


_READERS: dict[str, type[StreamReader]] = {
    API_CHAT: ChatReader,
    API_COMPLETIONS: CompletionsReader,
    API_RESPONSES: ResponsesReader,
    API_MESSAGES: MessagesReader,
    API_EMBEDDINGS: EmbeddingsReader,
}


def reader_for(api: str, capture_content: bool = False) -> StreamReader | None:
    """A fresh reader for a dialect's stream, or None for `other`."""
    cls = _READERS.get(api)
    return cls(capture_content) if cls is not None else None


EMBEDDINGS_FULL_PARSE = 64 << 10  # larger embeddings bodies: only their ends are read
_EDGE = 8 << 10
_MODEL_FIELD = re.compile(rb'"model"\s*:\s*"([^"\\]{1,256})"')


def _flat_object_after(buf: bytes, key: bytes) -> dict[str, Any] | None:
    """The flat JSON object that follows the last `key` in `buf` (e.g. `"usage": {...}`)."""
    i = buf.rfind(key)
    start = buf.find(b"{", i + len(key)) if i >= 0 else -1
    end = buf.find(b"}", start) if start >= 0 else -1
    obj = _loads(bytes(buf[start : end + 1])) if end > start else None
    return obj if isinstance(obj, dict) else None


def _embeddings_ends(reader: StreamReader, body: bytes) -> StreamReader:
    """Usage and model of a large embeddings body from its last and first 8 KiB (both orders seen:
    OpenAI writes them after `data`, some servers before it). Parsing megabytes of vectors would
    hold the event loop for milliseconds; anything not found is left unknown."""
    for edge in (body[-_EDGE:], body[:_EDGE]):
        if reader.usage is None:
            reader.usage = _openai_usage(_flat_object_after(edge, b'"usage"'))
        if reader.response_model is None:
            found = _MODEL_FIELD.search(edge)
            reader.response_model = _model(found.group(1).decode("utf-8", "replace")) if found else None
    return reader


def read_body(api: str, body: bytes, capture_content: bool = False) -> StreamReader | None:
    """Read a whole non-streaming JSON response with the same rules as a stream's events."""
    reader = reader_for(api, capture_content)
    if reader is not None and api == API_EMBEDDINGS and len(body) > EMBEDDINGS_FULL_PARSE:
        return _embeddings_ends(reader, body)
    obj = _loads(body) if reader is not None else None
    if reader is None or not isinstance(obj, dict):
        return reader
    if "error" in obj and obj["error"]:
        return reader  # the HTTP status already says what went wrong
    if api == API_MESSAGES:
        reader._meta(obj)
        reader.usage = _anthropic_usage(obj.get("usage"), None)
        reader._finish(obj.get("stop_reason"))
        for block in _items(obj.get("content")):
            if isinstance(block, dict):
                reader._keep(block.get("text"))
    elif api == API_RESPONSES:
        reader._meta(obj)
        reader.usage = _openai_usage(obj.get("usage"))
        reader._finish(obj.get("status"))
    elif api == API_EMBEDDINGS:
        reader._meta(obj)  # `id` is absent here; `model` is the one that answered
        reader.usage = _openai_usage(obj.get("usage"))
    else:
        reader._meta(obj)
        reader.usage = _openai_usage(obj.get("usage"))
        for choice in _items(obj.get("choices")):
            if isinstance(choice, dict):
                reader._finish(choice.get("finish_reason"))
                message = choice.get("message")
                reader._keep(message.get("content") if isinstance(message, dict) else choice.get("text"))
    return reader
