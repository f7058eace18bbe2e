"""The public surface is deliberate: adding or removing a name is a decision, not an accident."""

from __future__ import annotations

import logging

import pytest

import proxy
from proxy.cli import main
from proxy.config.settings import Settings
from proxy.telemetry.accesslog import access_line


def test_exported_members() -> None:
    assert sorted(proxy.__all__) == sorted(
        [
            "PhaseClock", "RequestInfo", "RequestRecord", "RequestTiming", "Running", "SSEDecoder",
            "SSEEvent", "Settings", "Usage", "__version__", "api_for_path", "running",
        ]
    )  # fmt: skip
    for name in proxy.__all__:
        assert getattr(proxy, name) is not None


def test_settings_defaults_match_the_contract() -> None:
    s = Settings()
    assert (s.upstream, s.host, s.port, s.metrics_port) == ("https://taotoken.net/api", "127.0.0.1", 8787, 9464)


def test_environment_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAOTRACE_PORT", "9999")
    monkeypatch.setenv("TAOTRACE_MODEL_ALLOWLIST", "gpt-4o, gpt-4o-mini")
    s = Settings()
    assert s.port == 9999 and s.model_allowlist == ["gpt-4o", "gpt-4o-mini"]
    assert Settings(port=1234).port == 1234  # an explicit value beats the environment


def test_serve_help_lists_every_setting(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    for flag in ("--upstream", "--host", "--port", "--metrics-port", "--connect-timeout", "--read-timeout",
                 "--max-body-bytes", "--drain-seconds", "--model-allowlist", "--capture-content"):  # fmt: skip
        assert flag in out


def test_bad_upstream_is_refused_with_a_clear_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--upstream", "ftp://nowhere", "--port", "0", "--metrics-port", "0"]) == 2
    assert "argument --upstream: upstream must be an http(s) URL" in capsys.readouterr().err


async def test_access_log_line_has_no_query_or_secrets(start_proxy, client, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="taotrace.access"):
        async with start_proxy(access_log=True) as p:
            async with client.post(
                p.url + "/v1/chat/completions?key=QUERY-CANARY",
                json={"model": "m"},
                headers={"Authorization": "Bearer KEY-CANARY"},
            ) as r:
                await r.read()
    line = access_line(p.records[-1])
    assert line in caplog.text
    assert "POST /v1/chat/completions 200 api=chat_completions model=m" in line
    assert "CANARY" not in caplog.text
