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

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["DEFAULT_BASE_URL", "ClientSettings", "Target", "load_target"]

DEFAULT_BASE_URL = "https://taotoken.net/api/v1"
KEY_VARIABLES = ("TAOTRACE_API_KEY", "TAOTOKEN_API_KEY")


class ClientSettings(BaseSettings):
    """Flags common to the commands that call an endpoint as a client."""

    model_config = SettingsConfigDict(env_prefix="TAOTRACE_", extra="ignore", populate_by_name=True)

    base_url: str = Field(DEFAULT_BASE_URL, min_length=1, description="OpenAI-style base URL (the one an SDK's base_url takes)")
    api_key: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices(*KEY_VARIABLES),
        description="API key (default: $TAOTRACE_API_KEY, then $TAOTOKEN_API_KEY); never printed",
    )
    model: str = Field("gpt-4o-mini", min_length=1, description="model name, or an alias from --config's `models`")
    config: str | None = Field(None, description="JSON file in the article's layout: base_url, models, default_params")
    timeout: float = Field(60.0, gt=0, description="seconds allowed for connecting and between reads")
    json_output: bool = Field(False, description="print the result as JSON", json_schema_extra={"flag": "--json"})


@dataclass(frozen=True)
class Target:
    """Where to call, resolved from flags, environment and the config file."""

    base_url: str
    model: str
    api_key: str | None = field(repr=False)
    key_source: str | None  # which flag or variable the key came from (never the key itself)
    params: Mapping[str, Any] = field(default_factory=dict)


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
    if settings.api_key is not None:
        key = settings.api_key.get_secret_value()
        source = next((f"${name}" for name in KEY_VARIABLES if os.environ.get(name) == key), "--api-key")
    elif isinstance(data.get("api_key_env"), str) and os.environ.get(data["api_key_env"]):
        key, source = os.environ[data["api_key_env"]], f"${data['api_key_env']}"
    return Target(base_url=base_url.rstrip("/"), model=model, api_key=key, key_source=source, params=params)
