"""A served model: loaded as its plan says (`localrun.assemble`: slots of
a context, placed where the models loaded before it left room), with its
engine thread, in this process (`load_model`) or in a runner process of its
own (`localrun.serve.runner`). Which are loaded, and when, is
`localrun.serve.router`'s.

Either way the server's side has the model's vocabulary to render and
tokenize requests with (the engine's here; a runner's asked of it), what
its load measured (`Loaded`) and a `Backend` that takes its requests."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from localrun.assemble import Assembled, replan
from localrun.errors import EngineError, LocalrunError
from localrun.gguf.info import ModelInfo, describe
from localrun.gguf.reader import GGUFInfo
from localrun.runtime.batch.scheduler import BatchRequest
from localrun.runtime.embed import Embedder, embedder_beside, makes_embeddings
from localrun.runtime.engine import Engine, EngineConfig, Tokens
from localrun.runtime.llama import Native
from localrun.runtime.prompt import chat_template
from localrun.runtime.promptcache import default_cache
from localrun.serve.worker import Deliver, Worker, WorkerStatus
from localrun.speculative import Speculation, lookup_drafters, speculation_refused

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
    pooling: str = "auto"  # embeddings: the model's own (none for a generative model), or this pooling for any

    @property
    def config(self) -> EngineConfig:
        return self.run.config

    @property
    def info(self) -> GGUFInfo:
        return self.run.info


class Backend(Protocol):
    """What takes a served model's requests: its engine thread here
    (`Worker`), or the runner process that holds it (`Runner`)."""

    parallel: int
    capacity: int
    max_queue: int
    ended: str | None  # why it can serve no more (its runner died); None while it can

    @property
    def pid(self) -> int: ...  # the process that holds the model

    def next_index(self) -> int: ...
    async def call(self, handler: Handler, model: ServedModel, body: dict[str, Any]) -> dict[str, Any]: ...
    def call_blocking(self, handler: Handler, model: ServedModel, body: dict[str, Any]) -> dict[str, Any]: ...
    def submit(self, request: BatchRequest, deliver: Deliver) -> None: ...
    def cancel(self, index: int) -> None: ...
    def status(self) -> WorkerStatus: ...
    def notices(self) -> list[str]: ...
    def stop(self, timeout: float | None = None) -> None: ...


@dataclass(frozen=True)
class Loaded:
    """What a model's load measured and settled, wherever it loaded (a
    runner sends it as is)."""

    held: dict[str, int]  # what it holds on each device, by name, as llama.cpp logged its buffers
    notices: tuple[str, ...]  # the engine's (a retry with fewer layers)
    flash_attn: str
    n_ctx_train: int
    recurrent: bool  # a memory whose cuts can be refused: served conversations are checkpointed
    embeds: bool  # it has an embedding context (/v1/embeddings, /v1/rerank)
    template: str | None  # None: the model has no chat template (chat requests are refused)
    parallel: int  # its slots
    capacity: int  # each slot's context
    n_vocab: int  # its vocabulary, as far as the server need know it without holding it
    add_bos: bool
    bos_token: str
    eos_token: str


Handler = Callable[["ServedModel", dict[str, Any]], dict[str, Any]]


@dataclass
class ServedModel:
    id: str
    names: frozenset[str]
    engine: Tokens  # its vocabulary: the loaded engine here, its runner's asked beside a runner
    worker: Backend
    shape: ModelInfo
    loaded: Loaded
    system: str | None
    plan: ModelPlan | None = None  # how to load it again (a runner that ended)
    created: int = field(default_factory=lambda: int(time.time()))
    embedder: Embedder | None = None  # a second context for /v1/embeddings and /v1/rerank, run on the worker's thread
    chat: bool = True  # whether chat requests are what it is for (not an embedding model)

    @property
    def template(self) -> str | None:
        return self.loaded.template

    @property
    def notices(self) -> list[str]:
        """What the server says of it once loaded: the engine's notices, and
        that a chat model without a chat template refuses every chat request."""
        said = list(self.loaded.notices)
        if self.template is None and self.chat:
            said.append(
                "no chat template: chat requests are refused (400); "
                "start the server with --template NAME|FILE, or use /v1/completions"
            )
        return said

    @property
    def capacity(self) -> int:
        return self.worker.capacity

    @property
    def held(self) -> dict[str, int]:
        """What it holds on each device, by name, as llama.cpp logged its
        buffers: weights, every slot's KV cache, the compute and output
        buffers, and its embedding context's."""
        return self.loaded.held

    @property
    def ended(self) -> str | None:
        """Why it can serve no more (its runner died), or None while it can."""
        return self.worker.ended

    def local_worker(self) -> Worker:
        """The engine thread in this process (a handler run where the model is loaded)."""
        if not isinstance(self.worker, Worker):
            raise EngineError(f"{self.id} is loaded in a runner process, not here")
        return self.worker

    async def call(self, handler: Handler, body: dict[str, Any]) -> dict[str, Any]:
        """``handler(model, body)`` where the model is loaded (`Backend.call`)."""
        return await self.worker.call(handler, self, body)

    def call_blocking(self, handler: Handler, body: dict[str, Any]) -> dict[str, Any]:
        """`call`, on this thread: for work that must not run in the server's
        process (what would page a library into it for good)."""
        return self.worker.call_blocking(handler, self, body)

    def describe(self) -> dict[str, Any]:
        """Its /v1/models entry (with llama-server's `meta`)."""
        return {
            "id": self.id,
            "object": "model",
            "created": self.created,
            "owned_by": "localrun",
            "meta": {
                "n_ctx": self.capacity,
                "n_ctx_train": self.loaded.n_ctx_train,
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
        if isinstance(self.engine, Native):
            self.engine.close()


def load_model(plan: ModelPlan, run: Assembled) -> ServedModel:
    """Load the model as ``run`` (its plan) says, and start its engine thread."""
    engine = Engine(run.config, run.info)
    embedder: Embedder | None = None
    try:
        template = chat_template(engine, plan.template) if plan.template or plan.info.chat_template else None
        capacity = engine.n_ctx // engine.n_seq_max
        speculate = plan.speculate and speculation_refused(engine) is None  # a recurrent memory that cannot roll back
        curve, growth = run.verify_curve, run.step_growth  # tune's, for the controller
        speculation = Speculation(lookup_drafters(engine), verify_curve=curve, growth=growth) if speculate else None
        embeds = plan.pooling != "auto" or makes_embeddings(plan.info)
        embedder = embedder_beside(engine, plan.pooling) if embeds else None
        worker = Worker(
            engine,
            run.parallel,
            capacity,
            max_queue=plan.max_queue,
            name=plan.id,
            speculation=speculation,
            prompt_cache=default_cache() if plan.prompt_cache else None,
            embedder=embedder,
        )
    except LocalrunError:
        if embedder is not None:
            embedder.close()
        engine.close()
        raise
    worker.start()
    held: dict[str, int] = {}
    for b in (*engine.buffers, *(embedder.buffers if embedder is not None else ())):
        held[b.device] = held.get(b.device, 0) + b.total
    loaded = Loaded(
        held=held,
        notices=tuple(engine.notices),
        flash_attn=engine.flash_attn,
        n_ctx_train=int(engine.n_ctx_train),
        recurrent=engine.cuts.recurrent,
        embeds=embedder is not None,
        template=template,
        parallel=worker.parallel,
        capacity=capacity,
        n_vocab=engine.n_vocab,
        add_bos=engine.add_bos,
        bos_token=engine.bos_token,
        eos_token=engine.eos_token,
    )
    return ServedModel(
        plan.id,
        plan.names,
        engine,
        worker,
        describe(plan.info),
        loaded,
        plan.system,
        plan=plan,
        embedder=embedder,
        chat=not makes_embeddings(plan.info),
    )


def held_by(models: Sequence[ServedModel]) -> dict[str, int]:
    """What ``models`` measurably hold together on each device, by name."""
    held: dict[str, int] = {}
    for model in models:
        for device, size in model.held.items():
            held[device] = held.get(device, 0) + size
    return held


def placed(plan: ModelPlan, held: dict[str, int]) -> Assembled:
    """``plan``'s run beside models that hold ``held``: as planned when
    nothing is held, else planned again on the devices as measured before any
    model loaded (the plan's own) less what is held; a UsageError when it does not fit."""
    return replan(plan.run, plan.run.placement.devices, held) if held else plan.run


Loader = Callable[[ModelPlan, Assembled], ServedModel]  # `load_model`, or `localrun.serve.runner.start_runner`


def load_models(plans: Sequence[ModelPlan], loader: Loader = load_model) -> list[ServedModel]:
    """Every model in turn, each `placed` beside the ones loaded before it;
    none stays loaded when one fails."""
    loaded: list[ServedModel] = []
    try:
        for plan in plans:
            loaded.append(loader(plan, placed(plan, held_by(loaded))))
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
