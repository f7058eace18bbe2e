"""Counters, gauges and histograms with a fixed label set, and their Prometheus exposition.

    Registry ── Counter / Gauge / Histogram (one declaration each) ── .labels(...) -> child
    render(openmetrics=False) -> text format 0.0.4      render(openmetrics=True) -> OpenMetrics 1.0

Why not prometheus_client's own: its `collect()` builds a `Sample` tuple and a label dict per
line, so at the 100-model cap (~110k lines) one render held a core for ~0.5 s. Here every label
child renders its lines once, into a `%` template, and a render is one `%` per child (C code).
The output is byte-identical to prometheus_client's for the same observations (same names,
sorted labels, `# HELP`/`# TYPE`, value formatting, exemplars; tests/test_exposition.py), except
that no `_created` series are written (no dashboard or alert reads them).

The families also answer `collect()` like a prometheus_client collector, so a registry can be
registered into a `CollectorRegistry` (tests read values with `get_sample_value`). Mutation is
not locked: counts are plain ints updated on the event loop; a render in another thread may see
one request half-applied (a bucket counted, its sum not yet), never a broken page.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import accumulate
from typing import Generic, TypeVar, cast

from prometheus_client import utils
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Exemplar

__all__ = [
    "Counter",
    "Gauge",
    "Histogram",
    "HistogramChild",
    "ValueChild",
    "Registry",
    "TEXT_CONTENT_TYPE",
    "OPENMETRICS_CONTENT_TYPE",
    "wants_openmetrics",
]

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
_go = cast(Callable[[float], str], utils.floatToGoString)  # Go's float format, as prometheus_client writes it
_now = time.time  # an exemplar's timestamp
BIG = 1_000_000  # from here floatToGoString writes integers with an exponent (Go's %g)


def wants_openmetrics(accept: str) -> bool:
    """True when an `Accept` header asks for OpenMetrics (what Prometheus sends with exemplars on)."""
    return any(part.split(";")[0].strip() == "application/openmetrics-text" for part in accept.split(","))


def _number(value: float) -> str:
    """`_go`, without its function calls in the common case."""
    return repr(value) if -BIG < value < BIG else _go(value)


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    """`{a="x",b="y"}` with names sorted, as prometheus_client writes them; "" for none."""
    items = sorted(pairs)
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in items) + "}" if items else ""


class Registry:
    """The families of one process, in declaration order."""

    def __init__(self) -> None:
        self.families: list[_Family[object]] = []

    def register(self, family: _Family[object]) -> None:
        if any(f.name == family.name for f in self.families):
            raise ValueError(f"duplicate metric family {family.name}")
        self.families.append(family)

    def render(self, openmetrics: bool = False) -> bytes:
        """The whole page: Prometheus text 0.0.4, or OpenMetrics 1.0 with exemplars."""
        return b"".join(self.pages(openmetrics))

    def pages(self, openmetrics: bool = False) -> Iterator[bytes]:
        """The page in pieces, each a family's header or a group of up to `GROUP_SIZE` children
        (a few KB to ~200 KB): a piece whose children did not change since the last render is
        the same bytes object again, and the caller may write, or yield the loop, between pieces."""
        for family in list(self.families):
            yield family.header_om if openmetrics else family.header_text
            render = family.render_group
            for group in list(family.groups):
                version = group.version  # read first: a change during the render makes the cache stale
                cached = group.cache[openmetrics]
                if cached is not None and cached[0] == version:
                    yield cached[1]
                else:
                    page = render(group.children, openmetrics)
                    group.cache[openmetrics] = (version, page)
                    yield page
        if openmetrics:
            yield b"# EOF\n"

    # prometheus_client's collector protocol, so a CollectorRegistry can read these families.
    def describe(self) -> Iterator[Metric]:
        for family in self.families:
            yield Metric(family.name, family.documentation, family.kind)

    def collect(self) -> Iterator[Metric]:
        for family in self.families:
            yield family.collect()


C = TypeVar("C")
# Children per group: a group's page is rendered again only when one of its children changed,
# and it is what a scrape renders between two turns of the event loop. Small enough that one
# group holds the loop briefly, large enough that a page with nothing new walks few groups
# (docs/performance.md).
GROUP_SIZE = 16


class _Group:
    """Up to `GROUP_SIZE` children of one family, in creation order, and their last page per format.

    Every change to a child bumps `version` (one integer add on the hot path)."""

    __slots__ = ("children", "version", "cache")

    def __init__(self) -> None:
        self.children: list[object] = []
        self.version = 0
        self.cache: list[tuple[int, bytes] | None] = [None, None]  # [text, openmetrics]


class _Family(Generic[C]):
    """One metric family: name, help, label names, and a child per label-value tuple."""

    kind = ""
    sample_suffix = ""  # counters expose `<name>_total`

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str] = (), *, registry: Registry | None = None
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.children: dict[tuple[str, ...], C] = {}
        self.groups: list[_Group] = []
        doc = documentation.replace("\\", r"\\").replace("\n", r"\n")
        text_name = name + self.sample_suffix
        self.header_text = f"# HELP {text_name} {doc}\n# TYPE {text_name} {self.kind}\n".encode()
        self.header_om = f"# HELP {name} {doc}\n# TYPE {name} {self.kind}\n".encode()
        if registry is not None:
            registry.register(self)  # type: ignore[arg-type]

    def labels(self, *values: object, **named: object) -> C:
        """The child for these label values (created on first use, then reused)."""
        if not named:
            # The hot path (the forwarder's in-flight gauge, once a request): values passed as
            # strings find their child without a key being built.
            found = self.children.get(values)  # type: ignore[arg-type]
            if found is not None:
                return found
        else:
            values = tuple(named[n] for n in self.labelnames)
        key = tuple(str(v) for v in values)
        child = self.children.get(key)
        if child is None:
            if len(key) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {key}")
            groups = self.groups
            if not groups or len(groups[-1].children) >= GROUP_SIZE:
                groups.append(_Group())
            group = groups[-1]
            child = self._child(tuple(zip(self.labelnames, key, strict=True)), group)
            group.children.append(child)  # before it is findable: a render that sees it has it
            group.version += 1
            self.children[key] = child
        return child

    def _child(self, labels: tuple[tuple[str, str], ...], group: _Group) -> C:
        raise NotImplementedError

    def render_group(self, children: list[object], openmetrics: bool) -> bytes:
        """The lines of `children` (one group's)."""
        raise NotImplementedError

    def collect(self) -> Metric:
        raise NotImplementedError


class _Value:
    """A counter or gauge child: one number."""

    __slots__ = ("line", "labels", "value", "page", "group")

    def __init__(self, sample: str, labels: tuple[tuple[str, str], ...], group: _Group) -> None:
        self.group = group
        self.labels = labels
        self.line = sample + _labels(labels) + " "
        self.value = 0.0
        # (the value object last rendered, its line): `inc` and `set` bind a new float, so an
        # identity test tells an unchanged child without formatting it again.
        self.page: tuple[float, bytes] | None = None

    def inc(self, amount: float = 1) -> None:
        self.value += amount
        self.group.version += 1

    def dec(self, amount: float = 1) -> None:
        self.value -= amount
        self.group.version += 1

    def set(self, value: float) -> None:
        self.value = float(value)
        self.group.version += 1

    def get(self) -> float:
        return self.value


class _ValueFamily(_Family[_Value]):
    def _child(self, labels: tuple[tuple[str, str], ...], group: _Group) -> _Value:
        return _Value(self.name + self.sample_suffix, labels, group)

    def render_group(self, children: list[object], openmetrics: bool) -> bytes:
        lines = []
        for child in cast(list[_Value], children):
            value, page = child.value, child.page
            if page is None or page[0] is not value:
                page = child.page = (value, (child.line + _number(value) + "\n").encode())
            lines.append(page[1])
        return b"".join(lines)

    def collect(self) -> Metric:
        metric = Metric(self.name, self.documentation, self.kind)
        for child in list(self.children.values()):
            metric.add_sample(self.name + self.sample_suffix, dict(child.labels), float(child.value))
        return metric


class Counter(_ValueFamily):
    """Exposed as `<name>_total`; `.labels(...).inc(n)`."""

    kind = "counter"
    sample_suffix = "_total"


class Gauge(_ValueFamily):
    """`.labels(...).inc()`, `.dec()`, `.set(v)`. `summed`: across the processes of a group the
    value is the sum of each one's (requests in flight), not the last one set (a rate limit seen)."""

    kind = "gauge"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        registry: Registry | None = None,
        summed: bool = False,
    ) -> None:
        self.summed = summed
        super().__init__(name, documentation, labelnames, registry=registry)


class _Buckets:
    """A histogram child: a count per bucket (not cumulative), the sum, an exemplar per bucket."""

    __slots__ = (
        "bounds", "name", "labels", "les", "counts", "sum", "exemplars", "positions", "rendered", "plain",
        "with_exemplars", "version", "cache", "group",
    )  # fmt: skip

    def __init__(
        self,
        name: str,
        bounds: tuple[float, ...],
        les: tuple[str, ...],
        labels: tuple[tuple[str, str], ...],
        group: _Group,
    ) -> None:
        self.group = group
        self.bounds = bounds
        self.name = name
        self.labels = labels
        self.les = les
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.exemplars: dict[int, tuple[str, float, float]] = {}  # bucket -> (trace_id, value, unix time)
        self.positions: tuple[int, ...] = ()  # the buckets that have an exemplar, in order
        self.rendered: dict[int, bytes] = {}  # bucket -> its exemplar as written after the count
        self.plain: bytes | None = None  # the lines as one template, built on first use
        self.with_exemplars: tuple[tuple[int, ...], bytes] | None = None  # (positions, template)
        self.version = 0  # bumped by every observation; the cache holds the page of one version
        self.cache: list[tuple[int, bytes] | None] = [None, None]  # [text, openmetrics]

    def _template(self, positions: tuple[int, ...] = ()) -> bytes:
        """The child's lines as one bytes `%` template (bytes formatting of ints is cheaper than
        str's): each bucket's count as `N.0` (then its exemplar, where it has one), then the
        count and the sum."""
        lines = [
            self._bucket_prefix(le) + ("%d.0%b\n" if i in positions else "%d.0\n") for i, le in enumerate(self.les)
        ]
        tail = _labels(self.labels).replace("%", "%%")
        lines += (f"{self.name}_count{tail} %d.0\n", f"{self.name}_sum{tail} %b\n")
        return "".join(lines).encode()

    def _bucket_prefix(self, le: str) -> str:
        return f"{self.name}_bucket{_labels((*self.labels, ('le', le)))} ".replace("%", "%%")

    def observe(self, value: float, exemplar: dict[str, str] | None = None) -> None:
        i = bisect_left(self.bounds, value)  # the first bound with value <= bound, as prometheus_client
        self.counts[i] += 1
        self.sum += value
        self.version += 1
        self.group.version += 1
        if exemplar is not None:  # _exemplar inlined: this runs ~8 times a request
            exemplars = self.exemplars
            new = i not in exemplars
            exemplars[i] = (exemplar["trace_id"], value, _now())
            if self.rendered:  # filled only by OpenMetrics renders
                self.rendered.pop(i, None)
            if new:  # after the exemplar is in: a render in another thread reads positions first
                self.positions = tuple(sorted(exemplars))

    def _exemplar(self, i: int, value: float, exemplar: dict[str, str], ts: float | None = None) -> None:
        new = i not in self.exemplars
        self.exemplars[i] = (exemplar["trace_id"], value, time.time() if ts is None else ts)
        self.rendered.pop(i, None)
        if new:  # after the exemplar is in: a render in another thread reads positions first
            self.positions = tuple(sorted(self.exemplars))

    def observe_many(self, values: Sequence[float], exemplar: dict[str, str] | None = None) -> None:
        """`observe(v)` for each value, one pass per bucket touched; `exemplar` goes with the
        largest value (a stream's slowest gap is the one worth opening as a trace).

        Sorted (in C), the values of one bucket are a run: two bisects count it, so a stream's
        gaps, which fall in a few buckets, cost a sort rather than a Python step per value.
        """
        if not values:
            return
        bounds, counts = self.bounds, self.counts
        ordered = sorted(values)
        n, pos = len(ordered), 0
        while pos < n:
            i = bisect_left(bounds, ordered[pos])  # the bucket of the smallest value left
            end = bisect_right(ordered, bounds[i], pos + 1)  # ... and every value up to its bound (a NaN: itself)
            counts[i] += end - pos
            pos = end
        self.sum += sum(values)
        self.version += 1
        self.group.version += 1
        if exemplar is not None:
            largest = ordered[-1]
            self._exemplar(bisect_left(bounds, largest), largest, exemplar)

    def add(self, pairs: Sequence[int], added: float, exemplars: Sequence[tuple[int, str, float, float]]) -> None:
        """Another process's observations of this child (`proxy/workers/deltas.py`): `pairs`
        (bucket, count) flattened, their sum, and the exemplars it set, each (bucket, trace id,
        value, time); an exemplar replaces this bucket's unless this one is newer."""
        counts = self.counts
        it = iter(pairs)
        for i, n in zip(it, it, strict=True):
            counts[i] += n
        self.sum += added
        for i, trace_id, value, ts in exemplars:
            held = self.exemplars.get(i)
            if held is None or held[2] <= ts:
                self._exemplar(i, value, {"trace_id": trace_id}, ts)
        self.version += 1
        self.group.version += 1

    def render(self, openmetrics: bool) -> bytes:
        version = self.version  # read first: an observation during the render makes the cache stale
        cached = self.cache[openmetrics]
        if cached is not None and cached[0] == version:
            return cached[1]
        cum = list(accumulate(self.counts))
        total = cum[-1]
        positions = self.positions if openmetrics else ()
        exemplars: list[bytes] = []
        for i in positions:
            found = self.rendered.get(i)
            if found is None:
                trace_id, value, ts = self.exemplars[i]
                found = self.rendered[i] = f' # {{trace_id="{_escape(trace_id)}"}} {_go(value)} {ts}'.encode()
            exemplars.append(found)
        if total >= BIG:  # rare: Go-style exponents for big integers
            page = self._render_big(cum, dict(zip(positions, exemplars, strict=True)))
        elif not positions:
            if self.plain is None:
                self.plain = self._template()
            page = self.plain % (*cum, total, _number(self.sum).encode())
        else:
            if self.with_exemplars is None or self.with_exemplars[0] != positions:
                self.with_exemplars = (positions, self._template(positions))
            args: list[object] = list(cum)
            for i, ex in zip(reversed(positions), reversed(exemplars), strict=True):
                args.insert(i + 1, ex)
            page = self.with_exemplars[1] % (*args, total, _number(self.sum).encode())
        self.cache[openmetrics] = (version, page)
        return page

    def _render_big(self, cum: list[int], exemplars: dict[int, bytes]) -> bytes:
        tail = _labels(self.labels)
        lines = [
            self._bucket_prefix(le).replace("%%", "%") + _go(c) + exemplars.get(i, b"").decode() + "\n"
            for i, (le, c) in enumerate(zip(self.les, cum, strict=True))
        ]
        lines += (
            f"{self.name}_count{tail} {_go(cum[-1])}\n",
            f"{self.name}_sum{tail} {_go(self.sum)}\n",
        )
        return "".join(lines).encode()


MAX_BUCKETS = 512


HistogramChild = _Buckets  # what `Histogram.labels(...)` returns
ValueChild = _Value  # what `Counter.labels(...)` and `Gauge.labels(...)` return


class Histogram(_Family[_Buckets]):
    """`.labels(...).observe(v, {"trace_id": ...})`; buckets end with +Inf (added when missing)."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        registry: Registry | None = None,
    ) -> None:
        bounds = tuple(float(b) for b in buckets)
        if bounds[-1] != math.inf:
            bounds += (math.inf,)
        if list(bounds) != sorted(bounds) or len(bounds) > MAX_BUCKETS:
            raise ValueError(f"{name}: buckets must be sorted (at most {MAX_BUCKETS})")
        self.bounds = bounds
        self.les = tuple(_go(b) for b in bounds)
        super().__init__(name, documentation, labelnames, registry=registry)

    def _child(self, labels: tuple[tuple[str, str], ...], group: _Group) -> _Buckets:
        return _Buckets(self.name, self.bounds, self.les, labels, group)

    def render_group(self, children: list[object], openmetrics: bool) -> bytes:
        return b"".join([child.render(openmetrics) for child in cast(list[_Buckets], children)])

    def collect(self) -> Metric:
        metric = Metric(self.name, self.documentation, self.kind)
        for child in list(self.children.values()):
            labels = dict(child.labels)
            cum = 0.0
            for i, le in enumerate(self.les):
                cum += child.counts[i]
                ex = child.exemplars.get(i)
                exemplar = Exemplar({"trace_id": ex[0]}, ex[1], ex[2]) if ex is not None else None
                metric.add_sample(self.name + "_bucket", {**labels, "le": le}, cum, exemplar=exemplar)
            metric.add_sample(self.name + "_count", labels, cum)
            metric.add_sample(self.name + "_sum", labels, child.sum)
        return metric
