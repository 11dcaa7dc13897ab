#!/usr/bin/env python3
"""A whole tool loop through `localrun serve` with the official clients, on a real model.

    .venv/bin/python scripts/tool_loop.py [MODEL] [--ctx 4096]

Two tools are declared; the model is asked a question that needs one; its call
is answered with a made-up result; the model then answers in text. Run with
the `openai` client (not streamed, then streamed, the stream's deltas
reassembled) and with the `anthropic` client through /v1/messages (the SDK's
stream helper). Prints each step and exits 1 if any step fails: a call that
does not name a declared tool, arguments that are not the tool's JSON, or no
final answer. The answer is asked for with the tools still declared and
`tool_choice` none: offered them again, Qwen2.5-Coder-1.5B repeats its call
rather than answer. The tests run the same loop on tiny models; this is the
real model's run (default: the registry's qwen2.5-coder:1.5b).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anthropic

from scripts._models import HelpFormatter, model_path
from scripts.bench_serve import Server, localrun_server

WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"],
    },
}
TIME = {
    "name": "get_time",
    "description": "The current time in a timezone, as an offset from UTC in hours.",
    "parameters": {"type": "object", "properties": {"tz": {"type": "integer"}}, "required": ["tz"]},
}
QUESTION = "What's the weather in Lisbon right now, in celsius?"
RESULT = json.dumps({"city": "Lisbon", "temperature": 18, "unit": "celsius", "sky": "clear"})


def _check(step: str, ok: bool, detail: str) -> bool:
    print(f"  {'ok ' if ok else 'FAIL'} {step}: {detail}")
    return ok


def _valid_call(name: str, arguments: str | dict[str, Any]) -> bool:
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    return name == "get_weather" and isinstance(args.get("city"), str)


def openai_loop(server: Server, stream: bool) -> bool:
    client = server.client()
    model = client.models.list().data[0].id
    tools: Any = [{"type": "function", "function": f} for f in (WEATHER, TIME)]
    messages: Any = [{"role": "user", "content": QUESTION}]
    if stream:
        calls: dict[int, dict[str, str]] = {}
        for chunk in client.chat.completions.create(
            model=model, messages=messages, tools=tools, max_tokens=200, temperature=0, stream=True
        ):
            for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                call["id"] = delta.id or call["id"]
                call["name"] += delta.function.name or "" if delta.function else ""
                call["arguments"] += delta.function.arguments or "" if delta.function else ""
        got = [calls[i] for i in sorted(calls)]
    else:
        first = client.chat.completions.create(
            model=model, messages=messages, tools=tools, max_tokens=200, temperature=0
        )
        got = [
            {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
            for c in first.choices[0].message.tool_calls or []
            if c.type == "function"
        ]
    ok = _check("call", len(got) >= 1 and _valid_call(got[0]["name"], got[0]["arguments"]), json.dumps(got))
    if not ok:
        return False
    call = got[0]
    messages.append(
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
            ],
        }
    )
    messages.append({"role": "tool", "tool_call_id": call["id"], "content": RESULT})
    final = client.chat.completions.create(
        model=model, messages=messages, tools=tools, tool_choice="none", max_tokens=80, temperature=0
    )
    text = final.choices[0].message.content or ""
    return _check("answer", bool(text.strip()) and not final.choices[0].message.tool_calls, repr(text[:120]))


def anthropic_loop(server: Server) -> bool:
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=600)
    model = server.client().models.list().data[0].id
    tools: Any = [
        {"name": f["name"], "description": f["description"], "input_schema": f["parameters"]} for f in (WEATHER, TIME)
    ]
    messages: Any = [{"role": "user", "content": QUESTION}]
    with client.messages.stream(
        model=model, max_tokens=200, messages=messages, tools=tools, extra_body={"temperature": 0}
    ) as stream:
        first = stream.get_final_message()
    uses = [b for b in first.content if b.type == "tool_use"]
    if not _check("tool_use", bool(uses) and _valid_call(uses[0].name, uses[0].input), str([u.input for u in uses])):
        return False
    messages.append({"role": "assistant", "content": [b.model_dump() for b in first.content]})
    messages.append(
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": RESULT}]}
    )
    final = client.messages.create(
        model=model,
        max_tokens=80,
        messages=messages,
        tools=tools,
        tool_choice={"type": "none"},
        extra_body={"temperature": 0},
    )
    text = "".join(b.text for b in final.content if b.type == "text")
    return _check("answer", bool(text.strip()) and final.stop_reason != "tool_use", repr(text[:120]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("model", nargs="?", default="qwen2.5-coder:1.5b", help="a model name or GGUF path")
    ap.add_argument("--ctx", type=int, default=4096, help="each slot's context")
    args = ap.parse_args()
    args.load, args.threads = 4, None  # what bench_serve's server start reads
    model = model_path(args.model)
    results = []
    with localrun_server(model, 1, args) as server:
        print("openai:")
        results.append(openai_loop(server, stream=False))
        print("openai, streamed:")
        results.append(openai_loop(server, stream=True))
        print("anthropic, streamed:")
        results.append(anthropic_loop(server))
    print(f"{sum(results)} of {len(results)} loops ended in an answer after a valid call")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
