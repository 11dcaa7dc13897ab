"""The fuzzing property for GGUF files, and llama.cpp loads in a child process.

`check_file` is the in-process half: `read_gguf` (and what every command asks
of its result) accepts the file or refuses it with `BadModelError`, in bounded
time and memory. For an accepted file, llama.cpp must then load it or refuse
it cleanly, without crashing:

Run as ``python -m tests.gguf.loadcheck FILE...``: the child loads each file in
turn through localrun (`Weights`: the GGUF check, then llama.cpp), printing
``start I`` before and ``ok I`` or ``refused I`` after. A child that dies by a
signal crashed on the file it last started; one that stops printing for the
timeout hangs on it. `load_all` runs the children and goes on after a crash.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_BYTES = 16 << 20  # Python allocations while checking a 0.4 MB file: no claimed count may size one
MAX_SECONDS = 2.0


class PropertyViolation(AssertionError):
    pass


def check_file(path: Path, max_bytes: int = MAX_BYTES, max_seconds: float = MAX_SECONDS) -> bool:
    """True if the check accepts ``path``, False if it refuses it with `BadModelError`;
    `PropertyViolation` for anything else (another exception, too slow, too much memory)."""
    from localrun.errors import BadModelError
    from localrun.gguf.info import describe
    from localrun.gguf.reader import read_gguf

    tracemalloc.start()
    start = time.perf_counter()
    try:
        info = read_gguf(path)
        # what commands ask of an accepted file before llama.cpp opens it
        _ = (info.architecture, info.name, info.context_length, info.chat_template, info.n_vocab)
        describe(info)
        accepted = True
    except BadModelError:
        accepted = False
    except Exception as exc:
        raise PropertyViolation(f"{type(exc).__name__}: {exc}") from exc
    finally:
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    if elapsed > max_seconds:
        raise PropertyViolation(f"took {elapsed:.2f} s")
    if peak > max_bytes:
        raise PropertyViolation(f"allocated {peak} bytes")
    return accepted


@dataclass(frozen=True)
class Outcome:
    path: Path
    result: str  # "ok", "refused" (by localrun or llama.cpp, with a clean error), "crash", "hang"
    detail: str = ""


def _child(paths: list[str]) -> int:
    from localrun.errors import BadModelError
    from localrun.runtime.engine import Weights
    from localrun.runtime.placement import ModelPlacement, Placement

    for i, path in enumerate(paths):
        print(f"start {i}", flush=True)
        try:
            Weights(Path(path), Placement(ModelPlacement(repack=False))).close()
        except BadModelError as exc:
            print(f"refused {i} {str(exc).splitlines()[0][:200]}", flush=True)
        else:
            print(f"ok {i}", flush=True)
    return 0


def _run_batch(paths: list[Path], timeout: float) -> tuple[list[Outcome], list[Path]]:
    """Outcomes of the files the child got through, and those it did not reach."""
    cmd = [sys.executable, "-m", "tests.gguf.loadcheck", *map(str, paths)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env, check=False)
        stdout, stderr, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or b""
        stdout, stderr, rc = out.decode() if isinstance(out, bytes) else out, "", None
    done: dict[int, Outcome] = {}
    started = -1
    for line in stdout.splitlines():
        word, _, rest = line.partition(" ")
        index, _, detail = rest.partition(" ")
        if word == "start":
            started = int(index)
        elif word in ("ok", "refused"):
            done[int(index)] = Outcome(paths[int(index)], word, detail)
    outcomes = [done[i] for i in sorted(done)]
    if rc == 0:
        return outcomes, []
    if started < 0 or started in done:
        # died before the first file or between files: the interpreter, not a file
        raise RuntimeError(f"the loader child failed (exit {rc}): {stderr[-2000:]}")
    tail = stderr.strip().splitlines()[-3:] if stderr else []
    if rc is None:
        outcomes.append(Outcome(paths[started], "hang", f"no answer in {timeout:.0f} s"))
    elif rc < 0:
        outcomes.append(Outcome(paths[started], "crash", f"signal {-rc}: " + " | ".join(tail)))
    else:
        outcomes.append(Outcome(paths[started], "crash", f"exit {rc}: " + " | ".join(tail)))
    return outcomes, paths[started + 1 :]


def load_all(paths: list[Path], timeout: float = 60.0) -> list[Outcome]:
    """Load every file in child processes (one at a time), restarting after a crash or hang."""
    outcomes: list[Outcome] = []
    todo = list(paths)
    while todo:
        got, todo = _run_batch(todo, timeout)
        outcomes += got
    return outcomes


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
