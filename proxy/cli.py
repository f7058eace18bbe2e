"""The `taotrace` command line: one sub-command per job, each a pydantic-settings class.

pydantic-settings' `CliSettingsSource` makes a command's flags (`--x/--no-x` for a boolean,
repeatable for a list, each help naming its default and its `TAOTRACE_*` variable) and reads
them over the environment, which it reads over the defaults. Ours is what it leaves to us:

- the first word picks the command, and only that command's module is imported;
- a field's own flag name and metavar (`json_schema_extra={"flag": ..., "metavar": ...}`);
- a refused value as one line naming the flag or the variable it came from and what is allowed
  (read from the field: type, bounds, choices), a secret's value never shown, where pydantic
  would print its multi-line report:

      argument --port: invalid value '99999': allowed: an integer from 0 to 65535
      TAOTRACE_PORT='abc': invalid value: allowed: an integer from 0 to 65535

- a `TAOTRACE_*` variable no command reads (pydantic-settings ignores it), warned about with the
  known name it resembles, never with its value (it may be a key).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
import types
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from proxy import __version__

if TYPE_CHECKING:  # imported once a command is picked: `taotrace --help` needs no pydantic
    from pydantic import ValidationError
    from pydantic.fields import FieldInfo
    from pydantic_settings import BaseSettings, CliSettingsSource

PREFIX = "TAOTRACE_"
CLOSENESS = 0.6  # of names without the prefix every one shares, so a stranger gets no guess
SHOWN_VALUE_LIMIT = 60
# pydantic error types that mean "not of the allowed kind or range": described from the field
_SHAPE_ERRORS = frozenset(
    {
        "int_parsing", "int_from_float", "int_type", "float_parsing", "float_type", "bool_parsing", "bool_type",
        "greater_than", "greater_than_equal", "less_than", "less_than_equal", "literal_error", "finite_number",
        "string_too_short", "string_too_long", "string_type", "list_type", "too_short", "too_long",
    }
)  # fmt: skip


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


def _extra(field: FieldInfo) -> dict[str, Any]:
    return field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}


def field_named(model: type[BaseSettings], key: object) -> str | None:
    """The field an argparse dest or an error's location names: its name or an alias (pydantic
    reads `api_key` from `TAOTRACE_API_KEY` or `TAOTOKEN_API_KEY`)."""
    from pydantic import AliasChoices

    if not isinstance(key, str) or key in model.model_fields:
        return key if isinstance(key, str) else None
    for name, field in model.model_fields.items():
        alias = field.validation_alias
        if key in (alias.choices if isinstance(alias, AliasChoices) else [alias]):
            return name
    return None


class Flags:
    """A settings class's flags, which pydantic-settings adds to `parser`. Through its
    `add_argument_method` hook each field's flag is `--field-name` or the field's own `flag`
    (the library would add the aliases too, which are variable names: `--TAOTRACE-API-KEY`);
    each field's flag and argparse dest are kept, to name them in an error."""

    def __init__(self, model: type[BaseSettings], parser: argparse.ArgumentParser) -> None:
        from pydantic_settings import CliSettingsSource

        self.model = model
        self.prog = parser.prog
        self.flag: dict[str, str] = {}
        self.dest: dict[str, str] = {}
        self.source: CliSettingsSource[argparse.ArgumentParser] = CliSettingsSource(
            model,
            root_parser=parser,
            add_argument_method=self._add_argument,
            cli_implicit_flags=True,
            cli_kebab_case=True,
            cli_hide_none_type=True,
            cli_show_env_vars=True,
        )

    def _add_argument(self, parser: argparse.ArgumentParser, *_names: str, **kwargs: Any) -> argparse.Action:
        name = field_named(self.model, kwargs["dest"])
        assert name is not None, kwargs["dest"]
        extra = _extra(self.model.model_fields[name])
        kwargs["metavar"] = extra.get("metavar", kwargs.get("metavar"))
        self.flag[name] = str(extra.get("flag") or "--" + name.replace("_", "-"))
        self.dest[name] = kwargs["dest"]
        return parser.add_argument(self.flag[name], **kwargs)

    def variables(self, name: str) -> tuple[str, ...]:
        """The environment variables field `name` reads, as pydantic-settings resolves them."""
        return self.source.env_var_names.get(self.dest.get(name, ""), ())

    def known(self) -> set[str]:
        return {n for names in self.source.env_var_names.values() for n in names}


def settings_class(command: Command) -> type[BaseSettings]:
    cls: type[BaseSettings] = getattr(importlib.import_module(command.module), command.settings)
    return cls


def selected(argv: Sequence[str]) -> Command | None:
    """The command the arguments name, if any."""
    name = next((a for a in argv if not a.startswith("-")), None)
    return next((c for c in COMMANDS if c.name == name), None)


def build_parser(selected: Command | None = None) -> tuple[argparse.ArgumentParser, Flags | None]:
    """The parser, with the selected command's flags: only its module is imported (fast start,
    isolated failures)."""
    parser = _Parser(prog="taotrace", description="Where the time of every LLM call goes.")
    parser.add_argument("--version", action="version", version=f"taotrace {__version__}")
    sub = parser.add_subparsers(metavar="COMMAND", parser_class=_Parser)
    flags = None
    for command in COMMANDS:
        sp = sub.add_parser(
            command.name,
            help=command.help,
            description=f"{command.help}. Each flag also reads the environment variable named in its help.",
        )
        sp.set_defaults(_command=command)
        if command == selected:
            flags = Flags(settings_class(command), sp)
    return parser, flags


def _unwrap(annotation: object) -> object:
    """`int | None` -> int; `Annotated[list[str], ...]` -> list[str]."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _unwrap(args[0])
    return annotation


def _number(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def allowed(field: FieldInfo) -> str:
    """What a field accepts, in words: `an integer from 0 to 65535`, `one of chat, completions`
    (or the field's own `json_schema_extra={"allowed": ...}` when its validator takes more)."""
    import annotated_types

    if _extra(field).get("allowed"):
        return str(_extra(field)["allowed"])
    kind = _unwrap(field.annotation)
    if typing.get_origin(kind) is typing.Literal:
        return "one of " + ", ".join(str(a) for a in typing.get_args(kind))
    if kind is bool:
        return "true or false (1/0, yes/no, on/off)"
    if kind is list or typing.get_origin(kind) is list:
        return "a comma-separated list"
    noun = "an integer" if kind is int else "a number" if kind is float else "text"
    lower = upper = longest = None
    shortest = 0
    bounds = []
    for meta in field.metadata:
        if isinstance(meta, annotated_types.Ge):
            lower = meta.ge
        elif isinstance(meta, annotated_types.Le):
            upper = meta.le
        elif isinstance(meta, annotated_types.Gt):
            bounds.append(f"> {_number(meta.gt)}")
        elif isinstance(meta, annotated_types.Lt):
            bounds.append(f"< {_number(meta.lt)}")
        elif isinstance(meta, annotated_types.MinLen):
            shortest = meta.min_length
        elif isinstance(meta, annotated_types.MaxLen):
            longest = meta.max_length
    if noun == "text" and longest is not None:
        return f"text of {shortest} to {longest} characters" if shortest else f"text of at most {longest} characters"
    if noun == "text" and shortest:
        return "non-empty text" if shortest == 1 else f"text of at least {shortest} characters"
    if lower is not None and upper is not None:
        return f"{noun} from {_number(lower)} to {_number(upper)}"
    if lower is not None:
        bounds.insert(0, f">= {_number(lower)}")
    if upper is not None:
        bounds.append(f"<= {_number(upper)}")
    return noun + (" " + " and ".join(bounds) if bounds else "")


def _shown(value: object, secret: bool) -> str:
    text = str(value)
    return "<hidden>" if secret else repr(text if len(text) <= SHOWN_VALUE_LIMIT else text[:SHOWN_VALUE_LIMIT] + "...")


def _words(error: Mapping[str, Any]) -> str:
    """Our validator's own words, without pydantic's `Value error, `."""
    return str(error.get("msg", "invalid")).removeprefix("Value error, ")


def _reason(field: FieldInfo, error: Mapping[str, Any], shown: str | None) -> str:
    """`invalid value '99999': allowed: ...` (`shown` None: the value is named already)."""
    if error["type"] in _SHAPE_ERRORS:
        return f"invalid value{'' if shown is None else ' ' + shown}: allowed: {allowed(field)}"
    return _words(error)


def explain(
    flags: Flags, error: ValidationError, given: Collection[str], environ: Mapping[str, str] = os.environ
) -> list[str]:
    """One line per invalid field, naming the flag (its dest in `given`) or the variable the value
    came from; a rule across fields (`--mirror` needs `--mirror-ratio`) in its own words."""
    from pydantic import SecretStr

    lines: dict[str, str] = {}  # field (or message) -> line
    upper_env = {k.upper(): k for k in environ}
    for err in error.errors():
        name = field_named(flags.model, err["loc"][0] if err["loc"] else None)
        if name is None:
            lines.setdefault(_words(err), _words(err))
            continue
        field = flags.model.model_fields[name]
        secret = _unwrap(field.annotation) is SecretStr
        env = next((upper_env[n.upper()] for n in flags.variables(name) if n.upper() in upper_env), None)
        if flags.dest.get(name) in given:
            line = f"argument {flags.flag[name]}: {_reason(field, err, _shown(err.get('input'), secret))}"
        elif env is not None:
            line = f"{env}={_shown(environ[env], secret)}: {_reason(field, err, None)}"
        else:  # a default that fails its own rule is a bug of ours, but still say which
            line = f"setting {name}: {_reason(field, err, _shown(err.get('input'), secret))}"
        lines.setdefault(name, line)
    return list(lines.values())


def unknown_variable_warnings(flags: Flags, environ: Mapping[str, str]) -> list[str]:
    """One line per `TAOTRACE_*` variable no command reads (pydantic-settings ignores it, so
    `TAOTRACE_UPSTREM=...` would start the proxy against the default upstream with the user's
    key), with the closest known name. A name another command reads (`TAOTRACE_SIM_PORT` in a
    shared environment) is not a mistake; the other commands' modules are imported only when
    `flags`' own command does not know a name."""
    names = sorted(n for n in environ if n.upper().startswith(PREFIX) and n.upper() not in flags.known())
    if not names:
        return []
    known = set().union(*(Flags(settings_class(c), argparse.ArgumentParser()).known() for c in COMMANDS))
    stems = {k[len(PREFIX) :]: k for k in known if k.startswith(PREFIX)}
    lines = []
    for name in (n for n in names if n.upper() not in known):
        close = difflib.get_close_matches(name.upper()[len(PREFIX) :], list(stems), n=1, cutoff=CLOSENESS)
        guess = f"; did you mean {stems[close[0]]}?" if close else ""
        lines.append(f"{flags.prog}: warning: {name} is not a taotrace setting and is ignored{guess}")
    return lines


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


def _ignore(_line: str) -> None:
    return None


def parse(
    argv: Sequence[str], environ: Mapping[str, str] = os.environ, warn: Callable[[str], None] = _ignore
) -> tuple[Command, BaseSettings] | None:
    """The command and its validated settings (None: no command given); `warn` gets the
    warnings about `environ` first (a misspelling may be why the settings fail). Raises
    `UsageError`; argparse's own errors exit 2 with one line."""
    parser, flags = build_parser(selected(argv))
    for line in [] if flags is None else unknown_variable_warnings(flags, environ):
        warn(line)
    args, extra = parser.parse_known_args(list(argv))
    if extra:  # said by the command, as its other errors are (argparse's root would say `taotrace:`)
        raise UsageError(
            flags.prog if flags is not None else parser.prog, [f"unrecognized arguments: {' '.join(extra)}"]
        )
    given = vars(args)
    command: Command | None = given.pop("_command", None)
    if command is None or flags is None:
        parser.print_help()
        return None
    from pydantic import ValidationError
    from pydantic_settings import CliApp

    try:
        return command, CliApp.run(flags.model, cli_args=given, cli_settings_source=flags.source)
    except ValidationError as exc:
        raise UsageError(flags.prog, explain(flags, exc, given, environ)) from None


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = selected(argv)
    if command is not None and not {"-h", "--help"} & set(argv):
        # First, before any module of the command is imported (see `otel_variable_lines`).
        lines, refused = otel_variable_lines(command, os.environ)
        for line in lines:
            print(line, file=sys.stderr)
        if refused:
            return 2
    try:
        parsed = parse(argv, warn=lambda line: print(line, file=sys.stderr))
    except UsageError as exc:
        for line in exc.lines:
            print(f"{exc.prog}: error: {line}", file=sys.stderr)
        return 2
    if parsed is None:
        return 2
    command, settings = parsed
    run: Callable[[BaseSettings], int] = getattr(importlib.import_module(command.module), command.run)
    try:
        return run(settings)
    except KeyboardInterrupt:
        # A Ctrl-C before the command took the signal over (its first instants): a stop, not a
        # crash, so one line and the shell's status for SIGINT instead of a traceback.
        print(f"taotrace {command.name}: interrupted while starting", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
