"""Local files by name (issue 54): a `path` alias in models.toml, `serve
--models-dir DIR`, and a server started with nothing pulled that serves a
model once it is."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import openai
import pytest

from localrun import store
from localrun.errors import RegistryError
from localrun.store import registry
from tests.helpers import cli
from tests.serve.conftest import Server, start

LOCAL = """
default = "mine:small"

[models."mine:small"]
path = "{path}"
quant = "F32"
defaults = {{ ctx = 256 }}
"""


def _user_registry(home: Path, text: str) -> Path:
    config = home / "localrun" / "config" / "models.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(text)
    return config


def _ids(server: Server) -> list[str]:
    return [m["id"] for m in httpx.get(server.url + "/v1/models", timeout=30).json()["data"]]


def _ask(server: Server, model: str) -> str:
    reply = server.client().chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    return reply.model


# -- path in models.toml --


def test_a_path_alias_names_the_file_from_its_own_folder(tmp_path: Path, tiny_model: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(tiny_model, models / "mine.gguf")
    config = tmp_path / "conf" / "models.toml"
    config.parent.mkdir()
    config.write_text(LOCAL.format(path="../models/mine.gguf"))
    loaded = registry.load(config)
    entry = loaded.resolve("mine")  # the bare family finds it as the default tag would
    assert entry.path == config.parent / "../models/mine.gguf" and entry.file == "mine.gguf" and not entry.repo
    assert entry.defaults == {"ctx": 256}
    found = store.resolve("mine:small", loaded, offline=True)
    assert found.path.resolve() == (models / "mine.gguf").resolve() and found.target.label == "mine:small"
    config.write_text(LOCAL.format(path="~/mine.gguf"))
    assert registry.load(config).entries["mine:small"].path == Path.home() / "mine.gguf"
    config.write_text('default = "mine:small"\n[models."mine:small"]\npath = "/models/mine-Q8_0.gguf"\n')
    assert registry.load(config).entries["mine:small"].quant == "Q8_0"  # no quant given: the file's name says


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ('repo = "a/b"\n', "repo is for a file on the hub"),
        ('sha256 = "{}"\n'.format("ab" * 32), "sha256 is for a file on the hub"),
    ],
)
def test_a_path_alias_refuses_what_is_for_the_hub(tmp_path: Path, extra: str, says: str) -> None:
    config = tmp_path / "models.toml"
    config.write_text(LOCAL.format(path="/models/mine.gguf") + extra)
    with pytest.raises(RegistryError, match=says):
        registry.load(config)
    config.write_text(LOCAL.format(path="/models/mine.bin"))
    with pytest.raises(RegistryError, match=r"must be a \.gguf file"):
        registry.load(config)


def test_commands_take_the_alias_and_list_shows_it_present(tiny_model: Path) -> None:
    registry.user_file().parent.mkdir(parents=True, exist_ok=True)
    registry.user_file().write_text(LOCAL.format(path=str(tiny_model)))
    ran = cli("generate", "-m", "mine:small", "-n", "3", "-t", "0", "hello")
    assert ran.returncode == 0, ran.stderr
    listed = cli("list")
    row = next(line for line in listed.stdout.splitlines() if line.startswith("mine:small"))
    assert listed.returncode == 0 and row.split()[2:3] == ["yes"] and row.endswith(str(tiny_model))  # its source


# -- serve --


@pytest.fixture
def empty_home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def test_serve_with_nothing_pulled_starts_and_serves_a_model_once_pulled(empty_home: Path, tiny_model: Path) -> None:
    for server in start(empty_home, "--parallel", "1", "--ctx", "256", "--no-log"):
        assert "no model is pulled yet" in server.log and "localrun pull" in server.log
        assert "serving each model once it is pulled" in server.log
        assert _ids(server) == []
        with pytest.raises(openai.NotFoundError, match="localrun pull smollm2:135m"):
            _ask(server, "smollm2:135m")
        entry = registry.load().entries["smollm2:135m"]  # as `localrun pull` leaves it: the mirror's copy
        cached = empty_home / "localrun" / "cache" / "mirror" / entry.mirrors[0].sha256 / entry.file
        cached.parent.mkdir(parents=True)
        shutil.copy(tiny_model, cached)
        assert _ask(server, "smollm2:135m") == "smollm2:135m"
        assert "smollm2:135m" in _ids(server)


@pytest.fixture
def folder_server(tmp_path: Path, tiny_model: Path, wide_model: Path) -> Iterator[tuple[Server, Path]]:
    folder = tmp_path / "ggufs"
    (folder / "nested").mkdir(parents=True)
    shutil.copy(tiny_model, folder / "first.gguf")
    shutil.copy(wide_model, folder / "nested" / "second.gguf")
    shutil.copy(tiny_model, folder / "mmproj-first.gguf")  # a vision projector, not a model
    home = tmp_path / "home"
    _user_registry(home, LOCAL.format(path=str(tiny_model)))  # and a path alias beside them
    for server in start(home, "--models-dir", str(folder), "--models-max", "1", "--parallel", "1", "--no-log"):
        yield server, folder


def test_models_dir_serves_its_ggufs_by_name_on_demand(folder_server: tuple[Server, Path], wide_model: Path) -> None:
    server, folder = folder_server
    ids = _ids(server)
    assert {"first", "second", "mine:small"} <= set(ids) and "mmproj-first" not in ids
    assert _ask(server, "second") == "second"
    assert _ask(server, "first.gguf") == "first"  # its file's name too
    assert _ask(server, "mine:small") == "mine:small"  # the path alias of models.toml
    shutil.copy(wide_model, folder / "third.gguf")  # put there after the start
    assert _ask(server, "third") == "third"


def test_models_dir_must_be_a_folder(tmp_path: Path) -> None:
    ran = cli("serve", "--models-dir", str(tmp_path / "nowhere"), "--port", "0")
    assert ran.returncode == 2 and "not a folder" in ran.stderr
