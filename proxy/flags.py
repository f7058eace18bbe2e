"""Settings classes as command-line flags, and their validation errors as one line each.

Every field of a pydantic-settings class becomes a flag whose help names its default and its
environment variable. Values reach pydantic as the user typed them (flags carry no argparse
type), so a bad flag and a bad `TAOTRACE_*` variable are refused by the same rules and told
the same way, naming where the value came from and what is allowed:

    argument --port: invalid value '99999': allowed: an integer from 0 to 65535
    TAOTRACE_PORT='abc': invalid value: allowed: an integer from 0 to 65535

What is allowed is read from the field itself (type, bounds, `Literal` choices), so a setting
added later is described without code here.
"""

from __future__ import annotations

import argparse
import os
import types
import typing
from collections.abc import Mapping

import annotated_types
from pydantic import AliasChoices, BaseModel, SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

__all__ = ["add_model_flags", "allowed", "env_names", "explain", "flag_for"]

SHOWN_VALUE_LIMIT = 60
# pydantic error types that mean "not of the allowed kind or range": described from the field
_SHAPE_ERRORS = frozenset(
    {
        "int_parsing", "int_from_float", "int_type", "float_parsing", "float_type", "bool_parsing", "bool_type",
        "greater_than", "greater_than_equal", "less_than", "less_than_equal", "literal_error", "finite_number",
        "string_too_short", "string_too_long", "string_type", "list_type", "too_short", "too_long",
    }
)  # fmt: skip


def flag_for(name: str, field: FieldInfo) -> str:
    """`max_body_bytes` -> `--max-body-bytes`; `json_schema_extra={"flag": ...}` overrides it."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    return str(extra.get("flag") or "--" + name.replace("_", "-"))


def env_names(model: type[BaseModel], name: str) -> list[str]:
    """The environment variables a field reads, as pydantic-settings looks them up."""
    field = model.model_fields[name]
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [c for c in alias.choices if isinstance(c, str)]
    if isinstance(alias, str):
        return [alias]
    prefix = str(model.model_config.get("env_prefix", ""))
    return [(prefix + (field.alias or name)).upper()]


def _unwrap(annotation: object) -> object:
    """`int | None` -> int; `Annotated[list[str], ...]` -> list[str]."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _unwrap(args[0])
    return annotation


def _is_list(annotation: object) -> bool:
    return annotation is list or typing.get_origin(annotation) is list


def _number(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def allowed(field: FieldInfo) -> str:
    """What a field accepts, in words: `an integer from 0 to 65535`, `one of chat, completions`
    (or the field's own `json_schema_extra={"allowed": ...}` when its validator takes more)."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if extra.get("allowed"):
        return str(extra["allowed"])
    kind = _unwrap(field.annotation)
    if typing.get_origin(kind) is typing.Literal:
        return "one of " + ", ".join(str(a) for a in typing.get_args(kind))
    if kind is bool:
        return "true or false (1/0, yes/no, on/off)"
    if _is_list(kind):
        return "a comma-separated list"
    noun = "an integer" if kind is int else "a number" if kind is float else "text"
    lower = upper = None
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
        elif isinstance(meta, annotated_types.MinLen) and meta.min_length > 0 and noun == "text":
            noun = "non-empty text"
    if lower is not None and upper is not None:
        return f"{noun} from {_number(lower)} to {_number(upper)}"
    if lower is not None:
        bounds.insert(0, f">= {_number(lower)}")
    if upper is not None:
        bounds.append(f"<= {_number(upper)}")
    return noun + (" " + " and ".join(bounds) if bounds else "")


def _default(field: FieldInfo) -> str | None:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return None
    else:
        value = field.default
    if value is None:
        return None  # the description says what happens then
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "none"
    if isinstance(value, SecretStr):
        return None
    return _number(value) if isinstance(value, float) else str(value) or '""'


def help_text(model: type[BaseModel], name: str) -> str:
    """The description, then `[default: X; env: TAOTRACE_Y]` (argparse-escaped)."""
    field = model.model_fields[name]
    notes = []
    default = _default(field)
    if default is not None:
        notes.append(f"default: {default}")
    notes.append("env: " + " or ".join(env_names(model, name)))
    text = f"{field.description or ''} [{'; '.join(notes)}]".strip()
    return text.replace("%", "%%")


def add_model_flags(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    """One flag per settings field; values stay unset (None) so the environment can fill them."""
    for name, field in model.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if field.exclude or extra.get("cli") is False:
            continue
        kind = _unwrap(field.annotation)
        flag, help_ = flag_for(name, field), help_text(model, name)
        if kind is bool:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_)
        elif _is_list(kind):  # repeatable; each may be a comma list (the field's validator flattens them)
            parser.add_argument(flag, dest=name, action="append", default=None, metavar="A,B", help=help_)
        else:
            metavar = str(extra.get("metavar") or name.upper())
            parser.add_argument(flag, dest=name, default=None, metavar=metavar, help=help_)


def _field_of(model: type[BaseModel], loc: object) -> str | None:
    if not isinstance(loc, str):
        return None
    if loc in model.model_fields:
        return loc
    for name in model.model_fields:  # an alias (e.g. TAOTOKEN_API_KEY) names its field
        if loc.upper() in env_names(model, name):
            return name
    return None


def _shown(value: object, secret: bool) -> str:
    if secret:
        return "<hidden>"
    text = str(value)
    return repr(text if len(text) <= SHOWN_VALUE_LIMIT else text[:SHOWN_VALUE_LIMIT] + "...")


def _reason(field: FieldInfo, error: Mapping[str, typing.Any], shown: str | None) -> str:
    """`invalid value '99999': allowed: ...` (`shown` None: the value is named already)."""
    if error["type"] in _SHAPE_ERRORS:
        return f"invalid value{'' if shown is None else ' ' + shown}: allowed: {allowed(field)}"
    return str(error.get("msg", "invalid")).removeprefix("Value error, ")  # our validators' own words


def explain(
    model: type[BaseModel], error: ValidationError, given: Mapping[str, object], environ: Mapping[str, str] = os.environ
) -> list[str]:
    """One line per invalid field, naming the flag (when given) or the variable it came from."""
    lines: list[str] = []
    seen: set[str] = set()
    upper_env = {k.upper(): k for k in environ}
    for err in error.errors():
        loc = err["loc"][0] if err["loc"] else None
        name = _field_of(model, loc)
        if name is None:
            lines.append(str(err.get("msg", "invalid settings")))
            continue
        if name in seen:
            continue
        seen.add(name)
        field = model.model_fields[name]
        secret = _unwrap(field.annotation) is SecretStr
        if name in given:
            reason = _reason(field, err, _shown(err.get("input"), secret))
            lines.append(f"argument {flag_for(name, field)}: {reason}")
            continue
        env = next((upper_env[n] for n in env_names(model, name) if n in upper_env), None)
        if env is not None:
            lines.append(f"{env}={_shown(environ[env], secret)}: {_reason(field, err, None)}")
        else:  # a default that fails its own rule is a bug of ours, but still say which
            lines.append(f"setting {name}: {_reason(field, err, _shown(err.get('input'), secret))}")
    return lines
