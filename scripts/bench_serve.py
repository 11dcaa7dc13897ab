#!/usr/bin/env python3
"""Measure `localrun serve` side by side with `--batch`, `generate` and (optionally) llama-server.

    .venv/bin/python scripts/bench_serve.py [MODEL] [--clients 4,8] [--tokens 128]
        [--rounds 1] [--turns 20] [--load 64] [--load-clients 16] [--threads N]
        [--llama-server PATH/TO/llama-server] [--busy N] [--fixed-threads T] [--in-process] [--quick]

1. throughput: for each N of --clients, N concurrent streaming clients (the
   official `openai` client, greedy, one prompt each, a coding task whose
   answer runs past --tokens, so that every system does the same work) against
   `localrun serve --parallel N`; aggregate tokens/sec = completion tokens of
   all clients / wall time from the first request to the last end. Beside it,
   the same prompts through `localrun generate --batch --parallel N` (its own
   summary: generated tokens / generation time), and with --llama-server the
   same clients against `llama-server -np N` on the same file. Both run with
   the flash attention the server chose (its log says which): the same
   arithmetic gives the same greedy texts, so all three do the same work (the
   tokens each generated are printed). Ratios serve / batch and serve /
   llama-server are taken within each round, whose order turns by one each
   round (serve first, then --batch first, ...) so that a drift in the
   machine's speed favours none. --fixed-threads T adds `serve --threads T`
   to the rotation, and the ratio serve / serve -tT; --in-process adds
   `serve --in-process` (every model in the server's own process, no
   runner), and the ratio serve / in-process.
2. single client: one streaming client, decode tokens/sec seen by the client
   (tokens after the first / time from the first chunk to the last), against
   `localrun generate --spec none --json` on the same prompt (its done event)
   with the flash attention the server chose (its log says which): the
   ratio is what HTTP costs. Beside it, generate with its own choice for
   that short prompt (serve chooses for the middle of a slot's context).
3. chat: one client holds a --turns-turn conversation, re-sending the whole
   history each turn; time to first token of each turn, turn --turns / turn 2,
   and the server's own timings behind it (tokens evaluated, tokens reused, ms
   per evaluated token); with --llama-server the same conversation against it.
   The last turn asks turn 2's question again, so both evaluate the same new
   tokens and the ratio is what the history between them costs (a longer
   question costs its extra tokens at any turn).
4. load: --load requests from --load-clients concurrent clients, 10% of which
   disconnect after a few chunks and 5% of which are malformed; it checks that
   every well-formed request completed, every malformed one got 400, every slot
   is free at the end, and reports the server's resident memory before and
   after (before: after a warm-up of --load-clients requests).
5. restart: a system prompt of about 1,500 tokens no earlier run has seen;
   a new server's first request with it (cold: evaluated and stored in the
   prompt cache), then a second new server's first request with it (loaded
   from the prompt cache), then one started with --no-prompt-cache; time to
   first token of each, and cached / not.

--busy N runs every part beside N competing CPU-bound processes (a shared
machine's load), started before the first part and stopped after the last.

Servers are started by this script on 127.0.0.1 with a port the system picks.
A shared machine is noisy: read the ranges. `--quick` (2 clients, 24 tokens,
4 turns, 16 requests from 4 clients) is a smoke run.

MODEL is any localrun model name (a registry alias, owner/repo:QUANT,
hf://owner/repo/file.gguf or a GGUF path); a registry model is pulled on
first use.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import openai

from localrun.openmp import others_environ
from scripts._load import cpu_load
from scripts._models import HelpFormatter, model_path
from scripts._stats import ratio_summary
from scripts.bench_batch import SHORT, SYSTEM, run_cli_batch

HERE = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = "qwen2.5-coder:1.5b"
_LISTENING = re.compile(r"on (http://127\.0\.0\.1:\d+)/v1")
_ATTENTION = re.compile(r"flash attention (on|off|as llama\.cpp decides)")


# ---------------------------------------------------------------- servers --


@dataclass
class Server:
    proc: subprocess.Popen[str]
    url: str
    lines: list[str] = field(default_factory=list)

    @property
    def flash_attn(self) -> str:
        """The flash attention `localrun serve` says it runs with (auto: llama.cpp decides)."""
        found = next((m for m in map(_ATTENTION.search, self.lines) if m), None)
        return "auto" if found is None or found.group(1) == "as llama.cpp decides" else found.group(1)

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, timeout=600)

    def rss_mib(self) -> float:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        found = re.search(r"VmRSS:\s+(\d+) kB", status)
        return int(found.group(1)) / 1024 if found else 0.0


def _drain(proc: subprocess.Popen[str], lines: list[str], ready: threading.Event, pattern: re.Pattern[str]) -> None:
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if pattern.search(line):
            ready.set()
    ready.set()


@contextmanager
def serve_process(serve_args: Sequence[str], env: Mapping[str, str] | None = None) -> Iterator[Server]:
    """`localrun serve --port 0 SERVE_ARGS` from this checkout (in ``env``,
    else this process's environment), until the block ends."""
    cmd = [sys.executable, "-m", "localrun", "serve", "--port", "0", *serve_args]
    proc = subprocess.Popen(cmd, cwd=HERE, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    lines: list[str] = []
    ready = threading.Event()
    threading.Thread(target=_drain, args=(proc, lines, ready, _LISTENING), daemon=True).start()
    ready.wait(600)
    found = next((m for m in map(_LISTENING.search, lines) if m), None)
    if found is None:
        proc.kill()
        raise RuntimeError("localrun serve did not start:\n" + "".join(lines[-20:]))
    try:
        yield Server(proc, found.group(1), lines)
    finally:
        proc.terminate()
        proc.wait(60)


def localrun_server(
    model: Path, parallel: int, args: argparse.Namespace, *extra: str
) -> AbstractContextManager[Server]:
    serve_args = ["-m", str(model), "--parallel", str(parallel), "--ctx", str(args.ctx), "--queue", str(args.load)]
    serve_args += [*extra, *(["--threads", str(args.threads)] if args.threads is not None else [])]
    return serve_process(serve_args)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def llama_server(
    binary: Path, model: Path, parallel: int, args: argparse.Namespace, flash_attn: str = "auto", *extra: str
) -> Iterator[Server]:
    port = _free_port()
    cmd = [str(binary), "-m", str(model), "--port", str(port), "-np", str(parallel), "-c", str(args.ctx * parallel)]
    cmd += ["-fa", flash_attn, *extra]
    if args.threads is not None:
        cmd += ["-t", str(args.threads)]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        env=others_environ(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    ready = threading.Event()
    threading.Thread(target=_drain, args=(proc, lines, ready, re.compile("listening")), daemon=True).start()
    server = Server(proc, f"http://127.0.0.1:{port}", lines)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if _raw(server, "GET", "/health")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        else:
            raise RuntimeError("llama-server did not start:\n" + "".join(lines[-20:]))
        yield server
    finally:
        proc.terminate()
        proc.wait(60)


def _raw(server: Server, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    try:
        conn.request(method, path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        try:
            return response.status, json.loads(data or b"null")
        except json.JSONDecodeError:
            return response.status, None
    finally:
        conn.close()


# ---------------------------------------------------------------- clients --


@dataclass
class Streamed:
    text: str = ""
    tokens: int = 0
    cached: int = 0
    t_start: float = 0.0
    t_first: float = 0.0
    t_last: float = 0.0
    finish: str | None = None
    timings: dict[str, Any] = field(default_factory=dict)  # the server's own, from the final chunk

    @property
    def ttft(self) -> float:
        return self.t_first - self.t_start

    @property
    def decode_rate(self) -> float:
        span = self.t_last - self.t_first
        return (self.tokens - 1) / span if self.tokens > 1 and span > 0 else 0.0


def stream_chat(
    server: Server, messages: list[dict[str, str]], tokens: int, *, stop_after: int | None = None
) -> Streamed:
    """A streaming greedy chat request; ``stop_after``: disconnect after that many chunks."""
    out = Streamed(t_start=time.perf_counter())
    sent: Any = messages
    usage: Any = {"include_usage": True}
    stream = server.client().chat.completions.create(
        model=_model_id(server),
        messages=sent,
        max_tokens=tokens,
        temperature=0,
        stream=True,
        stream_options=usage,
    )
    chunks = 0
    with stream:
        for chunk in stream:
            now = time.perf_counter()
            if chunk.choices and chunk.choices[0].delta.content:
                out.t_first = out.t_first or now
                out.t_last = now
                out.text += chunk.choices[0].delta.content
                chunks += 1
            if chunk.choices and chunk.choices[0].finish_reason:
                out.finish = chunk.choices[0].finish_reason
            extra = chunk.model_extra or {}
            if isinstance(extra.get("timings"), dict):
                out.timings = extra["timings"]
            if chunk.usage is not None:
                out.tokens = chunk.usage.completion_tokens
                details = chunk.usage.prompt_tokens_details
                out.cached = details.cached_tokens or 0 if details is not None else 0
            if stop_after is not None and chunks >= stop_after:
                break
    return out


_ids: dict[str, str] = {}


def _model_id(server: Server) -> str:
    if server.url not in _ids:
        _ids[server.url] = server.client().models.list().data[0].id
    return _ids[server.url]


def concurrent(server: Server, prompts: list[str], tokens: int) -> tuple[float, int, int]:
    """(aggregate tok/s, completion tokens, requests that ran to ``tokens``) of
    one streaming client per prompt, all at once."""
    results: list[Streamed] = []
    lock = threading.Lock()

    def one(prompt: str) -> None:
        got = stream_chat(server, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}], tokens)
        with lock:
            results.append(got)

    threads = [threading.Thread(target=one, args=(p,)) for p in prompts]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    generated = sum(r.tokens for r in results)
    return generated / (time.perf_counter() - t0), generated, sum(r.finish == "length" for r in results)


# ------------------------------------------------------------------ parts --

# Tasks whose answers run past --tokens (128 by default): every request of
# part 1 generates the same number of tokens whatever the arithmetic, so the
# three systems do the same work (a greedy text can end earlier or later
# when the batch around it changes the arithmetic's rounding).
LONG_ANSWERS = [
    "Write a complete Python module for a command-line todo list: argument parsing, a JSON store, add, list, "
    "done and remove commands, with a docstring on every function.",
    "Implement a binary search tree class in Java with insert, delete, search, in-order, pre-order and post-order "
    "traversal, and a main method that exercises each.",
    "Write a C program that reads a CSV file given on the command line, parses quoted fields, and prints each "
    "column's minimum, maximum and mean; handle every error.",
    "Write a Go HTTP server with handlers to create, read, update and delete notes kept in memory behind a mutex, "
    "with JSON bodies and proper status codes.",
    "Write a Rust program that counts word frequencies in a text file and prints the twenty most common words with "
    "their counts, with error handling and unit tests.",
    "Write a TypeScript class for an LRU cache with get, set, delete, has and clear, generic over keys and values, "
    "and a set of Jest tests for it.",
    "Write a bash script that backs up a directory to a timestamped tar.gz archive, keeps only the newest seven "
    "archives, logs each step, and checks every command's status.",
    "Write a Python asyncio web crawler that fetches pages up to a given depth, stays on one domain, limits "
    "concurrency with a semaphore, and prints each URL with its title.",
]


def long_answer_prompts(n: int) -> list[str]:
    """``n`` of LONG_ANSWERS; one used again gets a suffix."""
    k = len(LONG_ANSWERS)
    return [LONG_ANSWERS[i % k] + (f" (take {i // k + 1})" if i >= k else "") for i in range(n)]


def part_throughput(model: Path, args: argparse.Namespace) -> None:
    print("1. aggregate decode tokens/sec, N concurrent streaming clients (and tokens generated, all requests)")
    for n in args.clients:
        throughput(model, n, args)


def _variants(args: argparse.Namespace) -> dict[str, tuple[str, ...]]:
    """The other ways of running serve that part 1 puts beside it: their names and extra arguments."""
    variants: dict[str, tuple[str, ...]] = {}
    if args.fixed_threads:
        variants[f"serve -t{args.fixed_threads}"] = ("--threads", str(args.fixed_threads))
    if args.in_process:
        variants["serve --in-process"] = ("--in-process",)
    return variants


def throughput(model: Path, n: int, args: argparse.Namespace) -> None:
    """Part 1 for ``n`` clients: its rounds, and its lines of figures."""
    prompts = long_answer_prompts(n) if not args.quick else SHORT[:n]
    variants = _variants(args)
    rates: dict[str, list[float]] = {"serve": [], "--batch": [], "llama-server": [], **{v: [] for v in variants}}
    made: dict[str, list[int]] = {name: [] for name in rates}  # tokens generated, each round
    full: list[int] = []  # requests that ran to --tokens, of serve and llama-server
    attention = "auto"

    def clients(name: str, server: Server) -> None:
        concurrent(server, prompts[:1], 4)  # warm-up
        rate, tokens, ran = concurrent(server, prompts, args.tokens)
        rates[name].append(rate)
        made[name].append(tokens)
        full.append(ran)

    def on_serve() -> None:
        nonlocal attention
        with localrun_server(model, n, args) as server:
            clients("serve", server)
            attention = server.flash_attn

    def on_batch() -> None:
        # the others with the flash attention serve chose: the same arithmetic, so the same texts
        same = () if attention == "auto" else ("--flash-attn", attention)
        batch_args = argparse.Namespace(threads=args.threads, tokens=args.tokens)
        rate, tokens, _, _ = run_cli_batch(model, prompts, batch_args, fixed=n, extra=same)
        rates["--batch"].append(rate)
        made["--batch"].append(tokens)

    def on_native() -> None:
        with llama_server(args.llama_server, model, n, args, attention) as server:
            clients("llama-server", server)

    def on_variant(name: str) -> Callable[[], None]:
        def run() -> None:
            with localrun_server(model, n, args, *variants[name]) as server:
                clients(name, server)

        return run

    # serve first (it tells the others its flash attention), then each round
    # starts one further on, so a drift in the machine's speed favours none
    systems = [on_serve, on_batch, *([on_native] if args.llama_server else []), *map(on_variant, variants)]
    for r in range(args.rounds):
        for run in systems[r % len(systems) :] + systems[: r % len(systems)]:
            run()
    _throughput_lines(n, rates, made, attention, f"{min(full)}-{max(full)} of {n}", args.tokens)


def _throughput_lines(
    n: int, rates: dict[str, list[float]], made: dict[str, list[int]], attention: str, full: str, tokens: int
) -> None:
    serve, batch = rates["serve"], rates["--batch"]
    line = f"   N={n}: serve {statistics.median(serve):.1f} tok/s, --batch {statistics.median(batch):.1f}"
    line += f", serve/batch {ratio_summary(serve, batch, range_of_one=False)}"
    for name, got in rates.items():
        if name not in ("serve", "--batch") and got:
            line += f", {name} {statistics.median(got):.1f}, serve/{name} {ratio_summary(serve, got)}"
    print(line, flush=True)
    counts = "; ".join(f"{name} {'/'.join(map(str, got))}" for name, got in made.items() if got)
    print(f"      flash attention {attention} in all; tokens generated per round: {counts}; "
          f"requests that ran to {tokens} tokens: {full}", flush=True)  # fmt: skip


def _generate_rate(model: Path, prompt: str, args: argparse.Namespace, *extra: str) -> float:
    """`localrun generate`'s decode tokens/sec (its done event) for ``prompt``, greedy, no speculation."""
    cmd = [sys.executable, "-m", "localrun", "generate", "-m", str(model), "-t", "0", "--spec", "none"]
    cmd += ["-n", str(args.tokens), "--json", *extra, prompt]
    cmd += ["--threads", str(args.threads)] if args.threads else []
    out = subprocess.run(cmd, cwd=HERE, capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL)
    done = [json.loads(x) for x in out.stdout.splitlines() if '"done"' in x][-1]
    return float(done["decode_tokens_per_s"])


def part_single(model: Path, args: argparse.Namespace) -> None:
    print("2. one client: decode tokens/sec")
    prompt = SHORT[0]
    served, alike, alone = [], [], []
    attention = "auto"
    for _ in range(args.rounds):
        with localrun_server(model, 1, args) as server:
            stream_chat(server, [{"role": "user", "content": prompt}], 4)
            served.append(stream_chat(server, [{"role": "user", "content": prompt}], args.tokens).decode_rate)
            attention = server.flash_attn
        alike.append(_generate_rate(model, prompt, args, "--flash-attn", attention))
        alone.append(_generate_rate(model, prompt, args))
    print(f"   serve {statistics.median(served):.1f} tok/s (client side, flash attention {attention}), "
          f"generate --flash-attn {attention} {statistics.median(alike):.1f}: "
          f"serve/generate {ratio_summary(served, alike, range_of_one=False)}", flush=True)  # fmt: skip
    print(f"   generate with its own flash attention for this short prompt {statistics.median(alone):.1f}: "
          f"serve/generate {ratio_summary(served, alone, range_of_one=False)}", flush=True)  # fmt: skip


def chat_turns(server: Server, turns: int, tokens: int) -> list[Streamed]:
    """One client's conversation of ``turns`` turns, re-sending the whole history each turn."""
    messages = [{"role": "system", "content": SYSTEM}]
    replies = []
    for turn in range(turns):
        question = SHORT[(1 if turn == turns - 1 and turns > 2 else turn) % len(SHORT)]  # the last asks turn 2's again
        messages.append({"role": "user", "content": question})
        got = stream_chat(server, messages, tokens)
        messages.append({"role": "assistant", "content": got.text})
        replies.append(got)
    return replies


def _chat_line(name: str, replies: list[Streamed]) -> str:
    """TTFT of turn 2 and the last turn, and the server's prompt evaluation behind each:
    tokens evaluated, tokens reused, milliseconds per evaluated token."""

    def turn(k: int, got: Streamed) -> str:
        t = got.timings
        line = f"turn {k} {got.ttft * 1000:.0f} ms"
        if t.get("prompt_n"):
            per = float(t.get("prompt_ms", 0.0)) / int(t["prompt_n"])
            line += f" ({t['prompt_n']} tokens evaluated at {per:.1f} ms each, {t.get('cache_n', got.cached)} reused)"
        return line

    last = len(replies)
    ratio = replies[-1].ttft / replies[1].ttft
    return f"   {name}: {turn(2, replies[1])}, {turn(last, replies[-1])}: {ratio:.2f}x"


def part_chat(model: Path, args: argparse.Namespace) -> None:
    print(f"3. a {args.turns}-turn chat re-sending its history: time to first token, turn {args.turns} / turn 2 "
          f"(turn {args.turns} asks turn 2's question again)")  # fmt: skip
    ratios: dict[str, list[float]] = {"serve": [], "llama-server": []}
    for _ in range(args.rounds):
        with localrun_server(model, 1, args) as server:
            replies = chat_turns(server, args.turns, args.tokens)
        print(_chat_line("serve", replies), flush=True)
        ratios["serve"].append(replies[-1].ttft / replies[1].ttft)
        if args.llama_server:
            with llama_server(args.llama_server, model, 1, args) as server:
                replies = chat_turns(server, args.turns, args.tokens)
            print(_chat_line("llama-server", replies), flush=True)
            ratios["llama-server"].append(replies[-1].ttft / replies[1].ttft)
    if args.rounds > 1:
        for name, values in ratios.items():
            if values:
                print(f"   {name}: median {statistics.median(values):.2f}x over {len(values)} rounds "
                      f"(range {min(values):.2f}-{max(values):.2f})", flush=True)  # fmt: skip


def _malformed(server: Server, k: int) -> bool:
    bodies = [b"{not json", b'{"messages": "hi"}', b'{"messages": [{"role": "user"}], "temperature": "hot"}']
    status, body = _raw(server, "POST", "/v1/chat/completions", bodies[k % len(bodies)])
    return status == 400 and isinstance(body, dict) and "error" in body


def _load_kinds(n: int) -> list[str]:
    """Request kinds in order: 10% disconnect mid-stream, 5% malformed, the rest well-formed."""
    kinds = ["ok"] * n
    for i in range(0, n, 10):
        kinds[i] = "disconnect"
    for i in range(5, n, 20):
        kinds[i] = "malformed"
    return kinds


def _load_request(server: Server, k: int, kind: str, tokens: int) -> bool:
    """Whether request ``k`` of ``kind`` got what it should."""
    if kind == "malformed":
        return _malformed(server, k)
    messages = [{"role": "user", "content": SHORT[k % len(SHORT)]}]
    try:
        got = stream_chat(server, messages, tokens, stop_after=3 if kind == "disconnect" else None)
    except openai.APIError:
        return False
    return kind == "disconnect" or (got.finish in ("stop", "length") and got.tokens > 0)


def _wait_idle(server: Server) -> dict[str, Any]:
    health: dict[str, Any] = {}
    for _ in range(600):
        health = _raw(server, "GET", "/health")[1]
        if not health["slots_processing"] and not health["queued"]:
            break
        time.sleep(0.1)
    return health


def part_load(model: Path, args: argparse.Namespace) -> None:
    print(f"4. load: {args.load} requests from {args.load_clients} clients, 10% disconnecting, 5% malformed")
    with localrun_server(model, min(args.load_clients, 4), args) as server:
        concurrent(server, [SHORT[i % len(SHORT)] for i in range(args.load_clients)], args.tokens)  # warm-up
        rss_before = server.rss_mib()
        outcomes: dict[str, list[bool]] = {"ok": [], "disconnect": [], "malformed": []}
        lock = threading.Lock()
        work = iter(enumerate(_load_kinds(args.load)))

        def client() -> None:
            for k, kind in work:
                ok = _load_request(server, k, kind, args.tokens)
                with lock:
                    outcomes[kind].append(ok)

        threads = [threading.Thread(target=client) for _ in range(args.load_clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        health = _wait_idle(server)
        time.sleep(1.0)
        rss_after = server.rss_mib()
    ok, bad = outcomes["ok"], outcomes["malformed"]
    slots = health["slots_idle"] + health["slots_processing"]
    print(
        f"   well-formed completed: {sum(ok)}/{len(ok)}; malformed answered 400: {sum(bad)}/{len(bad)}; "
        f"disconnected: {len(outcomes['disconnect'])}; slots free at the end: {health['slots_idle']}/{slots}, "
        f"queued {health['queued']}"
    )
    change = (rss_after / rss_before - 1) * 100 if rss_before else 0.0
    print(f"   resident memory: {rss_before:.0f} MiB before, {rss_after:.0f} MiB after ({change:+.1f}%)", flush=True)


def long_system_prompt() -> str:
    """A system prompt of about 1,500 tokens that no earlier run has seen (a
    fresh number first), so the prompt cache starts without it."""
    rules = [
        f"Rule {i}: when the question is about {topic}, answer with the shortest correct code, name the one "
        f"pitfall that matters most, and never repeat the question back."
        for i, topic in enumerate(["strings", "files", "regular expressions", "processes", "sockets", "dates"] * 8)
    ]
    return f"Session {random.randrange(10**9)}. {SYSTEM}\n" + "\n".join(rules)


def part_restart(model: Path, args: argparse.Namespace) -> None:
    print("5. a long system prompt after a restart: time to first token of a new server's first request")
    for _ in range(args.rounds):
        system = long_system_prompt()
        figures: dict[str, Streamed] = {}
        for name, extra in (("cold", ()), ("from the prompt cache", ()), ("--no-prompt-cache", ("--no-prompt-cache",))):
            with localrun_server(model, 1, args, *extra) as server:
                question = SHORT[len(figures)]
                messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
                figures[name] = stream_chat(server, messages, 16)
        line = ", ".join(
            f"{name} {got.ttft * 1000:.0f} ms ({got.timings.get('cache_n', got.cached)} of "
            f"{int(got.timings.get('prompt_n', 0)) + int(got.timings.get('cache_n', 0))} tokens reused)"
            for name, got in figures.items()
        )
        ratio = figures["from the prompt cache"].ttft / figures["--no-prompt-cache"].ttft
        print(f"   {line}: cached / not {ratio:.3f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    parser.add_argument("--clients", default="4,8", help="concurrent clients (and --parallel) of part 1")
    parser.add_argument("--tokens", type=int, default=128, help="max tokens per request")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--load", type=int, default=64, help="requests of the load test")
    parser.add_argument("--load-clients", type=int, default=16)
    parser.add_argument("--ctx", type=int, default=4096, help="each slot's context")
    parser.add_argument("--threads", type=int, help="fixed CPU threads everywhere (default: each one's own)")
    parser.add_argument("--llama-server", type=Path, help="llama.cpp's llama-server, for a column beside serve")
    parser.add_argument("--parts", default="1,2,3,4,5", help="which parts to run")
    parser.add_argument("--busy", type=int, default=0, help="competing CPU-bound processes through every part")
    parser.add_argument("--fixed-threads", type=int, help="part 1: serve --threads T beside serve's default")
    parser.add_argument(
        "--in-process", action="store_true", help="part 1: serve --in-process (no runner processes) beside serve"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: small everything")
    args = parser.parse_args()
    if args.quick:
        args.clients, args.tokens, args.turns, args.load, args.load_clients = "2", 24, 4, 16, 4
    args.clients = [int(c) for c in str(args.clients).split(",")]
    model = model_path(args.model)
    os.environ.pop("LOCALRUN_API_KEY", None)
    parts = {"1": part_throughput, "2": part_single, "3": part_chat, "4": part_load, "5": part_restart}
    with cpu_load(args.busy):
        if args.busy:
            print(f"beside {args.busy} competing CPU-bound process(es)", flush=True)
        for key in args.parts.split(","):
            parts[key.strip()](model, args)


if __name__ == "__main__":
    main()
