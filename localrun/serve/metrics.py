"""``GET /metrics``: the server's figures in Prometheus' text format, as
llama-server gives them (behind the API key, as its are).

Counted as requests end (from the `RequestDone` every answered request
reports, a few additions each: nothing on the decode path): requests by
endpoint and status, prompt, cached and generated tokens by model, and
histograms of time to first token, decode speed and request duration. Read
when scraped, from the model table: the models loaded, each one's slots,
slots busy, requests waiting, what it holds on each device, and the recent
decode rate of all slots together.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from localrun.serve.events import OnEvent, RequestDone, ServeEvent
from localrun.serve.router import ModelTable

PATH = "/metrics"
OTHER = "other"  # the endpoint label of a path no route has (a 404): one label, whatever was asked
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
RATE_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0)
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class _Table(Collector):
    """What the model table holds now, read at each scrape."""

    def __init__(self, table: ModelTable) -> None:
        self.table = table

    def collect(self) -> Iterator[Metric]:
        loaded = GaugeMetricFamily("localrun_models_loaded", "Models loaded now")
        slots = GaugeMetricFamily("localrun_slots", "Each loaded model's slots", labels=["model"])
        busy = GaugeMetricFamily("localrun_slots_busy", "Slots decoding or evaluating a prompt", labels=["model"])
        queued = GaugeMetricFamily("localrun_requests_queued", "Requests waiting for a slot", labels=["model"])
        memory = GaugeMetricFamily(
            "localrun_model_memory_bytes", "What each loaded model holds, by device", labels=["model", "device"]
        )
        models = self.table.models
        loaded.add_metric([], len(models))
        for model in models:
            status = model.worker.status()
            slots.add_metric([model.id], status.parallel)
            busy.add_metric([model.id], status.busy)
            queued.add_metric([model.id], status.queued)
            for device, size in model.held.items():
                memory.add_metric([model.id, device], size)
        rate = GaugeMetricFamily(
            "localrun_decode_tokens_per_second_recent", "Tokens decoded per second, all slots together, recently"
        )
        rate.add_metric([], self.table.status().tokens_per_s)
        yield from (loaded, slots, busy, queued, memory, rate)


class Metrics:
    """The server's registry: counters fed by ``hear`` and the table read when scraped."""

    def __init__(self, table: ModelTable) -> None:
        self.registry = CollectorRegistry()
        self.routes: list[tuple[re.Pattern[str], str]] = []  # each route's pattern and the label it gets
        self.requests = Counter(
            "localrun_requests",
            "Requests answered, by endpoint and status",
            ["endpoint", "status"],
            registry=self.registry,
        )
        by_model = ["model"]
        self.prompt_tokens = Counter(
            "localrun_prompt_tokens", "Prompt tokens of the requests answered", by_model, registry=self.registry
        )
        self.cached_tokens = Counter(
            "localrun_cached_tokens", "Prompt tokens found in a slot's cache", by_model, registry=self.registry
        )
        self.generated_tokens = Counter(
            "localrun_generated_tokens", "Tokens generated", by_model, registry=self.registry
        )
        self.ttft = Histogram(
            "localrun_time_to_first_token_seconds",
            "Seconds from a request's admission to its first token",
            by_model,
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.decode = Histogram(
            "localrun_decode_tokens_per_second",
            "Each request's decode speed",
            by_model,
            buckets=RATE_BUCKETS,
            registry=self.registry,
        )
        self.duration = Histogram(
            "localrun_request_duration_seconds",
            "Seconds from a request's arrival to its end",
            ["endpoint"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_Table(table))

    def learn_routes(self, app: FastAPI) -> None:
        """The endpoints requests are counted by: the app's routes (a path with
        a parameter, /v1/models/{name}, is one endpoint)."""
        self.routes = []
        for route in app.routes:
            pattern = getattr(route, "path_regex", None)
            path = getattr(route, "path", None)
            if isinstance(pattern, re.Pattern) and isinstance(path, str):
                self.routes.append((pattern, re.sub(r":[^}]*}", "}", path)))

    def endpoint(self, path: str) -> str:
        return next((label for pattern, label in self.routes if pattern.match(path)), OTHER)

    def hear(self, event: ServeEvent) -> None:
        """Count a request that ended."""
        if not isinstance(event, RequestDone):
            return
        endpoint = self.endpoint(event.path)
        self.requests.labels(endpoint, str(event.status)).inc()
        self.duration.labels(endpoint).observe(event.elapsed_s)
        if event.model is None:
            return
        model = event.model
        self.prompt_tokens.labels(model).inc(event.prompt_tokens)
        self.cached_tokens.labels(model).inc(event.cached_tokens)
        self.generated_tokens.labels(model).inc(event.generated_tokens)
        if event.ttft_s is not None:
            self.ttft.labels(model).observe(event.ttft_s)
        if event.generated_tokens > 1 and event.decode_tokens_per_s > 0:
            self.decode.labels(model).observe(event.decode_tokens_per_s)

    def tee(self, on_event: OnEvent | None) -> OnEvent:
        """``on_event``, with each event counted first."""

        def both(event: ServeEvent) -> None:
            self.hear(event)
            if on_event is not None:
                on_event(event)

        return both

    def text(self) -> bytes:
        return generate_latest(self.registry)


def register(app: FastAPI, metrics: Metrics) -> None:
    """``GET /metrics`` on ``app`` (after its other routes: they are what requests are counted by)."""

    @app.get(PATH)
    async def metrics_route() -> Response:
        return Response(metrics.text(), media_type=CONTENT_TYPE_LATEST)

    metrics.learn_routes(app)
