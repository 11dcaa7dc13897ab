#!/usr/bin/env python3
"""A soak of `localrun serve`: minutes of random mixed traffic, loads and
unloads across three models under --models-max 2, and runner kills.

    .venv/bin/python scripts/soak_serve.py [A.gguf B.gguf C.gguf] [--minutes 10] [--clients 4]
        [--kill-every 60] [--json]

Three GGUF files (default: three tiny random-weight models written here)
are registered as pulled models in a fresh LOCALRUN_HOME and served on
demand by one `localrun serve --models-max 2 --pooling mean`. --clients
threads send, for --minutes, requests of a random kind to a random model
through the official clients: chat, streamed chat (a quarter of them
dropped mid-stream), a chat offering a tool, embeddings, Responses, and
Anthropic's messages. Every --kill-every seconds a loaded model's runner is
killed with SIGKILL; the requests it had in flight fail with a 5xx naming
the kill, and count as injected.

It reports the requests by kind and status, p50/p99 latency of the
answered ones, the server's resident memory at minute 2 and at the end
(the goal: within 10%), its threads, the runner processes seen and
whether any is left once the server stops. Exit 1 when a 5xx other than
the injected kills, a thread or a process is left, or memory grew by more
than 10%.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anthropic
import httpx2 as httpx
import openai

from scripts.bench_router import register_pulled, rss_mib, threads
from scripts.bench_serve import Server, serve_process

ALIASES = ("alpha:soak", "beta:soak", "gamma:soak")
KINDS = ("chat", "stream", "tools", "embeddings", "responses", "anthropic")
KILLED = "killed by SIGKILL"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
PROMPTS = ["Tell me about the sea.", "What is 2 + 2?", "Write a haiku about rain.", "Name three colours."]


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)
    latencies: defaultdict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    unexpected: list[str] = field(default_factory=list)
    injected: int = 0
    cancelled: int = 0

    def add(self, kind: str, status: int, seconds: float, error: str = "") -> None:
        with self.lock:
            self.statuses[(kind, status)] += 1
            if status == 200:
                self.latencies[kind].append(seconds)
            elif status >= 500 and KILLED in error:
                self.injected += 1
            elif status >= 500 or status == 0:
                self.unexpected.append(f"{kind} {status}: {error[:200]}")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)] if ordered else float("nan")


def one_request(kind: str, model: str, server: Server, rng: random.Random, tally: Tally) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
    prompt = rng.choice(PROMPTS)
    t0 = time.monotonic()
    try:
        if kind == "chat":
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}], max_tokens=32)
        elif kind == "stream":
            stream = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": prompt}], max_tokens=64, stream=True
            )
            drop = rng.random() < 0.25
            for n, _ in enumerate(stream):
                if drop and n == 3:
                    stream.close()  # the client goes away mid-stream
                    with tally.lock:
                        tally.cancelled += 1
                    break
        elif kind == "tools":
            client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "What's the weather in Paris?"}],
                tools=[WEATHER],  # type: ignore[list-item]
                max_tokens=48,
            )
        elif kind == "embeddings":
            client.embeddings.create(model=model, input=[prompt, "another text"])
        elif kind == "responses":
            client.responses.create(model=model, input=prompt, max_output_tokens=32)
        else:
            with anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=300) as claude:
                claude.messages.create(model=model, max_tokens=32, messages=[{"role": "user", "content": prompt}])
        tally.add(kind, 200, time.monotonic() - t0)
    except (openai.APIStatusError, anthropic.APIStatusError) as exc:
        tally.add(kind, exc.status_code, time.monotonic() - t0, str(exc))
    except (openai.APIError, anthropic.APIError, httpx.HTTPError) as exc:  # a stream cut by the kill
        tally.add(kind, 500 if KILLED in str(exc) else 0, time.monotonic() - t0, str(exc))
    finally:
        client.close()


def runners(server: Server) -> dict[str, tuple[int, int]]:
    """Each loaded model's runner process and its busy slots."""
    data = httpx.get(server.url + "/v1/models", timeout=60).json()["data"]
    return {
        m["id"]: (m["status"]["pid"], m["status"]["slots_busy"])
        for m in data
        if m["status"]["value"] == "loaded" and "pid" in m["status"]
    }


def unload_all(server: Server) -> None:
    """Every loaded model unloaded (its runner ends), once its requests have."""
    deadline = time.monotonic() + 120
    while (loaded := runners(server)) and time.monotonic() < deadline:
        for model in loaded:
            httpx.post(server.url + "/models/unload", json={"model": model}, timeout=120)
        time.sleep(0.5)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def soak(files: list[Path], args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        register_pulled(home, dict(zip(ALIASES, files, strict=True)))
        env = {**os.environ, "LOCALRUN_HOME": str(home / "localrun")}
        serve_args = ["--models-max", "2", "--pooling", "mean", "--parallel", "2", "--ctx", "2048", "--no-log"]
        serve_args += ["--idle-unload", "20s", "--queue-timeout", "2m"]
        with serve_process(serve_args, env) as server:
            return _run(server, args)


def _run(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    pid = server.proc.pid
    tally = Tally()
    seen: set[int] = set()
    memory: list[tuple[float, float]] = []
    kills: list[str] = []
    rss_start = rss_mib(pid)
    warm = random.Random(-1)
    for kind in KINDS:  # every path run once, then nothing loaded: what the server holds of its own
        one_request(kind, ALIASES[0], server, warm, Tally())
    unload_all(server)
    time.sleep(1)
    rss_warm, threads_warm = rss_mib(pid), threads(pid)
    start = time.monotonic()
    end = start + args.minutes * 60

    def client_loop(seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < end:
            one_request(rng.choice(KINDS), rng.choice(ALIASES), server, rng, tally)

    workers = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(args.clients)]
    for worker in workers:
        worker.start()
    next_kill = start + args.kill_every
    while time.monotonic() < end:
        time.sleep(min(1.0, max(end - time.monotonic(), 0)))
        now = time.monotonic()
        loaded = runners(server)
        seen.update(p for p, _ in loaded.values())
        memory.append((now - start, rss_mib(pid)))
        if args.kill_every and now >= next_kill and loaded:
            busy = sorted(m for m, (_, n) in loaded.items() if n) or sorted(loaded)  # one with requests, if any
            victim = random.choice(busy)
            os.kill(loaded[victim][0], signal.SIGKILL)
            kills.append(victim)
            next_kill = now + args.kill_every
    for worker in workers:
        worker.join(600)
    seen.update(p for p, _ in runners(server).values())
    unload_all(server)
    time.sleep(1)
    rss_end, threads_end = rss_mib(pid), threads(pid)
    after_two = [m for t, m in memory if t >= min(120.0, args.minutes * 60 / 2)] or [rss_warm]
    rss_from, rss_peak, rss_last = after_two[0], max(after_two), after_two[-1]
    server.proc.terminate()
    server.proc.wait(120)
    time.sleep(1)
    left = sorted(p for p in seen if alive(p))
    total = sum(tally.statuses.values())
    report = {
        "minutes": args.minutes,
        "clients": args.clients,
        "requests": total,
        "statuses": {f"{kind} {status}": n for (kind, status), n in sorted(tally.statuses.items())},
        "latency_s": {
            kind: {"p50": round(_pct(v, 0.5), 3), "p99": round(_pct(v, 0.99), 3), "n": len(v)}
            for kind, v in sorted(tally.latencies.items())
        },
        "kills": len(kills),
        "failed_by_kills": tally.injected,
        "dropped_mid_stream": tally.cancelled,
        "unexpected": tally.unexpected,
        "server_rss_mib": {
            "start": round(rss_start, 1),
            "idle_before": round(rss_warm, 1),
            "minute_2": round(rss_from, 1),
            "peak_after_minute_2": round(rss_peak, 1),
            "last_under_traffic": round(rss_last, 1),
            "idle_after": round(rss_end, 1),
        },
        "server_threads": {"idle_before": threads_warm, "idle_after": threads_end},
        "runners_seen": len(seen),
        "runners_left": left,
    }
    flat = max(rss_peak, rss_end) <= rss_from * 1.10  # from minute 2 to the end, loaded or idle
    grew = threads_end - threads_warm  # the HTTP server's pool may grow to serve the clients at once
    report["ok"] = not tally.unexpected and not left and flat and grew <= args.clients and total > 0
    return report


def _print(report: dict[str, Any]) -> None:
    print(f"{report['requests']} requests in {report['minutes']} min from {report['clients']} clients")
    for key, n in report["statuses"].items():
        print(f"  {key}: {n}")
    for kind, lat in report["latency_s"].items():
        print(f"  {kind}: p50 {lat['p50']} s, p99 {lat['p99']} s ({lat['n']} answered)")
    print(f"runner kills: {report['kills']}, requests they failed: {report['failed_by_kills']}")
    print(f"streams dropped by their client: {report['dropped_mid_stream']}")
    print(f"5xx other than the kills: {len(report['unexpected'])}")
    for line in report["unexpected"][:10]:
        print(f"  {line}")
    rss = report["server_rss_mib"]
    print(
        f"server memory: {rss['start']} MiB at start, {rss['idle_before']} idle before the soak; "
        f"{rss['minute_2']} at minute 2, at most {rss['peak_after_minute_2']} after it, "
        f"{rss['last_under_traffic']} at the end of the traffic, {rss['idle_after']} idle after it"
    )
    t = report["server_threads"]
    print(f"server threads, no model loaded: {t['idle_before']} before the soak, {t['idle_after']} after it")
    print(f"runner processes: {report['runners_seen']} seen, {len(report['runners_left'])} left after the server")
    print("ok" if report["ok"] else "NOT ok")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", type=Path, help="three GGUF files (default: tiny ones written here)")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--kill-every", type=float, default=60.0, help="seconds between runner kills (0: none)")
    parser.add_argument("--json", action="store_true", help="the report as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = list(args.models)
        if not files:
            from tests.tinymodel import write_tiny_model

            files = [write_tiny_model(Path(tmp) / f"{a.split(':')[0]}.gguf", seed=i) for i, a in enumerate(ALIASES)]
        if len(files) != 3:
            parser.error("give three GGUF files, or none")
        report = soak(files, args)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print(report)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
