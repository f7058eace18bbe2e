"""What the proxy reports about finished requests: spans (`spans`), their OTLP encoding (`otlp`),
Prometheus metrics (`metrics`), OTLP GenAI metrics (`genai_metrics`, aggregated by `aggregate`,
handed to the SDK's exporters by `metric_pipeline`) and the optional access log (`accesslog`).

Everything here is fed a finished `RequestRecord` (or a span begun at the request's start) and
never touches a request's bytes.
"""
