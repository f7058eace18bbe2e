"""`Dialects`: the dialects one proxy speaks, and which of them a request path names."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from proxy.dialects.dialect import API_OTHER, Dialect

__all__ = ["Dialects"]


class Dialects:
    """An immutable set of dialects; a path picks the one with the longest matching suffix.

    Looked up once per request (`for_path`); the reader it gives then runs per event with no
    lookup of its own.
    """

    __slots__ = ("_by_api", "_by_suffix")

    def __init__(self, dialects: Iterable[Dialect]) -> None:
        listed = tuple(dialects)
        apis = [d.api for d in listed]
        suffixes = [d.path_suffix.rstrip("/") for d in listed]
        for name, values in (("api", apis), ("path suffix", suffixes)):
            twice = sorted({v for v in values if values.count(v) > 1})
            if twice:
                raise ValueError(f"two dialects share the {name} {twice[0]!r}")
        if API_OTHER in apis:
            raise ValueError(f"{API_OTHER!r} is the label of paths no dialect claims; name the dialect otherwise")
        bad = [s for s in suffixes if not s.startswith("/")]
        if bad:
            raise ValueError(f"a dialect's path suffix starts with '/' (a path segment): {bad[0]!r}")
        # "/chat/completions" before "/completions": the longest suffix wins, whatever the order given
        ordered = sorted(zip(suffixes, listed, strict=True), key=lambda pair: -len(pair[0]))
        self._by_suffix: tuple[tuple[str, Dialect], ...] = tuple(ordered)
        self._by_api: dict[str, Dialect] = {d.api: d for d in listed}

    def for_path(self, path: str) -> Dialect | None:
        """The dialect of a request path (query string excluded), None for `other`."""
        path = path.rstrip("/")
        for suffix, dialect in self._by_suffix:
            if path.endswith(suffix):
                return dialect
        return None

    def api_for_path(self, path: str) -> str:
        """The `api` label for a request path (query string excluded)."""
        dialect = self.for_path(path)
        return API_OTHER if dialect is None else dialect.api

    def get(self, api: str) -> Dialect | None:
        """The dialect labelled `api`, None for `other` or a name none has."""
        return self._by_api.get(api)

    def __iter__(self) -> Iterator[Dialect]:
        return iter(self._by_api.values())

    def __len__(self) -> int:
        return len(self._by_api)

    def __repr__(self) -> str:
        return f"Dialects({', '.join(self._by_api)})"
