"""The accounting pieces a proxy uses, built once per start from its settings (errors at start)."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from pydantic import SecretStr

from proxy.accounting.attribution import Attributor, parse_header_attributes
from proxy.accounting.prices import PriceTable, load_prices
from proxy.config.settings import Settings

__all__ = ["Accounting", "accounting_from", "label_name"]

_RESERVED_LABELS = frozenset({"api", "model", "type", "error_type", "status_code", "kind", "le", "phase"})


def label_name(attribute: str) -> str:
    """A Prometheus label name for an attribute name: `user.id` -> `user_id`."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", attribute)


@dataclass(frozen=True, slots=True, kw_only=True)
class Accounting:
    """Who (attributor), how much (prices), and which attributes become metric labels.

    `key_salt` is the salt of `taotrace.key.id`: the one given, or one drawn for this start. A
    group hands it to its workers, so a key has one id across the group."""

    attributor: Attributor
    key_salt: SecretStr
    prices: PriceTable | None = None
    metric_labels: tuple[str, ...] = ()  # attribute names
    metric_label_values: int = 20


def accounting_from(settings: Settings) -> Accounting:
    """Build and check everything once; a `ValueError` with a message for the operator otherwise."""
    key_salt = settings.key_salt if settings.key_salt is not None else SecretStr(secrets.token_hex(32))
    attributor = Attributor(
        parse_header_attributes(settings.attribute_header),
        body_user=settings.attribute_body_user,
        salt=key_salt.get_secret_value().encode(),
    )
    labels = tuple(dict.fromkeys(settings.metric_label))
    unknown = [name for name in labels if name not in attributor.names]
    if unknown:
        raise ValueError(
            f"--metric-label {','.join(unknown)}: not an attribute the proxy records; "
            f"choose from {', '.join(sorted(attributor.names))}"
        )
    names = [label_name(name) for name in labels]
    clash = [n for n in names if n in _RESERVED_LABELS or names.count(n) > 1]
    if clash:
        raise ValueError(f"--metric-label: label name(s) {', '.join(sorted(set(clash)))} clash with another label")
    prices = load_prices(settings.prices) if settings.prices else None
    return Accounting(
        attributor=attributor,
        key_salt=key_salt,
        prices=prices,
        metric_labels=labels,
        metric_label_values=settings.metric_label_values,
    )
