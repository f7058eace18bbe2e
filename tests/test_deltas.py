"""A group's metrics from its workers' changes (proxy/workers/deltas.py): the same page as one
process fed every request, whatever the workers' takes and however they interleave."""

from __future__ import annotations

import dataclasses
import pickle
import random

import pytest

from proxy.accounting.ratelimits import RateLimit, RateLimits
from proxy.exchange.record import RequestRecord
from proxy.telemetry.metrics import Metrics, ModelLabels
from proxy.workers.deltas import Changes, Held, Merge
from tests.fakes import record_for


def _records(n: int, seed: int) -> list[RequestRecord]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        rec = record_for(rnd.choice(["chat_completions", "messages"]), rnd.choice(["a", "b", "c"]), 200, rnd)
        if i % 7 == 0:
            rec = record_for("chat_completions", "a", 429, rnd)
        rec = dataclasses.replace(rec, upstream=rnd.choice(["one", "two"]), attributes=(("user.id", f"u{i % 4}"),))
        out.append(rec)
    return out


def _page(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the page; sums rounded (a group adds them in another order)."""
    out = {}
    for family in metrics.registry.collect():
        for s in family.samples:
            value = round(s.value, 9) if s.name.endswith("_sum") or "cost" in s.name else s.value
            out[(s.name, tuple(sorted(s.labels.items())))] = value
    return out


def _metrics(models: int = 100) -> Metrics:
    return Metrics(
        models=ModelLabels(limit=models), attribute_labels=[("user.id", "user_id")], attribute_label_values=10
    )


@pytest.mark.parametrize("workers", [1, 3])
def test_the_group_page_is_one_process_page(workers: int) -> None:
    records = _records(300, seed=workers)
    alone = _metrics()
    for rec in records:
        alone.record(rec)
    group = _metrics()
    merge = Merge(group)
    ours = [_metrics() for _ in range(workers)]
    takes = [Changes(m) for m in ours]
    held: list[Held] = [{} for _ in range(workers)]
    rnd = random.Random(9)
    for rec in records:
        i = rnd.randrange(workers)
        ours[i].record(rec)
        if rnd.random() < 0.1:  # a take now and then, as a worker reports every quarter second
            merge.apply(pickle.loads(pickle.dumps(takes[i].take())), held[i])  # as the channel carries it
    for i in range(workers):
        merge.apply(takes[i].take(), held[i])  # the last (a scrape's)
        assert takes[i].take() == []  # nothing changed since
    assert _page(group) == _page(alone)


def test_a_series_made_at_zero_is_on_the_group_page_too() -> None:
    worker, group = Metrics(), Metrics()
    worker.sink_errors.labels("access_log")
    Merge(group).apply(Changes(worker).take(), {})
    assert group.sink_errors.labels("access_log").get() == 0
    assert ("access_log",) in group.sink_errors.children


def test_requests_in_flight_are_summed_and_a_gone_worker_is_taken_back() -> None:
    group = Metrics()
    merge = Merge(group)
    workers = [Metrics() for _ in range(2)]
    takes = [Changes(w) for w in workers]
    held: list[Held] = [{}, {}]
    workers[0].in_flight.labels("up", "chat").inc(3)
    workers[1].in_flight.labels("up", "chat").inc(2)
    for i in range(2):
        merge.apply(takes[i].take(), held[i])
    assert group.in_flight.labels("up", "chat").get() == 5
    workers[0].in_flight.labels("up", "chat").dec(1)
    merge.apply(takes[0].take(), held[0])
    assert group.in_flight.labels("up", "chat").get() == 4
    assert held[1] == {("taotrace_in_flight_requests", ("up", "chat")): 2.0}
    merge.release(held[1])  # worker 1 died
    assert group.in_flight.labels("up", "chat").get() == 2 and held[1] == {}


def test_a_rate_limit_is_the_last_one_reported() -> None:
    group = Metrics()
    merge = Merge(group)
    workers = [Metrics() for _ in range(2)]
    takes = [Changes(w) for w in workers]
    rnd = random.Random(1)
    seen = []
    # worker 0 sees 90, worker 1 sees 40, then worker 0 sees 90 again: a value set again is reported again
    for i, remaining in ((0, 90), (1, 40), (0, 90)):
        limits = RateLimits(limits=(RateLimit(kind="requests", limit=100, remaining=remaining),), observed_at=1.0)
        workers[i].record(dataclasses.replace(record_for("chat_completions", "m", 200, rnd), rate_limits=limits))
        merge.apply(takes[i].take(), {})
        seen.append(group.ratelimit_remaining.labels("", "m", "requests").get())
    assert seen == [90, 40, 90]  # never summed (130)


def test_exemplars_keep_the_latest_trace_per_bucket() -> None:
    group = Metrics()
    merge = Merge(group)
    workers = [Metrics() for _ in range(2)]
    takes = [Changes(w) for w in workers]
    rnd = random.Random(2)
    first = record_for("chat_completions", "m", 200, rnd)
    workers[0].record(first)
    second = dataclasses.replace(record_for("chat_completions", "m", 200, rnd), timing=first.timing)  # same buckets
    workers[1].record(second)
    merge.apply(takes[1].take(), {})  # the newer arrives first ...
    merge.apply(takes[0].take(), {})  # ... and is kept
    child = group.duration.labels("", "chat_completions", "m")
    assert {trace_id for trace_id, _, _ in child.exemplars.values()} == {second.trace_id}


def test_the_group_bounds_the_labels_each_worker_bounded_alone() -> None:
    """Each worker admits its own first models and --metric-label values; the group admits the
    first it is told of, and counts the rest as `other`, as one process would."""
    group = Metrics(models=ModelLabels(limit=2), attribute_labels=[("user.id", "user_id")], attribute_label_values=2)
    merge = Merge(group)
    rnd = random.Random(3)
    for model in ("a", "b", "c"):  # three workers, each seeing one model and user: each within its own bounds
        worker = Metrics(
            models=ModelLabels(limit=2), attribute_labels=[("user.id", "user_id")], attribute_label_values=2
        )
        rec = dataclasses.replace(record_for("chat_completions", model, 200, rnd), attributes=(("user.id", model),))
        worker.record(rec)
        merge.apply(Changes(worker).take(), {})
    assert {labels[2] for labels in group.requests.children} == {"a", "b", "other"}
    assert {labels[-1] for labels in group.attributed.requests.children} == {"a", "b", "other"}  # type: ignore[union-attr]
    assert sum(c.get() for c in group.requests.children.values()) == 3  # every request, none lost to the bound
