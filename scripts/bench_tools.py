#!/usr/bin/env python3
"""Measure tool calls through `localrun serve`, and (optionally) llama-server --jinja, on the same prompts.

    .venv/bin/python scripts/bench_tools.py [MODEL] [--llama-server PATH/TO/llama-server]
        [--tokens 256] [--cases N] [--threads N]

Single-turn prompts of our own (one tool offered, several, nested and enum
parameters, and questions no tool answers), each a streamed request with the
official `openai` client, greedy, `tool_choice: auto`. For each system:

  calls        calls returned (over the cases that expect one, and those that do not)
  valid        calls whose arguments parse as JSON and validate against the
               function's schema, over calls returned (localrun: 100% by construction)
  right        cases answered right: the expected function with the expected
               arguments (strings compared without case), or no call where none is needed
  in content   cases whose call came back as text in `content`, not as a call
  first call   median time from the request to the first tool-call byte of a stream
  tok/s        median decode rate the server reports (`timings.predicted_per_second`,
               which both servers send on the last chunk)

MODEL is any localrun model name (default qwen2.5-coder:1.5b). Servers are
started by this script on 127.0.0.1 with a port the system picks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jsonschema

from scripts._models import HelpFormatter, model_path
from scripts.bench_serve import Server, llama_server, localrun_server

DEFAULT_MODEL = "qwen2.5-coder:1.5b"


def _object(required: list[str], **properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


STRING: dict[str, Any] = {"type": "string"}
FUNCTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "get_weather": (
        "Current weather in a city",
        _object(["city"], city=STRING, unit={"type": "string", "enum": ["celsius", "fahrenheit"]}),
    ),
    "get_time": ("Current local time in an IANA timezone, like Europe/Paris", _object(["timezone"], timezone=STRING)),
    "convert_currency": (
        "Convert an amount between currencies",
        _object(
            ["amount", "source", "target"],
            amount={"type": "number"},
            source={"type": "string", "enum": ["USD", "EUR", "GBP", "JPY", "CHF"]},
            target={"type": "string", "enum": ["USD", "EUR", "GBP", "JPY", "CHF"]},
        ),
    ),
    "search_flights": (
        "Search flights between two cities on a date (YYYY-MM-DD)",
        _object(
            ["origin", "destination", "date"],
            origin=STRING,
            destination=STRING,
            date=STRING,
            passengers={"type": "integer", "minimum": 1},
            cabin={"type": "string", "enum": ["economy", "business", "first"]},
        ),
    ),
    "create_event": (
        "Create a calendar event",
        _object(
            ["title", "start"],
            title=STRING,
            start=_object(["date", "time"], date=STRING, time=STRING),
            attendees={"type": "array", "items": STRING},
        ),
    ),
    "send_email": ("Send an email", _object(["to", "subject"], to=STRING, subject=STRING, body=STRING)),
    "set_thermostat": (
        "Set the home thermostat",
        _object(["temperature"], temperature={"type": "number"}, mode={"type": "string", "enum": ["heat", "cool"]}),
    ),
}
ALL = list(FUNCTIONS)
W, T, C, F, E, M, H = ALL


@dataclass(frozen=True)
class Case:
    prompt: str
    tools: list[str]
    expect: str | None  # the function to call, None: no call
    args: dict[str, Any] = field(default_factory=dict)  # arguments that must be there with these values


CASES: list[Case] = [
    # one tool offered
    Case("What's the weather in Lisbon?", [W], W, {"city": "Lisbon"}),
    Case("Is it raining in Tokyo right now?", [W], W, {"city": "Tokyo"}),
    Case("How warm is it in Oslo, in fahrenheit?", [W], W, {"city": "Oslo", "unit": "fahrenheit"}),
    Case("Weather for Nairobi in celsius please.", [W], W, {"city": "Nairobi", "unit": "celsius"}),
    Case("What time is it in Paris? Use the timezone Europe/Paris.", [T], T, {"timezone": "Europe/Paris"}),
    Case("Current time in America/New_York?", [T], T, {"timezone": "America/New_York"}),
    Case("Convert 100 USD to EUR.", [C], C, {"amount": 100, "source": "USD", "target": "EUR"}),
    Case("How many yen is 250 Swiss francs?", [C], C, {"amount": 250, "source": "CHF", "target": "JPY"}),
    Case("Email bob@example.com with the subject 'Lunch'.", [M], M, {"to": "bob@example.com", "subject": "Lunch"}),
    Case("Set the thermostat to 21 degrees, heating.", [H], H, {"temperature": 21, "mode": "heat"}),
    Case("Cool the house down to 19.", [H], H, {"temperature": 19, "mode": "cool"}),
    # several tools offered
    Case("What's the weather like in Berlin today?", ALL, W, {"city": "Berlin"}),
    Case("Tell me the temperature in Madrid in celsius.", ALL, W, {"city": "Madrid", "unit": "celsius"}),
    Case("What time is it in Asia/Tokyo?", ALL, T, {"timezone": "Asia/Tokyo"}),
    Case("I need the local time for the timezone Australia/Sydney.", ALL, T, {"timezone": "Australia/Sydney"}),
    Case("Convert 42.5 EUR into GBP.", ALL, C, {"amount": 42.5, "source": "EUR", "target": "GBP"}),
    Case("How much is 1000 JPY in USD?", ALL, C, {"amount": 1000, "source": "JPY", "target": "USD"}),
    Case("Change 75 pounds sterling to euros.", ALL, C, {"amount": 75, "source": "GBP", "target": "EUR"}),
    Case("Send an email to ann@example.org titled 'Report ready'.", ALL, M, {"to": "ann@example.org"}),
    Case(
        "Email team@example.com, subject 'Standup moved', body 'Standup is at 10 now.'",
        ALL,
        M,
        {"to": "team@example.com", "subject": "Standup moved"},
    ),
    Case("Set the heating to 22.5 degrees.", ALL, H, {"temperature": 22.5, "mode": "heat"}),
    Case("Turn on cooling at 18 degrees.", ALL, H, {"temperature": 18, "mode": "cool"}),
    Case("Is it sunny in Cape Town?", [W, T, C], W, {"city": "Cape Town"}),
    Case("What's the time in Europe/London?", [W, T, C], T, {"timezone": "Europe/London"}),
    Case("Convert 9 CHF to USD.", [W, T, C], C, {"amount": 9, "source": "CHF", "target": "USD"}),
    Case("Weather in Reykjavik, fahrenheit.", [W, M, H], W, {"city": "Reykjavik", "unit": "fahrenheit"}),
    # nested and enum parameters
    Case(
        "Find flights from Lisbon to Paris on 2026-03-14.",
        ALL,
        F,
        {"origin": "Lisbon", "destination": "Paris", "date": "2026-03-14"},
    ),
    Case(
        "Search business class flights from London to New York on 2026-05-01 for 2 passengers.",
        ALL,
        F,
        {"origin": "London", "destination": "New York", "date": "2026-05-01", "passengers": 2, "cabin": "business"},
    ),
    Case(
        "Any first class flights Tokyo to Seoul on 2026-07-20?",
        [F, W],
        F,
        {"origin": "Tokyo", "destination": "Seoul", "date": "2026-07-20", "cabin": "first"},
    ),
    Case(
        "Economy flights for 3 people from Rome to Athens, 2026-08-09.",
        [F, C],
        F,
        {"origin": "Rome", "destination": "Athens", "passengers": 3, "cabin": "economy"},
    ),
    Case(
        "Look up flights Madrid to Berlin on 2026-02-02.",
        [F],
        F,
        {"origin": "Madrid", "destination": "Berlin", "date": "2026-02-02"},
    ),
    Case(
        "Create an event 'Dentist' on 2026-04-03 at 09:30.",
        ALL,
        E,
        {"title": "Dentist", "start": {"date": "2026-04-03", "time": "09:30"}},
    ),
    Case(
        "Schedule 'Team sync' on 2026-06-10 at 14:00 with alice and bob.",
        ALL,
        E,
        {"title": "Team sync", "start": {"date": "2026-06-10", "time": "14:00"}},
    ),
    Case(
        "Put 'Birthday party' in my calendar for 2026-09-21 at 19:00.",
        [E, M],
        E,
        {"title": "Birthday party", "start": {"date": "2026-09-21", "time": "19:00"}},
    ),
    Case(
        "Add a calendar event called 'Review' on 2026-01-15 at 11:00, attendees carol.",
        [E],
        E,
        {"title": "Review", "start": {"date": "2026-01-15", "time": "11:00"}},
    ),
    Case(
        "Book 'Yoga' on 2026-10-05 at 07:15.",
        [E, W, T],
        E,
        {"title": "Yoga", "start": {"date": "2026-10-05", "time": "07:15"}},
    ),
    Case("Convert 12 dollars to Swiss francs.", [C, H], C, {"amount": 12, "source": "USD", "target": "CHF"}),
    Case("Set cooling mode at 20.", [H, W], H, {"temperature": 20, "mode": "cool"}),
    Case("What is the weather in São Paulo in celsius?", ALL, W, {"city": "São Paulo", "unit": "celsius"}),
    Case("Flights Dublin to Edinburgh, 2026-11-11, first class.", ALL, F, {"origin": "Dublin", "cabin": "first"}),
    # no tool needed
    Case("Write a haiku about the sea.", ALL, None),
    Case("What is 17 times 23?", ALL, None),
    Case("Explain what a Python list comprehension is, in one sentence.", ALL, None),
    Case("Say hello in French.", [W, T], None),
    Case("Write a Python function that reverses a string.", ALL, None),
    Case("What is the capital of Portugal?", [C, M], None),
    Case("Give me a synonym for 'happy'.", ALL, None),
    Case("Summarise the plot of Romeo and Juliet in one sentence.", [W], None),
    Case("Sort these numbers: 5, 2, 9, 1.", ALL, None),
    Case("What does HTTP stand for?", [F, E], None),
    Case("Translate 'thank you' into Spanish.", ALL, None),
    Case("Write a SQL query that counts the rows of a table named users.", ALL, None),
]


def tools_for(case: Case) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {"name": n, "description": FUNCTIONS[n][0], "parameters": FUNCTIONS[n][1]}}
        for n in case.tools
    ]


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, dict):
        return isinstance(got, dict) and all(_same(got.get(k), v) for k, v in want.items())
    if isinstance(want, str):
        return isinstance(got, str) and got.strip().casefold() == want.casefold()
    if isinstance(want, int | float) and not isinstance(want, bool):
        return isinstance(got, int | float) and float(got) == float(want)
    return bool(got == want)


@dataclass
class Outcome:
    calls: list[tuple[str, str]]  # (name, arguments text)
    content: str
    first_call_s: float | None
    tokens_per_s: float


def ask(server: Server, model: str, case: Case, tokens: int) -> Outcome:
    messages: Any = [{"role": "user", "content": case.prompt}]
    tools: Any = tools_for(case)
    t0 = time.perf_counter()
    stream = server.client().chat.completions.create(
        model=model,
        messages=messages,
        tools=tools,
        tool_choice="auto",
        temperature=0,
        max_tokens=tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    calls: dict[int, list[str]] = {}
    content: list[str] = []
    first_call = None
    rate = 0.0
    for chunk in stream:
        now = time.perf_counter()
        timings = (chunk.model_extra or {}).get("timings")
        if isinstance(timings, dict):
            rate = float(timings.get("predicted_per_second") or 0.0)
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content.append(delta.content or "")
        for call in delta.tool_calls or []:
            first_call = first_call or now
            entry = calls.setdefault(call.index, ["", ""])
            entry[0] += (call.function.name or "") if call.function else ""
            entry[1] += (call.function.arguments or "") if call.function else ""
    return Outcome(
        [(c[0], c[1]) for _, c in sorted(calls.items())],
        "".join(content),
        first_call - t0 if first_call else None,
        rate,
    )


def _valid(name: str, arguments: str) -> bool:
    if name not in FUNCTIONS:
        return False
    try:
        jsonschema.validate(json.loads(arguments), FUNCTIONS[name][1])
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def _right(case: Case, got: Outcome) -> bool:
    if case.expect is None:
        return not got.calls
    if not got.calls:
        return False
    name, arguments = got.calls[0]
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError:
        return False
    return name == case.expect and _same(args, case.args)


def _leaked(case: Case, got: Outcome) -> bool:
    """A call written into the content as text (what llama-server --jinja does with fenced JSON)."""
    return not got.calls and case.expect is not None and '"name"' in got.content and case.expect in got.content


def run(name: str, server: Server, cases: list[Case], tokens: int) -> dict[str, Any]:
    model = server.client().models.list().data[0].id
    outcomes = []
    for k, case in enumerate(cases):
        got = ask(server, model, case, tokens)
        outcomes.append(got)
        mark = "ok" if _right(case, got) else "WRONG"
        print(f"   {name} {k + 1:2}/{len(cases)} {mark:5} {got.calls or repr(got.content[:60])}", flush=True)
    calls = [c for o in outcomes for c in o.calls]
    return {
        "calls": len(calls),
        "valid": sum(_valid(*c) for c in calls),
        "right": sum(_right(c, o) for c, o in zip(cases, outcomes, strict=True)),
        "leaked": sum(_leaked(c, o) for c, o in zip(cases, outcomes, strict=True)),
        "first_call": [o.first_call_s for o in outcomes if o.first_call_s is not None],
        "rates": [o.tokens_per_s for o in outcomes if o.tokens_per_s > 0],
    }


def _line(name: str, r: dict[str, Any], n: int) -> str:
    def median(values: list[float], scale: float = 1.0) -> str:
        return f"{statistics.median(values) * scale:.0f}" if values else "-"

    valid = f"{r['valid']}/{r['calls']} ({100 * r['valid'] / r['calls']:.0f}%)" if r["calls"] else "0/0"
    return (
        f"{name:14} calls {r['calls']:3}  valid {valid:14} right {r['right']}/{n} ({100 * r['right'] / n:.0f}%)"
        f"  in content {r['leaked']:2}  first call {median(r['first_call'], 1000)} ms  {median(r['rates'])} tok/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    parser.add_argument("--llama-server", type=Path, help="llama.cpp's llama-server, run with --jinja beside serve")
    parser.add_argument("--tokens", type=int, default=256, help="max tokens per request")
    parser.add_argument("--cases", type=int, help="only the first N cases (a smoke run)")
    parser.add_argument("--ctx", type=int, default=4096, help="the slot's context")
    parser.add_argument("--threads", type=int, help="fixed CPU threads for both servers")
    args = parser.parse_args()
    args.load = 1  # localrun_server's --queue
    model = model_path(args.model)
    os.environ.pop("LOCALRUN_API_KEY", None)
    cases = CASES[: args.cases] if args.cases else CASES
    print(f"{len(cases)} cases ({sum(c.expect is None for c in cases)} need no call), {model.name}", flush=True)
    systems: list[tuple[str, Callable[[], Any]]] = [("localrun serve", lambda: localrun_server(model, 1, args))]
    if args.llama_server is not None:
        binary = args.llama_server
        systems.append(("llama-server", lambda: llama_server(binary, model, 1, args, "auto", "--jinja")))
    results = {}
    for name, start in systems:
        with start() as server:
            results[name] = run(name, server, cases, args.tokens)
        print(_line(name, results[name], len(cases)), flush=True)  # now, in case a later system is stopped
    for name, r in results.items():
        print(_line(name, r, len(cases)), flush=True)


if __name__ == "__main__":
    main()
