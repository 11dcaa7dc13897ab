"""The run history without a model: records, search, figures, conversations,
and a database that is damaged, read-only, newer, or written by four processes at once."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from localrun import paths
from localrun.cli.logs import GROUP_KEYS
from localrun.errors import UsageError
from localrun.events import DoneEvent, DraftStats, Event, Stats, TokenEvent
from localrun.history import db, query
from localrun.history.record import Recorder, RunContext, logging_enabled, token_times_ms
from tests.helpers import cli


def context(**kw: Any) -> RunContext:
    return replace(RunContext("generate", model="tiny", kv="f16", draft="auto", cpu="test CPU"), **kw)


def events(text: list[str], gaps: list[float], stats: Stats | None = None) -> Iterator[Event]:
    """One TokenEvent per piece of text, each one token, ``gaps`` seconds apart after the first."""
    elapsed = 0.5
    for i, piece in enumerate(text):
        elapsed += gaps[i - 1] if i else 0.0
        yield TokenEvent(piece, i + 1, 0.5, elapsed, 10.0)
    yield DoneEvent(stats or Stats(7, len(text), 0.5, 10.0, elapsed, "eos"))


class Warnings(list[str]):
    def __call__(self, message: str) -> None:
        self.append(message)


def recorder(warn: Warnings | None = None, **kw: Any) -> Recorder:
    return Recorder(context(**kw), warn=warn if warn is not None else Warnings())


def record(
    prompt: str, *, rate: float = 10.0, draft: DraftStats | None = None, when: float | None = None, **kw: Any
) -> None:
    """One run in the history, as a command would log it."""
    rec = recorder(**kw)
    rec.add(Stats(5, 10, 0.2, rate, 1.0, "eos", draft=draft), prompt=prompt, response="reply", when=when)
    rec.flush(0)
    assert rec.written == 1


def rows() -> list[dict[str, object]]:
    with db.connect() as conn:
        return [dict(r) for r in conn.execute("SELECT * FROM runs ORDER BY id")]


def test_a_watched_run_is_recorded_with_its_figures_and_settings() -> None:
    settings = {"ctx": {"value": 256, "source": "option"}}
    draft = DraftStats("lookup", proposed=8, accepted=6, rounds=3)
    stats = Stats(7, 3, 0.5, 12.5, 0.9, "length", draft=draft, threads=2, valid=True, forced_tokens=0)
    rec = Recorder(context(settings=settings, ctx=256), warn=Warnings())
    seen = list(rec.watch(events(["Hel", "lo", "!"], [0.1, 0.3], stats), "say hi"))
    assert len(seen) == 4  # every event passes through
    assert not paths.history_db().exists()  # nothing written before flush
    rec.flush(0)
    (r,) = rows()
    assert (r["command"], r["model"], r["prompt"], r["response"]) == ("generate", "tiny", "say hi", "Hello!")
    assert (r["prompt_tokens"], r["generated_tokens"], r["ttft_s"], r["decode_tps"]) == (7, 3, 0.5, 12.5)
    assert (r["drafter"], r["drafted"], r["accepted"], r["threads"], r["ctx"]) == ("lookup", 8, 6, 2, 256)
    assert (r["stop_reason"], r["exit_status"], r["valid"], r["cpu"]) == ("length", 0, 1, "test CPU")
    assert r["token_p50_ms"] == pytest.approx(100) and r["token_p95_ms"] == pytest.approx(300)
    assert json.loads(str(r["settings"])) == settings


def test_time_per_token_shares_a_gap_among_the_tokens_of_one_event() -> None:
    tokens = [TokenEvent("a", 1, 0.1, 0.1, 0), TokenEvent("bcd", 4, 0.1, 0.4, 0), TokenEvent("e", 5, 0.1, 1.4, 0)]
    p50, p95 = token_times_ms(tokens)  # gaps: three tokens of 100 ms, one of 1000 ms
    assert p50 == pytest.approx(100) and p95 == pytest.approx(1000)
    assert token_times_ms(tokens[:1]) == (None, None)


def test_the_history_is_a_wal_database_synced_at_checkpoints() -> None:
    record("hello")
    with sqlite3.connect(paths.history_db()) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # stored in the file
    with db.connect() as conn:
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL: never OFF
        assert [r["prompt"] for r in conn.execute("SELECT prompt FROM runs")] == ["hello"]


def test_full_text_search_finds_words_in_prompts_and_responses() -> None:
    record("rename the variable foo")
    record("sort a list: foo")
    record('quote " and AND - (odd) *')
    with db.connect() as conn:
        found = {r["prompt"] for r in query.list_runs(conn, query.Filters(query="foo"))}
        assert found == {"rename the variable foo", "sort a list: foo"}
        assert [r["prompt"] for r in query.list_runs(conn, query.Filters(query="rename foo"))] == [
            "rename the variable foo"
        ]
        assert len(query.list_runs(conn, query.Filters(query='" AND (odd) *'))) == 1  # no FTS syntax error
        newest_first = [r["prompt"] for r in query.list_runs(conn, query.Filters(), limit=2)]
        assert newest_first == ['quote " and AND - (odd) *', "sort a list: foo"]


@pytest.fixture
def speeds() -> None:
    """kv f16 at 10, 20, 30 tok/s; kv q8_0 at 5, 15 tok/s, drafting with 50% acceptance."""
    for rate in (10.0, 20.0, 30.0):
        record("p", rate=rate, kv="f16", when=1_000_000.0 + rate * 10_000)
    for rate in (5.0, 15.0):
        record("p", rate=rate, kv="q8_0", draft=DraftStats("lookup", 4, 2, 2), when=2_000_000.0)


def test_stats_group_runs_and_give_medians_and_acceptance(speeds: None) -> None:
    with db.connect() as conn:
        groups = {g.key: g.summary() for g in query.group_stats(conn, ["kv"], query.Filters())}
        (everything,) = query.group_stats(conn, [], query.Filters())
    assert set(groups) == {("f16",), ("q8_0",)}
    assert (groups[("f16",)]["runs"], groups[("f16",)]["decode_tokens_per_s_p50"]) == (3, 20.0)
    assert (groups[("q8_0",)]["runs"], groups[("q8_0",)]["decode_tokens_per_s_p50"]) == (2, 10.0)
    assert groups[("f16",)]["acceptance"] is None and groups[("q8_0",)]["acceptance"] == 0.5
    assert everything.summary()["runs"] == 5


def test_compare_two_groups_and_two_date_ranges(speeds: None) -> None:
    with db.connect() as conn:
        a, b = query.compare(conn, query.selector("kv=f16"), query.selector("kv=q8_0"), query.Filters())
        assert (a.summary()["runs"], b.summary()["runs"]) == (3, 2)
        assert query.change(a.summary()["decode_tokens_per_s_p50"], b.summary()["decode_tokens_per_s_p50"]) == -0.5
        early = query.Filters(until=1_500_000.0)
        late = query.Filters(since=1_500_000.0)
        a, b = query.compare(conn, early, late, query.Filters())
        assert (a.summary()["runs"], b.summary()["runs"]) == (3, 2)
    res = cli("logs", "stats", "--compare", "kv=f16", "kv=q8_0", "--json")
    assert res.returncode == 0, res.stderr
    compared = json.loads(res.stdout)
    assert compared["change"]["decode_tokens_per_s_p50"] == -0.5 and compared["b"]["acceptance"] == 0.5
    by = cli("logs", "stats", "--by", "kv,draft")
    assert by.returncode == 0 and "q8_0" in by.stdout and "f16" in by.stdout


def test_selectors_and_keys_are_checked() -> None:
    assert query.selector("kv=q8_0,draft=none").equal == (("kv", "q8_0"), ("draft", "none"))
    assert query.selector("2026-12-01..").until is None
    with pytest.raises(UsageError):
        query.selector("kv")
    with pytest.raises(UsageError):
        query.selector("colour=blue")
    with pytest.raises(UsageError):
        query.parse_when("last tuesday")
    assert query.parse_when("2d", now=1_000_000.0) == 1_000_000.0 - 2 * 86400
    assert set(GROUP_KEYS.split(", ")) == set(query.GROUP_KEYS)  # --help lists every key


def test_the_chart_draws_a_line_per_group(speeds: None, tmp_path: Path) -> None:
    chart = tmp_path / "speed.svg"
    res = cli("logs", "stats", "--by", "kv", "--chart", str(chart))
    assert res.returncode == 0, res.stderr
    svg = chart.read_text()
    assert svg.startswith("<svg") and ">f16<" in svg and ">q8_0<" in svg
    assert svg.count("<polyline") == 1  # f16 has runs at three times; q8_0 at one (a dot)


def test_logs_json_names_each_quantity_as_the_done_event_does(speeds: None) -> None:
    (newest,) = json.loads(cli("logs", "-n", "1", "--json").stdout)
    assert newest["time"] == "1970-01-24T03:33:20.000+00:00"  # ISO 8601, UTC
    assert newest["decode_tokens_per_s"] == 15.0 and (newest["proposed"], newest["accepted"]) == (4, 2)
    assert "p50_token_ms" in newest and "p95_token_ms" in newest
    assert not {"decode_tps", "token_p50_ms", "token_p95_ms", "drafted"} & set(newest)
    shown = json.loads(cli("logs", "show", str(newest["id"]), "--json").stdout)
    assert shown["time"] == newest["time"] and shown["decode_tokens_per_s"] == 15.0
    assert shown["retry"] is False and "prompt_tokens_per_s" in shown
    (group,) = json.loads(cli("logs", "stats", "--json").stdout)
    assert (group["first"], group["last"]) == ("1970-01-13T17:33:20.000+00:00", newest["time"])
    assert group["decode_tokens_per_s_p50"] == 15.0 and "p95_token_ms_p95" in group


def test_a_run_as_json_decodes_what_the_history_keeps_as_text() -> None:
    row = {"time": 0.5, "settings": '{"ctx": {"value": 256}}', "thread_shares": "2:0.25,1:0.75", "valid": 1}
    assert query.as_json(row) == {
        "time": "1970-01-01T00:00:00.500+00:00",
        "settings": {"ctx": {"value": 256}},
        "thread_shares": {"2": 0.25, "1": 0.75},
        "valid": True,
    }


def test_logs_show_writes_values_as_the_options_do() -> None:
    from localrun.ui.history import run_text

    settings = {"ctx": {"value": None, "source": "default"}, "threads": {"value": 2, "source": "wisdom"}}
    text = run_text({"id": 7, "time": 0.0, "valid": 1, "settings": json.dumps(settings)})
    assert "  valid: yes" in text and "    ctx: auto [default]" in text and "    threads: 2 [wisdom]" in text
    assert "None" not in text and ": 1\n" not in text
    assert "  valid: no" in run_text({"id": 8, "valid": 0})


def test_logs_lists_shows_and_removes(speeds: None) -> None:
    listed = cli("logs", "-n", "2", "--json")
    ids = [r["id"] for r in json.loads(listed.stdout)]
    assert ids == [5, 4]
    shown = cli("logs", "show", "5")
    assert shown.returncode == 0 and "kv: q8_0" in shown.stdout and "acceptance: 50%" in shown.stdout
    assert cli("logs", "show", "99").returncode == 2
    assert cli("logs", "rm", "5").stdout.strip() == "removed 1 run"
    assert cli("logs", "rm", "--all").returncode == 2  # not without --yes off a terminal
    assert cli("logs", "rm", "--all", "--yes").stdout.strip() == "removed 4 runs"
    assert rows() == []
    with db.connect() as conn:
        assert query.list_runs(conn, query.Filters(query="p")) == []  # the search index forgot them too


def test_no_log_env_and_logs_off_write_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert logging_enabled() and not logging_enabled(no_log=True)
    monkeypatch.setenv("LOCALRUN_NO_LOG", "1")
    assert not logging_enabled()
    monkeypatch.delenv("LOCALRUN_NO_LOG")
    assert cli("logs", "off").returncode == 0
    assert not logging_enabled()
    rec = Recorder(context(), warn=Warnings(), enabled=logging_enabled())
    list(rec.watch(events(["a"], []), "p"))
    rec.flush(0)
    assert not paths.history_db().exists()
    assert cli("logs", "on").returncode == 0 and logging_enabled()


def test_a_damaged_file_is_moved_aside_and_a_new_one_started() -> None:
    history = paths.history_db()
    history.parent.mkdir(parents=True)
    history.write_bytes(b"this is not a database" * 100)
    warn = Warnings()
    rec = recorder(warn)
    list(rec.watch(events(["a"], []), "first"))
    rec.flush(0)
    assert len(warn) == 1 and "moved it to" in warn[0]
    aside = list(history.parent.glob("history.corrupt-*.db"))
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"this is not")
    assert [r["prompt"] for r in rows()] == ["first"]


def unwritable_data_dir() -> None:
    """The data folder read-only (for root, whom permissions do not stop: a file where the folder should be)."""
    data = paths.data_dir()
    if os.geteuid() == 0:
        data.parent.mkdir(parents=True, exist_ok=True)
        data.write_text("not a folder")
    else:
        data.mkdir(parents=True)
        data.chmod(0o555)


def test_a_history_that_cannot_be_written_warns_once() -> None:
    unwritable_data_dir()
    warn = Warnings()
    rec = recorder(warn)
    for prompt in ("one", "two"):
        list(rec.watch(events(["a"], []), prompt))
        rec.flush(0)  # never raises
    assert len(warn) == 1 and warn[0].startswith("this run was not logged")


def test_a_newer_schema_is_left_alone() -> None:
    with db.connect() as conn:
        conn.execute(f"PRAGMA user_version = {db.SCHEMA_VERSION + 1}")
    warn = Warnings()
    rec = recorder(warn)
    list(rec.watch(events(["a"], []), "p"))
    rec.flush(0)
    assert len(warn) == 1 and "newer localrun" in warn[0]


def test_the_schema_migrates_forward_keeping_the_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    record("kept")
    monkeypatch.setattr(db, "MIGRATIONS", (*db.MIGRATIONS, ("ALTER TABLE runs ADD COLUMN note TEXT",)))
    monkeypatch.setattr(db, "SCHEMA_VERSION", len(db.MIGRATIONS))
    with db.connect() as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == db.SCHEMA_VERSION
        assert [tuple(r) for r in conn.execute("SELECT prompt, note FROM runs")] == [("kept", None)]


WRITER = textwrap.dedent(
    """
    import sys
    from localrun.events import Stats
    from localrun.history.record import Recorder, RunContext

    context = RunContext("generate", model="w" + sys.argv[1], cpu="test CPU")
    warnings = []
    for i in range(int(sys.argv[2])):
        rec = Recorder(context, warn=warnings.append)
        rec.add(Stats(1, 1, 0.1, 1.0, 0.1, "eos"), prompt=f"{sys.argv[1]}-{i}", response="r")
        rec.flush(0)
    print("\\n".join(warnings))
    """
)


def test_four_concurrent_writers_lose_no_record() -> None:
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(n), "25"], stdout=subprocess.PIPE, text=True)
        for n in range(4)
    ]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0]
    assert all(not o.strip() for o in outputs), outputs
    prompts = sorted(str(r["prompt"]) for r in rows())
    assert prompts == sorted(f"{n}-{i}" for n in range(4) for i in range(25))


@dataclass
class Turn:
    user: str
    reply: str = ""


def chat_turn(rec: Recorder, turns: list[Turn], text: str) -> None:
    """What a chat command does per turn: the session appends the turn, the recorder watches its reply."""
    turns.append(Turn(text))
    for ev in rec.watch_turn(turns, events([f"re: {text}"], []), system=None):
        if isinstance(ev, TokenEvent):
            turns[-1].reply += ev.text
    rec.flush(0)


def test_a_conversation_is_linked_and_resumed_with_retries_replaced() -> None:
    rec = recorder(command="chat")
    turns: list[Turn] = []
    chat_turn(rec, turns, "one")
    chat_turn(rec, turns, "two")
    turns.pop()  # /retry: the session forgets the last reply and asks again
    chat_turn(rec, turns, "two again")
    turns.pop(0)  # the oldest turn dropped to fit the context: still the same conversation
    chat_turn(rec, turns, "three")
    with db.connect() as conn:
        found = query.last_conversation(conn)
    assert found is not None
    conversation_id, _system, logged = found
    assert [(t.user, t.reply) for t in logged] == [
        ("one", "re: one"),
        ("two again", "re: two again"),
        ("three", "re: three"),
    ]
    assert {r["conversation_id"] for r in rows()} == {conversation_id}

    turns.clear()  # /clear: a new conversation
    chat_turn(rec, turns, "fresh")
    chat_turn(rec, turns, "more")
    with db.connect() as conn:
        found = query.last_conversation(conn)
    assert found is not None and found[0] != conversation_id
    assert [t.user for t in found[2]] == ["fresh", "more"]

    resumed = recorder(command="chat")  # chat --continue: the next turn joins that conversation
    old = [Turn(t.user, t.reply) for t in found[2]]
    resumed.resume(found[0], old)
    chat_turn(resumed, old, "after a restart")
    with db.connect() as conn:
        again = query.last_conversation(conn)
    assert again is not None and again[0] == found[0]
    assert [t.user for t in again[2]] == ["fresh", "more", "after a restart"]


def test_a_conversation_that_began_from_a_file_keeps_its_turns() -> None:
    """`chat --load FILE`, a turn, then `chat -c`: the loaded turns come back before the new one."""
    rec = recorder(command="chat")
    turns = [Turn("loaded one", "first reply"), Turn("loaded two", "second reply"), Turn("new")]
    for ev in rec.watch_turn(turns, events(["re: new"], []), system="be brief"):
        if isinstance(ev, TokenEvent):
            turns[-1].reply += ev.text
    rec.flush(0)
    chat_turn(rec, turns, "newer")  # the same conversation goes on
    with db.connect() as conn:
        found = query.last_conversation(conn)
    assert found is not None
    _, system, logged = found
    assert system == "be brief"
    assert [(t.user, t.reply) for t in logged][:3] == [
        ("loaded one", "first reply"),
        ("loaded two", "second reply"),
        ("new", "re: new"),
    ]
    assert [t.user for t in logged] == ["loaded one", "loaded two", "new", "newer"]
    assert len(rows()) == 2  # the loaded turns are the conversation's, not runs of it


@pytest.mark.parametrize(
    ("model", "model_file", "remote", "reference"),
    [
        ("qwen2.5-coder:0.5b", "/store/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", None, "qwen2.5-coder:0.5b"),
        ("my.gguf", "/models/my.gguf", None, "/models/my.gguf"),  # a path given: the path, not its name
        (
            "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF:Q4_K_M",
            "/store/x.gguf",
            None,
            "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF:Q4_K_M",
        ),
        ("qwen-0.5b", None, "http://gpu-box:8000/v1", None),  # a remote's: nothing to load here
    ],
)
def test_a_conversations_model_is_what_m_takes(
    model: str, model_file: str | None, remote: str | None, reference: str | None
) -> None:
    rec = recorder(command="chat", model=model, model_file=model_file, remote=remote)
    chat_turn(rec, [], "one")
    with db.connect() as conn:
        found = query.last_conversation(conn)
        assert found is not None
        assert query.conversation_model(conn, found[0]) == reference


def test_reading_a_damaged_history_moves_it_aside() -> None:
    history = paths.history_db()
    history.parent.mkdir(parents=True)
    history.write_bytes(b"garbage" * 1000)
    res = cli("logs")
    assert res.returncode == 0 and "moved it to" in res.stderr
    assert not history.exists() or sqlite3.connect(history).execute("PRAGMA user_version").fetchone()


def test_a_run_whose_thread_count_changed_is_not_counted_as_its_last_count() -> None:
    """A run that started on 2 threads and dropped to 1 is logged with the share
    of steps at each: comparing threads=1 with threads=2 compares runs that
    stayed at one count, and the changed ones group as "mixed"."""
    for shares, threads, rate in (({2: 0.25, 1: 0.75}, 1, 5.0), ({1: 1.0}, 1, 20.0), ({2: 1.0}, 2, 10.0)):
        rec = recorder()
        stats = Stats(5, 10, 0.2, rate, 1.0, "eos", threads=threads, thread_shares=shares)
        rec.add(stats, prompt="p", response="r")
        rec.flush(0)
    assert [r["thread_shares"] for r in rows()] == ["2:0.25,1:0.75", "1:1", "2:1"]
    with db.connect() as conn:
        one, two = query.compare(conn, query.selector("threads=1"), query.selector("threads=2"), query.Filters())
        groups = {g.key: g.runs for g in query.group_stats(conn, ("threads",), query.Filters())}
    assert (one.runs, two.runs) == (1, 1)
    assert one.rates == [20.0]  # not with the run that spent a quarter of its steps on 2 threads
    assert groups == {("1",): 1, ("2",): 1, ("mixed",): 1}
