"""Pulling by repo name and by the hub's addresses from the fake hub: the
quantization a repo name picks, a split model's shards, and the sha256 a
pull checks (the hub's, which must be the one models.toml pins)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from localrun.store import registry
from localrun.units import human_bytes
from tests.fakehub import HubState, serve
from tests.helpers import cli_process

REPO = "tester/multi-GGUF"


@pytest.fixture
def hub(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubState]:
    state = HubState()
    data = tiny_model.read_bytes()
    state.add(REPO, "multi-Q4_K_M.gguf", data)
    state.add(REPO, "multi-Q8_0.gguf", data + b"q8")
    state.add(REPO, "mmproj-multi-f16.gguf", b"projector")
    state.add(REPO, "README.md", b"# multi")
    state.add("tester/noq4-GGUF", "noq4-Q8_0.gguf", b"eight")
    state.add("tester/noq4-GGUF", "noq4-F16.gguf", b"sixteen")
    with serve(state) as url:
        monkeypatch.setenv("HF_ENDPOINT", url)
        yield state


def pulled(*args: str) -> Path:
    res = cli_process("pull", "--no-tune", *args)
    assert res.returncode == 0, res.stderr
    return Path(res.stdout.split("\t")[1].strip())


def test_a_repo_name_picks_q4_k_m_from_the_listing(hub: HubState, tiny_model: Path) -> None:
    path = pulled(REPO)
    assert path.name == "multi-Q4_K_M.gguf" and path.read_bytes() == tiny_model.read_bytes()
    tree = [p for m, p, _ in hub.requests if m == "GET" and "/tree/" in p]
    assert tree == [f"/api/models/{REPO}/tree/main"], "the listing picked it"
    assert pulled(f"hf.co/{REPO}:q8_0").name == "multi-Q8_0.gguf"  # ollama's form, a quant named

    offline = cli_process("generate", "-m", f"hf.co/{REPO}", "--offline", "-n", "3", "-t", "0", "hi")
    assert offline.returncode == 0, offline.stderr  # found in the cache without asking the hub
    assert offline.stdout.strip()
    shown = json.loads(cli_process("show", REPO, "--json").stdout)
    assert shown["sha256"] == hashlib.sha256(tiny_model.read_bytes()).hexdigest()
    assert shown["checksum"] == "from the hub's listing" and shown["source"] == f"hf://{REPO}/multi-Q4_K_M.gguf"

    none = cli_process("pull", "--no-tune", "tester/noq4-GGUF")
    assert none.returncode == 3
    assert "no Q4_K_M GGUF file in tester/noq4-GGUF" in none.stderr and "F16, Q8_0" in none.stderr
    missing = cli_process("pull", "--no-tune", "tester/nothing-GGUF")
    assert missing.returncode == 3 and "no repo 'tester/nothing-GGUF'" in missing.stderr
    hub.gated.add("tester/noq4-GGUF")
    for name in ("tester/noq4-GGUF", "hf://tester/noq4-GGUF/noq4-F16.gguf"):  # the listing, then a file
        gated = cli_process("pull", "--no-tune", name)
        assert gated.returncode == 7 and "tester/noq4-GGUF is gated" in gated.stderr and "HF_TOKEN" in gated.stderr


def test_the_hubs_addresses_pull_the_file_they_name(hub: HubState) -> None:
    blob = pulled(f"https://huggingface.co/{REPO}/blob/main/multi-Q8_0.gguf")
    assert blob.name == "multi-Q8_0.gguf"
    resolve = pulled(f"https://huggingface.co/{REPO}/resolve/main/multi-Q8_0.gguf?download=true")
    assert resolve == blob  # the same file, in the cache already
    assert pulled(f"https://huggingface.co/{REPO}").name == "multi-Q4_K_M.gguf"
    bad = cli_process("pull", f"https://huggingface.co/{REPO}/blob/main/README.md")
    assert bad.returncode == 2 and "hf.co/owner/repo[:QUANT]" in bad.stderr


def test_a_split_model_comes_with_every_shard(hub: HubState) -> None:
    shards = [os.urandom(300_000) for _ in range(3)]
    for i, data in enumerate(shards, 1):
        hub.add("tester/split-GGUF", f"Q4_K_M/split-Q4_K_M-{i:05d}-of-00003.gguf", data)
    first = pulled("tester/split-GGUF")
    assert first.name == "split-Q4_K_M-00001-of-00003.gguf"
    assert [(first.parent / f"split-Q4_K_M-{i:05d}-of-00003.gguf").read_bytes() for i in (1, 2, 3)] == shards
    gone = cli_process("rm", "tester/split-GGUF", "--yes")
    assert gone.returncode == 0 and f"{human_bytes(900_000)} freed" in gone.stderr  # every shard
    assert not first.exists() and not (first.parent / "split-Q4_K_M-00003-of-00003.gguf").exists()


def _pinned(sha: str, size: int = 1000) -> None:
    path = registry.user_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f'[models."multi:q4"]\nrepo = "{REPO}"\nfile = "multi-Q4_K_M.gguf"\nsha256 = "{sha}"\nfamily = "Tests"\n'
        f"size = {size}\n"
    )


def test_a_pinned_sha256_the_hub_does_not_serve_downloads_nothing(hub: HubState, tiny_model: Path) -> None:
    _pinned("ab" * 32)
    refused = cli_process("pull", "--no-tune", "multi:q4")
    assert refused.returncode == 7
    assert f"not the {'ab' * 32} pinned in models.toml" in refused.stderr
    assert not any(p for m, p, _ in hub.requests if p.startswith("/blobs/") and m == "GET"), "no byte fetched"

    good = hashlib.sha256(tiny_model.read_bytes()).hexdigest()
    _pinned(good, tiny_model.stat().st_size)
    hub.corrupt = True  # the hub announces the right sha256 and serves other bytes
    corrupt = cli_process("pull", "--no-tune", "multi:q4")
    assert corrupt.returncode == 7 and "sha256 mismatch" in corrupt.stderr
    assert not [p for p in (Path(os.environ["HF_HOME"]) / "hub").rglob("blobs/*") if p.is_file()]
    hub.corrupt = False
    first_use = cli_process("generate", "-m", "multi:q4", "-n", "2", "-t", "0", "hi")
    assert first_use.returncode == 0, first_use.stderr
    assert f"multi:q4 is not downloaded yet: pulling it ({human_bytes(tiny_model.stat().st_size)})" in first_use.stderr
    shown = json.loads(cli_process("show", "multi:q4", "--json").stdout)
    assert (shown["sha256"], shown["checksum"], shown["family"]) == (good, "pinned in models.toml", "Tests")


def test_the_fake_hub_lists_files_as_the_hub_api_does(hub: HubState, tiny_model: Path) -> None:
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile, RepoFolder

    hub.add(REPO, "Q8_0/deep-Q8_0.gguf", b"deep")
    api = HfApi(endpoint=os.environ["HF_ENDPOINT"])
    top = {e.path: type(e) for e in api.list_repo_tree(REPO)}
    assert top["Q8_0"] is RepoFolder and top["multi-Q4_K_M.gguf"] is RepoFile
    every = {e.path: e for e in api.list_repo_tree(REPO, recursive=True) if isinstance(e, RepoFile)}
    assert every["Q8_0/deep-Q8_0.gguf"].size == 4
    lfs = every["multi-Q4_K_M.gguf"].lfs
    assert lfs is not None and lfs.sha256 == hashlib.sha256(tiny_model.read_bytes()).hexdigest()
    assert every["README.md"].lfs is None  # a small file is not in LFS
    info = api.get_paths_info(REPO, ["multi-Q8_0.gguf", "absent.gguf"])
    assert [(i.path, i.lfs.sha256 if isinstance(i, RepoFile) and i.lfs else None) for i in info] == [
        ("multi-Q8_0.gguf", hashlib.sha256(tiny_model.read_bytes() + b"q8").hexdigest())
    ]


def test_a_split_entry_is_listed_with_every_shards_bytes(hub: HubState) -> None:
    shards = [os.urandom(200_000), os.urandom(100_000)]
    for i, data in enumerate(shards, 1):
        hub.add("tester/whole-GGUF", f"whole-Q4_K_M-{i:05d}-of-00002.gguf", data)
    path = registry.user_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('[models."whole:q4"]\nrepo = "tester/whole-GGUF"\nfile = "whole-Q4_K_M-00001-of-00002.gguf"\n')
    assert pulled("whole:q4").name == "whole-Q4_K_M-00001-of-00002.gguf"
    row = next(r for r in json.loads(cli_process("list", "--json").stdout)["models"] if r["alias"] == "whole:q4")
    assert row["present"] and row["size_bytes"] == 300_000
    gone = cli_process("rm", "whole:q4", "--yes")
    assert gone.returncode == 0 and f"{human_bytes(300_000)} freed" in gone.stderr
