"""What `taotrace serve` says when it starts (pure): where it listens and forwards, where the
metrics, the live view and the spans are, and a warning when the live view is open to others.

One process and a group say the same, so scripts and people read one format:

    taotrace proxy on http://127.0.0.1:8787 -> https://taotoken.net/api; metrics on http://127.0.0.1:9464/metrics; live view on http://127.0.0.1:9464/ (no token); spans not exported (set OTEL_EXPORTER_OTLP_ENDPOINT)
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from proxy.telemetry.otlp_env import shown_endpoint

__all__ = ["exposed", "exposure_warning", "startup_line"]


def exposed(addresses: Iterable[str]) -> bool:
    """Whether a socket bound to any of `addresses` can be reached from another host."""
    for address in addresses:
        try:
            if not ipaddress.ip_address(address.split("%", 1)[0]).is_loopback:
                return True
        except ValueError:  # not an IP address (never so for a bound socket): assume the worst
            return True
    return False


def startup_line(
    *,
    proxy_url: str,
    upstream: str,
    metrics_url: str,
    ui: bool,
    ui_token: bool,
    spans: str,
    processes: str = "",
) -> str:
    """The one line that says the proxy is up. `processes`: a group's, e.g. `(2 workers, pids 7 8; ...)`."""
    view = "live view off (--no-ui)"
    if ui:
        view = f"live view on {metrics_url}/ ({'token required' if ui_token else 'no token'})"
    group = f" {processes}" if processes else ""
    return (
        f"taotrace proxy on {proxy_url}{group} -> {shown_endpoint(upstream)}; "
        f"metrics on {metrics_url}/metrics; {view}; {spans}"
    )


def exposure_warning(metrics_url: str, *, capture_content: bool) -> str:
    """Said when the live view answers other hosts and no `--ui-token` guards it."""
    shows = "every request's prompt and completion (--capture-content)" if capture_content else "every request"
    return (
        f"the live view on {metrics_url}/ is open to anyone who can reach this address and shows {shows}; "
        "set TAOTRACE_UI_TOKEN, listen on 127.0.0.1 (--metrics-host), or turn it off (--no-ui)"
    )
