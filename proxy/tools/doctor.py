"""`taotrace doctor`: the checks of `doctor_checks.py` in order, then the report.

It stops at the first failure with a one-line cause and a concrete fix; the exit status is 0
only when every check passes (warnings allowed). A proxy variable that cannot work is exit 2 and
one line, as for `probe` and `serve`. Each check is printed as it ends (on a terminal, the one
under way shows on stderr; with `--json`, stdout keeps only the JSON and finished checks are
lines on stderr when it is not a terminal). Ctrl-C stops the check under way: the ones finished
stay printed (`"interrupted": true` in `--json`) and the exit status is 130 (143 for SIGTERM).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any, TextIO

from pydantic import Field

from proxy.tools.clientconfig import BaseURLError, ClientSettings, Target, load_target, parse_base_url, shown_url
from proxy.tools.doctor_checks import CHECKS, Check, diagnose
from proxy.tools.progress import Progress
from proxy.tools.route import BAD_VARIABLE_FIX, route_for
from proxy.tools.stoppable import interrupted_status, signals, unless_stopped

__all__ = ["CHECKS", "Check", "DoctorSettings", "diagnose", "run"]


class DoctorSettings(ClientSettings):
    """Everything `taotrace doctor` can be told."""

    timeout: float = Field(10.0, gt=0, description="seconds allowed for each network step")


_MARKS = {"ok": "ok  ", "warn": "warn", "fail": "FAIL", "skip": "-   "}


def _header(target: Target) -> str:
    return f"taotrace doctor: {shown_url(target.base_url)}, model {target.model}\n"


def _lines(c: Check) -> str:
    """One check as the report prints it: its line, then its warning and fix under the detail."""
    text = f"  {_MARKS[c.status]}  {c.name:<8} {c.detail if c.status != 'skip' else ''}".rstrip() + "\n"
    if c.warning:
        text += f"        {'':<8} warning: {c.warning}\n"
    if c.fix:
        text += f"        {'':<8} fix: {c.fix}\n"
    return text


def _passed(checks: Sequence[Check]) -> bool:
    return all(c.status in ("ok", "warn") for c in checks)


def _footer(checks: Sequence[Check]) -> str:
    warned = sum(c.status == "warn" for c in checks)
    if not _passed(checks):
        return ""
    return "all checks passed" + (f" ({warned} warning{'s' if warned > 1 else ''})" if warned else "") + "\n"


def report(target: Target, checks: list[Check], as_json: bool, out: TextIO, interrupted: bool = False) -> int:
    """The whole report (text or JSON); the exit status: 0 when every check passed, else 1."""
    ok = _passed(checks)
    if as_json:
        doc: dict[str, Any] = {
            "base_url": shown_url(target.base_url),
            "model": target.model,
            "ok": ok,
            "checks": [asdict(c) for c in checks],
        }
        if interrupted:
            doc["interrupted"] = True
        out.write(json.dumps(doc, indent=2) + "\n")
        return 0 if ok else 1
    out.write(_header(target) + "".join(_lines(c) for c in checks) + _footer(checks))
    return 0 if ok else 1


def _show(progress: Progress, out: TextIO | None) -> Callable[[str, Check | None], None]:
    """doctor's progress: the check under way on a terminal; each finished check on `out` (the
    text report, printed as it goes) or, for --json (`out` None), as a line in a log."""

    def show(name: str, check: Check | None) -> None:
        if check is None:
            progress.running(f"doctor: checking {name}")
            return
        progress.clear()
        if out is not None:
            out.write(_lines(check))
            out.flush()
        elif check.status != "skip":
            progress.done(f"doctor: {name} {check.status}: {check.detail.splitlines()[0]}")

    return show


def run(settings: DoctorSettings, out: TextIO = sys.stdout) -> int:
    """The `taotrace doctor` command."""
    try:
        target = load_target(settings)
    except ValueError as exc:
        print(f"doctor: {exc}", file=sys.stderr)
        return 2
    try:  # a bad HTTPS_PROXY is a usage error, as for probe and serve (a bad base URL is the network check's)
        route_for(parse_base_url(target.base_url), os.environ)
    except BaseURLError:
        pass
    except ValueError as exc:
        print(f"doctor: {exc}; {BAD_VARIABLE_FIX}", file=sys.stderr)
        return 2
    checks: list[Check] = []
    progress = Progress(sys.stderr)
    as_text = not settings.json_output
    if as_text:
        out.write(_header(target))
        out.flush()

    async def main() -> int | None:
        """None when the checks all ran, else the exit status of the signal that stopped them."""
        shutdown = signals()
        work = diagnose(target, settings.timeout, results=checks, progress=_show(progress, out if as_text else None))
        return None if await unless_stopped(work, shutdown) is not None else interrupted_status(shutdown)

    stopped = asyncio.run(main())
    progress.clear()
    if stopped is not None:
        current = CHECKS[len(checks)][0]
        print(f"doctor: interrupted during the {current} check", file=sys.stderr)
        checks.append(Check(current, "skip", "interrupted"))
        checks += [Check(name, "skip", "not run") for name, _ in CHECKS[len(checks) :]]
        if not as_text:
            report(target, checks, True, out, interrupted=True)
        return stopped
    if not as_text:
        return report(target, checks, True, out)
    out.write(_footer(checks))
    return 0 if _passed(checks) else 1
