"""A user-supplied price table (`--prices FILE`, TOML or YAML) and the cost of one request.

Prices are per million tokens. Each model has `input` and `output`, and optionally
`cached_input` (cache reads), `cache_write` (cache creation) and `reasoning`; a missing one
costs what `input` (for the first two) or `output` (for reasoning) costs. A model that is not in
the table uses `fallback` when the file has one; otherwise it is unpriced, never guessed.

Usage arrives normalised by `proxy.dialects`: `input_tokens` includes cache reads and writes
(OpenAI's `prompt_tokens` already includes `cached_tokens`; for Anthropic the dialect adds
`cache_read_input_tokens` and `cache_creation_input_tokens` to `input_tokens`), and
`output_tokens` includes reasoning. So the fresh input is input − cached − cache writes.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from proxy.dialects import Usage

__all__ = ["Cost", "Price", "PriceTable", "cost_of", "load_prices"]

PER = 1_000_000  # prices are per million tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class Price:
    """One model's prices per million tokens."""

    input: float
    output: float
    cached_input: float
    cache_write: float
    reasoning: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Cost:
    """What one request cost; `amount` None means its model has no price (unpriced)."""

    amount: float | None
    cache_savings: float | None  # cached input at the input price minus what it cost
    currency: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PriceTable:
    """Prices by model name, an optional fallback, and the currency they are in."""

    currency: str
    models: Mapping[str, Price]
    fallback: Price | None = None

    def price_for(self, model: str | None, response_model: str | None = None) -> Price | None:
        """The request's model, else the model the upstream answered with, else the fallback."""
        for name in (model, response_model):
            if name is not None:
                found = self.models.get(name)
                if found is not None:
                    return found
        return self.fallback


def _fresh(usage: Usage) -> tuple[int, int, int, int, int]:
    """(fresh input, cache reads, cache writes, plain output, reasoning) token counts."""
    cached = usage.cached_input_tokens or 0
    written = usage.cache_creation_input_tokens or 0
    fresh = max(0, (usage.input_tokens or 0) - cached - written)
    reasoning = usage.reasoning_tokens or 0
    plain = max(0, (usage.output_tokens or 0) - reasoning)
    return fresh, cached, written, plain, reasoning


def cost_of(table: PriceTable, usage: Usage, model: str | None, response_model: str | None = None) -> Cost:
    """The cost of `usage` at the price of its model (pure)."""
    price = table.price_for(model, response_model)
    if price is None:
        return Cost(amount=None, cache_savings=None, currency=table.currency)
    fresh, cached, written, plain, reasoning = _fresh(usage)
    amount = (
        fresh * price.input
        + cached * price.cached_input
        + written * price.cache_write
        + plain * price.output
        + reasoning * price.reasoning
    ) / PER
    savings = cached * (price.input - price.cached_input) / PER
    return Cost(amount=amount, cache_savings=savings, currency=table.currency)


# ---------------------------------------------------------------------------------------------
# The file


class _PriceEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: float = Field(ge=0, le=1e6)
    output: float = Field(ge=0, le=1e6)
    cached_input: float | None = Field(None, ge=0, le=1e6)
    cache_write: float | None = Field(None, ge=0, le=1e6)
    reasoning: float | None = Field(None, ge=0, le=1e6)

    def price(self) -> Price:
        return Price(
            input=self.input,
            output=self.output,
            cached_input=self.input if self.cached_input is None else self.cached_input,
            cache_write=self.input if self.cache_write is None else self.cache_write,
            reasoning=self.output if self.reasoning is None else self.reasoning,
        )


class _PriceFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    currency: str = Field(min_length=1, max_length=16)
    models: dict[str, _PriceEntry] = Field(default_factory=dict)
    fallback: _PriceEntry | None = None


_SUFFIXES = (".toml", ".yaml", ".yml")


def _parse(path: Path, text: str) -> Any:
    if path.suffix.lower() == ".toml":
        if sys.version_info < (3, 11):  # pragma: no cover - tomllib is 3.11+
            raise ValueError(f"--prices {path}: TOML needs Python 3.11 or later; write the table in YAML")
        import tomllib

        return tomllib.loads(text)
    import yaml

    return yaml.safe_load(text)


def load_prices(path: str | Path) -> PriceTable:
    """Read and validate a price file; a `ValueError` naming the file and the problem otherwise."""
    path = Path(path)
    if path.suffix.lower() not in _SUFFIXES:
        raise ValueError(f"--prices {path}: the file must end in .toml, .yaml or .yml")
    try:
        raw = _parse(path, path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"--prices {path}: cannot read the file ({exc.strerror or exc})") from None
    except Exception as exc:  # noqa: BLE001 - TOML/YAML syntax errors have no common base class
        raise ValueError(f"--prices {path}: not valid {path.suffix[1:].upper()}: {exc}") from None
    try:
        parsed = _PriceFile.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"--prices {path}: {problems}") from None
    if not parsed.models and parsed.fallback is None:
        raise ValueError(f'--prices {path}: no [models."name"] table and no [fallback]: nothing to price')
    return PriceTable(
        currency=parsed.currency,
        models={name: entry.price() for name, entry in parsed.models.items()},
        fallback=parsed.fallback.price() if parsed.fallback is not None else None,
    )
