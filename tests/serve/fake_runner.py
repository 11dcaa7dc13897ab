"""A runner that loads nothing and then misbehaves as ``FAKE_RUNNER`` says
(`tests/serve/test_runner_faults.py` starts it in place of the real one):

- ``silent``: it never reads the socket again and never beats, as a process
  stopped or stuck would;
- ``garbage``: it answers the first request with an event that is no event.
"""

from __future__ import annotations

import os
import sys
import time
from multiprocessing.connection import Connection

from localrun.serve.served import Loaded

LOADED = Loaded(
    held={},
    notices=(),
    flash_attn="off",
    n_ctx_train=1 << 20,
    recurrent=False,
    embeds=False,
    template=None,
    parallel=1,
    capacity=1 << 20,
    n_vocab=256,
    add_bos=False,
    bos_token="",
    eos_token="",
)


def main() -> None:
    conn = Connection(int(sys.argv[1]))
    conn.recv()  # the plan
    conn.send(("loaded", LOADED))
    if os.environ.get("FAKE_RUNNER") == "garbage":
        conn.recv()
        conn.send(("events", [None]))
    time.sleep(600)


if __name__ == "__main__":
    main()
