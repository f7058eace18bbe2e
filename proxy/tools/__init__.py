"""Client-side tools built on the proxy's parsers: `taotrace demo`, `probe`, `doctor`,
`compare`.

They talk to an endpoint the way a user's tool would (over HTTP); the proxy core never imports
them (tests/test_layout.py pins this).
"""
