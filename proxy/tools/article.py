"""The seed article's client code, as it measures TTFT: the first chunk that carries content.

The article times a stream with the OpenAI SDK, in a loop like

    start = time.perf_counter()
    for chunk in client.chat.completions.create(model=model, messages=messages, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            ttft = time.perf_counter() - start
            break

For a reasoning model that streams its thinking (`reasoning_content`, `reasoning`), no chunk has
content until the answer begins: its TTFT is the answer's first token, the proxy's
`time_to_first_answer_token`, not the proxy's TTFT (the first token of any kind, a thought).
`FirstContent` is that loop over the bytes of a stream the measurement client reads anyway
(`client.measure(..., also=...)`): the same request seen both ways. Its rule for each dialect is
the naive client's "first text": chat's `delta.content`, legacy `text`, Responses'
`response.output_text.delta`, Anthropic's `text_delta`.
"""

from __future__ import annotations

import orjson

from proxy.dialects import API_CHAT, API_COMPLETIONS, API_MESSAGES, API_RESPONSES

__all__ = ["FirstContent"]


class FirstContent:
    """The article's TTFT: when the first chunk with content arrived, in seconds from the start of
    the request, as the article's loop sees it (no I/O here)."""

    def __init__(self, api: str) -> None:
        self.api = api
        self.ttft_s: float | None = None
        self._rest = b""

    def __call__(self, data: bytes, elapsed: float) -> None:
        """One read of the body, arrived `elapsed` seconds after the request was sent: its
        complete `data:` lines, as the SDK parses them."""
        if self.ttft_s is not None:
            return
        *lines, self._rest = (self._rest + data).split(b"\n")
        for line in lines:
            line = line.rstrip(b"\r")
            if line.startswith(b"data:") and self._content(line[5:].strip()):
                self.ttft_s = elapsed
                return

    def _content(self, data: bytes) -> bool:
        if not data or data == b"[DONE]":
            return False
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return False
        if not isinstance(chunk, dict):
            return False
        if self.api in (API_CHAT, API_COMPLETIONS):
            choices = chunk.get("choices")
            if not choices or not isinstance(choices[0], dict):  # the usage chunk's `choices: []`
                return False
            if self.api == API_COMPLETIONS:
                return bool(choices[0].get("text"))
            delta = choices[0].get("delta")
            return isinstance(delta, dict) and bool(delta.get("content"))
        if self.api == API_RESPONSES:
            return chunk.get("type") == "response.output_text.delta" and bool(chunk.get("delta"))
        if self.api == API_MESSAGES:
            delta = chunk.get("delta")
            return isinstance(delta, dict) and delta.get("type") == "text_delta" and bool(delta.get("text"))
        return False
