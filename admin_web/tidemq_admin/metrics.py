"""Prometheus metrics of the admin console: requests per view and how long they took.

Labels are bounded: ``endpoint`` is the Flask view's name (a fixed set; "none" for unrouted
paths, never the path itself with its ids) and ``code`` the HTTP status. The endpoint is served
by ``tidemq.metrics.serve_metrics`` on its own port, outside the console's login.
"""

from __future__ import annotations

import time

from flask import Flask, Response, g, request

from tidemq.metrics import counter, histogram

__all__ = ["REQUESTS", "REQUEST_SECONDS", "install"]

#: Seconds: the dashboard's target is 50 ms; a page at 1M rows without indexes takes 0.3 s.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

REQUESTS = counter("tidemq_console_requests", "Console HTTP requests answered, by view and status code.",
                   ("endpoint", "code"))
REQUEST_SECONDS = histogram("tidemq_console_request_duration_seconds", "Seconds the console took to answer a "
                            "request, by view.", BUCKETS, ("endpoint",))


def install(app: Flask) -> None:
    """Time every request of ``app``."""

    @app.before_request
    def _start() -> None:
        g.tidemq_started = time.perf_counter()

    @app.after_request
    def _done(response: Response) -> Response:
        started = g.pop("tidemq_started", None)
        endpoint = request.endpoint or "none"
        REQUESTS.labels(endpoint, str(response.status_code)).inc()
        if started is not None:
            REQUEST_SECONDS.labels(endpoint).observe(time.perf_counter() - started)
        return response
