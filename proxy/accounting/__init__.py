"""Who sent a request, how close the caller is to its rate limit, and what it cost.

Pure helpers the forwarder calls when a request finishes: `attribution` (header and body
attributes, the salted key fingerprint), `ratelimits` (the upstream's rate-limit headers),
`prices` (a user-supplied price table and the cost of one request's usage).
"""
