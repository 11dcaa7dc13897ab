"""An MCP server written by hand (JSON-RPC lines on stdio, no SDK), to
misbehave on purpose: ``garbage`` writes lines that are not JSON-RPC before
each answer, ``bad-schema`` lists a tool whose input schema is not a JSON
Schema beside one that is, ``silent`` never answers, ``exit-on-call`` ends
when a tool is called."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

MODE = sys.argv[1] if len(sys.argv) > 1 else ""
TEXT = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
GOOD = {"name": "echo", "description": "Echo the text.", "inputSchema": TEXT}
BAD = [  # one the SDK cannot read, one it reads that is no JSON Schema
    {"name": "broken", "description": "Its schema is not one.", "inputSchema": {"type": "object", "properties": 5}},
    {
        "name": "typo",
        "description": "A type that is none.",
        "inputSchema": {"type": "object", "properties": {"x": {"type": "strin"}}},
    },
]


def answer(request_id: object, result: dict[str, object]) -> None:
    if MODE == "garbage":
        sys.stdout.write('this is not JSON-RPC\n{"half": \n')
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}) + "\n")
    sys.stdout.flush()


def main() -> None:
    if pidfile := os.environ.get("LOCALRUN_TEST_PIDFILE"):
        with Path(pidfile).open("a") as f:
            f.write(f"{os.getpid()}\n")
    for line in sys.stdin:
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        if MODE == "silent" or request_id is None:
            continue
        if method == "initialize":
            version = message["params"]["protocolVersion"]
            answer(request_id, {"protocolVersion": version, "capabilities": {"tools": {}},
                                "serverInfo": {"name": "raw", "version": "1"}})  # fmt: skip
        elif method == "tools/list":
            answer(request_id, {"tools": [GOOD, *BAD] if MODE == "bad-schema" else [GOOD]})
        elif method == "tools/call":
            if MODE == "exit-on-call":
                sys.exit(0)
            text = message["params"]["arguments"].get("text", "")
            answer(request_id, {"content": [{"type": "text", "text": f"echo: {text}"}], "isError": False})
        else:
            error = {"code": -32601, "message": f"no method {method}"}
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
