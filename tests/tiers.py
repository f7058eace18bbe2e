"""The two test tiers: unit (`make test-fast`) and end-to-end (the rest of `make test`).

A unit test runs in this process on pure code: parsers, timers, state machines, renderers, the
telemetry builders fed records. A test is end-to-end (marked `e2e` by conftest.py) when it uses a
fixture that starts a server (`E2E_FIXTURES`), or its module drives real processes, browsers,
Prometheus or servers of its own (`E2E_MODULES`), or it carries `@pytest.mark.e2e` itself.

`pytest --unit` runs the unit tier and skips any test in it that starts a process, with a reason
naming this file: a new module that does so belongs in `E2E_MODULES`, so the fast tier stays
fast (`make test` runs every test whatever its tier).
"""

from __future__ import annotations

import multiprocessing.util
import os
import subprocess
from collections.abc import Iterable
from typing import NoReturn

import pytest

__all__ = ["E2E_FIXTURES", "E2E_MODULES", "forbid_processes", "is_e2e", "whole_module_e2e"]

# Fixtures of tests/conftest.py that start servers: the fake upstream, the proxy, a forward proxy.
E2E_FIXTURES = frozenset({"upstream", "start_proxy", "proxy", "forward"})

# Modules (paths from the repository root), or single tests in them (`path::name`, every
# parametrization), that start processes, browsers, Prometheus or servers without those fixtures,
# or take seconds each.
E2E_MODULES = frozenset(
    {
        "tests/adversarial/test_cardinality.py",
        "tests/adversarial/test_drain.py",
        "tests/adversarial/test_faults.py",
        "tests/adversarial/test_outages.py",
        "tests/adversarial/test_secrets.py",
        "tests/test_attribution.py::test_workers_share_one_salt_so_a_key_has_one_id",
        "tests/test_cli.py",
        "tests/test_client_close_real.py",
        "tests/test_compare.py",
        "tests/test_demo.py",
        "tests/test_doctor.py",
        "tests/test_exposition.py::test_promtool_accepts_a_full_page_of_the_proxys_metrics",
        "tests/test_failure_log.py",
        "tests/test_failures.py",
        "tests/test_layout.py::test_importing_the_parsers_does_not_load_the_server_or_opentelemetry",
        "tests/test_make.py",
        "tests/test_packaging.py",
        "tests/test_probe.py",
        "tests/test_readme.py",
        "tests/test_sdk_clients.py",
        "tests/test_semconv.py::test_the_table_generator_reads_the_model_at_a_tag",
        "tests/test_signals.py",
        "tests/test_sim.py::test_the_sdks_work_against_the_sim",
        "tests/test_sim_accounting.py::test_the_openai_sdk_sees_the_429",
        "tests/test_sim_accounting.py::test_embeddings_through_the_sdk_and_errors",
        "tests/test_stack_files.py",
        "tests/test_stack_live.py",
        "tests/test_startup.py",
        "tests/test_startup_hints.py::test_serve_says_at_start_that_the_upstream_has_an_endpoint_path_glued_on",
        "tests/test_tcp_network.py",
        "tests/test_ui_browser.py",
        "tests/test_worker_channel.py::test_a_worker_of_another_version_is_refused_and_the_group_serves_on",
        "tests/test_worker_channel.py::test_the_supervisor_adds_reports_and_counts_a_dead_workers_requests_in_flight_once",
        "tests/test_worker_channel.py::test_a_worker_whose_supervisor_stops_reading_holds_its_reports_back_and_loses_nothing",
        "tests/test_worker_channel.py::test_a_worker_reports_every_request_before_it_exits",
        "tests/test_workers.py",
    }
)


def is_e2e(nodeid: str, fixturenames: Iterable[str]) -> bool:
    """Whether the test with this node id and these fixtures belongs to the end-to-end tier."""
    module, _, name = nodeid.partition("::")
    test = f"{module}::{name.split('[', 1)[0]}"
    return module in E2E_MODULES or test in E2E_MODULES or not E2E_FIXTURES.isdisjoint(fixturenames)


def whole_module_e2e(path: str) -> bool:
    """Whether every test of the module at `path` (from the repository root) is end-to-end."""
    return path in E2E_MODULES


def forbid_processes(monkeypatch: pytest.MonkeyPatch, nodeid: str) -> None:
    """Make starting a process (subprocess, asyncio's, multiprocessing's, a bare fork) skip this
    test: it is end-to-end, and runs with `make test`."""

    def refuse(*args: object, **kwargs: object) -> NoReturn:
        pytest.skip(
            f"{nodeid} starts a process, so it is end-to-end (make test runs it): "
            "list its module in E2E_MODULES in tests/tiers.py, or mark it @pytest.mark.e2e"
        )

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
    monkeypatch.setattr(os, "fork", refuse)
    monkeypatch.setattr(multiprocessing.util, "spawnv_passfds", refuse)
