"""Prometheus metrics of one app instance (CONTRACT "Operations": ``GET /metrics``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


class _OpenCalls(Collector):
    """Reads the number of open (unsettled) calls from the database at scrape time."""

    def __init__(self, count_open: Callable[[], int | None]) -> None:
        self._count_open = count_open

    def collect(self) -> Iterable[GaugeMetricFamily]:
        value = self._count_open()
        family = GaugeMetricFamily("billing_calls_open", "Calls not yet settled.")
        if value is not None:
            family.add_metric([], value)
        yield family


class Metrics:
    """The service's metrics in their own registry (so several apps can live in one process)."""

    def __init__(self, count_open: Callable[[], int | None]) -> None:
        self.registry = CollectorRegistry()
        self.events_accepted = Counter(
            "billing_events_accepted", "Events newly stored.", registry=self.registry
        )
        self.events_duplicate = Counter(
            "billing_events_duplicate",
            "Events already stored (idempotent retries).",
            registry=self.registry,
        )
        self.events_rejected = Counter(
            "billing_events_rejected",
            "Refusals by reason: 409 counts each conflicting event, 413/422 each refused batch.",
            ["reason"],
            registry=self.registry,
        )
        self.request_latency = Histogram(
            "billing_request_duration_seconds",
            "HTTP request latency in seconds.",
            ["method", "route", "status"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.settled = Counter(
            "billing_calls_settled", "Calls settled by reconciliation.", registry=self.registry
        )
        self.adjustments = Counter(
            "billing_adjustments", "Adjustment ledger entries written.", registry=self.registry
        )
        self.registry.register(_OpenCalls(count_open))
