"""`localrun launch AGENT`: pick the model, find or start the server, run
the agent with what it reads, and stop the server it started when the
agent exits; the agent's exit status is the command's."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from localrun import paths
from localrun.errors import LaunchError
from localrun.launch.agents import Agent, AgentConfig, Endpoint, configure, find_program
from localrun.launch.server import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    START_TIMEOUT_S,
    Progress,
    is_localrun,
    model_contexts,
    started_server,
)
from localrun.store.registry import Registry


@dataclass(frozen=True)
class LaunchPlan:
    """What `localrun launch` was asked: the agent, the model (`--model`,
    None: the default), the agent's own arguments, where a running server
    would answer, and how long a started one may take to be ready."""

    agent: Agent
    model: str | None = None
    agent_args: tuple[str, ...] = ()
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    timeout_s: float = START_TIMEOUT_S


def pick_model(given: str | None, config_model: str | None, registry: Registry) -> str:
    """`--model`, else LOCALRUN_MODEL, else config.toml's `model`, else the
    registry's default: the model every other command takes."""
    return given or os.environ.get("LOCALRUN_MODEL") or config_model or registry.default


def served_name(model: str, ids: Sequence[str]) -> str:
    """What the agent names the model by on a server listing ``ids``: the
    name given where the server lists it, a file's name for a path (what
    serve calls a model given by path), the one model where there is one."""
    if model in ids:
        return model
    stem = Path(model).stem if model.endswith(".gguf") else None
    if stem is not None and stem in ids:
        return stem
    if len(ids) == 1:
        return ids[0]
    return stem or model


def _reachable_host(host: str) -> str:
    """Where to reach a server listening on ``host``: loopback for one on every address."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # a `kill`, a terminal closed


@contextmanager
def _ending_signals_exit() -> Iterator[None]:
    """SIGTERM or SIGHUP while the server starts: leave by SystemExit
    (128+N), so that the server started is stopped on the way out."""

    def _leave(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, _leave) for sig in ENDING_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_agent(program: Path, config: AgentConfig, agent_args: Sequence[str]) -> int:
    """The agent on this terminal, with ``config``'s environment and
    arguments before ``agent_args``; its exit status (128+N for a signal N).
    Ctrl-C is the agent's while it runs: launch waits for it to exit. A
    SIGTERM or SIGHUP to launch is passed on to the agent, and launch still
    waits, so what it started is stopped after the agent."""
    env = {**os.environ, **config.env}
    process = subprocess.Popen([str(program), *config.args, *agent_args], env=env)

    def _let_the_agent_have_it(_signum: int, _frame: FrameType | None) -> None:
        pass

    def _pass_on(signum: int, _frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)

    previous = {signal.SIGINT: signal.signal(signal.SIGINT, _let_the_agent_have_it)}
    previous |= {sig: signal.signal(sig, _pass_on) for sig in ENDING_SIGNALS}
    try:
        code = process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code


def launch(plan: LaunchPlan, *, registry: Registry, config_model: str | None, progress: Progress) -> int:
    """Run ``plan.agent`` on the model chosen, against the localrun server
    at the host and port when one answers there (kept running afterwards),
    else against one started for it (stopped afterwards)."""
    model = pick_model(plan.model, config_model, registry)
    program = find_program(plan.agent)
    url = f"http://{_reachable_host(plan.host)}:{plan.port}"
    if is_localrun(url):
        endpoint = Endpoint(url, os.environ.get("LOCALRUN_API_KEY") or None)
        contexts = model_contexts(endpoint)
        ids = list(contexts)
        name = served_name(model, ids)
        if name not in ids:
            progress(f"note: the server at {url} does not list {name} (it lists {', '.join(ids) or 'none'})")
        progress(f"using the localrun server at {url}")
        config = configure(plan.agent, endpoint, name, contexts.get(name))
        return run_agent(program, config, plan.agent_args)
    log = paths.ensure_dir(paths.data_dir() / "launch") / f"serve-{plan.agent}-{os.getpid()}.log"
    with (
        _ending_signals_exit(),
        started_server(plan.model, log, progress=progress, timeout_s=plan.timeout_s) as started,
    ):
        contexts = model_contexts(started.endpoint)
        if not contexts:
            raise LaunchError("the server started serves no model", hint=f"its log: {started.log}")
        name = served_name(model, list(contexts))
        progress(f"running {plan.agent} with {name} on {started.endpoint.url}")
        config = configure(plan.agent, started.endpoint, name, contexts.get(name))
        code = run_agent(program, config, plan.agent_args)
    log.unlink(missing_ok=True)  # the server came up and went: its log is kept only when something failed
    return code
