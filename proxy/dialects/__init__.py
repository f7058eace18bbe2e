"""What each API dialect sends, and which of it is a token: pure readers over parsed events.

One module per dialect, each defining one `Dialect` (`DIALECT`): its path suffix and `api`
label, its GenAI operation and provider, the request parameters it records, and the
`StreamReader` class of its answers. A reader is fed SSE events and answers "was that a token,
and of the answer or of the reasoning?" (`ANSWER`, `REASONING`, or `NOT_TOKEN`) while it gathers usage, finish reasons, the response id and model, and mid-stream errors, and
sets `done` once the dialect's terminal event has gone by (`[DONE]`, `message_stop`,
`response.completed` / `incomplete` / `failed`: after it the answer is whole, whatever the
connection does next); `read_body` does the same for a whole non-streaming JSON body.

`DIALECTS` is the registry the proxy uses unless it is given another (`Dialects([...])`); the
functions below (`api_for_path`, `inspect_request`, `reader_for`, `read_body`) read through it.
Nothing here raises on bad input: a body that is not what the dialect promises degrades to
"unknown", never to an error.

    reader.py       Usage, StreamReader (the base), JSON helpers shared by the readers
    content.py      captured messages in the GenAI conventions' shape, bounded (capture on only)
    dialect.py      Dialect, RequestInfo, request parameters
    registry.py     Dialects: path -> dialect, longest suffix first
    chat.py  completions.py  responses.py  messages.py  embeddings.py    one dialect each
"""

from __future__ import annotations

from proxy.dialects import chat, completions, embeddings, messages, responses
from proxy.dialects.chat import API_CHAT
from proxy.dialects.completions import API_COMPLETIONS
from proxy.dialects.dialect import API_OTHER, Dialect, RequestInfo, request_info
from proxy.dialects.embeddings import API_EMBEDDINGS, EMBEDDINGS_FULL_PARSE
from proxy.dialects.messages import API_MESSAGES
from proxy.dialects.reader import ANSWER, NOT_TOKEN, REASONING, StreamReader, Usage, is_chunk, nonneg_int
from proxy.dialects.registry import Dialects
from proxy.dialects.responses import API_RESPONSES

__all__ = [
    "ANSWER",
    "API_CHAT",
    "API_COMPLETIONS",
    "API_EMBEDDINGS",
    "API_MESSAGES",
    "API_OTHER",
    "API_RESPONSES",
    "DIALECTS",
    "EMBEDDINGS_FULL_PARSE",
    "NOT_TOKEN",
    "REASONING",
    "Dialect",
    "Dialects",
    "RequestInfo",
    "StreamReader",
    "Usage",
    "api_for_path",
    "inspect_request",
    "is_chunk",
    "nonneg_int",
    "read_body",
    "reader_for",
    "request_info",
]

DIALECTS = Dialects(m.DIALECT for m in (chat, completions, responses, messages, embeddings))


def api_for_path(path: str) -> str:
    """The `api` label for a request path (query string excluded)."""
    return DIALECTS.api_for_path(path)


def inspect_request(
    api: str, body: bytes, *, capture_content: bool = False, end_user: bool = False, io_values: bool = False
) -> RequestInfo:
    """Read model and `stream` (and, when asked, content, the end user and the last user
    message's text) from a JSON body; anything unexpected yields model None."""
    dialect = DIALECTS.get(api)
    if dialect is None:
        return RequestInfo(api, None, None, None, False)
    return dialect.inspect(body, capture_content=capture_content, end_user=end_user, io_values=io_values)


def reader_for(api: str, capture_content: bool = False) -> StreamReader | None:
    """A fresh reader for a dialect's stream, or None for `other`."""
    dialect = DIALECTS.get(api)
    return dialect.stream_reader(capture_content) if dialect is not None else None


def read_body(api: str, body: bytes, capture_content: bool = False) -> StreamReader | None:
    """Read a whole non-streaming JSON response with the same rules as a stream's events."""
    dialect = DIALECTS.get(api)
    return dialect.read_body(body, capture_content) if dialect is not None else None
