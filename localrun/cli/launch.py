"""`localrun launch claude|codex|opencode`: a coding agent on a local model
(localrun/launch does the work; this wires the options and says what it does)."""

from __future__ import annotations

import os
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer

from localrun.cli._env import current
from localrun.cli._output import out
from localrun.errors import UsageError

if TYPE_CHECKING:
    from localrun.launch.agents import Agent


class AgentName(StrEnum):
    claude = "claude"
    codex = "codex"
    opencode = "opencode"


def launch_command(
    agent: Annotated[AgentName, typer.Argument(help="The agent: claude (Claude Code), codex or opencode.")],
    agent_args: Annotated[
        list[str] | None,
        typer.Argument(help="Arguments for the agent, after --.", show_default=False, metavar="-- AGENT_ARGS"),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "-m",
            "--model",
            help="The model: what -m takes (default: LOCALRUN_MODEL, else config.toml's model, else the registry's"
            " default).",
            show_default=False,
        ),
    ] = None,
    config: Annotated[
        bool, typer.Option("--config", help="Print the agent's configuration instead of running it.")
    ] = False,
    write: Annotated[
        bool,
        typer.Option("--write", help="With --config: write it into the agent's own config file (the old one kept)."),
    ] = False,
    host: Annotated[str, typer.Option("--host", help="Where a running localrun serve listens.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Its port; none answering there: one is started.")] = 8080,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds a started server may take to load the model.")
    ] = 300.0,
) -> int:
    """Run a coding agent (Claude Code, Codex, opencode) on a local model.

    Uses the localrun server at --host/--port when one answers there, else
    starts one for the agent (stopped when the agent exits). --config prints
    what the agent is given instead; --config --write puts it in the agent's
    own config file."""
    from localrun.launch import session

    if write and not config:
        raise UsageError("--write goes with --config", hint=f"localrun launch {agent.value} --config --write")
    if not 0 < port <= 65535:
        raise UsageError("--port must be from 1 to 65535")
    if timeout <= 0:
        raise UsageError("--timeout must be more than 0")
    env = current()
    name: Agent = agent.value
    if config:
        return _show_config(name, model, host, port, write)
    plan = session.LaunchPlan(name, model, tuple(agent_args or ()), host=host, port=port, timeout_s=timeout)

    def progress(text: str) -> None:
        env.stderr.write(f"{text}\n")
        env.stderr.flush()

    return session.launch(plan, registry=env.registry, config_model=env.config.model, progress=progress)


def _show_config(name: Agent, model: str | None, host: str, port: int, write: bool) -> int:
    from localrun.launch import agents, session
    from localrun.launch import write as writing

    env = current()
    chosen = session.pick_model(model, env.config.model, env.registry)
    endpoint = agents.Endpoint(f"http://{host}:{port}", os.environ.get("LOCALRUN_API_KEY") or None)
    settings = agents.configure(name, endpoint, session.served_name(chosen, []))
    if write:
        written = writing.write_config(settings)
        if not written.changed:
            out().note(f"{written.path} already holds this configuration")
        else:
            kept = f" (what it held before: {written.backup})" if written.backup is not None else ""
            out().note(f"wrote {written.path}{kept}")
    else:
        env.stdout.write(writing.config_text(settings))
        out().note(f"# {agents.NAMES[name]} reads this from {_where(name)}")
    if writing.needs_env(settings) and not os.environ.get("LOCALRUN_API_KEY"):
        out().note(
            f"# and the key from LOCALRUN_API_KEY (any value where the server has none): "
            f"export LOCALRUN_API_KEY={agents.NO_KEY}"
        )
    out().note(f"# the server: localrun serve --port {port}" + (f" -m {chosen}" if model else ""))
    return 0


def _where(name: Agent) -> str:
    from localrun.launch import agents

    if name == "claude":
        return f"the environment, or under env in {agents.config_file('claude')}"
    return str(agents.config_file(name))
