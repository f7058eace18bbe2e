"""The server side of the proxy: the two aiohttp applications (the proxy port, the metrics port),
serving them on bound sockets and draining, the process lifecycle, and the start-up line."""
