"""Attribution: which caller sent a request, recorded without ever recording a secret.

`--attribute-header NAME=attr` copies a request header onto the span as `attr`; headers that
carry credentials are refused when the mapping is parsed (at start), not per request. The API
key itself is represented only by `taotrace.key.id`: the first 12 hex characters of
HMAC-SHA256(salt, key), so two keys give two ids and the key cannot be recovered from the id.

An `Attributor` remembers the ids of the last `KEY_ID_CACHE` distinct keys (a client sends the
same key on every request, and the HMAC costs more than the lookup). The cache is keyed by a
BLAKE2b-128 digest of the key under a random per-process key, never by the key itself: a raw
key lives only as long as the request that carried it, and a cached digest cannot be tested
against a guessed key outside this process. 128 bits make two keys sharing one entry (and one
id) a non-event.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "KEY_ID",
    "KEY_ID_CACHE",
    "MAX_VALUE_LENGTH",
    "USER_ID",
    "Attributor",
    "HeaderAttribute",
    "api_key_of",
    "is_secret_header",
    "key_id",
    "parse_header_attributes",
]

KEY_ID = "taotrace.key.id"
USER_ID = "user.id"  # where --attribute-body-user puts OpenAI `user` / Anthropic `metadata.user_id`
MAX_VALUE_LENGTH = 256
MAX_HEADER_ATTRIBUTES = 16  # bounds the span's attribute count (see telemetry/span_end.py)
KEY_ID_HEX = 12
KEY_ID_CACHE = 1024  # distinct keys whose id an Attributor remembers (least recently used dropped)

# Headers that carry credentials; any name containing one of the words below is refused too.
SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie", "set-cookie", "x-goog-api-key"}
)
_SECRET_WORDS = ("auth", "cookie", "key", "token", "secret", "passw", "credential", "signature")
# Attributes the proxy writes itself: a header may not overwrite them.
_RESERVED_PREFIXES = (
    "taotrace.",
    "http.",
    "url.",
    "server.",
    "error.",
    "gen_ai.request.",
    "gen_ai.response.",
    "gen_ai.usage.",
    "gen_ai.operation.",
    "gen_ai.provider.",
    "gen_ai.input.",
    "gen_ai.output.",
)
# OpenInference's, set with --capture-io-values
_RESERVED_NAMES = frozenset({"input.value", "input.mime_type", "output.value", "output.mime_type"})
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an RFC 9110 token
_ATTRIBUTE_NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")


def is_secret_header(name: str) -> bool:
    """True for a header that may carry a credential (never copied onto a span)."""
    lower = name.lower()
    return lower in SECRET_HEADERS or any(word in lower for word in _SECRET_WORDS)


@dataclass(frozen=True, slots=True, kw_only=True)
class HeaderAttribute:
    """Copy request header `header` onto the span as attribute `attribute`."""

    header: str
    attribute: str


def parse_header_attributes(items: Iterable[str]) -> tuple[HeaderAttribute, ...]:
    """`NAME=attr` items -> mappings; a `ValueError` that says what is wrong, for the first bad one."""
    found: list[HeaderAttribute] = []
    for item in items:
        header, sep, attribute = (part.strip() for part in item.partition("="))
        if not sep or not header or not attribute:
            raise ValueError(f"--attribute-header {item!r}: expected NAME=attribute, e.g. x-user-id=user.id")
        if not _HEADER_NAME.match(header):
            raise ValueError(f"--attribute-header {item!r}: {header!r} is not a valid header name")
        if is_secret_header(header):
            raise ValueError(
                f"--attribute-header {item!r}: {header!r} may carry a credential and is never recorded "
                "(the key is represented by taotrace.key.id)"
            )
        if not _ATTRIBUTE_NAME.match(attribute):
            raise ValueError(
                f"--attribute-header {item!r}: {attribute!r} is not an attribute name (lowercase, dot-separated)"
            )
        if attribute.startswith(_RESERVED_PREFIXES) or attribute in _RESERVED_NAMES:
            raise ValueError(f"--attribute-header {item!r}: {attribute!r} is an attribute the proxy sets itself")
        if any(f.attribute == attribute for f in found):
            raise ValueError(f"--attribute-header {item!r}: attribute {attribute!r} is mapped twice")
        found.append(HeaderAttribute(header=header.lower(), attribute=attribute))
    if len(found) > MAX_HEADER_ATTRIBUTES:
        raise ValueError(f"--attribute-header: at most {MAX_HEADER_ATTRIBUTES} mappings")
    return tuple(found)


def api_key_of(headers: Mapping[str, str]) -> str | None:
    """The API key a request carries: `Authorization: Bearer`, else `x-api-key`, else `api-key`."""
    auth = headers.get("Authorization")
    if auth is not None:
        scheme, _, token = auth.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    for name in ("x-api-key", "api-key"):
        value = headers.get(name)
        if value is not None and value.strip():
            return value.strip()
    return None


def key_id(salt: bytes, key: str) -> str:
    """The key's fingerprint: HMAC-SHA256(salt, key), first 12 hex characters."""
    return hmac.digest(salt, key.encode("utf-8", "surrogateescape"), hashlib.sha256).hex()[:KEY_ID_HEX]


def _clean(value: str) -> str | None:
    value = value[:MAX_VALUE_LENGTH]
    if not value.isprintable():
        value = "".join(ch if ch.isprintable() else "?" for ch in value)
    return value or None


class Attributor:
    """Computes a finished request's attribution attributes from its headers and body's user."""

    __slots__ = ("_cache_key", "_capacity", "_ids", "body_user", "header_attributes", "salt")

    def __init__(
        self,
        header_attributes: tuple[HeaderAttribute, ...],
        *,
        body_user: bool,
        salt: bytes,
        key_id_cache: int = KEY_ID_CACHE,
    ) -> None:
        self.header_attributes = header_attributes
        self.body_user = body_user
        self.salt = salt
        self._capacity = key_id_cache
        self._cache_key = secrets.token_bytes(32)
        self._ids: OrderedDict[bytes, str] = OrderedDict()  # digest of a key -> its id

    @property
    def names(self) -> frozenset[str]:
        """Every attribute name this attributor can produce (what --metric-label may name)."""
        names = {KEY_ID, *(h.attribute for h in self.header_attributes)}
        if self.body_user:
            names.add(USER_ID)
        return frozenset(names)

    def key_id(self, key: str) -> str:
        """`key_id(self.salt, key)`, from the cache when the key was seen lately (see the module doc)."""
        raw = key.encode("utf-8", "surrogateescape")
        digest = hashlib.blake2b(raw, digest_size=16, key=self._cache_key).digest()
        ids = self._ids
        found = ids.get(digest)
        if found is not None:
            ids.move_to_end(digest)
            return found
        found = ids[digest] = key_id(self.salt, key)
        if len(ids) > self._capacity:
            ids.popitem(last=False)
        return found

    def __call__(self, headers: Mapping[str, str], end_user: str | None) -> tuple[tuple[str, str], ...]:
        out: dict[str, str] = {}
        key = api_key_of(headers)
        if key is not None:
            out[KEY_ID] = self.key_id(key)
        for mapping in self.header_attributes:
            raw = headers.get(mapping.header)
            value = _clean(raw) if raw is not None else None
            if value is not None:
                out[mapping.attribute] = value
        if self.body_user and end_user is not None and USER_ID not in out:  # an explicit header wins
            value = _clean(end_user)
            if value is not None:
                out[USER_ID] = value
        return tuple(out.items())
