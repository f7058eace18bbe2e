"""Settings for `taotrace sim`: flags, `TAOTRACE_*` environment variables, defaults."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from proxy.sim.catalogue import catalogue_from

__all__ = ["SimSettings"]


def _split_csv(value: object) -> object:
    """Accept `a,b,c` from flags and the environment, and a list of such (a repeated flag)."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return [part.strip() for item in value for part in item.split(",") if part.strip()]
    return value


def _prefix(value: str) -> str:
    if value and not value.startswith("/"):
        raise ValueError(f"a path prefix starts with '/', e.g. /v1 (got {value!r})")
    return value


def _catalogue(value: str | None) -> str | None:
    """Read the file now, so a bad one is refused with the other settings, not as a traceback."""
    if value is None:
        return value
    try:
        catalogue_from(json.loads(Path(value).read_text()))
    except OSError as exc:
        raise ValueError(f"cannot read the catalogue {value}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"the catalogue {value} is not JSON ({exc})") from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"the catalogue {value} cannot be used: {exc}") from None
    return value


class SimSettings(BaseSettings):
    """Everything `taotrace sim` can be told."""

    model_config = SettingsConfigDict(env_prefix="TAOTRACE_SIM_", extra="ignore")

    host: str = Field("127.0.0.1", min_length=1, description="address the simulator listens on")
    port: int = Field(8788, ge=0, le=65535, description="simulator port (base URL http://HOST:PORT/v1)")
    time_scale: float = Field(
        1.0, gt=0, description="multiplies every simulated duration (0.1 = ten times faster, same ratios)"
    )
    require_key: bool = Field(False, description="answer 401 to requests without an API key")
    api_keys: Annotated[list[str], NoDecode] = Field(
        [], description="keys accepted when --require-key is on (comma separated; empty = any)"
    )
    bad_keys: Annotated[list[str], NoDecode] = Field(
        ["bad"], description="keys always answered with 401 (comma separated)"
    )
    tokenizer: Literal["auto", "estimate", "tiktoken"] = Field(
        "auto", description="prompt token counts: tiktoken when installed and usable offline (auto), else the estimate"
    )
    block_size: int = Field(16, ge=1, description="tokens per KV-cache block (the prefix cache matches whole blocks)")
    max_batch: int = Field(64, ge=1, description="most sequences decoded together; more wait in the queue")
    batch_slowdown: float = Field(0.04, ge=0, description="extra decode-step time per additional running stream")
    cache_residual: float = Field(0.05, ge=0, le=1, description="share of a cached prompt token's prefill still paid")
    stall_seconds: float = Field(30.0, ge=0, description="how long the `stall` failure trigger stays silent")
    path_prefix: str = Field(
        "", description="serve the API only under this prefix, e.g. /v1 (empty: any prefix, or none)"
    )
    catalogue: str | None = Field(None, description='JSON file overriding or adding models: {"models": [...]}')
    rate_limit_requests: int = Field(
        0, ge=0, le=10**9, description="requests per key per rate-limit window before 429 (0 = no limit)"
    )
    rate_limit_tokens: int = Field(
        0, ge=0, le=10**12, description="prompt + planned output tokens per key per window before 429 (0 = no limit)"
    )
    rate_limit_window: float = Field(
        60.0, gt=0, le=86400, description="seconds of the per-key rate-limit window (wall clock, not time-scaled)"
    )

    _split_keys = field_validator("api_keys", "bad_keys", mode="before")(_split_csv)
    _check_prefix = field_validator("path_prefix")(_prefix)
    _check_catalogue = field_validator("catalogue")(_catalogue)
