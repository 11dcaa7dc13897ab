"""Every command with every bad path it can be given or meets on disk.

Each case names a file a command reads (config.toml, models.toml, a chat
save, the run history, wisdom, a batch file, a schema or grammar, a model)
or a path it writes (an output, a chart, the cache, the history), makes it
bad in one way (missing, a folder, empty, not UTF-8, cut short, unreadable;
for writes: no folder, a file where the folder should be, a folder where the
file should be, read-only), and says what must happen: the exit code, a one-line
`error:` naming the path (or, where the command can go on, a `warning:` naming
it and exit 0), never a traceback, nothing lost.

The commands come from the Typer app itself: a new command without cases
fails `test_every_command_has_cases`.
"""

from __future__ import annotations

import errno
import io
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.core import TyperGroup

from localrun import paths
from localrun.cli import app
from localrun.cli._errors import ExitCode
from tests.helpers import cli, cli_process
from tests.tinymodel import write_tiny_model

# ------------------------------------------------------------------ world --


class Deny:
    """Injected PermissionError (we run as root: mode bits stop nothing) for
    opening paths under ``prefix``; ``writes`` only: opening for writing."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch

    def __call__(self, prefix: Path, *, writes: bool = False) -> None:
        target = str(prefix)
        real_os_open, real_io_open = os.open, io.open

        def hit(path: Any, writing: bool) -> bool:
            try:
                name = os.fspath(path)
            except TypeError:  # a file descriptor
                return False
            name = str(Path(name if isinstance(name, str) else name.decode()).absolute())
            return (name == target or name.startswith(target + os.sep)) and (writing or not writes)

        def os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            if hit(path, bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))):
                raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
            return real_os_open(path, flags, *args, **kwargs)

        def io_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            if hit(file, any(c in mode for c in "wax+")):
                raise PermissionError(errno.EACCES, "Permission denied", os.fspath(file))
            return real_io_open(file, mode, *args, **kwargs)

        self.monkeypatch.setattr(os, "open", os_open)
        self.monkeypatch.setattr(io, "open", io_open)


@dataclass
class World:
    """The paths a case works with; everything under the test's tmp folder."""

    tmp: Path
    model: Path
    deny: Deny

    @property
    def home(self) -> Path:
        return Path(os.environ["LOCALRUN_HOME"])

    @property
    def config_toml(self) -> Path:
        return paths.config_dir() / "config.toml"

    @property
    def models_toml(self) -> Path:
        return paths.config_dir() / "models.toml"

    @property
    def history(self) -> Path:
        return paths.history_db()

    @property
    def wisdom(self) -> Path:
        return paths.cache_dir() / "wisdom.json"

    def bad(self, path: Path, kind: str) -> Path:
        """``path`` made bad in the way ``kind`` says (a file to read)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "folder":
            path.mkdir()
        elif kind == "empty":
            path.write_bytes(b"")
        elif kind == "not_utf8":
            path.write_bytes(b"\xff\xfe\x00 not text \x80\x81")
        elif kind == "truncated":
            path.write_text(TRUNCATED.get(path.suffix, '{"messages": [{"role": "us'), encoding="utf-8")
        elif kind == "unreadable":
            path.write_text(GOOD.get(path.suffix, "hello\n"), encoding="utf-8")
            self.deny(path)
        elif kind != "missing":
            raise ValueError(kind)
        return path

    def bad_place(self, path: Path, kind: str) -> Path:
        """``path`` made a bad place to write in the way ``kind`` says."""
        if kind == "no_parent":
            return self.tmp / "no" / "such" / "folder" / path.name
        if kind == "file_as_parent":
            (self.tmp / "a-file").write_text("x")
            return self.tmp / "a-file" / path.name
        if kind == "folder":
            path.mkdir(parents=True, exist_ok=True)
            return path
        if kind == "read_only":
            path.parent.mkdir(parents=True, exist_ok=True)
            self.deny(path.parent, writes=True)
            return path
        raise ValueError(kind)


TRUNCATED = {".toml": "[defaults]\nthreads = ", ".json": '{"type": "object", "properties": {"a', ".gbnf": 'root ::= "a'}
GOOD = {".toml": "", ".json": '{"type": "object"}', ".jsonl": '{"prompt": "hi"}\n'}

READ_KINDS = ("missing", "folder", "empty", "not_utf8", "truncated", "unreadable")
CONFIG_KINDS = ("folder", "not_utf8", "truncated", "unreadable")  # a missing or empty config.toml is no config
WRITE_KINDS = ("no_parent", "file_as_parent", "folder", "read_only")


@dataclass
class Expect:
    """What a case runs and what must come of it."""

    args: list[str]
    code: int
    names: Path | str | None  # what the one line must name (a path, or a part of it)
    input: str | None = None
    warns: bool = False  # exit 0 is right, with a warning naming the path
    kept: Callable[[], None] | None = None  # checks that nothing was lost
    stdout: str | None = None  # must appear on stdout (text produced before a failed write)


Case = Callable[[World], Expect]


@dataclass
class Cases:
    """Named cases per command path ("logs stats")."""

    by_command: dict[str, dict[str, Case]] = field(default_factory=dict)

    def add(self, command: str, name: str, case: Case) -> None:
        self.by_command.setdefault(command, {})[name] = case


CASES = Cases()
GEN = ["-n", "3", "-t", "0", "--no-prompt-cache"]


def model_args(w: World) -> list[str]:
    return ["-m", str(w.model)]


# --------------------------------------------------------- config.toml --

_CONFIG_USERS: dict[str, Callable[[World], tuple[list[str], str | None]]] = {
    "generate": lambda w: ([*model_args(w), *GEN, "hi"], None),
    "chat": lambda w: ([*model_args(w), "-n", "2"], "hi\n"),
    "serve": lambda w: ([*model_args(w), "--port", "0"], None),
    "bench": lambda w: ([*model_args(w), "--quick", "-n", "2", "--rounds", "1"], None),
    "doctor": lambda w: ([], None),
    "launch": lambda w: (["claude", "--config"], None),  # the model from config.toml
}


def _config_case(command: str, kind: str) -> Case:
    def case(w: World) -> Expect:
        args, stdin = _CONFIG_USERS[command](w)
        path = w.bad(w.config_toml, kind)
        return Expect(args, ExitCode.BAD_CONFIG, path, input=stdin)

    return case


for _command in _CONFIG_USERS:
    for _kind in CONFIG_KINDS:
        CASES.add(_command, f"config.toml-{_kind}", _config_case(_command, _kind))


# --------------------------------------------------------- models.toml --

_REGISTRY_USERS: dict[str, Callable[[World], list[str]]] = {
    "generate": lambda w: ["-m", "qwen2.5-coder:0.5b", "--offline", "hi"],
    "chat": lambda w: ["-m", "qwen2.5-coder:0.5b", "--offline"],
    "serve": lambda w: ["-m", "qwen2.5-coder:0.5b", "--offline"],
    "pull": lambda w: ["qwen2.5-coder:0.5b", "--no-tune"],
    "list": lambda w: [],
    "rm": lambda w: ["qwen2.5-coder:0.5b", "-y"],
    "show": lambda w: ["qwen2.5-coder:0.5b"],
    "template": lambda w: ["-m", "qwen2.5-coder:0.5b", "hi"],
    "bench": lambda w: ["-m", "qwen2.5-coder:0.5b", "--offline"],
    "tune": lambda w: ["qwen2.5-coder:0.5b", "--offline"],
    "doctor": lambda w: [],
}


def _registry_case(command: str, kind: str) -> Case:
    def case(w: World) -> Expect:
        path = w.bad(w.models_toml, kind)
        return Expect(_REGISTRY_USERS[command](w), ExitCode.BAD_CONFIG, path)

    return case


for _command in _REGISTRY_USERS:
    for _kind in CONFIG_KINDS:
        CASES.add(_command, f"models.toml-{_kind}", _registry_case(_command, _kind))


# -------------------------------------------------------------- models --

_MODEL_USERS: dict[str, Callable[[Path], list[str]]] = {
    "generate": lambda p: ["-m", str(p), "hi"],
    "chat": lambda p: ["-m", str(p)],
    "run": lambda p: [str(p), "hi"],
    "serve": lambda p: ["-m", str(p)],
    "show": lambda p: [str(p)],
    "template": lambda p: ["-m", str(p), "hi"],
    "bench": lambda p: ["-m", str(p)],
    "tune": lambda p: [str(p)],
    "quantize": lambda p: [str(p), str(p.with_name("out.gguf")), "--type", "q8_0"],
    "embed": lambda p: ["-m", str(p)],
}
_MODEL_STDIN = {"embed": "hello\n"}  # embed reads its inputs first
_MODEL_CODES = {
    "missing": ExitCode.MODEL_NOT_FOUND,
    "folder": ExitCode.BAD_MODEL,
    "empty": ExitCode.BAD_MODEL,
    "truncated": ExitCode.BAD_MODEL,
    "unreadable": ExitCode.BAD_MODEL,
}


def _model_case(command: str, kind: str) -> Case:
    def case(w: World) -> Expect:
        path = w.tmp / "models" / "bad.gguf"
        if kind == "truncated":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(w.model.read_bytes()[:3000])
        else:
            w.bad(path, kind)
        return Expect(_MODEL_USERS[command](path), _MODEL_CODES[kind], path, input=_MODEL_STDIN.get(command))

    return case


for _command in _MODEL_USERS:
    for _kind in _MODEL_CODES:
        CASES.add(_command, f"model-{_kind}", _model_case(_command, _kind))


# ---------------------------------------------------- generate's inputs --


def _batch_case(kind: str) -> Case:
    def case(w: World) -> Expect:
        path = w.bad(w.tmp / "prompts.jsonl", kind)
        code = {"missing": 2, "folder": 2, "unreadable": 1}.get(kind, 0)
        return Expect([*model_args(w), *GEN, "--batch", str(path)], code, path if code else None)

    return case


for _kind in ("missing", "folder", "unreadable"):
    CASES.add("generate", f"batch-{_kind}", _batch_case(_kind))


def _prompt_file_case(kind: str) -> Case:
    def case(w: World) -> Expect:
        path = w.bad(w.tmp / "prompt.txt", kind)
        return Expect([*model_args(w), *GEN, "-f", str(path)], ExitCode.USAGE, path)

    return case


for _kind in ("missing", "folder", "not_utf8", "unreadable"):
    CASES.add("generate", f"prompt-file-{_kind}", _prompt_file_case(_kind))


def _spec_case(command: str, flag: str, kind: str) -> Case:
    def case(w: World) -> Expect:
        path = w.bad(w.tmp / ("schema.json" if flag == "--schema" else "grammar.gbnf"), kind)
        args = (
            [*model_args(w), *GEN, flag, str(path), "hi"]
            if command == "generate"
            else [*model_args(w), flag, str(path)]
        )
        return Expect(args, ExitCode.USAGE, path, input="hi\n")

    return case


for _command in ("generate", "chat"):
    for _flag in ("--schema", "--grammar"):
        for _kind in ("missing", "folder", "empty", "not_utf8", "truncated", "unreadable"):
            CASES.add(_command, f"{_flag[2:]}-{_kind}", _spec_case(_command, _flag, _kind))


def _template_file_case(command: str, kind: str) -> Case:
    def case(w: World) -> Expect:
        path = w.bad(w.tmp / "chat.jinja", kind)
        tail = {"generate": [*GEN, "hi"], "template": ["hi"], "serve": ["--port", "0"]}.get(command, [])
        return Expect([*model_args(w), "--template", str(path), *tail], ExitCode.USAGE, path, input="hi\n")

    return case


for _command in ("template", "generate", "chat", "serve"):
    for _kind in ("missing", "folder", "empty", "not_utf8", "unreadable"):
        CASES.add(_command, f"template-file-{_kind}", _template_file_case(_command, _kind))


def _mcp_case(command: str, kind: str) -> Case:
    """A bad --mcp file: `tools`, with nothing else to list, fails naming it; a run
    goes on without its tools, a warning naming it."""

    def case(w: World) -> Expect:
        path = w.bad(w.tmp / "mcp.json", kind)
        if command == "tools":
            return Expect(["--mcp", str(path)], ExitCode.USAGE, path)
        return Expect([*model_args(w), *GEN, "--mcp", str(path), "hi"], ExitCode.OK, path, warns=True)

    return case


for _command in ("tools", "generate"):
    for _kind in READ_KINDS:
        CASES.add(_command, f"mcp-{_kind}", _mcp_case(_command, _kind))


def _resume_case(kind: str) -> Case:
    def case(w: World) -> Expect:
        path = w.bad_place(w.tmp / "results.jsonl", kind)
        code = ExitCode.ERROR if kind == "read_only" else ExitCode.USAGE
        return Expect([*model_args(w), *GEN, "--batch", "-", "--resume", str(path)], code, path, input="hi\n")

    return case


for _kind in WRITE_KINDS:
    CASES.add("generate", f"resume-{_kind}", _resume_case(_kind))


# -------------------------------------------------- the run history --


def _history_kinds(w: World, kind: str) -> Path:
    """A bad history.db: a folder (cannot be opened), or a file that is not SQLite."""
    if kind == "not_sqlite":
        return w.bad(w.history, "truncated")
    if kind == "truncated_db":
        assert cli("generate", *model_args(w), *GEN, "hi").returncode == 0  # a real history with one run
        data = w.history.read_bytes()
        w.history.write_bytes(data[: len(data) // 2])
        for extra in ("-wal", "-shm"):
            w.history.with_name(w.history.name + extra).unlink(missing_ok=True)
        return w.history
    return w.bad(w.history, kind)


def _moved_aside(w: World) -> Callable[[], None]:
    def check() -> None:
        aside = list(w.history.parent.glob("history.corrupt-*.db"))
        assert len(aside) == 1 and aside[0].stat().st_size > 0, "the damaged history was not kept"

    return check


_LOGS_ARGS: dict[str, list[str]] = {
    "logs": [],
    "logs show": ["1"],
    "logs stats": [],
    "logs rm": ["1"],
    "logs path": [],
    "logs off": [],
    "logs on": [],
}


def _logs_case(command: str, kind: str) -> Case:
    def case(w: World) -> Expect:
        path = _history_kinds(w, kind)
        if command in ("logs path", "logs off", "logs on"):  # never opens the database
            return Expect(_LOGS_ARGS[command], 0, None)
        if kind == "folder":
            return Expect(_LOGS_ARGS[command], ExitCode.ERROR, path)
        code = ExitCode.USAGE if command == "logs show" else 0  # the moved history has no run 1
        return Expect(_LOGS_ARGS[command], code, path.parent, warns=True, kept=_moved_aside(w))

    return case


for _command in _LOGS_ARGS:
    for _kind in ("folder", "not_sqlite", "truncated_db"):
        CASES.add(_command, f"history-{_kind}", _logs_case(_command, _kind))


def _chat_continue_case(kind: str) -> Case:
    def case(w: World) -> Expect:
        path = _history_kinds(w, kind)
        if kind == "folder":
            return Expect([*model_args(w), "-c"], ExitCode.ERROR, path)
        return Expect([*model_args(w), "-c"], ExitCode.USAGE, path.parent, warns=True, kept=_moved_aside(w))

    return case


for _kind in ("folder", "not_sqlite", "truncated_db"):
    CASES.add("chat", f"continue-history-{_kind}", _chat_continue_case(_kind))


def _logged_run_case(command: str, kind: str) -> Case:
    """A run whose history cannot be written: the text is kept, a warning names the place."""

    def case(w: World) -> Expect:
        if kind == "data_dir_is_file":
            w.home.mkdir(parents=True, exist_ok=True)
            paths.data_dir().write_text("x")
            names: Path = paths.data_dir()
            kept = None
        else:
            names = _history_kinds(w, kind) if kind == "folder" else _history_kinds(w, kind).parent
            kept = None if kind == "folder" else _moved_aside(w)
        if command == "chat":
            return Expect([*model_args(w), *GEN[:-1]], 0, names, input="hi\n", warns=True, kept=kept, stdout="")
        return Expect([*model_args(w), *GEN, "hi"], 0, names, warns=True, kept=kept, stdout="")

    return case


for _command in ("generate", "chat"):
    for _kind in ("folder", "not_sqlite", "data_dir_is_file"):
        CASES.add(_command, f"log-{_kind}", _logged_run_case(_command, _kind))


# ---------------------------------------------------------- chat saves --


def _chat_load_case(kind: str) -> Case:
    def case(w: World) -> Expect:
        path = w.bad(w.tmp / "conversation.json", kind)
        return Expect([*model_args(w), "--load", str(path)], ExitCode.USAGE, path, input="hi\n")

    return case


for _kind in READ_KINDS:
    CASES.add("chat", f"load-{_kind}", _chat_load_case(_kind))


# ----------------------------------------------------- wisdom (tune) --


def _wisdom_case(command: str, kind: str) -> Case:
    def case(w: World) -> Expect:
        path = w.bad(w.wisdom, "truncated" if kind == "unreadable" else kind)
        before = path.read_bytes() if path.is_file() else b""
        if kind == "unreadable":
            w.deny(path)
        args = [str(w.model), "--show"] if command == "tune" else [*model_args(w), *GEN, "hi"]

        def kept() -> None:
            if kind == "unreadable":  # still denied: its size tells
                assert path.is_file() and path.stat().st_size == len(before) > 0
            elif kind != "folder":
                assert path.is_file() and path.read_bytes() == before, "a damaged wisdom file was changed"

        return Expect(args, 0, path, warns=True, kept=kept)

    return case


for _command in ("tune", "generate"):
    for _kind in ("folder", "empty", "not_utf8", "truncated", "unreadable"):
        CASES.add(_command, f"wisdom-{_kind}", _wisdom_case(_command, _kind))


# --------------------------------------------------------- prompt cache --


def _prompt_cache_case(command: str, kind: str) -> Case:
    def case(w: World) -> Expect:
        folder = paths.cache_dir() / "prompts"
        folder.parent.mkdir(parents=True, exist_ok=True)
        if kind == "folder_is_file":
            folder.write_text("x")
        else:
            assert cli("generate", *model_args(w), "-n", "2", "--prompt-cache", "hi").returncode == 0
            (entry,) = folder.glob("*.kv")
            if kind == "entry_is_folder":
                entry.unlink()
                entry.mkdir()
            else:
                entry.write_bytes(entry.read_bytes()[:-64])
        if command == "generate":
            return Expect([*model_args(w), "-n", "2", "--prompt-cache", "hi"], 0, "prompt cache", warns=True, stdout="")
        return Expect(["-y"] if command == "cache clear" else [], 0, None)

    return case


for _command in ("generate", "cache", "cache info", "cache clear"):  # `cache` alone says what `cache info` says
    for _kind in ("entry_is_folder", "entry_truncated", "folder_is_file"):
        CASES.add(_command, f"prompt-cache-{_kind}", _prompt_cache_case(_command, _kind))


# -------------------------------------------------------------- writes --


def _chart_case(command: str, kind: str) -> Case:
    def case(w: World) -> Expect:
        path = w.bad_place(w.tmp / "chart.svg", kind)
        if command == "logs stats":  # a chart needs a run to draw
            assert cli("generate", *model_args(w), *GEN, "hi").returncode == 0
        if command == "bench":
            args = [*model_args(w), "--quick", "-n", "2", "--rounds", "1", "--chart", str(path)]
        else:
            args = ["--chart", str(path)]
        code = ExitCode.ERROR if kind == "read_only" else ExitCode.USAGE  # the others refused before the run
        return Expect(args, code, path)

    return case


for _command in ("bench", "logs stats"):
    for _kind in WRITE_KINDS:
        CASES.add(_command, f"chart-{_kind}", _chart_case(_command, _kind))


def _save_defaults_case(kind: str) -> Case:
    def case(w: World) -> Expect:
        w.home.mkdir(parents=True, exist_ok=True)
        if kind == "config_dir_is_file":  # refused when the config is read, before anything is measured
            paths.config_dir().write_text("x")
            names = paths.config_dir()
        else:
            names = w.bad(w.config_toml, "truncated")
        args = [*model_args(w), "--quick", "-n", "2", "--rounds", "1", "--save-defaults"]
        return Expect(args, ExitCode.BAD_CONFIG, names)

    return case


for _kind in ("config_dir_is_file", "config_broken"):
    CASES.add("bench", f"save-defaults-{_kind}", _save_defaults_case(_kind))


def _quantize_output_case(kind: str) -> Case:
    def case(w: World) -> Expect:
        path = w.bad_place(w.tmp / "out.gguf", kind)
        names = path if kind == "folder" else path.parent  # the folder that is not one
        return Expect([str(w.model), str(path), "--type", "q8_0"], ExitCode.USAGE, names)

    return case


for _kind in ("no_parent", "file_as_parent", "folder"):  # llama.cpp writes the file itself: no injection reaches it
    CASES.add("quantize", f"output-{_kind}", _quantize_output_case(_kind))


def _tune_write_case(kind: str) -> Case:
    """`tune`'s measurements cannot be kept: a warning names the place, and
    the measurements are shown all the same."""

    def case(w: World) -> Expect:
        w.home.mkdir(parents=True, exist_ok=True)
        paths.cache_dir().write_text("x")
        return Expect([str(w.model), "--seconds", "5"], 0, paths.cache_dir(), warns=True, stdout="")

    return case


CASES.add("tune", "cache-dir-is-file", _tune_write_case("cache_dir_is_file"))


def _marker_case(command: str) -> Case:
    def case(w: World) -> Expect:
        w.home.mkdir(parents=True, exist_ok=True)
        paths.config_dir().write_text("x")
        return Expect([], ExitCode.ERROR, paths.config_dir())

    return case


for _command in ("logs off", "logs on"):
    CASES.add(_command, "config-dir-is-file", _marker_case(_command))


def _pull_write_case(kind: str) -> Case:
    def case(w: World) -> Expect:
        w.home.mkdir(parents=True, exist_ok=True)
        paths.cache_dir().write_text("x")
        return Expect(["qwen2.5-coder:0.5b", "--no-tune", "--no-draft"], ExitCode.ERROR, paths.cache_dir())

    return case


CASES.add("pull", "cache-dir-is-file", _pull_write_case("cache_dir_is_file"))


def _rm_case(w: World) -> Expect:
    return Expect(["no-such-model:1b", "-y"], ExitCode.MODEL_NOT_FOUND, "no-such-model:1b")


CASES.add("rm", "unknown-alias", _rm_case)


# ---------------------------------------------------------------- walk --


def registered_commands(group: Any = None, prefix: str = "") -> list[str]:
    """Every command path the app answers to ("generate", "logs stats"; a group with a callback of its own too)."""
    group = group or typer.main.get_command(app)
    found: list[str] = []
    for name, command in group.commands.items():
        path = f"{prefix}{name}"
        if isinstance(command, TyperGroup):
            if command.invoke_without_command:
                found.append(path)
            found += registered_commands(command, path + " ")
        else:
            found.append(path)
    return found


PATHLESS = {"rpc-server", "ps"}  # reads and writes no file: no config, no models, no history


def test_every_command_has_cases() -> None:
    commands = registered_commands()
    assert "logs stats" in commands and "generate" in commands
    missing = sorted(set(commands) - set(CASES.by_command) - PATHLESS)
    assert not missing, f"commands with no bad-path cases: {missing}"
    assert not set(CASES.by_command) - set(commands), "cases for a command that is gone"


def _params() -> Iterator[Any]:
    for command, cases in sorted(CASES.by_command.items()):
        for name in sorted(cases):
            yield pytest.param(command, name, id=f"{command.replace(' ', '-')}:{name}")


@pytest.fixture(scope="module")
def module_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("bad-paths") / "tiny.gguf")


@pytest.fixture
def world(tmp_path: Path, module_model: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there: no pull reaches out
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # nor does a mirror's
    return World(tmp_path / "w", module_model, Deny(monkeypatch))


def check(result: Any, expect: Expect, *, where: str) -> None:
    """The exit code, no traceback, and one line naming the path."""
    out, err = result.stdout, result.stderr
    assert "Traceback" not in out + err, f"{where}: a traceback\n{err}"
    assert result.returncode == expect.code, f"{where}: exit {result.returncode}, expected {expect.code}\n{err}"
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    if expect.code != 0:
        assert len(errors) == 1, f"{where}: expected one error line\n{err}"
    else:
        assert not errors, f"{where}: exit 0 with an error line\n{err}"
    if expect.names is not None:
        lines = errors or [line for line in err.splitlines() if line.startswith("warning:")]
        if expect.warns:
            lines += [line for line in err.splitlines() if line.startswith("warning:")]
        assert any(str(expect.names) in line for line in lines), f"{where}: no line names {expect.names}\n{err}"
    if expect.stdout is not None:
        assert out.strip(), f"{where}: the generated text was lost"
    if expect.kept is not None:
        expect.kept()


@pytest.mark.parametrize(("command", "name"), _params())
def test_bad_path(command: str, name: str, world: World) -> None:
    world.tmp.mkdir(parents=True)
    expect = CASES.by_command[command][name](world)
    result = cli(*command.split(), *expect.args, input=expect.input)
    check(result, expect, where=f"localrun {command} {' '.join(expect.args)}")


# A few as real processes: the exit status and stderr a shell sees.
SUBPROCESS_CASES = [
    ("generate", "config.toml-truncated"),
    ("chat", "load-folder"),
    ("logs", "history-not_sqlite"),
    ("quantize", "output-folder"),
    ("show", "model-truncated"),
]


@pytest.mark.parametrize(("command", "name"), SUBPROCESS_CASES, ids=[f"{c}:{n}" for c, n in SUBPROCESS_CASES])
def test_bad_path_in_a_process(command: str, name: str, world: World) -> None:
    world.tmp.mkdir(parents=True)
    expect = CASES.by_command[command][name](world)
    done = cli_process(*command.split(), *expect.args, input=expect.input)
    check(done, expect, where=f"localrun {command} (process)")
