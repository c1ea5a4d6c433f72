"""Prometheus metrics, one set per app (no module-level registry).

With several uvicorn workers each process counts on its own; set
``PROMETHEUS_MULTIPROC_DIR`` to an empty, writable directory before the
workers start and ``/metrics`` then sums the files all workers write there
(prometheus_client's multiprocess mode, chosen when it is first imported).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, get_args

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from service.domain import RewardOutcome, RewardStatus

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Metrics:
    """The service's counters and the request-latency histogram."""

    def __init__(self) -> None:
        self.multiproc_dir = os.environ.get(MULTIPROC_ENV) or None
        if self.multiproc_dir is not None and not Path(self.multiproc_dir).is_dir():
            raise ValueError(f"{MULTIPROC_ENV} must name an existing directory")
        self.registry = CollectorRegistry()
        # "code" is an HTTP status code wherever it appears; a reward's fate is its "outcome".
        self.latency = Histogram(
            "linreboot_request_duration_seconds",
            "HTTP request latency by method, route template and status code",
            ["method", "route", "code"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.decisions = Counter(
            "linreboot_decisions", "decisions returned by /choose and rankings by /rank",
            registry=self.registry
        )
        self.defaults = Counter(
            "linreboot_default_rewards",
            "default rewards applied by this process's sweeper (decisions whose window ended "
            "without a reward)", registry=self.registry,
        )
        self.rewards = Counter(
            "linreboot_rewards", "reward items by outcome", ["outcome"], registry=self.registry
        )
        self.errors = Counter(
            "linreboot_errors", "responses with status >= 400 by route template and status code",
            ["route", "code"], registry=self.registry,
        )
        # Set by a write refused for lack of memory, cleared by a ready /readyz;
        # across workers the latest of their values.
        self.store_full = Gauge(
            "linreboot_store_full",
            "1 while Redis is out of memory and refuses writes (as last seen), else 0",
            multiprocess_mode="mostrecent",
            registry=self.registry,
        )
        # Read from Redis by the scrape itself, exported by the process that serves it.
        self.reading = _StoreReading()
        self.registry.register(self.reading)
        # Labelled children by label values: labels() takes a lock and builds a
        # key on every call, a visible cost at thousands of requests a second.
        self._latency_children: dict[tuple[str, str, int], Any] = {}
        self._error_children: dict[tuple[str, int], Any] = {}
        self._rewards_by_outcome = {  # all exported as 0 before the first reward
            outcome: self.rewards.labels(outcome=outcome) for outcome in get_args(RewardStatus)
        }

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route, status)
        child = self._latency_children.get(key)
        if child is None:
            child = self._latency_children[key] = self.latency.labels(method, route, str(status))
        child.observe(seconds)
        if status >= 400:
            errors = self._error_children.get((route, status))
            if errors is None:
                errors = self._error_children[(route, status)] = self.errors.labels(
                    route, str(status))
            errors.inc()

    def set_store_full(self, full: bool) -> None:
        self.store_full.set(1 if full else 0)

    def record_decision(self) -> None:
        self.decisions.inc()

    def record_defaults(self, applied: int) -> None:
        self.defaults.inc(applied)

    def record_store(self, ready: bool, full: bool,
                     memory: Iterable[tuple[str, int, int]]) -> None:
        """What a scrape read of Redis: readiness, and each node's (name, used, max)."""
        self.reading.ready, self.reading.memory = ready, list(memory)
        self.store_full.set(1 if full else 0)

    def record_rewards(self, outcomes: Iterable[RewardOutcome]) -> None:
        for outcome in outcomes:
            self._rewards_by_outcome[outcome.status].inc()

    def exposition(self) -> bytes:
        """The Prometheus text format, summed over workers in multiprocess mode."""
        if self.multiproc_dir is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=self.multiproc_dir)
        registry.register(self.reading)
        return generate_latest(registry)


class _StoreReading(Collector):
    """Readiness and each Redis node's memory as this scrape read them, and nothing
    older: a node gone since (a failover) is not exported, and a Redis that did not
    answer gives ready 0 and no memory (gauges would keep their last values)."""

    def __init__(self) -> None:
        self.ready = False
        self.memory: list[tuple[str, int, int]] = []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "linreboot_ready", "1 if Redis answered and accepted writes when this scrape "
            "asked (what /readyz checks), else 0", value=1 if self.ready else 0)
        used = GaugeMetricFamily("linreboot_redis_used_memory_bytes",
                                 "each Redis primary's used_memory at this scrape",
                                 labels=["node"])
        limit = GaugeMetricFamily("linreboot_redis_maxmemory_bytes",
                                  "each Redis primary's maxmemory at this scrape (0: none)",
                                  labels=["node"])
        for node, used_bytes, max_bytes in self.memory:
            used.add_metric([node], used_bytes)
            limit.add_metric([node], max_bytes)
        yield used
        yield limit
