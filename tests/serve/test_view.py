"""The server's lines on stderr: a log without a terminal, never the key."""

from __future__ import annotations

import io

from localrun.serve.events import Listening, Notice, RequestDone, ServerStatus, Stopping
from localrun.ui.serve import ServeView, listening_line


def test_log_lines_without_a_terminal() -> None:
    stream = io.StringIO()
    with ServeView(stream, terminal=False) as view:
        view.handle(Listening("http://127.0.0.1:8080", ("tiny",), 4, 512, "off", auth=True))
        view.handle(ServerStatus(4, 1, 0, 0, 0, 12.5))  # a status tick: only a terminal shows it
        view.handle(RequestDone("POST", "/v1/chat/completions", 200, "tiny", 21, 18, 8, 40.0, 0.5, "length"))
        view.handle(RequestDone("POST", "/v1/completions", 400, outcome="not supported by this server: n"))
        view.handle(Notice("tiny: prompt cache file x.kv is truncated: ignored, rebuilding it"))
        view.handle(Notice("tiny: loaded (84 MiB) in 0.3 s", warning=False))  # information, no warning
        view.handle(Stopping(2, 10.0))
    lines = [line.split(" ", 1)[1] for line in stream.getvalue().splitlines()]  # after the time
    assert lines == [
        "serving tiny on http://127.0.0.1:8080/v1 (4 slots of 512 tokens, flash attention off, API key required); "
        "Ctrl-C stops",
        "POST /v1/chat/completions 200 tiny: prompt 21 (18 cached), 8 tokens at 40.0 tok/s, 0.50s, length",
        "POST /v1/completions 400 not supported by this server: n",
        "warning: tiny: prompt cache file x.kv is truncated: ignored, rebuilding it",
        "note: tiny: loaded (84 MiB) in 0.3 s",
        "stopping: 2 request(s) in flight get up to 10s to finish",
    ]


def test_a_server_with_nothing_loaded_says_models_load_on_demand() -> None:
    line = listening_line(Listening("http://127.0.0.1:8080", ("a", "b"), 0, 0, "auto", auth=False))
    assert line.startswith("serving a, b on http://127.0.0.1:8080/v1 (loaded on demand, ")
    assert "0 slots" not in line
