"""One request's way through the proxy: the handler, the relay of its answer, its timing and
outcome, and the record every observer gets when it ends."""
