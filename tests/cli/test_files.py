"""Nothing lost: a failed write leaves the old file whole, a damaged file the
user may want is moved aside (never deleted or overwritten), and every
failure names the path once. The walk over every command is test_bad_paths.py."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import IO, Any

import pytest

from localrun import config, paths
from localrun.errors import ConfigError, UsageError
from localrun.runtime.chat import read_conversation
from localrun.tune.wisdom import VERSION as WISDOM_VERSION
from localrun.tune.wisdom import WisdomFile, wisdom_file
from tests.helpers import cli


class _FullDisk:
    """A file opened by atomic_write whose writes fail as on a full disk."""

    def __init__(self, file: IO[Any]) -> None:
        self.file = file

    def write(self, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def fileno(self) -> int:
        return self.file.fileno()

    def __enter__(self) -> _FullDisk:
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()


def _full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next files atomic_write opens fill the disk (injected at its os.fdopen)."""
    real = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda fd, *args, **kwargs: _FullDisk(real(fd, *args, **kwargs)))


def test_a_failed_write_keeps_the_old_file_and_names_the_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "kept.json"
    target.write_text("old\n")
    with monkeypatch.context() as m:
        _full_disk(m)
        with pytest.raises(OSError) as caught:
            paths.atomic_write(target, "new\n" * 10_000)
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(target)
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["kept.json"]  # no temporary file left


def test_a_folder_where_the_file_should_be_is_named_not_the_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.svg"
    target.mkdir()
    with pytest.raises(IsADirectoryError) as caught:
        paths.atomic_write(target, "x")
    assert caught.value.filename == str(target)
    assert [p.name for p in tmp_path.iterdir()] == ["out.svg"]
    missing = tmp_path / "no" / "out.svg"
    with pytest.raises(FileNotFoundError) as gone:
        paths.atomic_write(missing, "x")
    assert gone.value.filename == str(missing)


def test_atomic_write_gives_the_umask_mode_or_keeps_the_old_one(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        new = tmp_path / "new.txt"
        paths.atomic_write(new, "x")
        assert stat.S_IMODE(new.stat().st_mode) == 0o640  # not the temporary file's 0600
        kept = tmp_path / "kept.txt"
        kept.write_text("old")
        kept.chmod(0o604)
        paths.atomic_write(kept, "new")
        assert stat.S_IMODE(kept.stat().st_mode) == 0o604
        assert kept.read_text() == "new"
    finally:
        os.umask(old)


def test_ensure_dir_names_the_file_in_the_way(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("x")
    with pytest.raises(NotADirectoryError) as caught:
        paths.ensure_dir(tmp_path / "data" / "sub" / "deeper")
    assert caught.value.filename == str(tmp_path / "data")
    assert paths.ensure_dir(tmp_path / "new" / "sub").is_dir()


def test_move_aside_never_overwrites_an_earlier_one(tmp_path: Path) -> None:
    first, second = tmp_path / "w.json", tmp_path / "w.json"
    first.write_text("one")
    a = paths.move_aside(first)
    second.write_text("two")
    b = paths.move_aside(second)
    assert a != b and a.read_text() == "one" and b.read_text() == "two" and not first.exists()


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b'{"version": 1, "entries": [', "not valid JSON"),
        (b"\xff\xfe garbage", "not UTF-8 text"),
        (b'{"version": 99, "entries": []}', f"not a wisdom file of version {WISDOM_VERSION}"),
        (b'{"version": 1, "entries": [{"model": 3}]}', "entry 1 is ignored"),
    ],
)
def test_damaged_wisdom_is_moved_aside_before_a_new_one_is_written(content: bytes, problem: str) -> None:
    path = wisdom_file()
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    found = WisdomFile.load()
    assert found.entries == [] and any(problem in p for p in found.problems), found.problems
    assert path.read_bytes() == content  # loading changes nothing
    found.save()
    assert found.moved_to is not None and found.moved_to.read_bytes() == content
    assert json.loads(path.read_text())["version"] == WISDOM_VERSION


def test_tune_keeps_damaged_wisdom_aside(tiny_model: Path) -> None:
    path = wisdom_file()
    path.parent.mkdir(parents=True)
    path.write_text('{"version": 1, "entries": [{"model": "cut')
    res = cli("tune", str(tiny_model), "--seconds", "5")
    assert res.returncode == 0, res.stderr
    assert f"warning: {path} is not valid JSON" in res.stderr and "Traceback" not in res.stderr
    (aside,) = path.parent.glob("wisdom.corrupt-*.json")
    assert aside.read_text() == '{"version": 1, "entries": [{"model": "cut'
    assert len(json.loads(path.read_text())["entries"]) == 1


def test_unreadable_wisdom_is_neither_moved_nor_overwritten_by_a_hint(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = wisdom_file()
    path.parent.mkdir(parents=True)
    path.mkdir()  # a folder where the file should be
    found = WisdomFile.load()
    assert not found.damaged and found.problems == [
        f"{path} cannot be read and is ignored (it is a folder, not a file)"
    ]
    res = cli("generate", "-m", str(tiny_model), "-n", "2", "hi")
    assert res.returncode == 0 and res.stdout and "it is a folder, not a file" in res.stderr
    assert path.is_dir()


def test_wisdom_that_cannot_be_read_is_not_overwritten_by_tune(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its permissions keep the user from reading it: a new measurement must
    not replace what is in it (tune shows what it measured, and says why it
    was not kept)."""
    path = wisdom_file()
    path.parent.mkdir(parents=True)
    path.write_text('{"version": 1, "entries": []}')
    real_read = Path.read_text

    def denied(self: Path, *args: Any, **kwargs: Any) -> str:
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", denied)
    res = cli("tune", str(tiny_model), "--seconds", "5")
    assert res.returncode == 0, res.stderr
    assert "threads" in res.stdout  # the measurements, shown
    assert f"could not be kept in {path}: it could not be read, so it is not overwritten" in res.stderr
    assert real_read(path) == '{"version": 1, "entries": []}'


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda p: p.mkdir(), "it is a folder, not a file"),
        (lambda p: p.write_bytes(b"\xff\xfe"), "not UTF-8 text (byte 0xff at offset 0)"),
    ],
)
def test_reading_a_bad_file_names_it_once(tmp_path: Path, make, reason: str) -> None:  # type: ignore[no-untyped-def]
    conversation = tmp_path / "saved.json"
    make(conversation)
    with pytest.raises(UsageError) as chat_error:
        read_conversation(conversation)
    assert chat_error.value.message == f"{conversation}: cannot read it: {reason}"
    config_toml = config.config_file()
    config_toml.parent.mkdir(parents=True)
    make(config_toml)
    with pytest.raises(ConfigError) as config_error:
        config.load()
    assert config_error.value.message == f"{config_toml}: cannot read: {reason}"


def test_save_defaults_on_a_full_disk_keeps_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    path = config.config_file()
    path.parent.mkdir(parents=True)
    path.write_text("[defaults]\nthreads = 3\n")
    with monkeypatch.context() as m:
        _full_disk(m)
        with pytest.raises(OSError) as caught:
            config.save_defaults({"parallel": 4})
    assert caught.value.filename == str(path)
    assert path.read_text() == "[defaults]\nthreads = 3\n"
    assert config.save_defaults({"parallel": 4}) == path and config.load().parallel == 4


def test_a_run_whose_history_cannot_be_written_keeps_its_text(tiny_model: Path) -> None:
    data = paths.data_dir()
    data.parent.mkdir(parents=True)
    data.write_text("not a folder")
    res = cli("generate", "-m", str(tiny_model), "-n", "4", "-t", "0", "hi")
    assert res.returncode == 0 and res.stdout.strip()
    (warning,) = [line for line in res.stderr.splitlines() if line.startswith("warning:")]
    assert "this run was not logged" in warning and str(data) in warning
    assert data.read_text() == "not a folder"


def test_chat_continue_sets_a_damaged_history_aside(tiny_model: Path) -> None:
    history = paths.history_db()
    history.parent.mkdir(parents=True)
    history.write_bytes(b"SQLite format 2\x00" + b"\x01" * 4000)
    res = cli("chat", "-m", str(tiny_model), "-c")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    (aside,) = history.parent.glob("history.corrupt-*.db")
    assert aside.read_bytes().startswith(b"SQLite format 2") and not history.exists()
    assert f"moved it to {aside}" in res.stderr
