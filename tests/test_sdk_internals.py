"""The OpenTelemetry releases whose private internals proxy/telemetry/sdk_internals.py relies on.

An upgrade must be deliberate: when the installed versions differ from the verified ones, this
fails, naming them. Then rerun tests/test_telemetry_fast.py and tests/test_telemetry_otlp.py
(they pin the fast paths' output to the SDK's), re-read the private names listed in
sdk_internals' docstring in the new release, and move VERIFIED and pyproject.toml's pins.
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

from proxy.telemetry.sdk_internals import VERIFIED

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")

ROOT = Path(__file__).resolve().parent.parent


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def test_installed_opentelemetry_is_the_verified_release() -> None:
    installed = {name: importlib.metadata.version(name) for name in VERIFIED}
    wrong = {name: v for name, v in installed.items() if _minor(v) != VERIFIED[name]}
    assert not wrong, (
        f"OpenTelemetry {wrong} installed, but proxy/telemetry/sdk_internals.py was verified against "
        f"{ {n: VERIFIED[n] for n in wrong} }: read its docstring before upgrading"
    )


def test_pyproject_pins_the_verified_minor_versions() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {}
    for dep in deps:
        m = re.fullmatch(r"(opentelemetry-[a-z-]+)~=(\d+\.\d+)\.\d+", dep.replace(" ", ""))
        if dep.startswith("opentelemetry"):
            assert m, f"{dep}: pin OpenTelemetry packages as ~=X.Y.Z (compatible within the verified minor)"
            pins[m.group(1)] = m.group(2)
    assert pins, "no OpenTelemetry pins in pyproject.toml"
    for name, minor in pins.items():
        assert VERIFIED.get(name, minor) == minor, name
    assert {"opentelemetry-sdk", "opentelemetry-exporter-otlp"} <= set(pins)
    # What the pinned packages bring in must be the verified release too.
    for name in VERIFIED:
        assert _minor(importlib.metadata.version(name)) == VERIFIED[name]
