"""What is reported about finished requests, built once per start: the metrics, the spans, the
observers fed every record (each behind its own guard), and the metrics port that serves them."""
