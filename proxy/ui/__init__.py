"""The built-in live view: recent requests, their waterfalls, an overview, and the demo's plots.

Fed finished `RequestRecord`s as one of the observers (`LiveView.observe`) and
served on the metrics port (`add_ui_routes`). Never imports tools/ or sim/.
"""

from __future__ import annotations

from proxy.ui.live import LiveView
from proxy.ui.web import add_ui_routes

__all__ = ["LiveView", "add_ui_routes"]
