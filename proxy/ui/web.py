"""The live view's routes on the metrics port: the page, its static files and its JSON API.

    /                         the page (static HTML; all data comes from the API below)
    /ui/{file}                its script, charts and stylesheet (package data, read once)
    /api/requests             recent requests, newest first (?limit=&api=&model=&errors=&slow=&since=),
                              and the requests in flight now
    /api/requests/{id}        one request, finished or in flight: record, phase spans, inter-token gaps
    /api/pairs/{pair_id}      --mirror: a request and its mirror copy, both details and their differences
    /api/summary              the last 15 minutes per model, phases, errors, requests/s, in flight
                              (client requests only: mirror copies are summarised apart, under pairs)

With a token, each of these needs `Authorization: Bearer <token>` or the cookie set by opening
`/?token=<token>` once; `/metrics`, `/healthz` and `/readyz` never do. Without it, a browser
opening a page gets a short HTML page saying how to log in; scripts (`Accept:
application/json`, or any `/api/` path) get the JSON 401. Long answers are built in
slices that yield to the event loop, so a page polling 1,000 rows never stalls the proxy.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from importlib import resources

import orjson
from aiohttp import web

from proxy.ui.live import LiveSource
from proxy.ui.ring import parse_query

__all__ = ["add_ui_routes"]

COOKIE = "taotrace_ui"
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
_SECURITY = {
    # Everything the page needs is served from here; nothing inline, nothing from elsewhere.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _static_files() -> dict[str, tuple[bytes, str]]:
    root = resources.files("proxy.ui") / "static"
    files = {}
    for item in root.iterdir():
        suffix = "." + item.name.rsplit(".", 1)[-1]
        if item.is_file() and suffix in _TYPES:
            files[item.name] = (item.read_bytes(), _TYPES[suffix])
    return files


def _json(body: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json", headers=_SECURITY)


def _error(status: int, kind: str, message: str) -> web.Response:
    return _json({"error": {"message": f"taotrace: {message}", "type": kind}}, status)


# The login page: static text (nothing from the request), so its inline style is safe to allow.
_LOGIN_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
_LOGIN = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>taotrace live view: token needed</title>
<style>body{{font:15px/1.5 system-ui,sans-serif;max-width:40em;margin:3em auto;padding:0 1em;color:#1d232b}}
code{{background:#eef0f3;padding:0 3px}}input{{font:inherit;width:18em}}.bad{{color:#c0392b}}</style></head>
<body><h1>taotrace live view</h1>{problem}
<p>This live view is guarded by a token: the value given to <code>taotrace serve --ui-token</code>
(or <code>TAOTRACE_UI_TOKEN</code>).</p>
<form method="get" action="/"><label>Token <input type="password" name="token" autocomplete="off" autofocus></label>
<button type="submit">Open the live view</button></form>
<p>Or open <code>/?token=&lt;token&gt;</code> once: the proxy trades the token for a cookie (HttpOnly) and takes it
out of the address bar. Scripts send <code>Authorization: Bearer &lt;token&gt;</code> instead.</p>
<p><code>/metrics</code>, <code>/healthz</code> and <code>/readyz</code> need no token.</p>
</body></html>
"""


def _wants_html(request: web.Request) -> bool:
    """A browser opening a page (not a script, not the API): it gets the login page, not JSON."""
    accept = request.headers.get("Accept", "")
    return "text/html" in accept and not request.path.startswith("/api/")


def _login(problem: str = "") -> web.Response:
    body = _LOGIN.format(problem=f'<p class="bad">{problem}</p>' if problem else "")
    headers = {**_SECURITY, "Content-Security-Policy": _LOGIN_POLICY, "WWW-Authenticate": "Bearer"}
    return web.Response(status=401, text=body, content_type="text/html", headers=headers)


def add_ui_routes(app: web.Application, live: LiveSource, *, token: str | None = None) -> None:
    """Mount the live view on `app` (the metrics app): `live` answers the API (`LiveSource`)."""
    files = _static_files()
    secret = token.encode() if token else None

    def authorized(request: web.Request) -> bool:
        if secret is None:
            return True
        supplied = ""
        auth = request.headers.get("Authorization", "")
        if auth[:7].lower() == "bearer ":
            supplied = auth[7:].strip()
        else:
            supplied = request.cookies.get(COOKIE, "")
        return hmac.compare_digest(supplied.encode(), secret)

    def guarded(handler: Handler) -> Handler:
        async def check(request: web.Request) -> web.StreamResponse:
            if not authorized(request):
                if _wants_html(request):
                    return _login()
                response = _error(
                    401,
                    "unauthorized",
                    "the live view needs its token: open /?token=<TAOTRACE_UI_TOKEN> once, "
                    "or send Authorization: Bearer <token>",
                )
                response.headers["WWW-Authenticate"] = "Bearer"
                return response
            return await handler(request)

        return check

    async def page(request: web.Request) -> web.StreamResponse:
        given = request.query.get("token")
        if secret is not None and given is not None:
            if not hmac.compare_digest(given.encode(), secret):
                if _wants_html(request):
                    return _login("That is not this proxy's token.")
                return _error(401, "unauthorized", "wrong token")
            # Trade the token in the address bar (and history) for a cookie scripts cannot read.
            response = web.Response(status=303, headers={"Location": "/", **_SECURITY})
            response.set_cookie(COOKIE, given, httponly=True, samesite="Strict", path="/")
            return response
        return await index(request)

    async def _index(_request: web.Request) -> web.StreamResponse:
        body, ctype = files["index.html"]
        return web.Response(body=body, content_type=ctype, headers=_SECURITY)

    index = guarded(_index)

    async def static(request: web.Request) -> web.StreamResponse:
        found = files.get(request.match_info["name"])
        if found is None:
            return _error(404, "not_found", "no such file")
        body, ctype = found
        return web.Response(body=body, content_type=ctype, headers=_SECURITY)

    async def requests(request: web.Request) -> web.StreamResponse:
        try:
            query = parse_query(request.query, live.capacity)
        except ValueError as exc:
            return _error(400, "bad_request", str(exc))
        return _json(await live.requests(query))

    async def one(request: web.Request) -> web.StreamResponse:
        found = await live.request(request.match_info["id"])
        if found is None:
            return _error(
                404, "not_found", "no such request among the recent ones (the ring keeps the last --ui-requests)"
            )
        return _json(found)

    async def pair(request: web.Request) -> web.StreamResponse:
        found = await live.pair(request.match_info["pair_id"])
        if found is None:
            return _error(
                404, "not_found", "no such pair among the recent requests (the ring keeps the last --ui-requests)"
            )
        return _json(found)

    async def summary(_request: web.Request) -> web.StreamResponse:
        return _json(await live.summary())

    app.router.add_get("/", page)
    app.router.add_get("/ui/{name}", guarded(static))
    app.router.add_get("/api/requests", guarded(requests))
    app.router.add_get("/api/requests/{id}", guarded(one))
    app.router.add_get("/api/pairs/{pair_id}", guarded(pair))
    app.router.add_get("/api/summary", guarded(summary))
