#!/usr/bin/env python3
"""Models on demand: memory before, during and after, in one `localrun serve`.

    .venv/bin/python scripts/bench_router.py [MODEL_A.gguf MODEL_B.gguf] [--rounds 3] [--idle 3]

Two GGUF files (default: two tiny random-weight models written here) are
registered as pulled models in a fresh LOCALRUN_HOME (`alpha:bench`,
`beta:bench`), and one `localrun serve` with no `-m`, `--models-max 1` and
`--idle-unload` of --idle seconds serves them. Requests alternate between the
two for --rounds rounds, each checked to be answered by the model named; the
server's resident memory (VmRSS) is read after it starts (before any model
loads), after each request, and once the idle unload has left no model
loaded. The goal: after the idle unload, within 10% of before the first load.
With --pooling (mean, cls, last), the server pools every model and each
turn asks the model named for embeddings of a few texts too, before its
completion. With --responses, each turn also makes a Responses call with a
tool and `tool_choice: required` (one function call back, checked): the
tool grammar is built where the model is loaded, not in the server.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import re
import sys
import tempfile
import time
from contextlib import AbstractContextManager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import openai
from openai.types.responses import FunctionToolParam

from scripts.bench_serve import Server, serve_process

ALIASES = ("alpha:bench", "beta:bench")


def register_pulled(home: Path, models: dict[str, Path]) -> dict[str, Path]:
    """``models`` (alias: GGUF file) in ``home``'s models.toml, each already in
    its cache as a mirror copy, as `localrun pull` leaves them; where each file lies now."""
    toml, files = [], {}
    for alias, model in models.items():
        sha = hashlib.sha256(model.read_bytes()).hexdigest()
        base = alias.split(":")[0]
        cached = home / "localrun" / "cache" / "mirror" / sha / f"{base}.gguf"
        cached.parent.mkdir(parents=True, exist_ok=True)
        if not cached.exists():
            cached.write_bytes(model.read_bytes())
        files[alias] = cached
        toml.append(
            f'[models."{alias}"]\nrepo = "bench/{base}"\nfile = "{base}.gguf"\n'
            f'[[models."{alias}".mirrors]]\nsha256 = "{sha}"\n'
            f'parts = [{{ wheel = "{base}-part==1.0", member = "{base}.gguf" }}]\n'
        )
    config = home / "localrun" / "config" / "models.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("".join(toml))
    return files


def rss_mib(pid: int, kind: str = "VmRSS") -> float:
    """Resident memory, MiB: all of it (VmRSS), or its anonymous part (RssAnon: the heap,
    buffers) or its file part (RssFile: the code of the libraries, paged in as it first runs)."""
    found = re.search(rf"{kind}:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(found.group(1)) / 1024 if found else 0.0


def parts(pid: int) -> str:
    return f"anonymous {rss_mib(pid, 'RssAnon'):.0f} MiB, files {rss_mib(pid, 'RssFile'):.0f} MiB"


def loaded(url: str) -> list[str]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("GET", "/v1/models")
        data = json.loads(conn.getresponse().read())["data"]
    finally:
        conn.close()
    return [m["id"] for m in data if m["status"]["value"] != "unloaded"]


def threads(pid: int) -> int:
    """The process's threads now."""
    found = re.search(r"Threads:\s+(\d+)", Path(f"/proc/{pid}/status").read_text())
    return int(found.group(1)) if found else 0


def start(home: Path, idle: float, pooling: str | None = None) -> AbstractContextManager[Server]:
    env = {**os.environ, "LOCALRUN_HOME": str(home / "localrun")}
    args = ["--models-max", "1", "--idle-unload", f"{idle}s", "--parallel", "1", "--ctx", "512", "--no-log"]
    return serve_process(args + (["--pooling", pooling] if pooling else []), env)


TEXTS = ["the cat sat on the mat", "a quick brown fox jumps over the lazy dog", "hello there"] * 4
WEATHER: FunctionToolParam = {
    "type": "function",
    "strict": False,
    "name": "get_weather",
    "description": "Get the weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def cycle(
    client: openai.OpenAI, url: str, pid: int, rounds: int, before: float, embed: bool = False, tools: bool = False
) -> float:
    """Requests alternating between the two models (embeddings, then a
    completion, with ``embed``; then a Responses call that must call a tool,
    with ``tools``), then the wait for the idle unload; the server's resident
    memory (MiB) once no model is loaded."""
    peak = before
    for turn in range(2 * rounds):
        name = ALIASES[turn % 2]
        if embed:
            vectors = client.embeddings.create(model=name, input=TEXTS)
            assert vectors.model == name and len(vectors.data) == len(TEXTS), vectors.model
        reply = client.completions.create(model=name, prompt="Once upon a time", max_tokens=16)
        assert reply.model == name, (reply.model, name)
        if tools:
            asked = "What's the weather in Paris? Use the tool."
            called = client.responses.create(
                model=name, input=asked, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False
            )
            assert [o.type for o in called.output] == ["function_call"], called.output
        assert loaded(url) == [name], loaded(url)
        peak = max(peak, rss_mib(pid))
    t0 = time.monotonic()
    while loaded(url):
        time.sleep(0.2)
    after = rss_mib(pid)
    print(f"{2 * rounds} requests, each answered by the model named, one loaded at a time: at most {peak:.0f} MiB; "
          f"idle unload after {time.monotonic() - t0:.1f} s: {after:.0f} MiB ({parts(pid)}, "
          f"{threads(pid)} threads)", flush=True)  # fmt: skip
    return after


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", type=Path, help="two GGUF files (default: two tiny ones)")
    parser.add_argument("--rounds", type=int, default=3, help="requests to each model, alternating")
    parser.add_argument("--cycles", type=int, default=2, help="rounds then an idle unload, this many times")
    parser.add_argument("--idle", type=float, default=3.0, help="--idle-unload, seconds")
    parser.add_argument("--pooling", choices=("mean", "cls", "last"), help="serve --pooling; embeddings each turn")
    parser.add_argument("--responses", action="store_true", help="a Responses call with a required tool each turn")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        models = list(args.models)
        if not models:
            from tests.tinymodel import write_tiny_model

            models = [write_tiny_model(home / "a.gguf"), write_tiny_model(home / "b.gguf", n_embd=128, n_head=4)]
        if len(models) != 2:
            parser.error("give two GGUF files, or none")
        register_pulled(home, dict(zip(ALIASES, models, strict=True)))
        with start(home, args.idle, args.pooling) as server:
            proc, url = server.proc, server.url
            time.sleep(1.0)
            before = rss_mib(proc.pid)
            print(f"before any load: {before:.0f} MiB ({parts(proc.pid)}, {threads(proc.pid)} threads)", flush=True)
            client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
            embed = args.pooling is not None
            afters = [
                cycle(client, url, proc.pid, args.rounds, before, embed, args.responses) for _ in range(args.cycles)
            ]
            client.close()
            change = (afters[0] / before - 1) * 100
            growth = afters[-1] - afters[0]
            print(f"resident memory: {before:.0f} MiB before the first load, {afters[0]:.0f} MiB after the first "
                  f"idle unload ({change:+.1f}%; goal within 10%); {growth:+.1f} MiB more after {args.cycles} cycles")  # fmt: skip  # noqa: E501
            return 0 if abs(change) <= 10 else 1


if __name__ == "__main__":
    sys.exit(main())
