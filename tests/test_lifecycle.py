"""`proxy.lifecycle.Shutdown`'s exit status: the shell's 128 + the signal that asked first (the
tools demo, probe and doctor exit with it when a signal stops their work)."""

from __future__ import annotations

import signal

from proxy.lifecycle import Shutdown
from proxy.tools.stoppable import interrupted_status


def test_the_first_signal_names_the_exit_status() -> None:
    for first, then, status in [(signal.SIGINT, signal.SIGTERM, 130), (signal.SIGTERM, signal.SIGINT, 143)]:
        shutdown = Shutdown()
        shutdown.signal(first)
        shutdown.signal(then)  # a second signal hurries the stop; it does not rename it
        assert shutdown.requested.is_set() and shutdown.now.is_set()
        assert shutdown.exit_status == status == interrupted_status(shutdown)
    assert interrupted_status(None) == 130  # off the main thread no signal is taken: Ctrl-C's status
