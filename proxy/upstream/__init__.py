"""The upstream HTTP/1.1 client: pooled keep-alive connections to one origin, built for relaying.

Why not `aiohttp.ClientSession`: a request through it (with trace signals for the phase timings)
cost much CPU before the first byte left (docs/performance.md), and every body chunk took a trip
through a `StreamReader` and a task wake-up before it could be written on. Here the response is
parsed by llhttp (`httptools`, the parser of Node.js and uvicorn) inside `data_received`, and
the body of each read is handed straight to a sink on the same call: the relay writes it to the
client before the event loop does anything else.

    pool = UpstreamPool(URL("https://taotoken.net/api"), connect_timeout=10, read_timeout=300, keepalive=4)
    resp = await pool.request("POST", "/api/v1/chat/completions", headers, body, phase)
    await resp.relay(sink, drained)     # sink(bytes) per read; True asks to pause reading
    resp.close()                        # or resp.discard_rest() when the client left with all it needed

Timings go straight into the request's phase clock, seen through `Steps` (pool wait, DNS,
connect incl. TLS, reuse, request written). The connection's `TCP_INFO` is read as a request ends (`end_tcp()`, or, if the
connection fails first, just before its socket closes); one request's end reading is the next
one's baseline (`tcp_start`), so counting per request costs no extra system call. Failures
before the response head raise a `ProxyError` (`UpstreamUnreachable`, `UpstreamTimeout`,
`UpstreamBroken`) with our own message (never bytes from the wire); failures in the body raise
`BodyFailure` with an error type (the tree is drawn in `proxy/errors.py`).

    _cycle.py       one connection's response cycle without I/O: `State`, the transition table, events
    _connection.py  the asyncio adapter: feeds the cycle, does what its events say, the relay
    _response.py    `UpstreamResponse`, one request's handle on its response
    _pool.py        `UpstreamPool`: idle connections, the cap, the stale retry, discarding a body's rest
    _dial.py        new connections: DNS, addresses in turn, TLS, the connect timeout
    _tunnel.py      CONNECT through a forward proxy
    _request.py     the request head as written
    _steps.py       `Steps`: what the pool stamps on a request's phase clock
    tcpinfo.py      Linux `TCP_INFO`: parse (pure), read, per-request stats
"""

from __future__ import annotations

from proxy.upstream._pool import UpstreamPool
from proxy.upstream._response import UpstreamResponse
from proxy.upstream._steps import Steps

__all__ = ["Steps", "UpstreamPool", "UpstreamResponse"]
