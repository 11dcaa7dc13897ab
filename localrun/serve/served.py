"""The models a server was started with: each loaded once as its plan
says (`localrun.assemble`: slots of a context, placed where the models
loaded before it left room), with its engine thread; and the one way a
request's ``model`` finds one of them (never a file, never a download)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from localrun.assemble import Assembled, replan
from localrun.errors import InvalidRequestError, LocalrunError, ModelNotFoundError
from localrun.gguf.info import ModelInfo, describe
from localrun.gguf.reader import GGUFInfo
from localrun.runtime.embed import Embedder, embedder_beside, makes_embeddings
from localrun.runtime.engine import Engine, EngineConfig
from localrun.runtime.prompt import chat_template
from localrun.runtime.promptcache import default_cache
from localrun.serve.events import ServerStatus
from localrun.serve.worker import Worker
from localrun.speculative import Speculation, lookup_drafters
from localrun.store.registry import Registry

DEFAULT_QUEUE = 16  # requests that may wait for a slot, per model, beyond the busy slots


@dataclass(frozen=True)
class ModelPlan:
    """How to serve one model: what the CLI resolved, before anything loads;
    ``run`` is its plan (slots, placement) on the devices as measured before
    any model loaded, made again for a model loaded after another."""

    id: str  # what /v1/models lists and requests name
    names: frozenset[str]  # other names it answers to (its registry alias)
    run: Assembled
    max_queue: int = DEFAULT_QUEUE
    template: str | None = None  # a built-in chat template for a model without one
    system: str | None = None  # put first in a conversation that has no system message
    speculate: bool = False  # prompt lookup for a request decoding alone (see ContinuousBatch)
    prompt_cache: bool = True  # long system prompts kept on disk (see ContinuousBatch)

    @property
    def config(self) -> EngineConfig:
        return self.run.config

    @property
    def info(self) -> GGUFInfo:
        return self.run.info


@dataclass
class ServedModel:
    id: str
    names: frozenset[str]
    engine: Engine
    worker: Worker
    shape: ModelInfo
    template: str | None  # None: the model has no chat template (chat requests are refused)
    system: str | None
    created: int = field(default_factory=lambda: int(time.time()))
    embedder: Embedder | None = None  # an embedding model's second context, for /v1/embeddings and /v1/rerank

    @property
    def capacity(self) -> int:
        return self.worker.capacity

    @property
    def held(self) -> dict[str, int]:
        """What it holds on each device, by name, as llama.cpp logged its
        buffers: weights, every slot's KV cache, the compute and output buffers."""
        return {b.device: b.total for b in self.engine.buffers}

    def describe(self) -> dict[str, Any]:
        """Its /v1/models entry (with llama-server's `meta`)."""
        return {
            "id": self.id,
            "object": "model",
            "created": self.created,
            "owned_by": "localrun",
            "meta": {
                "n_ctx": self.capacity,
                "n_ctx_train": self.engine.n_ctx_train,
                "n_params": self.shape.parameters,
                "size": self.shape.weights_bytes,
                "parallel": self.worker.parallel,
                "quantization": self.shape.quantization,
            },
        }

    def close(self) -> None:
        self.worker.stop()
        if self.embedder is not None:
            self.embedder.close()
        self.engine.close()


def load_model(plan: ModelPlan, run: Assembled) -> ServedModel:
    """Load the model as ``run`` (its plan) says, and start its engine thread."""
    engine = Engine(run.config, run.info)
    try:
        template = chat_template(engine, plan.template) if plan.template or plan.info.chat_template else None
        capacity = engine.n_ctx // engine.n_seq_max
        speculation = Speculation(lookup_drafters(engine), verify_curve=run.verify_curve) if plan.speculate else None
        worker = Worker(
            engine,
            run.parallel,
            capacity,
            max_queue=plan.max_queue,
            name=plan.id,
            speculation=speculation,
            prompt_cache=default_cache() if plan.prompt_cache else None,
        )
        embedder = embedder_beside(engine) if makes_embeddings(plan.info) else None
    except LocalrunError:
        engine.close()
        raise
    worker.start()
    served = ServedModel(plan.id, plan.names, engine, worker, describe(plan.info), template, plan.system)
    served.embedder = embedder
    return served


def load_models(plans: Sequence[ModelPlan]) -> list[ServedModel]:
    """Every model in turn: the first as planned, each other planned again
    on the devices as measured before any model loaded (the first plan's)
    less what the models loaded before it measurably hold on each device;
    none stays loaded when one fails."""
    loaded: list[ServedModel] = []
    held: dict[str, int] = {}
    found = plans[0].run.placement.devices if plans else ()
    try:
        for plan in plans:
            model = load_model(plan, replan(plan.run, found, held) if loaded else plan.run)
            loaded.append(model)
            for device, size in model.held.items():
                held[device] = held.get(device, 0) + size
    except BaseException:
        for model in loaded:
            model.close()
        raise
    return loaded


def looks_like_path(name: str) -> bool:
    """Whether a request's ``model`` names a file rather than a model: it is refused."""
    return (
        name.endswith(".gguf")
        or name.startswith(("/", "~", ".", "hf://", "file:"))
        or "\\" in name
        or name.count("/") > 1
    )


class ModelTable:
    """The served models, found by id, by a name they answer to, or by a
    registry alias of one of them."""

    def __init__(self, models: Sequence[ServedModel], registry: Registry | None = None) -> None:
        if not models:
            raise ValueError("a server needs a model")
        self.models = list(models)
        self.registry = registry

    def find(self, name: str | None) -> ServedModel:
        if not name:
            return self.models[0]
        for model in self.models:
            if name == model.id or name in model.names:
                return model
        if looks_like_path(name):
            raise InvalidRequestError(
                f"model {name!r} is a file path; a request names one of the models this server was started with",
                "model",
            )
        if self.registry is not None and "/" not in name:
            try:
                alias = self.registry.resolve(name).alias
            except ModelNotFoundError:
                alias = None
            for model in self.models:
                if alias is not None and (alias == model.id or alias in model.names):
                    return model
        served = ", ".join(m.id for m in self.models)
        raise ModelNotFoundError(f"model {name!r} is not served here", hint=f"served: {served}")

    def status(self) -> ServerStatus:
        """All models' slots and requests together."""
        each = [m.worker.status() for m in self.models]
        return ServerStatus(
            slots=sum(s.parallel for s in each),
            busy=sum(s.busy for s in each),
            queued=sum(s.queued for s in each),
            done=sum(s.done for s in each),
            cancelled=sum(s.cancelled for s in each),
            tokens_per_s=sum(s.tokens_per_s for s in each),
        )

    def notices(self) -> list[str]:
        """What each model's scheduler had to say since the last call."""
        return [f"{m.id}: {text}" for m in self.models for text in m.worker.notices()]

    def stop(self) -> None:
        """End every request still running or waiting (each gets an error saying why); no more are taken."""
        for model in self.models:
            model.worker.stop()

    def close(self) -> None:
        for model in self.models:
            model.close()
