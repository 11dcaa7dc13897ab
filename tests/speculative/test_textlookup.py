from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from localrun.events import Stats
from localrun.runtime.engine import Engine
from localrun.runtime.generate import generate
from localrun.runtime.sampling import SamplingParams
from localrun.speculative import Speculation, lookup_drafters, open_speculation
from localrun.speculative.control import FixedController
from localrun.speculative.lookup import PromptLookupDrafter
from localrun.speculative.textlookup import (
    CATCH_UP_CHARS,
    SYNC_CHARS,
    SpacingRules,
    TextLookupDrafter,
    split_gaps,
)
from tests.helpers import collect, engine_config
from tests.tinymodel import write_tiny_model

GREEDY = SamplingParams(temperature=0.0)
RNG = np.random.default_rng(0)


def by_char() -> TextLookupDrafter:
    """A text lookup over a tokenizer with one token per character."""
    return TextLookupDrafter(lambda t: chr(t).encode(), lambda text: [ord(c) for c in text])


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def drafted(drafter: TextLookupDrafter, prompt: str, answer: str, n: int = 40) -> str | None:
    drafter.begin(ids(prompt))
    context = ids(prompt + answer)
    if drafter.offer(context, 0) is None:
        return None
    return "".join(chr(t) for t in drafter.draft(context, n, GREEDY, RNG).tokens)


def test_split_gaps_keeps_the_whitespace_before_each_character() -> None:
    chars, gaps, trail = split_gaps("  a =b\n\tc  ")
    assert (chars, gaps, trail) == (["a", "=", "b", "c"], ["  ", " ", "", "\n\t"], "  ")


def test_spacing_rules_go_from_the_pair_to_its_classes_to_the_source() -> None:
    rules = SpacingRules()
    rules.learn("x", "", "=", " ", 0)
    rules.learn("=", "", "1", " ", 0)
    assert rules.predict("x", "", "=", 0) == " "
    assert rules.predict("y", "", "<", 0) == " "  # a word, then an operator: the same classes
    assert rules.predict("y", "", ".", 0) == ""  # nothing known: the source's own gap
    assert rules.predict(">", "", "=", 0) == ""  # an operator's characters stay together
    rules.learn("x", "", "=", "", 0)  # the latest for a pair wins over its class
    assert rules.predict("x", "", "=", 0) == ""
    assert rules.predict("y", "", "=", 0) == " "  # the class votes 1:1, the first seen first


def test_spacing_rules_break_lines_relative_to_the_line_and_scale_indents() -> None:
    rules = SpacingRules()
    rules.learn(":", " ", "r", "\n        ", 4)  # `if x: return` split, the body one level in
    assert rules.predict(":", " ", "r", 8) == "\n" + " " * 12
    rules.learn(")", "\n  ", "r", "\n    ", 0)  # the source indents by 2, the answer by 4
    assert rules.predict("]", "\n  ", "p", 0) == "\n    "
    assert rules.predict("]", "\n      ", "p", 0) == "\n" + " " * 12  # a depth not seen yet: scaled


def test_text_lookup_drafts_the_source_respaced_as_the_answer_respaces_it() -> None:
    prompt = "code:\ndef f(a,b):\n  x=a,b\n  y=a*b\n  return x,y\nend"
    answer = "def f(a, b):\n    x = a, b\n    y"
    assert drafted(by_char(), prompt, answer) == " = a * b\n    return x, y\nend"
    assert drafted(by_char(), prompt, answer, 3) == " = "


def test_text_lookup_waits_for_enough_copied_text() -> None:
    prompt = "code:\ndef f(a,b):\n  x=a+b\n"
    assert drafted(by_char(), prompt, "unrelated words here") is None
    assert len("deff(a,b):") == SYNC_CHARS  # the test's premise: the prompt so far is one character short
    assert drafted(by_char(), prompt, "def f(a, b)") is None  # fewer than SYNC_CHARS characters so far
    assert drafted(by_char(), prompt, "def f(a, b):") == "\n  x=a+b"  # nothing learned: the source's spacing
    assert drafted(by_char(), prompt, "def f(a, b):\n  x") == "=a+b"


def test_text_lookup_picks_the_source_up_again_after_an_edit() -> None:
    prompt = "print(alpha_value,beta_value,gamma_value)"
    answer = "print(alpha_value, BETA"
    drafter = by_char()
    assert drafted(drafter, prompt, answer) is None  # left the source
    assert drafted(drafter, prompt, answer + "_value, gamm") == "a_value)"  # found again


def test_text_lookup_takes_up_a_long_unread_stretch_from_its_end() -> None:
    """After a long rest (the drafters not asked), only the last
    `CATCH_UP_CHARS` new characters are followed: the copy is found from
    them, and the draft goes on where the answer is."""
    source = "".join(f"row{i} = value{i * 7 % 13};" for i in range(60))
    answer = source[: 2 * CATCH_UP_CHARS]
    drafter = by_char()
    drafter.begin(ids(source))
    assert drafter.offer(ids(source + answer[:5]), 0) is None  # read a little: nothing copied yet
    context = ids(source + answer)  # then a long stretch at once
    assert drafter.offer(context, 0) is not None
    assert len(drafter.out) <= CATCH_UP_CHARS + 5
    tail = source[len(answer) : len(answer) + 12]
    assert "".join(chr(t) for t in drafter.draft(context, 12, GREEDY, RNG).tokens) == tail


def test_text_lookup_reads_text_in_pieces_across_multibyte_characters() -> None:
    pieces = {1: "naïve".encode()[:3], 2: "naïve".encode()[3:], 3: b" caf\xc3", 4: b"\xa9", 5: b"=1"}
    drafter = TextLookupDrafter(lambda t: pieces.get(t, chr(t).encode()), lambda text: [ord(c) for c in text])
    prompt = ids("x:naïve café=1,naïve café=2")
    drafter.begin(prompt)
    context = [*prompt, *ids("x: "), 1, 2, 3, 4, 5]  # "x: naïve café=1", split inside both accents
    assert drafter.offer(context, 0) is not None
    assert "".join(chr(t) for t in drafter.draft(context, 20, GREEDY, RNG).tokens) == ",naïve café=2"


# -- on a model --


@pytest.fixture(scope="module")
def loop_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    path = write_tiny_model(
        tmp_path_factory.mktemp("text") / "loop.gguf", bigram=True, n_ctx_train=2048, loop="f(x,y)\n"
    )
    with Engine(engine_config(path, n_ctx=1024, n_threads=2)) as engine:
        yield engine


def run(engine: Engine, prompt: Sequence[int], spec: Speculation | None, n: int = 200) -> tuple[str, Stats]:
    if spec is None:
        return collect(generate(engine, prompt, GREEDY, max_tokens=n))
    return collect(spec.generate(engine, prompt, GREEDY, max_tokens=n))


def test_text_lookup_follows_a_respaced_copy_losslessly(loop_model: Engine) -> None:
    """The model writes `f(x,y)` lines; the prompt has them spaced out. Token
    lookup finds nothing in the prompt to copy, text lookup drafts the
    answer's spacing once it has learned it."""
    prompt = loop_model.tokenize("f( x , y )\n" * 40)
    expected, _ = run(loop_model, prompt, None)
    assert expected.startswith("f(x,y)\nf(x,y)\n")
    text_lookup = TextLookupDrafter.for_engine(loop_model)
    with Speculation([PromptLookupDrafter(), text_lookup], FixedController(1, 8)) as spec:
        text, stats = run(loop_model, prompt, spec)
    assert text == expected
    draft = stats.draft
    assert draft is not None and draft.drafter == "text-lookup"
    assert draft.accepted > 150 and draft.mean_accepted > 5
    with Speculation(lookup_drafters(loop_model)) as adaptive:  # on the real clock: the same text
        assert run(loop_model, prompt, adaptive)[0] == expected


def test_lookup_choice_opens_both_lookups(loop_model: Engine) -> None:
    spec = open_speculation(loop_model, "lookup")
    assert spec is not None
    assert [d.profile.name for d in spec.drafters] == ["lookup", "text-lookup"]
    spec.close()


def test_text_lookup_stops_at_a_token_that_renders_to_nothing() -> None:
    """A control token (a message's end) ends a stretch of source: a draft does not run across it."""
    drafter = TextLookupDrafter(lambda t: b"" if t == 0 else chr(t).encode(), lambda text: [ord(c) for c in text])
    prompt = [*ids("copy: alpha beta gamma"), 0, *ids("assistant"), 0]
    drafter.begin(prompt)
    context = [*prompt, *ids("alpha beta g")]
    assert drafter.offer(context, 0) is not None
    assert "".join(chr(t) for t in drafter.draft(context, 20, GREEDY, RNG).tokens) == "amma"
    end = [*context, *ids("amma")]
    assert drafter.offer(end, 0) is None
