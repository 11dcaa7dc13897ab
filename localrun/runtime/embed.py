"""Embeddings and reranking on llama.cpp's low-level API.

An `Embedder` is a llama.cpp context with embeddings on: the model's own
pooling (mean, CLS, last token, read from the GGUF's ``<arch>.pooling_type``
unless one is asked for), many inputs packed into one decode as separate
sequences, each pooled vector L2-normalized. A model whose pooling is the
rank head (rerankers) scores query/document pairs instead.

The context comes either with an engine of its own (`open_embedder`, for
`localrun embed`: the engine's config is the run's plan, as
`localrun.assemble` made it, with embeddings switched on) or beside an engine already
loaded (`embedder_beside`, for a served model: a second context on the same
weights, so generation and embeddings share one load). A served model's
embedder decodes on the model's engine thread (`localrun.serve.worker`):
`embed_tokens` and `rerank` take the ``run`` that gets them there.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import llama_cpp
import numpy as np

from localrun.errors import ContextOverflowError, EngineError, InvalidRequestError, UsageError
from localrun.gguf.reader import GGUFInfo
from localrun.runtime import llama_log
from localrun.runtime.engine import Engine, EngineConfig, _context_params
from localrun.runtime.llama import Batch, DecodeStatus, llama_decode, native_call

POOLING = {
    "none": llama_cpp.LLAMA_POOLING_TYPE_NONE,
    "mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
    "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
    "last": llama_cpp.LLAMA_POOLING_TYPE_LAST,
    "rank": llama_cpp.LLAMA_POOLING_TYPE_RANK,
}
POOLING_NAMES = {value: name for name, value in POOLING.items()}
DEFAULT_CTX = 4096  # the longest input, in tokens, unless a context is asked for
PACK_TOKENS = 512  # tokens packed into one decode (a longer input alone): attention spans what a decode holds
SEQUENCES = 128  # inputs packed into one decode at most

# Families trained with Matryoshka representation learning: a prefix of their
# vector, renormalized, is itself an embedding (OpenAI's `dimensions`). Matched
# against the GGUF's general.name / general.basename, lowercased.
MATRYOSHKA = (
    "nomic-embed-text-v1.5",
    "nomic-embed-text-v2",
    "qwen3-embedding",
    "embeddinggemma",
    "mxbai-embed-large",
    "snowflake-arctic-embed",
    "jina-embeddings-v3",
)

Progress = Callable[[int, int], None]
Run = Callable[[Sequence[list[int]]], list[np.ndarray]]  # inputs' raw pooled outputs, in order


def declared_pooling(info: GGUFInfo) -> int | None:
    """The pooling the model file declares (``<arch>.pooling_type``), or None."""
    value = info.arch_value("pooling_type")
    return int(value) if isinstance(value, int) and value in POOLING_NAMES else None


def makes_embeddings(info: GGUFInfo) -> bool:
    """Whether the model is one made for embeddings or ranking: its file declares a pooling."""
    pooling = declared_pooling(info)
    return pooling is not None and pooling != llama_cpp.LLAMA_POOLING_TYPE_NONE


def matryoshka(info: GGUFInfo) -> bool:
    """Whether a prefix of the model's vector is an embedding too (see `MATRYOSHKA`)."""
    names = " ".join(str(info.metadata.get(k, "")) for k in ("general.name", "general.basename")).lower()
    return any(family in names for family in MATRYOSHKA)


def check_pooling(asked: str | None) -> None:
    """``asked`` is auto, None or a pooling that makes a vector."""
    if asked is not None and asked != "auto" and (asked not in POOLING or asked == "none"):
        raise UsageError(f"unknown pooling {asked!r}", hint="use auto, mean, cls, last or rank")


def settle_pooling(info: GGUFInfo, asked: str | None) -> int:
    """The pooling to run: ``asked`` (a name of `POOLING`), else the model's own;
    a model that declares none (a generative model) needs one asked for."""
    check_pooling(asked)
    if asked is not None and asked != "auto":
        return POOLING[asked]
    if not makes_embeddings(info):
        raise UsageError(
            f"{info.path.name} is not an embedding model: its file declares no pooling",
            hint="use an embedding model (e.g. nomic-embed-text), or --pooling mean to pool a generative model",
        )
    pooling = declared_pooling(info)
    assert pooling is not None
    return pooling


def embedding_config(config: EngineConfig, pooling: int, n_ctx: int, n_seq: int = SEQUENCES) -> EngineConfig:
    """``config`` (a run's plan) as an embedding context: each input whole in
    one micro-batch (an encoder attends both ways), the sequences sharing the
    cells. The context is a multiple of the sequences (llama.cpp's pooled
    graph is sized for as many tokens in each)."""
    n_seq = max(1, min(n_seq, n_ctx))
    n_ctx = -(-n_ctx // n_seq) * n_seq
    return replace(
        config,
        embeddings=True,
        pooling=pooling,
        n_ctx=n_ctx,
        n_batch=n_ctx,
        n_ubatch=n_ctx,
        n_seq_max=n_seq,
        kv_unified=True,
        sample_on="host",
    )


def normalized(vector: np.ndarray) -> np.ndarray:
    """``vector`` at unit length (a zero vector stays zero)."""
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector


def truncated(vector: np.ndarray, dimensions: int) -> np.ndarray:
    """A Matryoshka embedding's first ``dimensions``, at unit length again."""
    return normalized(vector[:dimensions])


@dataclass(frozen=True)
class Embedded:
    vectors: list[np.ndarray]  # one unit-length float32 vector per input, in order
    tokens: int  # the inputs' tokens, together


class Embedder:
    """A context with embeddings on, and the engine whose model and vocabulary it uses.

    One batch at a time (a lock): a server's requests take turns."""

    def __init__(self, engine: Engine, ctx: Any, n_ctx: int, n_seq: int, *, owns_engine: bool) -> None:
        self.engine = engine
        self.ctx = ctx
        self._owns_engine = owns_engine
        self._owns_ctx = not owns_engine
        self.n_ctx = n_ctx
        self.n_seq = n_seq
        self.pooling = int(llama_cpp.llama_pooling_type(ctx))
        if self.pooling == llama_cpp.LLAMA_POOLING_TYPE_RANK:
            self.width = int(llama_cpp.llama_model_n_cls_out(engine.model)) or 1
        else:
            self.width = int(llama_cpp.llama_model_n_embd_out(engine.model)) or int(
                llama_cpp.llama_model_n_embd(engine.model)
            )
        self.matryoshka = matryoshka(engine.info)
        self.memory = llama_cpp.llama_get_memory(ctx)
        self.lock = threading.Lock()
        self._batch = Batch(n_ctx)
        # what its own context holds on each device (the weights are the engine's), as llama.cpp logged it
        self.buffers: tuple[llama_log.DeviceBuffers, ...] = ()

    @property
    def ranks(self) -> bool:
        return self.pooling == llama_cpp.LLAMA_POOLING_TYPE_RANK

    @property
    def pooling_name(self) -> str:
        return POOLING_NAMES.get(self.pooling, str(self.pooling))

    # -- input --

    def tokenize(
        self, texts: Sequence[str], param: str = "input", line: int | None = None, *, fit: bool = False
    ) -> list[list[int]]:
        """Each text's tokens (with the model's BOS/EOS or CLS/SEP); an empty
        input or one over the context is refused, naming which (``line``: the
        first text's line number, for inputs read as lines); ``fit``: one over
        the context is cut to fit it instead (`fitted`)."""
        tokenize = self.fitted if fit else self.engine.tokenize
        return [self.check(tokenize(text), i, len(texts), param, line) for i, text in enumerate(texts)]

    def fitted(self, text: str) -> list[int]:
        """``text``'s tokens, cut to the context where they are more: the
        text's first tokens, between the marks the model puts around a text
        (BOS/CLS before, EOS/SEP after), as ollama's ``truncate`` cuts."""
        tokens = self.engine.tokenize(text)
        if len(tokens) <= self.n_ctx:
            return tokens
        body = self.engine.tokenize(text, add_special=False)
        added = len(tokens) - len(body)
        start = next((k for k in range(max(added, 0) + 1) if tokens[k : k + len(body)] == body), None)
        if start is None:  # the marks are not simply around the text: its first tokens
            return tokens[: self.n_ctx]
        head, tail = tokens[:start], tokens[start + len(body) :]
        return head + body[: max(self.n_ctx - len(head) - len(tail), 0)] + tail

    def check(
        self, tokens: list[int], index: int, count: int, param: str = "input", line: int | None = None
    ) -> list[int]:
        where = f"{param} {index}" if count > 1 else f"the {param}"
        if line is not None:
            where = f"line {line + index}"
        if not tokens:
            raise InvalidRequestError(f"{where} is empty", param)
        if len(tokens) > self.n_ctx:
            raise ContextOverflowError(
                f"{where} is {len(tokens)} tokens; the context holds {self.n_ctx}",
                hint="shorten it, or give a longer --ctx",
                n_prompt=len(tokens),
                n_ctx=self.n_ctx,
            )
        return tokens

    # -- running --

    def _groups(self, inputs: Sequence[list[int]]) -> list[list[int]]:
        """Input indices packed into decodes: at most `n_seq` inputs and the
        batch's tokens each (a longer input alone)."""
        limit = min(self._batch.capacity, PACK_TOKENS) if len(inputs) > 1 else self._batch.capacity
        groups: list[list[int]] = []
        group: list[int] = []
        tokens = 0
        for i, item in enumerate(inputs):
            if group and (tokens + len(item) > limit or len(group) >= self.n_seq):
                groups.append(group)
                group, tokens = [], 0
            group.append(i)
            tokens += len(item)
        if group:
            groups.append(group)
        return groups

    def _decode(self, inputs: Sequence[list[int]], group: list[int]) -> list[np.ndarray]:
        batch = self._batch
        batch.clear()
        for seq, i in enumerate(group):
            for pos, token in enumerate(inputs[i]):
                batch.add(token, pos, seq, True)
        batch.handle.n_tokens = batch.n
        try:
            with native_call():
                status = llama_decode(self.ctx, batch.handle)
            if status != DecodeStatus.OK:
                reason = llama_log.last_error() or f"status {status}"
                raise EngineError(f"llama_decode could not embed {len(group)} inputs: {reason}")
            vectors = []
            for seq in range(len(group)):
                pointer = llama_cpp.llama_get_embeddings_seq(self.ctx, seq)
                if not pointer:
                    raise EngineError(f"llama.cpp made no pooled embedding (pooling {self.pooling_name})")
                vectors.append(np.ctypeslib.as_array(pointer, shape=(self.width,)).astype(np.float32))
        finally:
            llama_cpp.llama_memory_clear(self.memory, True)
        return vectors

    def run(self, inputs: Sequence[list[int]], progress: Progress | None = None) -> list[np.ndarray]:
        """Each input's pooled output, raw (a vector, or a rank head's scores), in order."""
        out: list[np.ndarray] = [np.empty(0, np.float32)] * len(inputs)
        done = 0
        with self.lock:
            for group in self._groups(inputs):
                for i, vector in zip(group, self._decode(inputs, group), strict=True):
                    out[i] = vector
                done += len(group)
                if progress is not None:
                    progress(done, len(inputs))
        return out

    def embed_tokens(
        self, inputs: Sequence[list[int]], progress: Progress | None = None, run: Run | None = None
    ) -> Embedded:
        """Each input's unit-length embedding, decoded by ``run`` (None: `run` here, now)."""
        if self.ranks:
            raise InvalidRequestError(f"{self.engine.info.path.name} is a reranker: it scores pairs", "model")
        raw = run(inputs) if run is not None else self.run(inputs, progress)
        vectors = [normalized(v) for v in raw]
        return Embedded(vectors, sum(len(t) for t in inputs))

    def embed(self, texts: Sequence[str], progress: Progress | None = None) -> Embedded:
        """Each text's unit-length embedding."""
        if not texts:
            raise InvalidRequestError("no input to embed", "input")
        return self.embed_tokens(self.tokenize(texts), progress)

    # -- reranking --

    def pair(self, query: str, document: str) -> list[int]:
        """A query and a document as the reranker reads them: its file's rerank
        template where it has one, else [BOS] query [EOS] [SEP] document [EOS]."""
        template = self.engine.info.metadata.get("tokenizer.chat_template.rerank")
        if isinstance(template, str) and template:
            return self.engine.tokenize(template.replace("{query}", query).replace("{document}", document))
        vocab = self.engine.vocab
        tokens = self.engine.tokenize(query, add_special=False, parse_special=False)
        doc = self.engine.tokenize(document, add_special=False, parse_special=False)
        marks = (llama_cpp.llama_vocab_bos, llama_cpp.llama_vocab_eos, llama_cpp.llama_vocab_sep)
        bos, eos, sep = (m if m >= 0 else None for m in (int(mark(vocab)) for mark in marks))
        pair = ([bos] if bos is not None else []) + tokens + ([eos] if eos is not None else [])
        pair += ([sep] if sep is not None else []) + doc + ([eos] if eos is not None else [])
        return pair

    def rerank(self, query: str, documents: Sequence[str], run: Run | None = None) -> tuple[list[float], int]:
        """Each document's relevance to ``query`` (the rank head's first score),
        and the tokens read; decoded by ``run`` (None: `run` here, now)."""
        if not self.ranks:
            raise InvalidRequestError(
                f"{self.engine.info.path.name} has no rank head (pooling {self.pooling_name}); use a reranker",
                "model",
            )
        if not query:
            raise InvalidRequestError("the query is empty", "query")
        if not documents:
            raise InvalidRequestError("no documents to rank", "documents")
        empty = next((i for i, d in enumerate(documents) if not d), None)
        if empty is not None:
            raise InvalidRequestError(f"document {empty} is empty", "documents")
        pairs = [self.check(self.pair(query, d), i, len(documents), "documents") for i, d in enumerate(documents)]
        scores = run(pairs) if run is not None else self.run(pairs)
        return [float(s[0]) for s in scores], sum(len(p) for p in pairs)

    # -- lifetime --

    def close(self) -> None:
        self._batch.close()
        ctx, self.ctx = self.ctx, None
        if self._owns_ctx and ctx:
            with native_call():
                llama_cpp.llama_free(ctx)
        if self._owns_engine:
            self.engine.close()

    def __enter__(self) -> Embedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def context_size(asked: int | None, trained: int | None) -> int:
    """The longest input: the context asked for, else `DEFAULT_CTX` within what the model was trained on."""
    if asked:
        return asked
    return min(DEFAULT_CTX, trained or DEFAULT_CTX)


def open_embedder(
    config: EngineConfig,
    info: GGUFInfo,
    pooling: str | None = None,
    ctx: int | None = None,
    n_seq: int = SEQUENCES,
) -> Embedder:
    """An engine of its own on ``config`` (a run's plan) with embeddings on:
    ``pooling`` as asked (None or auto: the model's own), inputs up to ``ctx``
    tokens (None: `context_size`'s default)."""
    chosen = settle_pooling(info, pooling)
    config = embedding_config(config, chosen, context_size(ctx, info.context_length), n_seq)
    engine = Engine(config, info)
    try:
        return Embedder(engine, engine.ctx, config.n_ctx, config.n_seq_max, owns_engine=True)
    except BaseException:
        engine.close()
        raise


def embedder_beside(engine: Engine, pooling: str | None = None, n_seq: int = SEQUENCES) -> Embedder:
    """A second context on ``engine``'s loaded model with embeddings on,
    ``pooling`` as asked (None or auto: the model's own), each input up to
    the engine's slot context."""
    chosen = settle_pooling(engine.info, pooling)
    n_ctx = max(engine.n_ctx // max(engine.n_seq_max, 1), 1)
    config = embedding_config(engine.config, chosen, n_ctx, n_seq)
    cparams = _context_params(config, engine.flash_attn, config.n_ctx)
    with native_call():
        ctx = llama_cpp.llama_init_from_model(engine.model, cparams)
    if not ctx:
        raise EngineError(f"llama.cpp could not create an embedding context: {llama_log.last_error() or 'unknown'}")
    # the buffer lines logged since are this context's (the model's are the load's, counted by the engine)
    buffers = tuple(replace(b, model=0) for b in llama_log.device_buffers())
    try:
        embedder = Embedder(engine, ctx, config.n_ctx, config.n_seq_max, owns_engine=False)
        embedder.buffers = tuple(b for b in buffers if b.total)
        return embedder
    except BaseException:
        with contextlib.suppress(Exception), native_call():
            llama_cpp.llama_free(ctx)
        raise
