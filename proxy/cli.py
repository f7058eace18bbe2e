"""The `taotrace` command line: one sub-command per job, flags generated from settings classes.

Each command is a pydantic-settings class (env prefix `TAOTRACE_`) and a `run(settings) -> int`.
A flag given on the command line overrides the environment, which overrides the default.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel
from pydantic.fields import FieldInfo


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
    Command("sim", "the simulated upstream alone", "proxy.sim", "SimSettings"),
)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _is_list(annotation: object) -> bool:
    for arg in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(arg) is list or arg is list:
            return True
    return False


def _base_type(annotation: object) -> object:
    """`int | None` -> int; `Annotated[list[str], ...]` -> list."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _base_type(args[0])
    return annotation


def add_model_flags(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    """One flag per settings field; defaults stay unset so the environment can fill them."""
    for name, field in model.model_fields.items():
        if field.exclude or (field.json_schema_extra or {}).get("cli") is False:  # type: ignore[union-attr]
            continue
        _add_field(parser, name, field)


def _add_field(parser: argparse.ArgumentParser, name: str, field: FieldInfo) -> None:
    kind = _base_type(field.annotation)
    help_text = field.description or ""
    # `json_schema_extra={"flag": "--json"}` names the flag when the field name can't (`json` shadows BaseModel).
    flag = str((field.json_schema_extra or {}).get("flag") or _flag(name))  # type: ignore[union-attr]
    if kind is bool:
        parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
    elif _is_list(kind):
        parser.add_argument(flag, dest=name, default=None, metavar="A,B", help=help_text)
    elif kind in (int, float):
        parser.add_argument(flag, dest=name, type=kind, default=None, help=help_text)  # type: ignore[arg-type]
    else:
        parser.add_argument(flag, dest=name, default=None, help=help_text)


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The parser; only the selected command's module is imported (fast start, isolated failures)."""
    parser = argparse.ArgumentParser(prog="taotrace", description="Where the time of every LLM call goes.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        sp = sub.add_parser(command.name, help=command.help, description=command.help)
        sp.set_defaults(_command=command)
        if command.name == selected:
            module = importlib.import_module(command.module)
            add_model_flags(sp, getattr(module, command.settings))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = {c.name for c in COMMANDS}
    selected = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(selected if selected in names else None)
    args = parser.parse_args(argv)
    command: Command | None = getattr(args, "_command", None)
    if command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(command.module)
    settings_cls = getattr(module, command.settings)
    given = {k: v for k, v in vars(args).items() if v is not None and not k.startswith("_") and k != "command"}
    settings = settings_cls(**given)
    run: Callable[[object], int] = getattr(module, command.run)
    return run(settings)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
