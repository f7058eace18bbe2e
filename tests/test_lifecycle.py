"""`proxy.server.lifecycle.Shutdown`'s exit status: the shell's 128 + the signal that asked first (the
tools demo, probe and doctor exit with it when a signal stops their work)."""

from __future__ import annotations

import gc
import signal

from proxy.server.lifecycle import GC_YOUNG_THRESHOLD, Shutdown, settle_heap
from proxy.tools.stoppable import interrupted_status


def test_the_first_signal_names_the_exit_status() -> None:
    for first, then, status in [(signal.SIGINT, signal.SIGTERM, 130), (signal.SIGTERM, signal.SIGINT, 143)]:
        shutdown = Shutdown()
        shutdown.signal(first)
        shutdown.signal(then)  # a second signal hurries the stop; it does not rename it
        assert shutdown.requested.is_set() and shutdown.now.is_set()
        assert shutdown.exit_status == status == interrupted_status(shutdown)
    assert interrupted_status(None) == 130  # off the main thread no signal is taken: Ctrl-C's status


def test_settle_heap_freezes_start_up_and_lets_a_burst_of_live_objects_be() -> None:
    before = gc.get_threshold()
    collections: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    try:
        settle_heap()
        assert gc.get_freeze_count() > 0  # start-up objects are out of the collector's reach
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, *before[1:])
        gc.collect()  # start the young count from zero
        gc.callbacks.append(seen)
        try:
            # A burst of requests starting together: objects that all stay alive for a while.
            burst = [{"request": i} for i in range(GC_YOUNG_THRESHOLD // 2)]
        finally:
            gc.callbacks.remove(seen)
        assert len(burst) == GC_YOUNG_THRESHOLD // 2
        assert collections == [], "a young collection walked the burst's live objects"
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
