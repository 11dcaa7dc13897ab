"""Continuous batching: many prompts through one context, sharing each llama_decode.

Up to `engine.n_seq_max` sequences are live at once, each with its own
llama.cpp seq_id and positions, its own native sampler and its own
`TokenOutput`. Every step packs into one batch the next token of each
decoding sequence and as much of the waiting prompts as fits in n_batch,
decodes it once, and samples each sequence from its own row of logits. A
finished sequence's cells are removed and its slot goes to the next prompt at
once: that prompt is evaluated in the very next decode, beside the others'
next tokens.

A prefix that every prompt shares (a system prompt, an instruction) is
evaluated once, in sequence 0, and copied to the other sequences. A slot keeps
it when its sequence ends, so each later prompt evaluates only its own part.

`ContinuousBatch` is the scheduler itself, for a caller that keeps it running
(the server): requests are submitted while it runs and join at the next step,
one can be cancelled (its slot is free at once), its text can be streamed, and
with ``reuse_prefix`` a finished slot keeps its whole sequence so that a new
request goes to the free slot holding the longest prefix of it and only its
new tokens are evaluated. `run_batch` runs a fixed list of prompts through it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import llama_cpp

from localrun.errors import ContextOverflowError, EngineError
from localrun.events import (
    BatchEvent,
    BatchProgress,
    DoneEvent,
    Event,
    ReasoningEvent,
    SequenceDone,
    SequenceReasoning,
    SequenceText,
    TokenChoice,
    TokenEvent,
)
from localrun.runtime.decoder import common_prefix
from localrun.runtime.engine import Engine
from localrun.runtime.llama import Batch, DecodeStatus
from localrun.runtime.memory import CHECKPOINTS, Checkpoints
from localrun.runtime.output import TokenOutput
from localrun.runtime.promptcache import AUTO_MIN_TOKENS
from localrun.runtime.reasoning import AnswerGuard, Reasoning
from localrun.runtime.sampling import Sampler, SamplingParams, log_probabilities, logits
from localrun.runtime.stepper import Speculative, Stepper
from localrun.runtime.threads import ThreadMeter
from localrun.structured.constraint import Constraint
from localrun.structured.spec import OutputSpec

if TYPE_CHECKING:
    from localrun.runtime.promptcache import Checkpoint, PromptCache


@dataclass(frozen=True)
class BatchRequest:
    """One prompt of a batch. ``index`` says which: results carry it back."""

    index: int
    tokens: Sequence[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    output: OutputSpec | None = None  # the text must follow this schema or grammar
    reasoning: Reasoning | None = None  # a reasoning model's thinking: apart from the text, before the grammar
    shared: int = 0  # leading tokens other requests are likely to share (a system prompt): what a prompt cache keeps
    logprobs: int | None = None  # each token's log-probability, with this many alternatives (None: none)
    preserved: tuple[str, ...] = ()  # markers written as text though they are control tokens (tool-call markers)
    marks: tuple[int, ...] = ()  # positions a later request is likely to share (a chat's history): checkpointed


def shared_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """How many leading tokens all ``prompts`` share, leaving each at least one
    of its own: the logits of a prompt's last token are what its first sample reads."""
    if not prompts:
        return 0
    first = prompts[0]
    n = min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        n = common_prefix(first, p, n)
    return max(n, 0)


def check_request(request: BatchRequest, capacity: int) -> None:
    """Refuse a request that cannot run: no tokens, or a prompt a slot of ``capacity`` tokens cannot hold."""
    if not request.tokens:
        raise ValueError(f"request {request.index} has no prompt tokens")
    if len(request.tokens) >= capacity:
        raise ContextOverflowError(
            f"prompt {request.index} is {len(request.tokens)} tokens; each sequence's context holds {capacity}",
            n_prompt=len(request.tokens),
            n_ctx=capacity,
        )


# the fewest tokens worth copying another slot's cells for (a copy across
# per-sequence caches copies the whole sequence), or waiting for them: a
# choice, not a measurement (a chat template's system turn is about this long)
COPY_MIN = 16


class _Slot:
    """A live sequence: its seq_id, where its next token goes, what it still has to evaluate."""

    def __init__(
        self, engine: Engine, seq_id: int, request: BatchRequest, start: int, capacity: int, *, on_device: bool = False
    ) -> None:
        self.seq_id = seq_id
        self.request = request
        self.pending = list(request.tokens[start:])  # prompt tokens not yet decoded
        self.context = list(request.tokens)  # the prompt, then each sampled token that will be decoded
        self.pos = start  # the cells of the sequence hold context[:pos]
        self.cached = start
        grammar = Constraint(engine, request.output) if request.output is not None else None
        self.guard = AnswerGuard(grammar, request.reasoning, lambda t: engine.tokenize(t, add_special=False))
        self.out = TokenOutput(
            engine,
            n_prompt=len(request.tokens),
            stop=request.stop,
            ignore_eos=request.ignore_eos,
            reasoning=request.reasoning,
            preserved=request.preserved,
        )
        limit = capacity - len(request.tokens)
        self.limit = min(limit, request.max_tokens) if request.max_tokens is not None else limit
        self.next_token: int | None = None
        self.stepper: Stepper | None = None  # its speculative steps, once it has drafted or could have
        self.target: _SlotTarget | None = None  # the sequence, as its stepper drives it
        self.checkpoint: Checkpoint | None = None  # its shared prefix, stored once the cells hold it
        self.waiting: tuple[int, int, int] | None = None  # (seq_id, request index, n): copy that slot's first n tokens
        self.take = 0  # tokens this sequence puts in the current batch
        self.row = -1  # its logits' row in the current batch, -1 for none
        self.choices: list[TokenChoice] = []  # each sampled token's log-probability (request.logprobs)
        self.reported = 0  # of them, those a SequenceText carried
        # last (nothing after it can fail and leave a chain attached): in llama.cpp's graph where asked,
        # unless something reads its rows on the host (a mask, log-probabilities)
        plain = on_device and not self.guard.masks and request.logprobs is None
        self.sampler = Sampler(request.sampling, engine.n_vocab, engine if plain else None, seq_id)

    def new_choices(self) -> tuple[TokenChoice, ...]:
        """The log-probabilities not reported yet (the end of generation's never: it is no text)."""
        end = len(self.out.tokens)
        taken = tuple(self.choices[self.reported : end])
        self.reported = max(self.reported, end)
        return taken

    @property
    def speculates(self) -> bool:
        """Whether a speculative step can stand in for its sampler: each token
        comes from `_choose` only when it does not (log-probabilities), and
        speculative sampling models the chain without biases."""
        return self.request.logprobs is None and self.request.sampling.speculable

    @property
    def constraint(self) -> Constraint | None:
        """Its grammar, once it applies (after the thinking, where there is one)."""
        return self.guard.constraint


SlotEvent = SequenceText | SequenceReasoning | SequenceDone


def _texts(s: _Slot, events: Sequence[Event]) -> Iterator[SequenceText | SequenceReasoning]:
    """A sequence's text events as the batch streams them: the answer's, and its thinking's apart."""
    for ev in events:
        if isinstance(ev, TokenEvent):
            yield SequenceText(s.request.index, ev.text, s.out.n_gen, s.new_choices())
        elif isinstance(ev, ReasoningEvent):
            yield SequenceReasoning(s.request.index, ev.text, s.out.n_gen)


class ContinuousBatch:
    """The scheduler: ``slots`` sequences (at most `engine.n_seq_max`) of
    ``capacity`` tokens each, fed from a queue that may grow while it runs.

    ``prefix_tokens`` (a prefix every request shares) is evaluated once by
    `evaluate_prefix` and kept in every slot. ``reuse_prefix``: a slot keeps
    its whole sequence when it ends, and a new request takes the free slot
    holding the longest prefix of its tokens; a longer one another slot holds,
    or is about to evaluate, is copied from it (`_place`, `_future_donor`).
    ``stream``: `step` reports each
    sequence's text as it comes (`SequenceText`), not only at the end.
    ``speculation`` (prompt lookup, `localrun.speculative`): a sequence that
    decodes alone (nothing queued, no other slot busy) takes its steps through
    the speculation's stepper (`runtime.stepper`), the one the single-sequence
    loop uses: it drafts where the controller finds it pays, and the draft is
    verified in the sequence's own batch. Sequences decoding together draft
    too where the speculation says extra rows are nearly free (its verify
    curve: a GPU), each weighing its draft against the others' rows; their
    drafts ride in the shared batch (`_speculate_together`). On a CPU's
    curve, or with none, they do not: a verify row there costs most of a step.
    ``prompt_cache``: a request's shared prefix (`BatchRequest.shared`, a
    system prompt) of `AUTO_MIN_TOKENS` or more that no slot holds is loaded
    from it, or stored there once evaluated (a server restarted, or the same
    system prompt in `localrun generate`).

    Where the engine samples on the device (``sample_on`` device: asked
    with `--sample-on device`) and nothing speculates, each slot's sampler
    chain is attached to its sequence and runs inside llama.cpp's graph,
    and the step reads the token it drew. A request whose rows are read on
    the host (a grammar, a thinking budget, log-probabilities) samples
    there, beside the others."""

    def __init__(
        self,
        engine: Engine,
        slots: int,
        capacity: int,
        *,
        prefix_tokens: Sequence[int] = (),
        reuse_prefix: bool = False,
        stream: bool = False,
        speculation: Speculative | None = None,
        prompt_cache: PromptCache | None = None,
    ) -> None:
        self.engine = engine
        self.speculation = speculation
        self.prompt_cache = prompt_cache
        # a verify step reads a slot's rows on the host: where anything may speculate, every slot samples there
        self.on_device = engine.config.sample_on == "device" and speculation is None
        self.warnings: list[str] = []  # what the prompt cache had to say (a damaged file, a full disk), to show
        self._writers: list[threading.Thread] = []  # prompt cache entries being written
        self._drafting: _Slot | None = None  # the slot the drafters follow
        self.memory = engine.memory
        self.cuts = engine.cuts
        self.queue: deque[BatchRequest] = deque()
        self.total = 0
        self.prefix_tokens = list(prefix_tokens)
        self.capacity = capacity
        self.reuse_prefix = reuse_prefix
        self.stream = stream
        self.slots: list[_Slot | None] = [None] * min(engine.n_seq_max, slots)
        self.held: list[list[int]] = [[] for _ in self.slots]  # what a free slot's cells hold (reuse_prefix)
        self.last_used = [0] * len(self.slots)
        self.steps = 0
        self.done = self.cancelled = self.generated = self.evaluated = 0
        self.t0 = time.perf_counter()
        self.batch = Batch(engine.n_batch)
        # a recurrent memory's checkpoints, any slot's: each restores into a slot holding its tokens
        self.checkpoints = Checkpoints(engine.ctx, engine.cuts, CHECKPOINTS * len(self.slots))
        self.meter = ThreadMeter(engine)  # steps of one token per sequence feed the thread governor

    # -- requests --

    def check(self, request: BatchRequest) -> None:
        """Refuse a request that cannot run (`check_request`)."""
        check_request(request, self.capacity)

    def submit(self, request: BatchRequest) -> None:
        """Queue ``request``: it takes a slot at the next step that has one free."""
        self.check(request)
        self.queue.append(request)
        self.total += 1

    def cancel(self, index: int) -> bool:
        """Drop request ``index``, queued or running (its slot is free for the
        next step); False when it is neither (it has finished)."""
        for request in self.queue:
            if request.index == index:
                self.queue.remove(request)
                self.cancelled += 1
                return True
        for seq_id, s in enumerate(self.slots):
            if s is not None and s.request.index == index:
                self._release(seq_id, s)
                self.cancelled += 1
                return True
        return False

    def cancel_all(self) -> list[int]:
        """Drop every request, queued or running; their indexes."""
        dropped = [r.index for r in self.queue] + [s.request.index for s in self.slots if s is not None]
        for index in dropped:
            self.cancel(index)
        return dropped

    def reset(self) -> list[int]:
        """Drop every request and empty the KV cache, shared prefix included
        (after a failed decode); their indexes. They do not count as cancelled."""
        cancelled = self.cancelled
        dropped = self.cancel_all()
        self.cancelled = cancelled
        self.cuts.clear_all()
        self.held = [[] for _ in self.slots]
        return dropped

    @property
    def busy(self) -> bool:
        return bool(self.queue) or any(s is not None for s in self.slots)

    @property
    def active(self) -> int:
        return sum(s is not None for s in self.slots)

    # -- the batch --

    def _decode(self, with_prompt: bool, *, timed: bool = False) -> DecodeStatus:
        """Decode the batch; ``timed``: a step of one token per sequence, which feeds the thread governor."""

        def decode() -> DecodeStatus:
            return self.batch.decode(self.engine, abortable=with_prompt)  # a prompt is long: Ctrl-C stops it midway

        status = self.meter.timed(decode, rows=self.batch.n) if timed else decode()
        if status == DecodeStatus.NO_SLOT:
            raise EngineError(f"llama_decode found no room in the KV cache for a batch of {self.batch.n} tokens")
        return status

    def evaluate_prefix(self) -> DecodeStatus:
        """The shared prefix, once, into sequence 0; then copied to the other sequences."""
        step = self.engine.n_batch
        for start in range(0, len(self.prefix_tokens), step):
            self.batch.clear()
            chunk = self.prefix_tokens[start : start + step]
            for k, token in enumerate(chunk):
                self.batch.add(token, start + k, 0, False)
            status = self._decode(with_prompt=True)
            if status != DecodeStatus.OK:
                return status
            self.cuts.decoded(0, len(chunk))
        self.evaluated += len(self.prefix_tokens)
        if self.cuts.recurrent:  # what a slot's sequence is cut back to when it ends
            self.checkpoints.save(0, self.prefix_tokens)
        for seq_id in range(1, len(self.slots)):
            llama_cpp.llama_memory_seq_cp(self.memory, 0, seq_id, -1, -1)
        return DecodeStatus.OK

    # -- the loop --

    def _place(self, request: BatchRequest, free: list[int]) -> tuple[int, int, Checkpoint | None]:
        """(the free slot for ``request``, how many of its tokens that slot holds already).
        With ``reuse_prefix``: the free slot holding the longest prefix of it;
        and where another slot, busy or free, holds a prefix longer by at least
        `COPY_MIN` tokens (a system prompt many clients share), its cells are
        copied into that slot rather than evaluated again. The last: the
        prompt cache's checkpoint of the request's shared prefix, to store
        once evaluated (see `_cached`)."""
        if not self.reuse_prefix:  # the slot holds the shared prefix, or nothing (a recurrent memory, no checkpoint)
            return free[0], min(len(self.prefix_tokens), self.cuts.held(free[0])), None
        limit = len(request.tokens) - 1  # the last prompt token is evaluated: its logits give the first sample
        seq_id = max(free, key=lambda i: (common_prefix(self.held[i], request.tokens, limit), -self.last_used[i]))
        keep = common_prefix(self.held[seq_id], request.tokens, limit)
        donor, longer = self._donor(request.tokens, limit)
        if donor is not None and donor != seq_id and longer >= keep + COPY_MIN:
            self.cuts.clear(seq_id)
            llama_cpp.llama_memory_seq_cp(self.memory, donor, seq_id, -1, -1)  # across streams: whole ones only
            keep = longer
        keep = self.checkpoints.cut(seq_id, request.tokens, keep)  # a recurrent memory: a checkpoint, or nothing
        keep, checkpoint = self._cached(request, seq_id, keep)
        return seq_id, keep, checkpoint

    def _future_donor(self, request: BatchRequest, keep: int) -> tuple[int, int, int] | None:
        """A busy slot whose prompt, not yet evaluated that far, starts as
        ``request`` does for at least `COPY_MIN` tokens more than ``keep``
        (requests that came together with one system prompt): (its seq_id,
        its request's index, how many tokens). The new slot waits for those
        cells and copies them, rather than evaluating them a second time."""
        limit = len(request.tokens) - 1
        best: tuple[int, int, int] | None = None
        for seq_id, s in enumerate(self.slots):
            if s is None or s.waiting is not None:
                continue
            n = common_prefix(s.context, request.tokens, limit)
            if s.pos < n and n >= keep + COPY_MIN and (best is None or n > best[2]):
                best = (seq_id, s.request.index, n)
        return best

    def _end_waits(self) -> None:
        """Slots waiting for a donor's cells: copy them once the donor holds
        them; a donor gone before (cancelled) leaves the slot to evaluate its own."""
        for seq_id, s in enumerate(self.slots):
            if s is None or s.waiting is None:
                continue
            donor_id, index, n = s.waiting
            donor = self.slots[donor_id]
            if donor is not None and donor.request.index == index and donor.pos < n:
                continue  # not there yet
            held = donor.context[: donor.pos] if donor is not None else self.held[donor_id]
            s.waiting = None
            if common_prefix(held, s.context, n) < n:
                continue  # the donor went before it held them
            self.cuts.clear(seq_id)
            llama_cpp.llama_memory_seq_cp(self.memory, donor_id, seq_id, -1, -1)  # across streams: whole ones only
            n = self.checkpoints.cut(seq_id, s.context, n)
            s.pos = s.cached = n
            s.pending = list(s.request.tokens[n:])

    def _cached(self, request: BatchRequest, seq_id: int, keep: int) -> tuple[int, Checkpoint | None]:
        """(what ``seq_id`` holds of ``request`` after the prompt cache had its
        say, the checkpoint to store when it missed). Only a shared prefix of
        `AUTO_MIN_TOKENS` or more that the slot does not hold already."""
        if self.prompt_cache is None or request.shared < AUTO_MIN_TOKENS or keep >= request.shared:
            return keep, None
        try:
            checkpoint = self.prompt_cache.checkpoint(self.engine, request.tokens[: request.shared])
        except OSError as exc:  # the model file is gone from under the server: no cache, the request runs
            self.warnings.append(f"prompt cache not used: {exc}")
            return keep, None
        loaded = checkpoint.load_into(seq_id)
        self.warnings += checkpoint.warnings
        checkpoint.warnings = self.warnings  # what its later write says comes here too
        if loaded:
            return checkpoint.length, None
        return (0 if checkpoint.touched else keep), checkpoint

    def _store(self, s: _Slot, checkpoint: Checkpoint) -> None:
        """Store ``s``'s cells, which hold exactly the checkpoint's prefix: the
        state is taken here, and hashed and written on a thread of its own, so
        the other sequences do not wait for the disk."""
        state = checkpoint.capture(s.seq_id)
        writer = threading.Thread(target=checkpoint.write, args=(state,), name="localrun-prompt-cache", daemon=True)
        writer.start()
        self._writers = [w for w in self._writers if w.is_alive()] + [writer]

    def _donor(self, tokens: Sequence[int], limit: int) -> tuple[int | None, int]:
        """The slot whose cells hold the longest prefix of ``tokens``, and its length."""
        best, longest = None, 0
        for seq_id, s in enumerate(self.slots):
            held = self.held[seq_id] if s is None else s.context[: s.pos]
            n = common_prefix(held, tokens, limit)
            if n > longest:
                best, longest = seq_id, n
        return best, longest

    def _fill_slots(self) -> None:
        free = [seq_id for seq_id, slot in enumerate(self.slots) if slot is None]
        while free and self.queue:
            request = self.queue.popleft()
            try:
                seq_id, start, checkpoint = self._place(request, free)
                slot = _Slot(self.engine, seq_id, request, start, self.capacity, on_device=self.on_device)
            except BaseException:
                self.queue.appendleft(request)  # still the scheduler's: a reset ends it with the others
                raise
            free.remove(seq_id)
            slot.checkpoint = checkpoint
            if self.reuse_prefix and checkpoint is None:
                slot.waiting = self._future_donor(request, start)
            self.slots[seq_id] = slot

    def _step(self) -> DecodeStatus:
        """One shared decode: each decoding sequence's next token, and prompt
        tokens in the room left. Tokens go in seq_id order: with a KV cache per
        sequence, llama.cpp splits a batch into ubatches of consecutive seq_ids."""
        live = [s for s in self.slots if s is not None]
        self._share_room(live)
        self.batch.clear()
        with_prompt = False
        for s in live:
            s.row = -1
            if not s.pending:
                assert s.next_token is not None
                s.row = self.batch.add(s.next_token, s.pos, s.seq_id, True)
            elif s.take:
                with_prompt = True
                last = s.take == len(s.pending)
                for k in range(s.take):
                    row = self.batch.add(s.pending[k], s.pos + k, s.seq_id, last and k == s.take - 1)
                if last:
                    s.row = row
        status = self._decode(with_prompt, timed=not with_prompt)
        if status != DecodeStatus.OK:
            return status
        for s in live:
            self._advance(s)
        return status

    def _advance(self, s: _Slot) -> None:
        """``s`` after a decode that took its ``take`` tokens."""
        if self.cuts.recurrent:
            self.cuts.decoded(s.seq_id, s.take)
        if not s.pending:
            s.pos += 1
        elif s.take:
            del s.pending[: s.take]
            s.pos += s.take
            self.evaluated += s.take
            if s.checkpoint is not None and s.pos == s.checkpoint.length:
                self._store(s, s.checkpoint)
                s.checkpoint = None
            if self.cuts.recurrent and (s.pos in s.request.marks or not s.pending):
                self.checkpoints.save(s.seq_id, s.context[: s.pos])  # where a later request may start again
            if not s.pending:
                s.out.prompt_done(s.cached)

    def _share_room(self, live: list[_Slot]) -> None:
        """Each sequence's tokens in the next batch (``take``): one for each
        decoding sequence, then prompt tokens in the room left, in seq_id
        order; a prompt stops at the end of a shared prefix to be stored."""
        room = self.engine.n_batch - sum(1 for s in live if not s.pending)
        for s in live:
            s.take = 1 if not s.pending else 0 if s.waiting is not None else min(len(s.pending), room)
            if s.pending and s.checkpoint is not None:
                s.take = min(s.take, s.checkpoint.length - s.pos)
            if s.pending and self.cuts.recurrent:  # it checkpoints at a mark: the prompt stops there
                s.take = min(s.take, min((m for m in s.request.marks if m > s.pos), default=s.pos + s.take) - s.pos)
            if s.pending:
                room -= s.take

    def _choose(self, s: _Slot, row: int) -> int:
        """The token of ``row`` for sequence ``s``: masked to what may come (its grammar, its thinking budget),
        sampled, taken."""
        if s.guard.masks:
            s.guard.mask(logits(self.engine, row))
        token = s.sampler.sample(self.engine, row)
        if s.request.logprobs is not None:  # the row the sampler read (masked by a grammar, if any)
            s.choices.append(log_probabilities(logits(self.engine, row), token, s.request.logprobs))
        s.guard.accepted(token)
        return token

    def _sample(self) -> Iterator[SlotEvent]:
        for seq_id, s in enumerate(self.slots):
            if s is not None and s.row >= 0:
                yield from self._take(seq_id, s, [self._choose(s, s.row)])

    def _take(self, seq_id: int, s: _Slot, tokens: Sequence[int]) -> Iterator[SlotEvent]:
        """Put decided ``tokens`` in the sequence's output, until it ends."""
        for token in tokens:
            before = s.out.n_gen
            events = s.out.push_events(token)
            self.generated += s.out.n_gen - before
            if self.stream:
                yield from _texts(s, events)
            if s.out.reason is not None or s.out.n_gen >= s.limit:
                yield from self._finish(seq_id, s)
                return
            s.next_token = token
            s.context.append(token)

    def _alone(self) -> tuple[int, _Slot] | None:
        """The one sequence decoding, when it is alone (nothing queued, no other slot busy)."""
        live = [(seq_id, s) for seq_id, s in enumerate(self.slots) if s is not None]
        if self.queue or len(live) != 1 or live[0][1].pending or not live[0][1].speculates:
            return None
        return live[0]

    def _together(self) -> list[tuple[int, _Slot]]:
        """The sequences decoding, when there are several, none has prompt
        left, and the speculation says they may draft in their shared batch
        (its verify curve: extra rows nearly free, a GPU); else none."""
        live = [(seq_id, s) for seq_id, s in enumerate(self.slots) if s is not None]
        if self.speculation is None or len(live) < 2 or any(s.pending or not s.speculates for _, s in live):
            return []
        if self.cuts.recurrent:  # its padding is cut back from the last sequence's cells, past what snapshots keep
            return []
        return live if self.speculation.drafts_in_batch(len(live)) else []

    def _stepper(self, s: _Slot) -> tuple[Stepper, _SlotTarget]:
        assert self.speculation is not None
        if s.stepper is None or s.target is None:
            s.target = _SlotTarget(self, s)
            s.stepper = self.speculation.stepper(s.target, s.request.sampling)
        return s.stepper, s.target

    def _speculate(self, seq_id: int, s: _Slot) -> tuple[DecodeStatus, list[SlotEvent]]:
        """A step of the sequence decoding alone, by its stepper: a verify step
        of [next token, draft], or a plain step where the controller finds no
        draft pays."""
        stepper, target = self._stepper(s)
        target.room = None  # its batch is its own
        if self._drafting is not s:
            stepper.begin()
            self._drafting = s
        decided = stepper.next()
        if not decided:
            return stepper.status, []
        return DecodeStatus.OK, list(self._take(seq_id, s, decided))

    def _speculate_together(self, live: list[tuple[int, _Slot]]) -> tuple[DecodeStatus, list[SlotEvent]]:
        """One shared decode where each sequence's stepper puts its rows: its
        next token, and a draft where the controller finds one pays beside
        the others' rows; then each checks its own rows. The batch is padded
        to a size the curve favours, as a sequence's verify batch is alone."""
        assert self.speculation is not None
        self.batch.clear()
        placed: list[tuple[int, _Slot, Stepper, int]] = []
        total = 0
        tokens: list[int] = []
        for k, (seq_id, s) in enumerate(live):
            stepper, target = self._stepper(s)
            later = len(live) - k - 1  # the sequences after this one: a row each at least
            target.room = self.engine.n_batch - total - later
            tokens, first = stepper.prepare(total + later)
            target.offset, target.rows = self.batch.n, len(tokens)
            for i, token in enumerate(tokens):
                self.batch.add(token, s.pos + i, s.seq_id, i >= first)
            total += len(tokens)
            placed.append((seq_id, s, stepper, len(tokens)))
        _, last, _, rows = placed[-1]  # padding goes after the last sequence's rows, in its cells
        end = last.pos + rows
        size = self.speculation.padded(total, min(self.engine.n_batch, total + self.capacity - end))
        for i in range(size - total):  # logits asked for, never read: the step's outputs repeat too
            self.batch.add(tokens[-1], end + i, last.seq_id, True)
        t0 = time.perf_counter()
        status = self._decode(with_prompt=False, timed=size == len(live))  # no draft: the governor's step
        seconds = time.perf_counter() - t0
        if size > total:
            llama_cpp.llama_memory_seq_rm(self.memory, last.seq_id, end, -1)
        if status == DecodeStatus.OK:
            self.speculation.observe_batch(size, seconds)
        events: list[SlotEvent] = []
        for seq_id, s, stepper, rows in placed:
            if status == DecodeStatus.OK:
                s.pos += rows
            decided = stepper.settle(status, seconds * rows / total)
            events += self._take(seq_id, s, decided)
        return status, events

    def _finish(self, seq_id: int, s: _Slot) -> Iterator[SlotEvent]:
        if self._drafting is s:
            self._drafting = None
        events = list(s.out.finish("length", **({"draft": s.stepper.stats()} if s.stepper is not None else {})))
        if self.stream:
            yield from _texts(s, events)
            rest = s.new_choices()  # tokens whose text was held back and then cut: their figures still go out
            if rest:
                yield SequenceText(s.request.index, "", s.out.n_gen, rest)
        stats = [ev for ev in events if isinstance(ev, DoneEvent)][-1].stats
        if (grammar := s.guard.grammar) is not None:  # the whole text is known now: check it
            checked = grammar.check(s.out.text)
            stats = replace(stats, valid=checked.valid, invalid=checked.error, forced_tokens=grammar.forced)
        self._release(seq_id, s)
        self.done += 1
        yield SequenceDone(s.request.index, s.out.text, stats, s.out.reasoning, tuple(s.choices[: len(s.out.tokens)]))

    def refill(self, s: _Slot, pos: int) -> None:
        """Evaluate ``s``'s context up to ``pos`` again after a cut a recurrent
        memory refused; where that stops short, the slot holds less (a
        stepper evaluates the rest as pending tokens)."""
        step = self.engine.n_batch
        while s.pos < pos:
            chunk = s.context[s.pos : min(pos, s.pos + step)]
            self.batch.clear()
            for k, token in enumerate(chunk):
                self.batch.add(token, s.pos + k, s.seq_id, False)
            if self._decode(with_prompt=True) != DecodeStatus.OK:
                return
            s.pos += len(chunk)
            self.cuts.decoded(s.seq_id, len(chunk))

    def _release(self, seq_id: int, s: _Slot) -> None:
        s.sampler.close()
        self.slots[seq_id] = None
        self.last_used[seq_id] = self.steps
        if self.reuse_prefix:  # the cells stay for a later request that starts the same way
            self.held[seq_id] = s.context[: s.pos]
        else:  # forget the sequence but keep the shared prefix for the next one in this slot
            self.checkpoints.cut(seq_id, self.prefix_tokens, len(self.prefix_tokens))  # or less: see `_place`

    def step(self) -> tuple[DecodeStatus, list[SlotEvent]]:
        """Give free slots to queued requests, decode once, sample each
        sequence: the decode's status, and the text and ends it produced."""
        self._fill_slots()
        self._end_waits()
        self.steps += 1
        alone = self._alone() if self.speculation is not None else None
        if alone is not None:
            return self._speculate(*alone)
        together = self._together()
        if together:
            return self._speculate_together(together)
        status = self._step()
        return status, list(self._sample()) if status == DecodeStatus.OK else []

    def progress(self, *, final: bool = False, interrupted: bool = False) -> BatchProgress:
        return BatchProgress(
            done=self.done,
            total=self.total,
            generated_tokens=self.generated,
            evaluated_tokens=self.evaluated,
            shared_prefix=len(self.prefix_tokens),
            elapsed_s=time.perf_counter() - self.t0,
            parallel=len(self.slots),
            final=final,
            interrupted=interrupted,
        )

    def events(self) -> Iterator[BatchEvent]:
        """Run until every submitted request is done (or `engine.abort_requested`)."""
        self.cuts.clear_all()
        self.t0 = time.perf_counter()
        try:
            status = self.evaluate_prefix()
            while status == DecodeStatus.OK and self.busy:
                if self.engine.abort_requested:
                    status = DecodeStatus.ABORTED
                    break
                status, finished = self.step()
                if status == DecodeStatus.OK:
                    yield from (ev for ev in finished if isinstance(ev, SequenceDone))
                    yield self.progress()
            yield self.progress(final=True, interrupted=status == DecodeStatus.ABORTED)
        finally:
            self.close()

    def close(self) -> None:
        self.meter.finish()
        for s in self.slots:
            if s is not None:
                s.sampler.close()
        self.batch.close()
        for writer in self._writers:  # an entry half written would be left as a temporary file
            writer.join()


class _SlotTarget:
    """A sequence, as its stepper drives it (`runtime.stepper.SteppedSequence`), in
    the scheduler's context: decoding alone, in batches of its own; decoding
    together with others, in ``rows`` rows from ``offset`` of the shared
    batch, with ``room`` rows of it for its own."""

    def __init__(self, run: ContinuousBatch, slot: _Slot) -> None:
        self.run = run
        self.slot = slot
        self.offset = 0  # its first row in the last batch
        self.rows = 0  # its rows there
        self.room: int | None = None  # rows it may take in the next shared batch; None: alone

    @property
    def context(self) -> list[int]:
        return self.slot.context

    @property
    def n_past(self) -> int:
        return self.slot.pos

    @property
    def left(self) -> int:
        return self.slot.limit - self.slot.out.n_gen

    @property
    def n_ctx(self) -> int:
        return self.run.capacity

    @property
    def n_batch(self) -> int:
        return int(self.run.engine.n_batch) if self.room is None else self.room

    @property
    def draft_room(self) -> int:
        return self.run.cuts.room

    @property
    def constraint(self) -> Constraint | None:
        return self.slot.constraint

    @property
    def generated(self) -> Sequence[int]:
        return self.slot.out.tokens

    def fast_forward(self) -> list[int]:
        return []  # the scheduler samples every token

    def evaluate(self, tokens: Sequence[int]) -> DecodeStatus:
        return self._evaluate(tokens, len(tokens) - 1, timed=len(tokens) == 1)

    def evaluate_rows(self, tokens: Sequence[int], first: int) -> DecodeStatus:
        return self._evaluate(tokens, first, timed=False)

    def _evaluate(self, tokens: Sequence[int], first: int, *, timed: bool) -> DecodeStatus:
        s, batch = self.slot, self.run.batch
        batch.clear()
        for k, token in enumerate(tokens):
            batch.add(token, s.pos + k, s.seq_id, k >= first)
        self.offset, self.rows = 0, len(tokens)
        status = self.run._decode(with_prompt=False, timed=timed)
        if status == DecodeStatus.OK:
            s.pos += len(tokens)
            self.run.cuts.decoded(s.seq_id, len(tokens))
        return status

    def _row(self, row: int) -> int:
        """Its ``row`` (from its end when negative) in the last batch."""
        return self.offset + (row if row >= 0 else self.rows + row)

    def sample(self, row: int = -1) -> int:
        return self.run._choose(self.slot, self._row(row))

    def logits(self, row: int) -> Any:
        row_logits = logits(self.run.engine, self._row(row))
        self.slot.guard.mask(row_logits)
        return row_logits

    def accept(self, token: int) -> None:
        self.slot.sampler.accept(token)
        self.slot.guard.accepted(token)

    def rollback(self, pos: int) -> None:
        s = self.slot
        pos = min(pos, s.pos)
        s.pos = self.run.checkpoints.cut(s.seq_id, s.context, pos)  # less where a recurrent memory refuses
        if s.pos < pos:
            self.run.refill(s, pos)


def run_batch(engine: Engine, requests: Sequence[BatchRequest], *, share_prefix: bool = True) -> Iterator[BatchEvent]:
    """Generate for every request, up to `engine.n_seq_max` at a time; yields a
    `SequenceDone` as each finishes (in the order they finish), a
    `BatchProgress` after each shared decode, and a final `BatchProgress`
    (``interrupted`` when `engine.abort_requested` stopped the run; the
    sequences still running then are not reported)."""
    capacity = engine.n_ctx // engine.n_seq_max  # each sequence's share of the context
    for r in requests:
        if not r.tokens:
            raise ValueError(f"request {r.index} has no prompt tokens")
        if len(r.tokens) >= capacity:
            raise ContextOverflowError(
                f"prompt {r.index} is {len(r.tokens)} tokens; each sequence's context holds {capacity}"
            )
    if not requests:
        return iter([BatchProgress(0, 0, 0, 0, 0, 0.0, final=True)])
    prefix = shared_prefix([r.tokens for r in requests]) if share_prefix and len(requests) > 1 else 0
    run = ContinuousBatch(engine, len(requests), capacity, prefix_tokens=requests[0].tokens[:prefix])
    for request in requests:
        run.submit(request)
    return run.events()
