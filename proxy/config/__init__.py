"""What the proxy is told at start: the settings (flags and `TAOTRACE_*`), the routes to its
upstreams, and the forward proxy rules of the environment."""
