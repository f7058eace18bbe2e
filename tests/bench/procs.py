"""Child processes of the benchmark and what /proc says about them (CPU time, RSS)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path


def best_of_runs(
    trees: Sequence[Path], run: Callable[[Path], dict[str, float]], rounds: int
) -> dict[Path, dict[str, float]]:
    """Each tree's least value of every measurement over `rounds` calls of `run(tree)` (each a
    fresh process: both trees import `proxy`), the trees in turns and their order reversed every
    other round: on a shared host the second of two back-to-back runs was often the slower one."""
    best: dict[Path, dict[str, float]] = {}
    for r in range(rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            got = run(tree)
            mine = best.setdefault(tree, got)
            for name, value in got.items():
                mine[name] = min(mine.get(name, value), value)
    return best


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tree(pid: int) -> list[int]:
    """pid and all its descendants (by scanning /proc: no psutil needed)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def cpu_ns(pids: list[int]) -> int:
    """On-CPU nanoseconds of every thread of these processes (schedstat: ns, not 10 ms ticks)."""
    total = 0
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    return total


def rss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
                    break
        except OSError:
            pass
    return total


def wait_port(port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout:.0f}s")


@dataclass
class Proc:
    """A child started under `taskset`, its log file, and its /proc readings."""

    name: str
    argv: list[str]
    log: Path
    cpus: str | None = None
    env: dict[str, str] | None = None
    cwd: str | None = None
    nice: int = 0
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _pids: list[int] = field(default_factory=list, repr=False)

    def start(self) -> Proc:
        argv = list(self.argv)
        if self.cpus is not None and shutil.which("taskset"):
            argv = ["taskset", "-c", self.cpus, *argv]
        if self.nice:
            argv = ["nice", "-n", str(self.nice), *argv]
        self.log.parent.mkdir(parents=True, exist_ok=True)
        fh = self.log.open("wb")
        self.popen = subprocess.Popen(
            argv, stdout=fh, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd, start_new_session=True
        )
        fh.close()
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def pids(self, refresh: bool = False) -> list[int]:
        """The process tree, cached (workers of nginx/uvicorn do not come and go mid-run)."""
        if refresh or not self._pids:
            self._pids = tree(self.pid)
        return self._pids

    def cpu_ns(self) -> int:
        return cpu_ns(self.pids())

    def rss_kib(self) -> int:
        return rss_kib(self.pids())

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM this child's own process group, then SIGKILL it if it lingers."""
        if self.popen is None or self.popen.poll() is not None:
            return
        pgid = self.popen.pid  # start_new_session: the child leads its own group
        try:
            os.killpg(pgid, signal.SIGTERM)
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.popen.wait(5)
        except ProcessLookupError:
            pass

    def tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


async def http_get(port: int, path: str) -> bytes:
    """The body of `GET path` on 127.0.0.1:port (one connection, closed after; chunked decoded)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
    data = await asyncio.wait_for(reader.read(-1), 30)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        out, pos = bytearray(), 0
        while True:
            eol = body.find(b"\r\n", pos)
            size = int(body[pos:eol], 16)
            if size == 0:
                break
            out += body[eol + 2 : eol + 2 + size]
            pos = eol + 2 + size + 2
        body = bytes(out)
    return body


def load_streams(port: int, concurrency: int, tokens: int, seconds: float) -> int:
    """`load.py` against `port` (C streams started together, again and again for S seconds): the
    streams completed. Raises when it printed no summary or counted an error."""
    out = subprocess.run(
        [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "load.py"), "--port", str(port),
         "--concurrency", str(concurrency), "--tokens", str(tokens), "--seconds", str(seconds)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    m = re.search(r"(\d+) streams, (\d+) errors", out)
    if m is None or int(m.group(2)):
        raise RuntimeError(f"load.py: {out.strip()!r}")
    return int(m.group(1))
