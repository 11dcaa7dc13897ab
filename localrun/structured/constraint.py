"""llguidance on a running engine: the tokens the grammar allows at each
step, applied to the logits before sampling (greedy or not), and the check of
the finished text.

The tokenizer is built once per loaded model from the model's own vocabulary
(`llguidance.llamacpp`), never downloaded. End of generation is a token like
any other: the mask allows it only where the grammar accepts.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from localrun.structured.spec import OutputSpec, json_problem


class Vocabulary(Protocol):
    """What a grammar needs of a loaded model (a runtime `Engine` is one): its
    llama.cpp vocabulary handle and size. Kept as the key of its tokenizer."""

    @property
    def vocab(self) -> Any: ...

    @property
    def n_vocab(self) -> int: ...


class Tokenizer(Vocabulary, Protocol):
    """A vocabulary that also turns text into token ids (what tool grammars need)."""

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]: ...

    def is_special(self, token: int) -> bool: ...


_tokenizers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def tokenizer_for(engine: Vocabulary) -> Any:
    """llguidance's tokenizer for the engine's vocabulary (about a second to build; kept per engine)."""
    tok = _tokenizers.get(engine)
    if tok is None:
        from llguidance.llamacpp import lltokenizer_from_vocab

        tok = lltokenizer_from_vocab(engine.vocab, n_vocab=engine.n_vocab)
        _tokenizers[engine] = tok
    return tok


@dataclass(frozen=True)
class Checked:
    """What the finished text is: ``valid`` None where there is no schema to validate against."""

    valid: bool | None
    error: str | None = None


class Constraint:
    """One generation's grammar state. `apply` before each sample, `consume`
    each token the output keeps; `stopped` once the grammar allows nothing more."""

    def __init__(self, engine: Vocabulary, spec: OutputSpec) -> None:
        import llguidance
        import llguidance.numpy as llnp

        self.spec = spec
        self.matcher = llguidance.LLMatcher(tokenizer_for(engine), spec.grammar)
        if self.matcher.is_error():
            raise ValueError(self.matcher.get_error())
        self._llnp = llnp
        self.n_vocab = engine.n_vocab
        self._mask = llnp.allocate_token_bitmask(1, engine.n_vocab)
        self._ends = frozenset(tokenizer_for(engine).eos_tokens)
        self.forced = 0  # tokens of the text the grammar left no choice about (jump-forward, or a mask of one)

    def fork(self) -> Constraint:
        """A copy of the state that moves on its own (a draft model drafts
        under it; the output's state stays where it is)."""
        copy = object.__new__(Constraint)
        copy.spec, copy._llnp, copy.n_vocab, copy._ends, copy.forced = (
            self.spec,
            self._llnp,
            self.n_vocab,
            self._ends,
            0,
        )
        copy.matcher = self.matcher.deep_copy()
        copy._mask = self._llnp.allocate_token_bitmask(1, self.n_vocab)
        return copy

    def apply(self, logits: np.ndarray[Any, Any]) -> None:
        """Mask ``logits`` (one row, in place): what the grammar does not allow cannot be sampled."""
        self._llnp.fill_next_token_bitmask(self.matcher, self._mask, 0)
        words = self._mask[0]
        nonzero = np.flatnonzero(words)
        if len(nonzero) == 1 and (word := int(words[nonzero[0]]) & 0xFFFFFFFF).bit_count() == 1:
            self.forced += int(nonzero[0]) * 32 + word.bit_length() - 1 not in self._ends  # the end is not text
        self._llnp.apply_token_bitmask_inplace(logits[None, :], self._mask)

    def fast_forward(self, room: int) -> list[int]:
        """The tokens the grammar forces next (none, or a key, punctuation, the
        rest of an enum value), at most ``room``, consumed as if sampled."""
        if room < 1 or self.matcher.is_stopped():
            return []
        forced = list(self.matcher.compute_ff_tokens())[:room]
        if forced:
            self.matcher.consume_tokens(forced)
            self.forced += len(forced)
        return forced

    def allowed_prefix(self, tokens: list[int]) -> int:
        """How many leading ``tokens`` the grammar accepts from here (a draft
        is cut at the first one it rejects); the state does not change."""
        return int(self.matcher.validate_tokens(tokens)) if tokens else 0

    def consume(self, token: int) -> None:
        if not self.matcher.is_stopped():
            self.matcher.consume_token(token)

    @property
    def stopped(self) -> bool:
        return bool(self.matcher.is_stopped())

    @property
    def accepting(self) -> bool:
        return bool(self.matcher.is_accepting())

    def check(self, text: str) -> Checked:
        """Validate the finished text: JSON against the schema; a grammar's text by the grammar's own end."""
        if self.spec.schema is None:
            return Checked(True) if self.accepting else Checked(False, "the text ends before the grammar does")
        problem = json_problem(self.spec.schema, text)
        return Checked(True) if problem is None else Checked(False, problem)
