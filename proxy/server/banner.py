"""What `taotrace serve` says when it starts (pure): where it listens and forwards, where the
metrics, the live view and the spans are, and a warning when the live view is open to others.

One process and a group say the same, so scripts and people read one format:

    taotrace proxy on http://127.0.0.1:8787 -> https://taotoken.net/api; metrics on http://127.0.0.1:9464/metrics; live view on http://127.0.0.1:9464/ (no token); spans not exported (set OTEL_EXPORTER_OTLP_ENDPOINT)
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from proxy.telemetry.otlp_env import shown_endpoint

__all__ = ["exposed", "exposure_warning", "live_view_warning", "startup_line"]


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


def exposure_warning(
    metrics_url: str, *, capture_content: bool, listen_flag: str = "--metrics-host", off_flag: str | None = "--no-ui"
) -> str:
    """Said when the live view answers other hosts and no `--ui-token` guards it. `listen_flag`,
    `off_flag`: the command's own flags for where it listens and turning the view off (None: none)."""
    shows = "every request's prompt and completion (--capture-content)" if capture_content else "every request"
    listen = f"listen on 127.0.0.1 ({listen_flag})"
    fix = f"{listen}, or turn it off ({off_flag})" if off_flag is not None else f"or {listen}"
    return (
        f"the live view on {metrics_url}/ is open to anyone who can reach this address and shows {shows}; "
        f"set TAOTRACE_UI_TOKEN, {fix}"
    )


def live_view_warning(
    metrics_url: str,
    addresses: Iterable[str],
    *,
    ui: bool,
    token: bool,
    capture_content: bool,
    listen_flag: str = "--metrics-host",
    off_flag: str | None = "--no-ui",
) -> str | None:
    """`exposure_warning` when the live view is on, unguarded and bound to `addresses` another host
    can reach; else None. serve and demo both say it."""
    if not ui or token or not exposed(addresses):
        return None
    return exposure_warning(metrics_url, capture_content=capture_content, listen_flag=listen_flag, off_flag=off_flag)
