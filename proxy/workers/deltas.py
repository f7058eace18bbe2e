"""A worker's `taotrace_*` metrics, sent to its supervisor as changes, and merged there.

    worker      Changes(registry).take()  -> what changed since the last take (every family)
    supervisor  Merge(metrics).apply(changes, held) -> the group's families, one page

Every family of the worker's `Metrics` registry is walked, so a family added there travels
without a change here. A take is, per family, the children that changed, each as:

    counter     how much it grew                          added
    gauge       its value now                             summed over the workers (`Gauge(summed=True)`:
                                                          requests in flight), else the last one set
    histogram   (bucket, count) pairs of what was added,  added; an exemplar replaces the bucket's
                the sum added, the exemplars set since    when it is as new or newer

A take is measured against the last one, not against what the supervisor got: the worker keeps
what it sent, so a take it could not send (a supervisor that does not read) is carried by the
next one and nothing is lost. What a take costs grows with the children that changed, never
with the requests behind them. A child the worker made is in its first take even at 0, so the
group's page has the same series as one process's.

The supervisor bounds the labels a worker bounded alone (each worker admits its own first
`--max-models` models): `model` through the group's `ModelLabels`, the `--metric-label` values
through the group's own bounds; a worker's series past the group's bound are added to `other`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy.exchange.record import UNKNOWN_MODEL
from proxy.telemetry.exposition import HistogramChild, ValueChild
from proxy.telemetry.metrics import OTHER_MODEL, Metrics, ModelLabels

__all__ = ["Changes", "Held", "Merge", "Taken"]

# (family name, [(label values, state), ...]) for each family with a change; see the module's docstring.
Taken = list[tuple[str, list[tuple[tuple[str, ...], Any]]]]
# What one worker's summed gauges add to the group's, by (family name, label values).
Held = dict[tuple[str, tuple[str, ...]], float]


class Changes:
    """The worker's side: each `take` is what changed in `registry`'s families since the last."""

    def __init__(self, metrics: Metrics) -> None:
        self.registry = metrics.registry
        self._groups: dict[object, int] = {}  # a group of children -> its version when last taken
        self._values: dict[ValueChild, float] = {}
        # a histogram child -> its version, counts, sum and exemplars when last taken
        self._buckets: dict[HistogramChild, tuple[int, list[int], float, dict[int, tuple[str, float, float]]]] = {}

    def take(self) -> Taken:
        out: Taken = []
        seen = self._groups
        for family in list(self.registry.families):
            counter, histogram = family.kind == "counter", family.kind == "histogram"
            changed: list[tuple[tuple[str, ...], Any]] = []
            for group in list(family.groups):
                version = group.version  # read first: a change during the walk is in the next take
                if seen.get(group) == version:
                    continue
                seen[group] = version
                for child in list(group.children):
                    found: Any = (
                        self._histogram(child)  # type: ignore[arg-type]
                        if histogram
                        else self._value(child, counter)  # type: ignore[arg-type]
                    )
                    if found is not None:
                        changed.append((tuple(v for _, v in child.labels), found))  # type: ignore[attr-defined]
            if changed:
                out.append((family.name, changed))
        return out

    def _value(self, child: ValueChild, counter: bool) -> float | None:
        value = child.value
        last = self._values.get(child)
        if last is value:  # `inc` and `set` bind a new float: a gauge set again to its value is sent again
            return None
        self._values[child] = value
        return value - (last or 0.0) if counter else value

    def _histogram(self, child: HistogramChild) -> tuple[tuple[int, ...], float, tuple[Any, ...]] | None:
        last = self._buckets.get(child)
        version = child.version
        if last is not None and last[0] == version:
            return None
        counts, total, exemplars = list(child.counts), child.sum, dict(child.exemplars)
        if last is None:
            pairs = [x for i, n in enumerate(counts) if n for x in (i, n)]
            added, set_since = total, exemplars
        else:
            _, before, before_total, before_exemplars = last
            pairs = [x for i, (n, m) in enumerate(zip(counts, before, strict=True)) if n != m for x in (i, n - m)]
            added = total - before_total
            set_since = {i: ex for i, ex in exemplars.items() if before_exemplars.get(i) is not ex}
        self._buckets[child] = (version, counts, total, exemplars)
        return tuple(pairs), added, tuple((i, *ex) for i, ex in set_since.items())


Bound = Callable[[str], str]


def _passing(bound: ModelLabels) -> Bound:
    """`bound`, leaving the names a worker gives for no model and past its own bound as they are."""

    def admit(value: str) -> str:
        return value if value in (UNKNOWN_MODEL, OTHER_MODEL) else bound(value)

    return admit


class Merge:
    """The supervisor's side: every worker's changes, applied to the group's `metrics`."""

    def __init__(self, metrics: Metrics) -> None:
        self.families = {f.name: f for f in metrics.registry.families}
        model = _passing(metrics.models)
        attributed = metrics.attributed
        extra: dict[str, Bound] = {}
        if attributed is not None:  # the --metric-label values, each bounded as in one process
            for counter in (attributed.requests, attributed.tokens, attributed.cost):
                names = counter.labelnames[-len(attributed.values) :]
                extra.update(
                    {f"{counter.name}\0{n}": _passing(b) for n, b in zip(names, attributed.values, strict=True)}
                )
        self._bounds: dict[str, tuple[Bound | None, ...]] = {}
        for name, family in self.families.items():
            bounds = tuple(model if label == "model" else extra.get(f"{name}\0{label}") for label in family.labelnames)
            if any(bounds):
                self._bounds[name] = bounds
        # (family name, the worker's label values) -> the group's child: bounds decide a name once
        self._children: dict[tuple[str, tuple[str, ...]], Any] = {}

    def _child(self, name: str, labels: tuple[str, ...]) -> Any:
        key = (name, labels)
        child = self._children.get(key)
        if child is None:
            bounds = self._bounds.get(name)
            given = labels if bounds is None else tuple(b(v) if b else v for b, v in zip(bounds, labels, strict=True))
            child = self._children[key] = self.families[name].labels(*given)
        return child

    def apply(self, taken: Taken, held: Held) -> None:
        """One worker's changes; `held`: what its summed gauges add to the group's now (updated).
        Raises KeyError for a family this process does not have."""
        for name, changed in taken:
            family = self.families[name]
            kind = family.kind
            summed = getattr(family, "summed", False)
            for labels, state in changed:
                child = self._child(name, labels)
                if kind == "histogram":
                    child.add(*state)
                elif kind == "counter":
                    child.inc(state)
                elif summed:
                    before = held.get((name, labels), 0.0)
                    held[(name, labels)] = state
                    child.inc(state - before)
                else:
                    child.set(state)

    def release(self, held: Held) -> None:
        """A worker is gone: what its summed gauges added (its requests in flight) is taken back."""
        for (name, labels), value in held.items():
            if value:
                self._child(name, labels).dec(value)
        held.clear()
