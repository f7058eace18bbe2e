"""The `taotrace` command line: one sub-command per job, flags generated from settings classes.

Each command is a pydantic-settings class (env prefix `TAOTRACE_`) and a `run(settings) -> int`.
A flag given on the command line overrides the environment, which overrides the default.
Mistakes in flags or variables are one line on stderr and exit status 2, as argparse does.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn

from pydantic import BaseModel, ValidationError

from proxy import __version__
from proxy.envnames import PREFIX, unknown_variables
from proxy.flags import add_model_flags, env_names, explain


@dataclass(frozen=True)
class Command:
    """A sub-command: where its settings class and its `run` function live."""

    name: str
    help: str
    module: str
    settings: str
    run: str = "run"


COMMANDS: tuple[Command, ...] = (
    Command("serve", "run the proxy", "proxy.serve", "Settings"),
    Command("demo", "simulated upstream + proxy + the three experiments", "proxy.tools.demo", "DemoSettings"),
    Command("probe", "client-side TTFT / TPOT / tokens/s of a streaming call", "proxy.tools.probe", "ProbeSettings"),
    Command(
        "doctor", "check key -> network -> auth -> model -> stream parsing", "proxy.tools.doctor", "DoctorSettings"
    ),
    Command(
        "compare", "which of two base URLs is faster for the same prompts", "proxy.tools.compare", "CompareSettings"
    ),
    Command("sim", "the simulated upstream alone", "proxy.sim", "SimSettings"),
)


class UsageError(Exception):
    """Bad flags or variables: `lines` say which and what is allowed."""

    def __init__(self, prog: str, lines: Sequence[str]) -> None:
        super().__init__("; ".join(lines))
        self.prog = prog
        self.lines = list(lines)


class _Parser(argparse.ArgumentParser):
    """argparse, but its errors are one line (a command's usage runs to fifteen)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The parser; only the selected command's module is imported (fast start, isolated failures)."""
    parser = _Parser(prog="taotrace", description="Where the time of every LLM call goes.")
    parser.add_argument("--version", action="version", version=f"taotrace {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for command in COMMANDS:
        sp = sub.add_parser(
            command.name,
            help=command.help,
            description=f"{command.help}. Each flag also reads the environment variable named in its help.",
        )
        sp.set_defaults(_command=command)
        if command.name == selected:
            add_model_flags(sp, settings_class(command))
    return parser


def settings_class(command: Command) -> type[BaseModel]:
    cls: type[BaseModel] = getattr(importlib.import_module(command.module), command.settings)
    return cls


def selected(argv: Sequence[str]) -> Command | None:
    """The command the arguments name, if any."""
    name = next((a for a in argv if not a.startswith("-")), None)
    return next((c for c in COMMANDS if c.name == name), None)


def known_variables(commands: Sequence[Command]) -> set[str]:
    """Every environment variable the settings of `commands` read."""
    known: set[str] = set()
    for command in commands:
        cls = settings_class(command)
        for name in cls.model_fields:
            known.update(env_names(cls, name))
    return known


def unknown_variable_warnings(command: Command, environ: Mapping[str, str]) -> list[str]:
    """One line per `TAOTRACE_*` variable no command reads. A name another command reads (say
    `TAOTRACE_SIM_PORT` in a shared environment) is not a mistake; the other commands' modules
    are imported only when the selected one does not know a name."""
    names = [n for n in environ if n.upper().startswith(PREFIX)]
    if not unknown_variables(names, known_variables([command])):
        return []
    return [
        f"taotrace {command.name}: warning: {u.warning()}" for u in unknown_variables(names, known_variables(COMMANDS))
    ]


# The commands whose proxy reads the OTEL_* variables.
OTEL_COMMANDS = frozenset({"serve", "demo"})


def otel_variable_lines(command: Command, environ: Mapping[str, str]) -> tuple[list[str], bool]:
    """One line per `OTEL_*` variable taotrace cannot honour as set, and whether one is refused.
    Judged before the command's module is imported: the OpenTelemetry API loads `OTEL_PROPAGATORS`
    on import, and would end in a traceback on a name it cannot find."""
    if command.name not in OTEL_COMMANDS:
        return [], False
    from proxy.telemetry.otel_variables import check, installed_names

    findings = check(environ, installed_names)
    lines = [f"taotrace {command.name}: {'error' if f.refused else 'warning'}: {f.message}" for f in findings]
    return lines, any(f.refused for f in findings)


def parse(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> tuple[Command, BaseModel] | None:
    """The command and its validated settings (None: no command given). Raises `UsageError`;
    argparse's own errors exit 2 with one line."""
    wanted = selected(argv)
    parser = build_parser(None if wanted is None else wanted.name)
    args = parser.parse_args(list(argv))
    command: Command | None = getattr(args, "_command", None)
    if command is None:
        parser.print_help()
        return None
    cls = settings_class(command)
    given = {k: v for k, v in vars(args).items() if v is not None and not k.startswith("_") and k != "command"}
    try:
        return command, cls(**given)
    except ValidationError as exc:
        raise UsageError(f"taotrace {command.name}", explain(cls, exc, given, environ)) from None


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = selected(argv)
    if command is not None:  # before the settings are read: a misspelling may be why they fail
        if not {"-h", "--help"} & set(argv):  # first: before any module of the command is imported
            lines, refused = otel_variable_lines(command, os.environ)
            for line in lines:
                print(line, file=sys.stderr)
            if refused:
                return 2
        for line in unknown_variable_warnings(command, os.environ):
            print(line, file=sys.stderr)
    try:
        parsed = parse(argv)
    except UsageError as exc:
        for line in exc.lines:
            print(f"{exc.prog}: error: {line}", file=sys.stderr)
        return 2
    if parsed is None:
        return 2
    command, settings = parsed
    run: Callable[[BaseModel], int] = getattr(importlib.import_module(command.module), command.run)
    try:
        return run(settings)
    except KeyboardInterrupt:
        # A Ctrl-C before the command took the signal over (its first instants): a stop, not a
        # crash, so one line and the shell's status for SIGINT instead of a traceback.
        print(f"taotrace {command.name}: interrupted while starting", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
