"""The command line a newcomer meets first: bad values are one line and exit 2 (never a
traceback), `--help` names each flag's default and variable, `--version` answers.

The bad values are generated from the settings classes themselves (type, bounds, choices), so a
setting added later is covered without touching this file.
"""

from __future__ import annotations

import re
import subprocess
import sys
import typing
from dataclasses import dataclass

import annotated_types
import pytest
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

import proxy
from proxy.cli import COMMANDS, UsageError, main, parse, settings_class
from proxy.flags import _unwrap, env_names, flag_for


@dataclass(frozen=True)
class Bad:
    command: str
    field: str
    value: str


def _bad_values(field: FieldInfo) -> list[str]:
    """Values the field must refuse, read from its annotation and bounds."""
    kind = _unwrap(field.annotation)
    if typing.get_origin(kind) is typing.Literal:
        return ["no-such-choice"]
    if kind is bool:
        return ["maybe"]
    out: list[str] = []
    if kind in (int, float):
        out.append("abc")
        if kind is int:
            out.append("1.5")
        for meta in field.metadata:
            if isinstance(meta, annotated_types.Ge):
                out.append(str(typing.cast(float, meta.ge) - 1))
            elif isinstance(meta, annotated_types.Gt):
                out.append(str(meta.gt))
            elif isinstance(meta, annotated_types.Le):
                out.append(str(typing.cast(float, meta.le) + 1))
            elif isinstance(meta, annotated_types.Lt):
                out.append(str(meta.lt))
    if kind is str and any(isinstance(m, annotated_types.MinLen) and m.min_length > 0 for m in field.metadata):
        out.append("")
    return out


def _cases() -> list[Bad]:
    cases = []
    for command in COMMANDS:
        cls = settings_class(command)
        for name, field in cls.model_fields.items():
            if _unwrap(field.annotation) is SecretStr:
                continue
            cases += [Bad(command.name, name, value) for value in _bad_values(field)]
    return cases


CASES = _cases()


def _cls(command: str) -> type[BaseModel]:
    return settings_class(next(c for c in COMMANDS if c.name == command))


def test_the_generated_cases_cover_every_command_and_the_issue_s_examples() -> None:
    by_command = {c.command for c in CASES}
    assert by_command == {c.name for c in COMMANDS}
    wanted = {
        ("serve", "port", "65536"), ("serve", "connect_timeout", "0"), ("serve", "drain_seconds", "-1"),
        ("serve", "max_body_bytes", "0"), ("serve", "port", "abc"), ("sim", "time_scale", "0"),
        ("demo", "api", "no-such-choice"), ("probe", "runs", "0"), ("doctor", "timeout", "0"),
        ("serve", "log_level", "no-such-choice"),
    }  # fmt: skip
    assert wanted <= {(c.command, c.field, c.value) for c in CASES}


@pytest.mark.parametrize(
    "case", [c for c in CASES if _unwrap(_cls(c.command).model_fields[c.field].annotation) is not bool], ids=str
)
def test_a_bad_flag_is_one_line_naming_the_flag_and_what_is_allowed(case: Bad) -> None:
    cls = _cls(case.command)
    flag = flag_for(case.field, cls.model_fields[case.field])
    with pytest.raises(UsageError) as caught:
        parse([case.command, flag, case.value], environ={})
    (line,) = caught.value.lines
    assert line.startswith(f"argument {flag}: "), line
    assert "allowed" in line or "must" in line or "starts with" in line, line


@pytest.mark.parametrize("case", CASES, ids=str)
def test_a_bad_variable_is_one_line_naming_the_variable(case: Bad, monkeypatch: pytest.MonkeyPatch) -> None:
    variable = env_names(_cls(case.command), case.field)[0]
    monkeypatch.setenv(variable, case.value)
    with pytest.raises(UsageError) as caught:
        parse([case.command], environ={variable: case.value})
    (line,) = caught.value.lines
    assert line.startswith(f"{variable}={case.value!r}: "), line
    assert "allowed: " in line, line


def test_a_flag_beats_a_bad_variable_and_values_are_converted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAOTRACE_PORT", "abc")
    parsed = parse(["serve", "--port", "1234", "--log-level", "DEBUG", "--model-allowlist", "a, b"])
    assert parsed is not None
    settings = parsed[1]
    assert (settings.port, settings.log_level, settings.model_allowlist) == (1234, "debug", ["a", "b"])  # type: ignore[attr-defined]


def test_forwarded_for_from_a_flag_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TAOTRACE_FORWARDED_FOR", raising=False)
    parsed = parse(["serve"], environ={})
    assert parsed is not None and parsed[1].forwarded_for == "append"  # type: ignore[attr-defined]
    monkeypatch.setenv("TAOTRACE_FORWARDED_FOR", "Forwarded")  # any case, as --log-level
    parsed = parse(["serve"])
    assert parsed is not None and parsed[1].forwarded_for == "forwarded"  # type: ignore[attr-defined]
    parsed = parse(["serve", "--forwarded-for", "off"])
    assert parsed is not None and parsed[1].forwarded_for == "off"  # type: ignore[attr-defined]


def test_io_values_without_capture_are_refused_never_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    message = "needs --capture-content (TAOTRACE_CAPTURE_CONTENT): it sets the prompt's and the answer's text on spans"
    for name in ("TAOTRACE_CAPTURE_IO_VALUES", "TAOTRACE_CAPTURE_CONTENT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(UsageError) as caught:
        parse(["serve", "--capture-io-values", "--no-capture-content"], environ={})
    assert caught.value.lines == [f"argument --capture-io-values: {message}"]
    parsed = parse(["serve", "--capture-io-values", "--capture-content"], environ={})
    assert parsed is not None and parsed[1].capture_io_values is True  # type: ignore[attr-defined]
    parsed = parse(["serve", "--no-capture-io-values"], environ={})  # off without capture: nothing to refuse
    assert parsed is not None and parsed[1].capture_io_values is False  # type: ignore[attr-defined]
    monkeypatch.setenv("TAOTRACE_CAPTURE_IO_VALUES", "true")
    with pytest.raises(UsageError) as caught:
        parse(["serve"], environ={"TAOTRACE_CAPTURE_IO_VALUES": "true"})
    assert caught.value.lines == [f"TAOTRACE_CAPTURE_IO_VALUES='true': {message}"]
    monkeypatch.setenv("TAOTRACE_CAPTURE_CONTENT", "1")
    parsed = parse(["serve"], environ={})
    assert parsed is not None and parsed[1].capture_io_values is True  # type: ignore[attr-defined]


def test_several_bad_flags_get_a_line_each(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--port", "99999", "--connect-timeout", "-1"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "taotrace serve: error: argument --port: invalid value '99999': allowed: an integer from 0 to 65535",
        "taotrace serve: error: argument --connect-timeout: invalid value '-1': allowed: a number > 0",
    ]


def test_bad_upstream_and_sim_files_are_refused_in_the_same_words(tmp_path: typing.Any) -> None:
    with pytest.raises(UsageError) as caught:
        parse(["serve", "--upstream", "ftp://nowhere"], environ={})
    assert caught.value.lines == [
        "argument --upstream: upstream must be an http(s) URL with a host, e.g. https://taotoken.net/api"
    ]
    with pytest.raises(UsageError) as caught:
        parse(["demo", "--upstream", "http://h/api?key=1"], environ={})
    assert "query string" in caught.value.lines[0]
    bad = tmp_path / "models.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError) as caught:
        parse(["sim", "--catalogue", str(bad)], environ={})
    assert (
        caught.value.lines[0].startswith("argument --catalogue: the catalogue")
        and "is not JSON" in caught.value.lines[0]
    )
    with pytest.raises(UsageError) as caught:
        parse(["sim", "--path-prefix", "v1"], environ={})
    assert "starts with '/'" in caught.value.lines[0]


# --- as a newcomer types them: real processes, what they print, their exit status -----------

ISSUE_EXAMPLES = [
    (["serve", "--port", "99999"], {}, "argument --port: invalid value '99999': allowed: an integer from 0 to 65535"),
    (["serve", "--connect-timeout", "-1"], {}, "argument --connect-timeout: invalid value '-1': allowed: a number > 0"),
    (["serve", "--drain-seconds", "-5"], {}, "argument --drain-seconds: invalid value '-5': allowed: a number >= 0"),
    (["serve", "--max-body-bytes", "0"], {}, "argument --max-body-bytes: invalid value '0': allowed: an integer > 0"),
    (["serve"], {"TAOTRACE_PORT": "abc"}, "TAOTRACE_PORT='abc': invalid value: allowed: an integer from 0 to 65535"),
    (["sim", "--time-scale", "0"], {}, "argument --time-scale: invalid value '0': allowed: a number > 0"),
    (["demo", "--api", "foo"], {}, "argument --api: invalid value 'foo': allowed: one of chat, completions, responses, messages"),
    (["probe", "--runs", "0"], {}, "argument --runs: invalid value '0': allowed: an integer from 1 to 1000"),
    (["doctor", "--timeout", "-1"], {}, "argument --timeout: invalid value '-1': allowed: a number > 0"),
    (["serve", "--log-level", "verbose"], {}, "argument --log-level: invalid value 'verbose': allowed: one of debug, info, warning, error"),
    (["serve", "--port"], {}, "argument --port: expected one argument"),
    (["serve", "--capture-io-values"], {}, "argument --capture-io-values: needs --capture-content (TAOTRACE_CAPTURE_CONTENT): it sets the prompt's and the answer's text on spans"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "env", "message"), ISSUE_EXAMPLES, ids=lambda v: " ".join(v) if isinstance(v, list) else None
)
def test_the_issue_s_examples_exit_2_with_one_line(argv: list[str], env: dict[str, str], message: str) -> None:
    import os

    clean = {k: v for k, v in os.environ.items() if not k.startswith("TAOTRACE_")}
    done = subprocess.run(
        [sys.executable, "-m", "proxy", *argv], capture_output=True, text=True, timeout=60, env={**clean, **env}
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr == f"taotrace {argv[0]}: error: {message}\n"


def test_version() -> None:
    done = subprocess.run([sys.executable, "-m", "proxy", "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == f"taotrace {proxy.__version__}\n"
    from importlib.metadata import version

    assert proxy.__version__ == version("taotrace")  # one version, in pyproject.toml and the package


@pytest.mark.parametrize("command", [c.name for c in COMMANDS])
def test_help_shows_each_flag_s_default_and_variable(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main([command, "--help"])
    assert caught.value.code == 0
    text = re.sub(r"\s+", " ", capsys.readouterr().out)
    options = text[text.index(" options: ") :]
    cls = _cls(command)
    for name, field in cls.model_fields.items():
        flag = flag_for(name, field)
        found = re.search(rf" {re.escape(flag)}[ ,]", options)
        assert found is not None, flag
        entry = options[found.start() : options.index("]", options.index("env: ", found.start())) + 1]
        assert "env: " + " or ".join(env_names(cls, name)) in entry, entry
        if field.default not in (None,) and _unwrap(field.annotation) is not SecretStr:
            assert "default: " in entry, entry
    assert "[default: 8787; env: TAOTRACE_PORT]" in text or command != "serve"


# A SIGINT delivered at a fixed moment of start-up: while `run_loop` imports uvloop, before the
# command has taken SIGINT over (the first instants after Enter, where a user's Ctrl-C lands).
_EARLY_SIGINT = r"""
import signal, sys

sent = []

def hook(event, args):
    if event == "import" and args[0] == "uvloop" and not sent:
        sent.append(True)
        signal.raise_signal(signal.SIGINT)

sys.addaudithook(hook)
from proxy.cli import main
sys.exit(main(["sim", "--port", "0"]))
"""


def test_a_ctrl_c_while_a_command_starts_is_one_line_and_status_130() -> None:
    proc = subprocess.run([sys.executable, "-c", _EARLY_SIGINT], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "taotrace sim: interrupted while starting"
