"""GET /metrics on a real server: requests by endpoint and status, tokens,
time to first token and decode speed as requests end, the slots and loaded
models as scraped; behind the API key; off with --no-metrics."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from localrun.serve.app import AppSettings, create_app
from localrun.serve.router import ModelTable, Servable
from tests.serve.conftest import Server

MODEL = "tiny"
HELLO: Any = [{"role": "user", "content": "hello"}]


def scrape(server: Server, key: str | None = None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample by name and labels."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    response = httpx.get(server.url + "/metrics", headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def until(server: Server, done: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A scrape once ``done(samples)`` holds: a stream's end is counted as its last event goes out."""
    for _ in range(100):
        samples = scrape(server)
        if done(samples):
            return samples
        time.sleep(0.1)
    return samples


def test_requests_tokens_and_timings_are_counted(server: Server) -> None:
    before = scrape(server)
    client = server.client()
    whole = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, temperature=0)
    streamed = list(
        client.chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=6, stream=True, stream_options={"include_usage": True}
        )
    )
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=HELLO, max_tokens=4)
    assert httpx.get(server.url + "/v1/models/" + MODEL).status_code == 200
    assert httpx.get(server.url + "/no/such/path").status_code == 404
    usage = [whole.usage, streamed[-1].usage]
    assert usage[0] is not None and usage[1] is not None
    chat = "/v1/chat/completions"

    def grew(name: str, by: float, **labels: str) -> bool:
        return value(after, name, **labels) - value(before, name, **labels) == by

    after = until(
        server,
        lambda s: (
            value(s, "localrun_requests_total", endpoint=chat, status="200")
            >= 2 + value(before, "localrun_requests_total", endpoint=chat, status="200")
        ),
    )
    assert grew("localrun_requests_total", 2, endpoint=chat, status="200")
    assert grew("localrun_requests_total", 1, endpoint=chat, status="404")
    assert grew("localrun_requests_total", 1, endpoint="other", status="404")
    assert grew("localrun_generated_tokens_total", 14, model=MODEL)
    assert grew("localrun_prompt_tokens_total", usage[0].prompt_tokens + usage[1].prompt_tokens, model=MODEL)
    assert grew("localrun_time_to_first_token_seconds_count", 2, model=MODEL)
    assert grew("localrun_decode_tokens_per_second_count", 2, model=MODEL)
    assert value(after, "localrun_time_to_first_token_seconds_sum", model=MODEL) > value(
        before, "localrun_time_to_first_token_seconds_sum", model=MODEL
    )
    assert grew("localrun_request_duration_seconds_count", 3, endpoint=chat)
    assert value(after, "localrun_models_loaded") == 1
    assert value(after, "localrun_slots", model=MODEL) == 2
    assert value(after, "localrun_slots_busy", model=MODEL) == 0
    assert value(after, "localrun_requests_queued", model=MODEL) == 0
    assert sum(v for (name, _), v in after.items() if name == "localrun_model_memory_bytes") > 0


def test_metrics_need_the_key(keyed: Server) -> None:
    assert httpx.get(keyed.url + "/metrics").status_code == 401
    assert httpx.get(keyed.url + "/health").status_code == 200
    samples = scrape(keyed, key=keyed.key)
    assert value(samples, "localrun_models_loaded") == 1


def _idle_table() -> ModelTable:
    """A table whose one model would load on demand (none is asked for here)."""

    def plan() -> Any:
        raise AssertionError("nothing loads in this test")

    return ModelTable([], None, servable=[Servable("lazy", frozenset(), plan)])


def test_no_metrics_turns_the_route_off() -> None:
    with TestClient(create_app(_idle_table(), AppSettings(metrics=False))) as client:
        assert client.get("/metrics").status_code == 404
    with TestClient(create_app(_idle_table())) as client:
        response = client.get("/metrics")
        assert response.status_code == 200 and "localrun_models_loaded 0.0" in response.text


def test_requests_are_counted_by_route_not_by_path() -> None:
    """A path with a parameter is its route's one endpoint; a path no route has is `other` (bounded labels)."""
    from localrun.serve.metrics import Metrics

    counted = Metrics(_idle_table())
    counted.learn_routes(create_app(_idle_table()))
    assert counted.endpoint("/v1/models/tiny") == counted.endpoint("/v1/models/other") == "/v1/models/{name}"
    assert counted.endpoint("/v1/responses/resp_1") == "/v1/responses/{response_id}"
    assert counted.endpoint("/api/chat") == "/api/chat"
    assert counted.endpoint("/wp-admin/x.php") == "other"


def test_the_guards_own_answers_are_counted() -> None:
    """A wrong API key (401) and a body over the limit (413) are answered
    before any route: they are counted all the same, by the route asked for."""
    settings = AppSettings(api_key="metrics-key-9", max_body=1000)
    with TestClient(create_app(_idle_table(), settings)) as client:
        key = {"Authorization": "Bearer metrics-key-9"}
        assert (
            client.post("/v1/chat/completions", json={}, headers={"Authorization": "Bearer wrong"}).status_code == 401
        )
        assert client.get("/api/tags").status_code == 401
        big = {"model": "lazy", "messages": [{"role": "user", "content": "x" * 2000}]}
        assert client.post("/v1/chat/completions", json=big, headers=key).status_code == 413
        response = client.get("/metrics", headers=key)
    assert response.status_code == 200
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }
    assert value(samples, "localrun_requests_total", endpoint="/v1/chat/completions", status="401") == 1
    assert value(samples, "localrun_requests_total", endpoint="/api/tags", status="401") == 1
    assert value(samples, "localrun_requests_total", endpoint="/v1/chat/completions", status="413") == 1
