"""The test tiers of tests/tiers.py: what is end-to-end, and the unit tier's refusal of processes."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import tiers

ROOT = Path(__file__).resolve().parents[1]


def test_a_server_fixture_or_a_listed_module_or_test_makes_a_test_e2e() -> None:
    assert tiers.is_e2e("tests/test_sse.py::test_x", ["proxy", "client"])
    assert tiers.is_e2e("tests/test_sse.py::test_x[a-b]", ["upstream"])
    assert tiers.is_e2e("tests/test_readme.py::test_anything[1]", [])
    listed = "tests/test_sim.py::test_the_sdks_work_against_the_sim"
    assert tiers.is_e2e(listed, []) and tiers.is_e2e(listed + "[param]", [])
    assert not tiers.is_e2e("tests/test_sim.py::test_the_sdks_work_against_the_simulator", [])
    assert not tiers.is_e2e("tests/test_sse.py::test_x", ["registry", "exporter", "tracing", "client"])
    assert tiers.whole_module_e2e("tests/test_readme.py")
    assert not tiers.whole_module_e2e("tests/test_sim.py")


@pytest.mark.parametrize("entry", sorted(tiers.E2E_MODULES))
def test_every_listed_module_and_test_exists(entry: str) -> None:
    """A renamed module or test would silently fall into the unit tier: the list must follow."""
    module, _, name = entry.partition("::")
    path = ROOT / module
    assert path.is_file(), f"{module} is listed in tests/tiers.py but does not exist"
    if name:
        assert re.search(rf"^(async )?def {re.escape(name)}\(", path.read_text(), re.M), f"no {name} in {module}"


def test_the_unit_tier_refuses_a_subprocess(monkeypatch: pytest.MonkeyPatch) -> None:
    tiers.forbid_processes(monkeypatch, "tests/test_x.py::test_y")
    with pytest.raises(pytest.skip.Exception, match=r"test_y starts a process.*E2E_MODULES in tests/tiers.py"):
        subprocess.run([sys.executable, "-c", "pass"], check=False)


async def test_the_unit_tier_refuses_an_asyncio_subprocess(monkeypatch: pytest.MonkeyPatch) -> None:
    tiers.forbid_processes(monkeypatch, "tests/test_x.py::test_y")
    with pytest.raises(pytest.skip.Exception, match="starts a process"):
        await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
