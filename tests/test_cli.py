"""The command line a newcomer meets first: bad values are one line and exit 2 (never a
traceback), `--help` names each flag's default and variable, `--version` answers; flags beat
variables, which beat defaults.

The bad values are generated from the settings classes themselves (type, bounds, choices), so a
setting added later is covered without touching this file.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import typing
from dataclasses import dataclass
from pathlib import Path

import annotated_types
import pytest
from pydantic import AliasChoices, SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

import proxy
from proxy.cli import COMMANDS, UsageError, _unwrap, main, parse, settings_class


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


def _cls(command: str) -> type[BaseSettings]:
    return settings_class(next(c for c in COMMANDS if c.name == command))


def _flag(cls: type[BaseSettings], name: str) -> str:
    """A field's flag: `--field-name`, or the one its `json_schema_extra` names."""
    extra = cls.model_fields[name].json_schema_extra
    return str(extra["flag"]) if isinstance(extra, dict) and "flag" in extra else "--" + name.replace("_", "-")


def _variables(cls: type[BaseSettings], name: str) -> list[str]:
    """The variables a field reads, by pydantic-settings' rules: its aliases, else prefix + name;
    with `populate_by_name`, prefix + name too."""
    field = cls.model_fields[name]
    prefix = str(cls.model_config.get("env_prefix", "")).upper()
    alias = field.validation_alias
    names = [c for c in alias.choices if isinstance(c, str)] if isinstance(alias, AliasChoices) else []
    if not names or cls.model_config.get("populate_by_name"):
        names.append(prefix + name.upper())
    return list(dict.fromkeys(names))


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
    flag = _flag(_cls(case.command), case.field)
    with pytest.raises(UsageError) as caught:
        parse([case.command, flag, case.value], environ={})
    (line,) = caught.value.lines
    assert line.startswith(f"argument {flag}: "), line
    assert "allowed" in line or "must" in line or "starts with" in line, line


@pytest.mark.parametrize("case", CASES, ids=str)
def test_a_bad_variable_is_one_line_naming_the_variable(case: Bad, monkeypatch: pytest.MonkeyPatch) -> None:
    variable = _variables(_cls(case.command), case.field)[0]
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
    (["serve", "--mirror", "a"], {}, "--mirror doubles token spend on the requests it copies: give --mirror-ratio (e.g. 0.05) and --mirror-max-per-minute (e.g. 10) too"),
    (["serve", "--key-salt", "short-secret"], {}, "argument --key-salt: invalid value <hidden>: allowed: text of 16 to 1024 characters"),
    (["sim"], {"TAOTRACE_SIM_TIME_SCALE": "fast"}, "TAOTRACE_SIM_TIME_SCALE='fast': invalid value: allowed: a number > 0"),
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
    script = Path(sys.executable).with_name("taotrace")  # the console script, when installed
    for args in (["--version"], ["--help"], ["sim", "--help"]) if script.is_file() else ():
        by_script = subprocess.run([script, *args], capture_output=True, text=True, timeout=60)
        by_module = subprocess.run([sys.executable, "-m", "proxy", *args], capture_output=True, text=True, timeout=60)
        assert by_script.returncode == by_module.returncode == 0 and by_script.stdout == by_module.stdout
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
    for name in cls.model_fields:
        flag = _flag(cls, name)
        found = re.search(rf" {re.escape(flag)}[ ,]", options)
        assert found is not None, flag
        entry = options[found.start() : options.index("]", options.index("[env: ", found.start())) + 1]
        assert entry.endswith("[env: " + " | ".join(_variables(cls, name)) + "]"), entry
        assert "(default: " in entry, entry
    assert "--TAOTRACE" not in text and "--TAOTOKEN" not in text  # variables are not flags
    if command == "serve":
        assert "proxy port (default: 8787) [env: TAOTRACE_PORT]" in text
        assert " --route [NAME:]/PREFIX=URL " in text and "(default: []) [env: TAOTRACE_ROUTES]" in text
        assert " --ui, --no-ui " in text and " --workers N|auto " in text
    if command == "probe":
        assert " --json, --no-json " in text and "[env: TAOTRACE_JSON_OUTPUT]" in text
        assert " --api-key SecretStr " in text and "[env: TAOTRACE_API_KEY | TAOTOKEN_API_KEY]" in text


def _settings(argv: list[str]) -> typing.Any:
    parsed = parse(argv, environ={})
    assert parsed is not None
    return parsed[1]


def test_flags_beat_variables_which_beat_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("TAOTRACE_")]:
        monkeypatch.delenv(name)
    assert (_settings(["serve"]).port, _settings(["serve"]).ui) == (8787, True)
    monkeypatch.setenv("TAOTRACE_PORT", "1234")
    monkeypatch.setenv("TAOTRACE_UI", "false")
    assert (_settings(["serve"]).port, _settings(["serve"]).ui) == (1234, False)
    assert (_settings(["serve", "--port", "99", "--ui"]).port, _settings(["serve", "--ui"]).ui) == (99, True)
    assert _settings(["serve", "--no-ui"]).ui is False
    monkeypatch.setenv("TAOTRACE_API_KEY", "sk-from-env")  # an alias: the flag is still --api-key
    assert _settings(["probe"]).api_key.get_secret_value() == "sk-from-env"
    assert _settings(["probe", "--api-key", "sk-flag"]).api_key.get_secret_value() == "sk-flag"
    assert _settings(["probe", "--json"]).json_output is True


def test_lists_take_repeated_flags_and_comma_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("TAOTRACE_")]:
        monkeypatch.delenv(name)
    routes = ["a:/a=http://a.test", "b:/b=http://b.test", "c:/c=http://c.test"]
    settings = _settings(["serve", "--route", routes[0], "--route", f"{routes[1]},{routes[2]}"])
    assert settings.routes == routes
    monkeypatch.setenv("TAOTRACE_MODEL_ALLOWLIST", "a,b")
    assert _settings(["serve"]).model_allowlist == ["a", "b"]
    assert _settings(["serve", "--model-allowlist", "c"]).model_allowlist == ["c"]
    assert _settings(["serve"]).mirror_paths == ["/chat/completions", "/responses", "/messages"]
    assert _settings(["sim", "--bad-keys", "x", "--bad-keys", "y"]).bad_keys == ["x", "y"]
    compared = _settings(["compare", "--base-url", "http://a.test/v1", "--base-url", "http://b.test/v1"])
    assert compared.base_url == ["http://a.test/v1", "http://b.test/v1"]


def test_a_rule_across_flags_is_its_own_words_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--mirror", "taotoken.net"]) == 2
    assert capsys.readouterr().err == (
        "taotrace serve: error: --mirror doubles token spend on the requests it copies: give --mirror-ratio "
        "(e.g. 0.05) and --mirror-max-per-minute (e.g. 10) too\n"
    )


def test_a_secret_is_never_shown_in_an_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--key-salt", "short-secret-1"]) == 2
    err = capsys.readouterr().err
    assert err.endswith(": invalid value <hidden>: allowed: text of 16 to 1024 characters\n") and "short" not in err
    monkeypatch.setenv("TAOTRACE_KEY_SALT", "short-secret-2")
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("taotrace serve: error: TAOTRACE_KEY_SALT=<hidden>: invalid value: ") and "short" not in err


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


def test_a_variable_no_command_reads_is_warned_of_never_its_value(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in [n for n in os.environ if n.startswith("TAOTRACE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TAOTRACE_SIM_TIMESCALE", "value-not-shown")
    monkeypatch.setenv("TAOTRACE_PORT", "1")  # serve's: known, not warned of under sim
    monkeypatch.setenv("TAOTRACE_DEMO_API_KEY", "k")  # demo's key read by its field name too
    assert main(["sim", "--port", "99999"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "taotrace sim: warning: TAOTRACE_SIM_TIMESCALE is not a taotrace setting and is ignored; "
        "did you mean TAOTRACE_SIM_TIME_SCALE?",
        "taotrace sim: error: argument --port: invalid value '99999': allowed: an integer from 0 to 65535",
    ]


_LOADED = """
import sys
from proxy.cli import parse
parse({argv!r}, environ={{}})
print(sorted({{m.split(".")[0] if not m.startswith("proxy.") else m for m in sys.modules}}))
"""


def test_a_command_imports_only_its_own_module_and_the_command_list_no_pydantic() -> None:
    def loaded(argv: list[str]) -> set[str]:
        code = _LOADED.format(argv=argv)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
        return set(ast.literal_eval(done.stdout.splitlines()[-1]))

    sim = {m for m in loaded(["sim"]) if m.startswith("proxy.") and not m.startswith("proxy.sim")}
    assert sim == {"proxy.cli", "proxy.server", "proxy.server.lifecycle", "proxy.server.listen"}, sim
    top = loaded([])  # `taotrace` alone: the command list
    assert not top & {"pydantic", "pydantic_settings", "aiohttp"}, top


def test_an_unknown_argument_is_said_by_its_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--workers", "2", "--telemetry-process"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "taotrace serve: error: unrecognized arguments: --telemetry-process"
    ]
    assert main(["--bogus"]) == 2
    assert capsys.readouterr().err.splitlines() == ["taotrace: error: unrecognized arguments: --bogus"]
