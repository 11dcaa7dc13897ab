"""Models on demand in process: one load for two first requests, a request
during an unload, eviction that spares the busy model, a file gone, and
`keep_alive` as ollama takes it."""

from __future__ import annotations

import asyncio
import functools
import math
import shutil
import sys
from pathlib import Path

import pytest

from localrun.errors import InvalidRequestError, LocalrunError, ServerBusyError
from localrun.gguf.info import describe
from localrun.gguf.reader import read_gguf
from localrun.runtime.engine import Engine
from localrun.serve.errors import api_error
from localrun.serve.own_thread import in_own_thread
from localrun.serve.router import ModelTable, Servable, parse_duration, split_keep_alive
from localrun.serve.served import ModelPlan, ServedModel
from tests.serve.test_served import held_alone, plan


class Counted:
    """A servable model's planner that counts how often it is asked to plan (once a load)."""

    def __init__(self, path: Path, ident: str) -> None:
        self.path, self.ident, self.calls = path, ident, 0

    def __call__(self) -> ModelPlan:
        self.calls += 1
        return plan(self.path, self.ident)


def table(
    tiny_model: Path, *idents: str, models_max: int = 0, queue_timeout_s: float = 0.0
) -> tuple[ModelTable, dict[str, Counted]]:
    planners = {i: Counted(tiny_model, i) for i in idents}
    servable = [Servable(i, frozenset({f"{i}.gguf"}), planners[i]) for i in idents]
    models = ModelTable(
        [], servable=servable, models_max=models_max, idle_unload_s=None, queue_timeout_s=queue_timeout_s
    )
    return models, planners


def closed(model: ServedModel) -> bool:
    """Its llama.cpp context and weights freed."""
    engine = model.engine
    assert isinstance(engine, Engine)  # loaded in process
    return engine._ctx is None and engine._model is None


def test_two_first_requests_load_once(tiny_model: Path) -> None:
    models, planners = table(tiny_model, "a")

    async def both() -> list[ServedModel]:
        return list(await asyncio.gather(models.ready("a"), models.ready("a.gguf")))

    try:
        first, second = asyncio.run(both())
        assert first is second and planners["a"].calls == 1
        assert [m.id for m in models.models] == ["a"]
    finally:
        models.close()


def test_a_request_during_an_unload_loads_it_again(tiny_model: Path) -> None:
    models, planners = table(tiny_model, "a")

    async def run() -> tuple[ServedModel, bool, ServedModel]:
        before = await models.ready("a")
        unloading = asyncio.ensure_future(models.unload("a"))
        await asyncio.sleep(0)  # the unload has begun: the model is no longer there
        assert models.describe_one("a")["status"]["value"] == "unloading"
        after = await models.ready("a")
        return before, await unloading, after

    try:
        before, unloaded, after = asyncio.run(run())
        assert unloaded and closed(before)  # the engine was freed, not just forgotten
        assert after is not before and not closed(after) and planners["a"].calls == 2
    finally:
        models.close()


def test_a_load_and_an_unload_leave_no_thread_behind(tiny_model: Path) -> None:
    """Each runs on a thread of its own that ends with it, and the native
    threads it started (the warm-up's OpenMP team) go with it: once the model
    is unloaded, the running server has the threads it had before the load."""
    models, _ = table(tiny_model, "a")

    def native_threads() -> set[str]:
        return {p.name for p in Path("/proc/self/task").iterdir()} if sys.platform.startswith("linux") else set()

    async def run() -> tuple[set[str], set[str], bool]:
        before = native_threads()
        await models.ready("a")  # loaded with a warm-up decode
        during = native_threads() - before
        unloaded = await models.unload("a")
        await asyncio.sleep(0.5)  # what ended with the unload has exited
        return during, native_threads() - before, unloaded

    try:
        during, left, unloaded = asyncio.run(run())
        assert unloaded and (during or not sys.platform.startswith("linux"))  # the model's worker ran meanwhile
        assert left == set()
    finally:
        models.close()


def test_work_in_its_own_thread_gives_its_result_or_its_error() -> None:
    def boom() -> None:
        raise ValueError("the model's file is gone")

    async def run() -> tuple[int, str]:
        result = await in_own_thread(lambda a, b: a + b, 2, 3)
        with pytest.raises(ValueError, match="file is gone") as raised:
            await in_own_thread(boom)
        return result, str(raised.value)

    assert asyncio.run(run()) == (5, "the model's file is gone")


def test_eviction_spares_the_busy_model(tiny_model: Path) -> None:
    models, _ = table(tiny_model, "a", "b", "c", models_max=2)

    async def run() -> None:
        idle = await models.ready("b")  # answered, and idle since
        with models.holding():  # a request on "a" still streaming
            busy = await models.ready("a")
            with models.holding():
                await models.ready("c")  # past --models-max: "b", idle, goes; "a" stays
            assert closed(idle) and not closed(busy)
            assert sorted(m.id for m in models.models) == ["a", "c"]
        with models.holding():
            await models.ready("a")
            await models.ready("b")  # "a" is held again: "c", idle, goes
        assert sorted(m.id for m in models.models) == ["a", "b"]

    try:
        asyncio.run(run())
    finally:
        models.close()


def test_a_model_that_cannot_be_evicted_in_time_is_a_503(tiny_model: Path) -> None:
    models, _ = table(tiny_model, "a", "b", models_max=1)  # --queue-timeout 0

    async def run() -> None:
        with models.holding():
            await models.ready("a")
            with pytest.raises(ServerBusyError, match="none went idle within 0 s: a"):
                await models.ready("b")
        await models.ready("b")  # the request on "a" has ended: "a" goes
        assert [m.id for m in models.models] == ["b"]

    try:
        asyncio.run(run())
    finally:
        models.close()


async def streaming_on(models: ModelTable, name: str, ended: asyncio.Event) -> asyncio.Task[None]:
    """A request on the model ``name`` (loaded once this returns), held until ``ended`` is set."""
    ready = asyncio.Event()

    async def request() -> None:
        with models.holding():
            await models.ready(name)
            ready.set()
            await ended.wait()

    task = asyncio.create_task(request())
    await ready.wait()
    return task


def test_a_request_waits_for_the_busy_model_to_make_room(tiny_model: Path) -> None:
    models, _ = table(tiny_model, "a", "b", models_max=1, queue_timeout_s=600)

    async def run() -> None:
        ended = asyncio.Event()
        on_a = await streaming_on(models, "a", ended)
        for_b = asyncio.create_task(models.ready("b"))
        for _ in range(20):  # a few turns of the loop, with the poll's wake-ups among them
            await asyncio.sleep(0.05)
        assert not for_b.done() and models.waiting == 1 and models.status().queued == 1  # waiting, not refused
        ended.set()
        await on_a
        served = await for_b
        assert served.id == "b" and [m.id for m in models.models] == ["b"] and models.waiting == 0

    try:
        asyncio.run(run())
    finally:
        models.close()


def test_requests_for_a_busy_model_queue_behind_a_load_waiting_for_room(tiny_model: Path) -> None:
    """Requests for a, overlapping so that a is never idle, and one for b
    under --models-max 1: b's load does not wait for ever; the requests for
    a that came after it wait for it, and load a again after it."""
    models, _ = table(tiny_model, "a", "b", models_max=1, queue_timeout_s=600)
    served: list[str] = []

    async def request(name: str, done: asyncio.Event) -> None:
        with models.holding():  # as the server holds every request
            served.append((await models.ready(name)).id)
            await done.wait()

    async def run() -> None:
        first, b_done, later_done = asyncio.Event(), asyncio.Event(), asyncio.Event()
        on_a = await streaming_on(models, "a", first)
        for_b = asyncio.create_task(request("b", b_done))
        await asyncio.sleep(0.3)  # b's load waits for room
        later = [asyncio.create_task(request("a", later_done)) for _ in range(3)]  # each would keep a busy
        await asyncio.sleep(0.3)
        assert served == []  # the later ones wait behind b, not before it
        first.set()  # the one request a had ends: a goes idle, and b loads
        await on_a
        while not served:
            await asyncio.sleep(0.05)
        assert served == ["b"]
        b_done.set()  # b's request ends: a loads again for the later ones
        await for_b
        while len(served) < 4:
            await asyncio.sleep(0.05)
        later_done.set()
        await asyncio.gather(*later)

    try:
        asyncio.run(asyncio.wait_for(run(), 120))
        assert served == ["b", "a", "a", "a"]
    finally:
        models.close()


def test_past_the_queue_a_request_for_a_model_is_a_503(tiny_model: Path) -> None:
    models, _ = table(tiny_model, "a", "b", models_max=1, queue_timeout_s=600)
    models.max_waiting = 1

    async def run() -> None:
        ended = asyncio.Event()
        on_a = await streaming_on(models, "a", ended)
        first = asyncio.create_task(models.ready("b"))
        await asyncio.sleep(0.05)
        with pytest.raises(ServerBusyError, match=r"1 requests are waiting for a model to load \(--queue 1\)"):
            await models.ready("b")
        ended.set()
        await on_a
        assert (await first).id == "b"

    try:
        asyncio.run(run())
    finally:
        models.close()


def test_a_model_that_does_not_fit_is_a_503_naming_what_holds_the_memory(tiny_model: Path) -> None:
    shape = describe(read_gguf(tiny_model))
    budget = shape.memory_needed(4 * 512, "f16", "f16") + 1000  # the first with four slots, not one of another
    assert budget - held_alone(tiny_model) < shape.memory_needed(512, "f16", "f16")
    servable = [Servable(i, frozenset(), functools.partial(plan, tiny_model, i, budget)) for i in ("a", "b")]
    models = ModelTable([], servable=servable, idle_unload_s=None, queue_timeout_s=0)

    async def run() -> None:
        with models.holding():
            await models.ready("a")
            with pytest.raises(ServerBusyError, match="'b' does not fit") as refused:
                await models.ready("b")
            answer = api_error(refused.value)  # what the client reads names what holds the memory
            assert answer.status == 503 and "; held by a (CPU " in answer.message and " MiB)" in answer.message
        await models.ready("b")  # "a" is idle now: it makes room
        assert [m.id for m in models.models] == ["b"]

    try:
        asyncio.run(run())
    finally:
        models.close()


def test_a_model_file_deleted_is_an_error_and_the_rest_serve(tiny_model: Path, tmp_path: Path) -> None:
    copy = tmp_path / "gone.gguf"
    shutil.copyfile(tiny_model, copy)
    gone = Servable("gone", frozenset(), lambda: plan(copy, "gone"))
    here = Servable("here", frozenset(), lambda: plan(tiny_model, "here"))
    models = ModelTable([], servable=[gone, here], idle_unload_s=None)
    copy.unlink()

    async def run() -> None:
        with pytest.raises(LocalrunError, match="gone"):
            await models.ready("gone")
        assert models.describe_one("gone")["status"]["value"] == "unloaded"
        assert (await models.ready("here")).id == "here"

    try:
        asyncio.run(run())
    finally:
        models.close()


def test_keep_alive_zero_unloads_after_the_request(tiny_model: Path) -> None:
    models, _ = table(tiny_model, "a")

    async def run() -> ServedModel:
        with models.holding():
            model = await models.ready("a", keep_alive=0.0)
            assert await models.sweep() == []  # held by its request
        while models.models:  # the request's end starts the sweep
            await asyncio.sleep(0.01)
        return model

    try:
        assert closed(asyncio.run(run()))
        assert models.describe_one("a")["status"]["value"] == "unloaded"
    finally:
        models.close()


def test_pinned_models_stay(tiny_model: Path) -> None:
    from localrun.serve.served import load_models

    (pinned,) = load_models([plan(tiny_model, "pinned")])
    models = ModelTable([pinned], idle_unload_s=0.0)

    async def run() -> None:
        await models.ready("pinned", keep_alive=0.0)
        assert await models.sweep() == []
        with pytest.raises(LocalrunError, match="stays loaded"):
            await models.unload("pinned")

    try:
        asyncio.run(run())
        assert models.find("pinned") is pinned and not closed(pinned)
    finally:
        models.close()


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("5m", 300.0),
        ("30s", 30.0),
        ("1h30m", 5400.0),
        (12, 12.0),
        ("2.5", 2.5),
        (0, 0.0),
        (-1, math.inf),
        ("-5m", math.inf),
    ],
)
def test_keep_alive_durations(value: object, seconds: float) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5 minutes", "", True, None, [1], "m5"])
def test_keep_alive_that_does_not_parse_is_refused_by_name(value: object) -> None:
    with pytest.raises(InvalidRequestError, match="keep_alive") as caught:
        parse_duration(value)
    assert caught.value.param == "keep_alive"


def test_keep_alive_is_taken_out_of_the_body() -> None:
    body, seconds = split_keep_alive(b'{"model": "a", "keep_alive": "30s", "messages": []}')
    assert seconds == 30.0 and b"keep_alive" not in body and b'"model": "a"' in body
    untouched = b'{"model": "a"}'
    assert split_keep_alive(untouched) == (untouched, None)
