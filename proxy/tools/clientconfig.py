"""What `probe` and `doctor` share: where to call, with which key and model, and the article's
config file layout.

    {
      "base_url": "https://taotoken.net/api/v1",
      "api_key_env": "TAOTOKEN_API_KEY",            (optional: where the key lives)
      "models": {"fast": "gpt-4o-mini", "strong": "gpt-4o", "reasoning": {"model": "o3-mini", "max_tokens": 2048}},
      "default_params": {"temperature": 0.7, "max_tokens": 512}
    }

`--model fast` then means `gpt-4o-mini`. Flags and `TAOTRACE_*` variables win over the file.
The key is a `SecretStr`: it never shows in a repr, a log line or an error message.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict
from yarl import URL

from proxy.server.hints import ENDPOINT_SUFFIXES as _DIALECT_SUFFIXES

__all__ = [
    "DEFAULT_BASE_URL", "ENDPOINT_SUFFIXES", "BaseURLError", "ClientSettings", "Target", "load_target",
    "key_hint", "key_places", "parse_base_url", "route_base_url", "shown_url",
]  # fmt: skip

DEFAULT_BASE_URL = "https://taotoken.net/api/v1"
KEY_VARIABLES = ("TAOTRACE_API_KEY", "TAOTOKEN_API_KEY")
ENDPOINT_SUFFIXES = (*_DIALECT_SUFFIXES, "/models")  # what a client's base URL must not end with
_HOSTLIKE = re.compile(r"^(?P<host>\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+)(?::(?P<port>\d{1,5}))?(?P<path>/\S*)?$")


class ClientSettings(BaseSettings):
    """Flags common to the commands that call an endpoint as a client."""

    model_config = SettingsConfigDict(env_prefix="TAOTRACE_", extra="ignore", populate_by_name=True)

    base_url: str = Field(
        DEFAULT_BASE_URL, min_length=1, description="OpenAI-style base URL (the one an SDK's base_url takes)"
    )
    api_key: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices(*KEY_VARIABLES),
        description="API key (default: $TAOTRACE_API_KEY, then $TAOTOKEN_API_KEY); never printed",
    )
    model: str = Field("gpt-4o-mini", min_length=1, description="model name, or an alias from --config's `models`")
    config: str | None = Field(None, description="JSON file in the article's layout: base_url, models, default_params")
    timeout: float = Field(60.0, gt=0, description="seconds allowed for connecting and between reads")
    json_output: bool = Field(False, description="print the result as JSON", json_schema_extra={"flag": "--json"})
    route: str | None = Field(
        None,
        min_length=1,
        description="call the upstream of the proxy's route NAME directly (its URL + /v1), the routes read "
        "as serve reads them from TAOTRACE_ROUTES and TAOTRACE_UPSTREAM; instead of --base-url",
        json_schema_extra={"metavar": "NAME"},
    )


class BaseURLError(ValueError):
    """A base URL that cannot be called: what is wrong (`cause`) and the URL to use (`fix`)."""

    def __init__(self, cause: str, fix: str) -> None:
        super().__init__(f"{cause}; {fix}")
        self.cause = cause
        self.fix = fix


def shown_url(url: str) -> str:
    """A URL fit to print: no user:password part, no query string."""
    try:
        parsed = URL(url)
    except ValueError:
        return url.split("?")[0]
    if parsed.user or parsed.password:
        parsed = parsed.with_user(None)
    return str(parsed.with_query(None))


def _local(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return not ipaddress.ip_address(host.strip("[]")).is_global
    except ValueError:
        return False


def _with_scheme(text: str) -> str | None:
    """`localhost:8787/v1` -> `http://localhost:8787/v1`, `api.example.com/v1` -> `https://...`:
    the URL the user most likely meant, or None when the text does not look like host[:port][/path]."""
    found = _HOSTLIKE.match(text.split("://", 1)[-1])
    if found is None:
        return None
    host, port = found["host"], found["port"]
    plain = _local(host) or (port is not None and port != "443")
    return ("http://" if plain else "https://") + text.split("://", 1)[-1]


def parse_base_url(base: str) -> URL:
    """The one check of a client base URL (probe and doctor): http(s), a host, and no endpoint
    path glued on. Raises `BaseURLError` whose fix names the user's own host."""
    try:
        url = URL(base)
    except ValueError:
        url = None
    if url is None or url.scheme not in ("http", "https") or not url.host:
        guess = _with_scheme(base)
        fix = f"use --base-url {shown_url(guess)}" if guess else f"use e.g. --base-url {DEFAULT_BASE_URL}"
        typed = re.sub(r"//[^/@]*@", "//", base.split("?")[0])  # as typed, less any user:password
        raise BaseURLError(f"base URL {typed!r} has no http(s):// scheme and host", fix)
    for suffix in ENDPOINT_SUFFIXES:
        if url.path.rstrip("/").endswith(suffix):
            fixed = str(url.with_path(url.path.rstrip("/")[: -len(suffix)] or "/").with_query(None)).rstrip("/")
            raise BaseURLError(
                f"base URL ends with the endpoint path {suffix!r}: clients add it themselves",
                f"use --base-url {shown_url(fixed)}",
            )
    return url


@dataclass(frozen=True)
class Target:
    """Where to call, resolved from flags, environment and the config file."""

    base_url: str
    model: str
    api_key: str | None = field(repr=False)
    key_source: str | None  # which flag or variable the key came from (never the key itself)
    params: Mapping[str, Any] = field(default_factory=dict)
    key_env: str | None = None  # the config file's `api_key_env`: where the user keeps the key


def _model_entry(entry: object) -> tuple[str | None, dict[str, Any]]:
    if isinstance(entry, str):
        return entry, {}
    if isinstance(entry, Mapping):
        name = next((entry[k] for k in ("model", "id", "name") if isinstance(entry.get(k), str)), None)
        return name, {k: v for k, v in entry.items() if k not in ("model", "id", "name")}
    return None, {}


def load_target(settings: ClientSettings) -> Target:
    """Apply `--config` under the flags. Raises ValueError for a file that can't be used."""
    data: dict[str, Any] = {}
    if settings.config:
        try:
            data = json.loads(Path(settings.config).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read --config {settings.config}: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"--config {settings.config}: expected a JSON object")
    given = settings.model_fields_set
    base_url = settings.base_url if "base_url" in given or "base_url" not in data else str(data["base_url"])
    if settings.route is not None:
        if "base_url" in given:
            raise ValueError("give --route or --base-url, not both")
        base_url = route_base_url(settings.route, os.environ)
    params: dict[str, Any] = dict(data.get("default_params") or {})
    model = settings.model
    models = data.get("models") or {}
    if isinstance(models, Mapping) and model in models:
        name, extra = _model_entry(models[model])
        if name is None:
            raise ValueError(f"--config: models.{model} names no model")
        model = name
        params.update(extra)
    key, source = None, None
    key_env = data.get("api_key_env") if isinstance(data.get("api_key_env"), str) else None
    if settings.api_key is not None:
        key = settings.api_key.get_secret_value()
        source = next((f"${name}" for name in KEY_VARIABLES if os.environ.get(name) == key), "--api-key")
    elif key_env and os.environ.get(key_env):
        key, source = os.environ[key_env], f"${key_env}"
    return Target(
        base_url=base_url.rstrip("/"), model=model, api_key=key, key_source=source, params=params, key_env=key_env
    )


def route_base_url(name: str, environ: Mapping[str, str]) -> str:
    """The OpenAI-style base URL of the proxy's route `name`: its upstream URL + /v1. The routes
    come from `TAOTRACE_ROUTES` and `TAOTRACE_UPSTREAM`, as `taotrace serve` reads them."""
    from proxy.config.routes import DEFAULT_UPSTREAM, routes_for
    from proxy.config.settings import split_csv

    specs = split_csv(environ.get("TAOTRACE_ROUTES", ""))
    assert isinstance(specs, list)
    routes = routes_for(environ.get("TAOTRACE_UPSTREAM", DEFAULT_UPSTREAM), specs)  # ValueError: a bad route
    for route in routes:
        if route.name == name.strip().lower():
            return shown_url(route.base) + "/v1"
    names = ", ".join(r.name for r in routes)
    raise ValueError(f"no route named {name[:40]!r}; the proxy's routes (TAOTRACE_ROUTES, TAOTRACE_UPSTREAM): {names}")


def key_hint(key_env: str | None = None) -> str:
    """Where to put a key, in the user's own terms (`key_env`: the config file's `api_key_env`)."""
    return f"export {key_env or KEY_VARIABLES[1]}=<your key>  (or pass --api-key)"


def key_places(key_env: str | None = None) -> str:
    """Where a key was looked for."""
    places = ["--api-key", *(f"${name}" for name in KEY_VARIABLES)]
    if key_env:
        places.insert(0, f"${key_env} (api_key_env in --config)")
    return ", ".join(places)
