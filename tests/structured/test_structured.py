"""--schema and --grammar: checked before the model loads, enforced by
llguidance's masks on a real (tiny) model, and the result validated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llguidance
import numpy as np
import pytest

from localrun.errors import UsageError
from localrun.runtime.engine import Engine
from localrun.runtime.generate import generate
from localrun.runtime.sampling import SamplingParams
from localrun.speculative import Speculation, lookup_drafters
from localrun.speculative.control import FixedController
from localrun.speculative.draftmodel import DraftModelDrafter
from localrun.structured.constraint import Constraint
from localrun.structured.spec import OutputSpec, concise_schema, parse_grammar, parse_schema, schema_spec
from tests.helpers import cli, collect, engine_config


def test_the_concise_form() -> None:
    schema = concise_schema("name, age int, tags list[str], kind cat|dog, ok bool, score float")
    assert schema["required"] == ["name", "age", "tags", "kind", "ok", "score"]
    assert schema["properties"]["age"] == {"type": "integer"}
    assert schema["properties"]["tags"] == {"type": "array", "items": {"type": "string"}}
    assert schema["properties"]["kind"] == {"enum": ["cat", "dog"]}
    assert schema["additionalProperties"] is False
    with pytest.raises(UsageError, match="unknown type 'integer!'"):
        concise_schema("age integer!")
    with pytest.raises(UsageError, match="given twice"):
        concise_schema("a, a int")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('{"type": "object",', "not valid JSON"),
        ('{"type": "objec"}', "not a valid JSON Schema at type"),
        ('{"type": "string", "format": "zzz"}', "zzz"),
        ("[1, 2]", "a JSON Schema is an object"),
    ],
)
def test_an_unusable_schema_is_a_usage_error(value: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_schema(value)


def test_schema_from_a_file_and_grammars(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text('{"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}')
    assert parse_schema(str(path)).schema == json.loads(path.read_text())
    gbnf, lark, bad = tmp_path / "g.gbnf", tmp_path / "g.lark", tmp_path / "bad.gbnf"
    gbnf.write_text('root ::= "yes" | "no"\n')
    lark.write_text('start: "x" NUM\nNUM: /[0-9]+/\n')
    bad.write_text("root ::= missing\n")
    assert parse_grammar(gbnf).kind == parse_grammar(lark).kind == "grammar"
    with pytest.raises(UsageError, match="missing"):
        parse_grammar(bad)


def test_a_bad_schema_fails_before_the_model_loads() -> None:
    res = cli("generate", "-m", "/nonexistent/model.gguf", "--schema", '{"type": "objec"}', "hi")
    assert res.returncode == 2 and "not a valid JSON Schema" in res.stderr


def _run(model: Path, *args: str) -> tuple[int, str, dict[str, Any]]:
    res = cli("generate", "-m", str(model), "--json", *args, "Describe a pet.")
    events = [json.loads(line) for line in res.stdout.splitlines()]
    text = "".join(str(e["text"]) for e in events if e["type"] == "token")
    return res.returncode, text, events[-1]


@pytest.mark.parametrize("temperature", ["0", "1.0"])
def test_the_output_follows_the_schema(tiny_model: Path, temperature: str) -> None:
    code, text, done = _run(
        tiny_model, "--schema", "kind cat|dog, n int", "-n", "200", "--temperature", temperature, "--seed", "3"
    )
    assert code == 0, done
    record = json.loads(text)
    assert record["kind"] in ("cat", "dog") and isinstance(record["n"], int) and set(record) == {"kind", "n"}
    assert done["valid"] is True and done["stop_reason"] == "eos"
    assert isinstance(done["forced_tokens"], int) and done["forced_tokens"] > 0  # the keys, the braces


def test_cut_short_is_kept_and_said(tiny_model: Path) -> None:
    res = cli("generate", "-m", str(tiny_model), "--schema", "kind cat|dog, n int", "-n", "3", "-t", "0", "hi")
    assert res.returncode == 9 and res.stdout.startswith("{") and "cut it short" in res.stderr
    code, _text, done = _run(tiny_model, "--schema", "kind cat|dog, n int", "-n", "3")
    assert code == 9 and done["valid"] is False and done["stop_reason"] == "length"


def test_the_output_follows_a_grammar(tiny_model: Path, tmp_path: Path) -> None:
    grammar = tmp_path / "yn.gbnf"
    grammar.write_text('root ::= "yes" | "no"\n')
    code, text, done = _run(tiny_model, "--grammar", str(grammar), "-n", "50", "--temperature", "0.8", "--seed", "1")
    assert code == 0 and text in ("yes", "no") and done["valid"] is True


def test_schema_and_grammar_together_are_refused(tiny_model: Path) -> None:
    res = cli("generate", "-m", str(tiny_model), "--schema", "a", "--grammar", "g.gbnf", "hi")
    assert res.returncode == 2


@pytest.mark.parametrize("spec", ["lookup", "auto"])
def test_speculation_under_a_schema_gives_the_same_text(tiny_model: Path, spec: str) -> None:
    """Drafts are cut at the first token the grammar rejects and each verify
    row is masked: greedy, the text is the one plain decoding gives."""
    prompt = "[1, 2, 3, 1, 2, 3, 1, 2, 3] repeat: [1, 2, 3, 1, 2, 3"
    schema = '{"type": "array", "items": {"type": "integer"}, "maxItems": 30}'
    args = ("--schema", schema, "-n", "80", "-t", "0", "--raw")
    plain = cli("generate", "-m", str(tiny_model), "--spec", "none", "--json", *args, prompt)
    speculative = cli("generate", "-m", str(tiny_model), "--spec", spec, "--json", *args, prompt)
    assert plain.returncode == speculative.returncode
    texts = []
    for res in (plain, speculative):
        events = [json.loads(line) for line in res.stdout.splitlines()]
        texts.append("".join(e["text"] for e in events if e["type"] == "token"))
        assert events[-1]["valid"] is (res.returncode == 0)
    assert texts[0] == texts[1]
    done = json.loads(speculative.stdout.splitlines()[-1])
    assert "draft" in done


def test_chat_replies_follow_the_schema(tiny_model: Path) -> None:
    res = cli("chat", "-m", str(tiny_model), "--schema", "kind cat|dog", "--json", "-n", "60", input="hi\nagain\n")
    assert res.returncode == 0, res.stderr
    events = [json.loads(line) for line in res.stdout.splitlines()]
    for turn in (1, 2):
        text = "".join(e["text"] for e in events if e["type"] == "token" and e["turn"] == turn)
        done = next(e for e in events if e["type"] == "done" and e["turn"] == turn)
        assert json.loads(text)["kind"] in ("cat", "dog") and done["valid"] is True


def test_the_schema_command_of_a_chat(tiny_model: Path) -> None:
    import io

    from rich.console import Console

    from localrun.cli.repl import Repl
    from localrun.runtime.chat import ChatSession
    from localrun.runtime.engine import Engine
    from localrun.runtime.prompt import chat_template
    from localrun.runtime.sampling import SamplingParams

    with Engine(engine_config(tiny_model, n_ctx=512)) as engine:
        session = ChatSession(engine, chat_template(engine, None), SamplingParams(temperature=0))
        repl = Repl(session, Console(file=io.StringIO()), history=tiny_model.parent / "history")
        repl._command("/schema kind a|b")
        assert session.output is not None and session.output.schema is not None
        assert session.output.schema["properties"] == {"kind": {"enum": ["a", "b"]}}
        repl._command("/schema off")
        assert session.output is None


def test_batch_lines_follow_their_own_schema(tiny_model: Path, tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    lines = [
        {
            "id": "a",
            "prompt": "one",
            "schema": {
                "type": "object",
                "properties": {"x": {"enum": ["p", "q"]}},
                "required": ["x"],
                "additionalProperties": False,
            },
        },
        {"id": "b", "prompt": "two", "schema": "kind cat|dog"},
        {
            "id": "c",
            "prompt": "three",
            "response_format": {"type": "json_schema", "json_schema": {"schema": {"enum": ["yes", "no"]}}},
        },
        {"id": "d", "prompt": "four"},
        {"id": "e", "prompt": "five", "schema": {"type": "objec"}},
        {"id": "f", "prompt": "six", "response_format": {"type": "xml"}},
    ]
    src.write_text("".join(json.dumps(line) + "\n" for line in lines))
    res = cli("generate", "-m", str(tiny_model), "--batch", str(src), "-n", "60", "-t", "0")
    assert res.returncode == 8, res.stderr  # e and f cannot run
    records = {r["id"]: r for r in map(json.loads, res.stdout.splitlines())}
    assert json.loads(records["a"]["text"])["x"] in ("p", "q") and records["a"]["valid"] is True
    assert json.loads(records["b"]["text"])["kind"] in ("cat", "dog") and records["b"]["valid"] is True
    assert json.loads(records["c"]["text"]) in ("yes", "no") and records["c"]["valid"] is True
    assert "valid" not in records["d"]
    assert "not a valid JSON Schema" in records["e"]["error"] and "xml" in records["f"]["error"]


def test_batch_with_the_command_lines_schema(tiny_model: Path, tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("one\ntwo\n")
    res = cli("generate", "-m", str(tiny_model), "--batch", str(src), "--schema", "kind cat|dog", "-n", "60")
    assert res.returncode == 0, res.stderr
    assert all(json.loads(r["text"])["kind"] in ("cat", "dog") for r in map(json.loads, res.stdout.splitlines()))
    cut = cli("generate", "-m", str(tiny_model), "--batch", str(src), "--schema", "kind cat|dog", "-n", "2")
    assert cut.returncode == 9 and all(json.loads(r)["valid"] is False for r in cut.stdout.splitlines())


def test_a_fixed_text_is_forced_not_sampled(tiny_model: Path, tmp_path: Path) -> None:
    grammar = tmp_path / "fixed.lark"
    grammar.write_text('start: "hello, structured world"\n')
    for temperature in ("0", "1.5"):
        code, text, done = _run(tiny_model, "--grammar", str(grammar), "-n", "100", "--temperature", temperature)
        assert code == 0 and text == "hello, structured world" and done["valid"] is True
        # jump-forward: every token of the text (then the end of generation, the one token allowed: not text)
        assert done["forced_tokens"] == done["generated_tokens"]


def test_json_is_one_line_with_its_separators_forced(tiny_model: Path) -> None:
    """No choice of whitespace: the layout of Python's json.dumps, every key and separator forced."""
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}}, "required": ["a", "b"], "additionalProperties": false}'  # noqa: E501
    for seed in range(3):
        code, text, done = _run(tiny_model, "--schema", schema, "-n", "200", "--temperature", "1", "--seed", str(seed))
        assert code == 0, text
        assert json.dumps(json.loads(text)) == text
        assert done["forced_tokens"] >= 4  # at least {"a": and , "b": [


def _fixed(engine: Engine, text: str) -> Constraint:
    return Constraint(engine, OutputSpec("grammar", llguidance.LLMatcher.grammar_from_lark(f'start: "{text}"\n')))


def test_the_draft_model_drafts_under_the_mask(tiny_model: Path) -> None:
    """A draft model's tokens follow the grammar (the tiny model left alone
    never writes this text), and drafting leaves the output's state as it was."""
    with Engine(engine_config(tiny_model, n_ctx=512, n_threads=2)) as engine:
        drafter = DraftModelDrafter(tiny_model, engine, eager=True, p_min=0.0)
        try:
            context = engine.tokenize("the fixed text:")
            drafter.begin(context)
            constraint = _fixed(engine, "hello, structured world")
            greedy = SamplingParams(temperature=0.0)
            for sampling in (greedy, SamplingParams(temperature=1.0, seed=3)):
                rng = np.random.default_rng(0)
                draft = drafter.draft(context, 6, sampling, rng, constraint.fork())
                spelled = engine.detokenize(draft.tokens)
                assert len(draft.tokens) == 6 and "hello, structured world".startswith(spelled), spelled
            free = engine.detokenize(drafter.draft(context, 6, greedy, np.random.default_rng(0)).tokens)
            assert not "hello, structured world".startswith(free)
            assert constraint.allowed_prefix(draft.tokens) == 6  # the output's state did not move
        finally:
            drafter.close()


def test_a_self_draft_under_a_schema_is_always_accepted(tiny_model: Path) -> None:
    """The target drafting for itself under the mask proposes the target's own
    masked choices: every draft is kept, with the forced tokens riding ahead of
    it in the batch, and the text is plain decoding's."""
    schema = schema_spec(concise_schema("name, size int, tags list[str], kind cat|dog"), "test")
    greedy = SamplingParams(temperature=0.0)
    with Engine(engine_config(tiny_model, n_ctx=1024, n_threads=2)) as engine:
        prompt = engine.tokenize("describe a pet as JSON")
        plain, plain_stats = collect(
            generate(engine, prompt, greedy, max_tokens=120, constraint=Constraint(engine, schema))
        )
        drafter = DraftModelDrafter(tiny_model, engine, eager=True, p_min=0.0)
        with Speculation([drafter], FixedController(0, 4)) as spec:
            events = spec.generate(engine, prompt, greedy, max_tokens=120, constraint=Constraint(engine, schema))
            text, stats = collect(events)
    assert text == plain and stats.valid is plain_stats.valid
    assert stats.forced_tokens == plain_stats.forced_tokens and (stats.forced_tokens or 0) > 5
    assert stats.draft is not None and stats.draft.proposed > 10 and stats.draft.accepted == stats.draft.proposed


PET = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 30},
        "weight": {"type": "number"},
        "kind": {"enum": ["cat", "dog", "axolotl"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3},
        "owner": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 6}, "adult": {"type": "boolean"}},
            "required": ["name", "adult"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "kind", "tags", "owner"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("speculative", [False, True])
def test_every_seed_at_temperature_one_validates(tiny_model: Path, speculative: bool) -> None:
    """A tiny random model sampling hot writes nothing sensible, yet every
    output parses and validates: the mask, not the model, keeps it in shape."""
    import jsonschema

    spec = schema_spec(PET, "test")
    with Engine(engine_config(tiny_model, n_ctx=1024, n_threads=2)) as engine:
        prompt = engine.tokenize("a pet as JSON:")
        for seed in range(12):
            sampling = SamplingParams(temperature=1.0, seed=seed)
            constraint = Constraint(engine, spec)
            if speculative:
                with Speculation(lookup_drafters(engine), FixedController(0, 3)) as spec_run:
                    text, stats = collect(
                        spec_run.generate(engine, prompt, sampling, max_tokens=400, constraint=constraint)
                    )
            else:
                text, stats = collect(generate(engine, prompt, sampling, max_tokens=400, constraint=constraint))
            assert stats.valid is True and stats.stop_reason == "eos", (seed, text, stats.invalid)
            jsonschema.validate(json.loads(text), PET)
