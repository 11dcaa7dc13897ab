#!/usr/bin/env python3
"""Make the golden renders of every vendored chat template with llama.cpp's own renderer.

    .venv/bin/python scripts/template_goldens.py --llama-server PATH/TO/llama-server
        [--set main|heldout] [--only NAME ...]

For each template in the pinned llama.cpp (``tests/vendored.py``) this starts
``llama-server --jinja --chat-template-file TEMPLATE`` on a tiny random-weight
model (``tests/tinymodel.py``) on 127.0.0.1, and posts each conversation of the
set to ``POST /apply-template``: the prompt llama-server would decode for that
chat-completions body. It writes ``tests/data/template_goldens[_heldout]/``:
``scenarios.json`` (the request bodies, by name) and one ``TEMPLATE.json`` per
template: the BOS/EOS text the template saw, the date it ran on (templates
print it; the server runs with TZ=UTC), and per scenario either the ``prompt``
or the ``error`` llama-server answered. The tests compare localrun's renderer
with these files, so they need no llama.cpp build.

Build llama-server from the pinned sources (``vendor/llama.cpp`` in the
llama-cpp-python sdist) with ``cmake --build build --target llama-server``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.tinymodel import EOS_ID, SPECIALS, write_tiny_model  # noqa: E402
from tests.vendored import templates  # noqa: E402

DATA = ROOT / "tests" / "data"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city, météo included",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": 'City name, e.g. "Paris"'},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer", "minimum": 1},
                "filters": {"type": "object", "properties": {"site": {"type": "string"}}},
            },
            "required": ["query"],
        },
    },
}
NOW_TOOL = {"type": "function", "function": {"name": "now", "description": "The current time"}}


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
MAIN: dict[str, dict[str, Any]] = {
    "plain": {"messages": [{"role": "user", "content": "Hello! How are you?"}]},
    "system": {"messages": [SYSTEM, {"role": "user", "content": "What is the capital of France?"}]},
    "multi_turn": {
        "messages": [
            SYSTEM,
            {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello! How can I help you today?"},
            {"role": "user", "content": "Tell me a joke."},
        ]
    },
    "no_generation_prompt": {
        "messages": [SYSTEM, {"role": "user", "content": "Hi there"}],
        "add_generation_prompt": False,
    },
    "tools": {
        "messages": [SYSTEM, {"role": "user", "content": "What's the weather in Paris?"}],
        "tools": [WEATHER],
    },
    "tool_call": {
        "messages": [
            {"role": "user", "content": "What's the weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [_call("call00001", "get_weather", '{"location": "Paris", "unit": "celsius"}')],
            },
            {"role": "tool", "tool_call_id": "call00001", "content": '{"temperature": 21, "sky": "clear"}'},
        ],
        "tools": [WEATHER],
    },
    "tool_call_answered": {
        "messages": [
            SYSTEM,
            {"role": "user", "content": "What's the weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call("call00001", "get_weather", '{"location": "Paris"}')],
            },
            {"role": "tool", "tool_call_id": "call00001", "content": "21 degrees and sunny"},
            {"role": "assistant", "content": "It is 21 degrees and sunny in Paris."},
            {"role": "user", "content": "Thanks!"},
        ],
        "tools": [WEATHER],
    },
    "thinking_off": {
        "messages": [{"role": "user", "content": "What is 2+2?"}],
        "chat_template_kwargs": {"enable_thinking": False},
    },
    "thinking_on": {
        "messages": [{"role": "user", "content": "What is 2+2?"}],
        "chat_template_kwargs": {"enable_thinking": True},
    },
    "reasoning_effort_low": {"messages": [{"role": "user", "content": "What is 2+2?"}], "reasoning_effort": "low"},
    "reasoning_effort_high": {"messages": [{"role": "user", "content": "What is 2+2?"}], "reasoning_effort": "high"},
    "prefill": {
        "messages": [
            {"role": "user", "content": "Write a haiku."},
            {"role": "assistant", "content": "Autumn"},
        ]
    },
    "reasoning_history": {
        "messages": [
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "Two plus two makes four."},
            {"role": "user", "content": "And 3+3?"},
        ]
    },
}

HELDOUT: dict[str, dict[str, Any]] = {
    "single_user": {"messages": [{"role": "user", "content": "Write a haiku about autumn leaves."}]},
    "system_multi": {
        "messages": [
            {"role": "system", "content": "Answer in French.\nBe brief."},
            {"role": "user", "content": "Good morning"},
            {"role": "assistant", "content": "Bonjour !"},
            {"role": "user", "content": "How do I say 'thank you'?"},
            {"role": "assistant", "content": "Merci."},
            {"role": "user", "content": "And 'please'?"},
        ]
    },
    "two_tools_offered": {
        "messages": [{"role": "user", "content": "Find recent news about llamas"}],
        "tools": [WEATHER, SEARCH, NOW_TOOL],
    },
    "parallel_calls": {
        "messages": [
            {"role": "system", "content": "Use tools when useful."},
            {"role": "user", "content": "Weather in Oslo and in Rome?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    _call("call00002", "get_weather", '{"location": "Oslo"}'),
                    _call("call00003", "get_weather", '{"location": "Rome", "unit": "fahrenheit"}'),
                ],
            },
            {"role": "tool", "tool_call_id": "call00002", "content": "-3 C"},
            {"role": "tool", "tool_call_id": "call00003", "content": "64 F"},
        ],
        "tools": [WEATHER, SEARCH],
    },
    "nested_arguments": {
        "messages": [
            {"role": "user", "content": "Search 5 pages of docs"},
            {
                "role": "assistant",
                "content": "Searching.",
                "tool_calls": [
                    _call("srch00001", "search", '{"query": "gguf", "limit": 5, "filters": {"site": "docs"}}')
                ],
            },
            {"role": "tool", "tool_call_id": "srch00001", "content": "[]"},
            {"role": "assistant", "content": "Nothing found."},
            {"role": "user", "content": "Try again"},
        ],
        "tools": [SEARCH],
    },
    "thinking_off_system": {
        "messages": [
            {"role": "system", "content": "Be precise."},
            {"role": "user", "content": "Name a prime above 10"},
        ],
        "chat_template_kwargs": {"enable_thinking": False},
    },
    "reasoning_effort_medium": {
        "messages": [{"role": "system", "content": "Think step by step."}, {"role": "user", "content": "Why?"}],
        "reasoning_effort": "medium",
    },
    "reasoning_two_turns": {
        "messages": [
            {"role": "user", "content": "Pick a colour"},
            {"role": "assistant", "content": "Blue.", "reasoning_content": "Any colour works; blue is common."},
            {"role": "user", "content": "Another one"},
            {"role": "assistant", "content": "Green.", "reasoning_content": "Not blue again."},
            {"role": "user", "content": "Last one"},
        ],
        "chat_template_kwargs": {"enable_thinking": True},
    },
    "text_parts": {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "First part."}, {"type": "text", "text": "Second."}]}
        ]
    },
    "history_no_prompt": {
        "messages": [
            {"role": "user", "content": "Ping"},
            {"role": "assistant", "content": "Pong"},
            {"role": "user", "content": "Again"},
        ],
        "add_generation_prompt": False,
    },
}

# a second held-out set, made after the renderer was done with the first
HELDOUT2: dict[str, dict[str, Any]] = {
    "unicode": {
        "messages": [
            {"role": "system", "content": "Réponds en français. «Toujours»."},
            {"role": "user", "content": 'Ça va ? 日本語も話せますか？ 🙂\tTab and "quotes"'},
        ]
    },
    "developer_role": {
        "messages": [
            {"role": "developer", "content": "Only answer with numbers."},
            {"role": "user", "content": "How many legs has a spider?"},
        ]
    },
    "typed_arguments": {
        "messages": [
            {"role": "user", "content": "Search with options"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    _call("opts00001", "search", '{"query": "rust", "limit": 2.5, "strict": true, "tags": ["a", "b"]}')
                ],
            },
            {"role": "tool", "tool_call_id": "opts00001", "name": "search", "content": "no results"},
        ],
        "tools": [SEARCH, WEATHER],
    },
    "reasoning_and_call": {
        "messages": [
            {"role": "user", "content": "Weather in Lima?"},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "I should call the weather tool.",
                "tool_calls": [_call("lima00001", "get_weather", '{"location": "Lima"}')],
            },
            {"role": "tool", "tool_call_id": "lima00001", "content": "18 C, cloudy"},
            {"role": "assistant", "content": "18 C and cloudy.", "reasoning_content": "Report it."},
            {"role": "user", "content": "And tomorrow?"},
        ],
        "tools": [WEATHER],
        "chat_template_kwargs": {"enable_thinking": True},
    },
    "thinking_off_tools": {
        "messages": [{"role": "user", "content": "Search for cats"}],
        "tools": [SEARCH],
        "chat_template_kwargs": {"enable_thinking": False},
    },
    "effort_none": {"messages": [{"role": "user", "content": "Quick: 7*6?"}], "reasoning_effort": "none"},
    "long_history": {
        "messages": [
            {"role": "system", "content": "You count."},
            *[{"role": role, "content": str(n)} for n, role in enumerate(["user", "assistant"] * 3, start=1)],
            {"role": "user", "content": "next"},
        ]
    },
    "empty_system": {
        "messages": [{"role": "system", "content": ""}, {"role": "user", "content": "Hello"}],
    },
}

SETS = {"main": MAIN, "heldout": HELDOUT, "heldout2": HELDOUT2}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(base: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.2)
    raise RuntimeError("llama-server did not become ready")


def post(url: str, body: dict[str, Any]) -> dict[str, str]:
    """The prompt llama-server answers, or its error message."""
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return {"prompt": json.loads(response.read())["prompt"]}
    except urllib.error.HTTPError as exc:
        answer = json.loads(exc.read() or b"{}")
        return {"error": str(answer.get("error", {}).get("message", exc.reason))}


def render_all(
    server: str, model: Path, template: str, scenarios: dict[str, dict[str, Any]], tmp: Path
) -> dict[str, Any]:
    """Start one llama-server with ``template`` and post every scenario."""
    path = tmp / "template.jinja"
    path.write_text(template, encoding="utf-8")
    log = tmp / "server.log"
    port = free_port()
    env = {**os.environ, "TZ": "UTC"}
    command = [
        server,
        "-m",
        str(model),
        "--jinja",
        "--chat-template-file",
        str(path),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-c",
        "512",
        "-t",
        "1",
        "--no-webui",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc, log)
        day = datetime.datetime.now(datetime.UTC).date().isoformat()
        cases: dict[str, Any] = {}
        for name, body in scenarios.items():
            cases[name] = post(f"{base}/apply-template", body)
        if datetime.datetime.now(datetime.UTC).date().isoformat() != day:
            raise RuntimeError("the date changed during the run; run it again")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {"date": day, "cases": cases}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-server", required=True, help="a llama-server built from the pinned sources")
    parser.add_argument("--set", choices=sorted(SETS), default="main")
    parser.add_argument("--only", nargs="*", help="template file names to redo (default: all)")
    args = parser.parse_args()
    scenarios = SETS[args.set]
    out = DATA / ("template_goldens" if args.set == "main" else f"template_goldens_{args.set}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "scenarios.json").write_text(json.dumps(scenarios, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        model = write_tiny_model(tmp / "tiny.gguf", n_embd=32, n_layer=1, n_head=2, n_head_kv=1, n_ff=32)
        for name, source in sorted(templates().items()):
            if args.only and name not in args.only and name.removesuffix(".jinja") not in args.only:
                continue
            try:
                result = render_all(args.llama_server, model, source, scenarios, tmp)
            except RuntimeError as exc:
                print(f"{name}: {exc}", file=sys.stderr)
                continue
            golden = {"template": name, "bos_token": SPECIALS[EOS_ID], "eos_token": SPECIALS[EOS_ID], **result}
            target = out / f"{name.removesuffix('.jinja')}.json"
            target.write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
            errors = sum("error" in case for case in result["cases"].values())
            print(f"{name}: {len(result['cases']) - errors} rendered, {errors} refused", file=sys.stderr)


if __name__ == "__main__":
    main()
