"""What each coding agent reads to talk to a localrun server: a base URL,
a token and a model. Plain values, decided here once; `session` runs the
agent with them, `--config` shows them, `write` puts them in the agent's
own configuration file.

- Claude Code speaks Anthropic's Messages API. It reads the server from
  ANTHROPIC_BASE_URL (it adds /v1/messages), sends ANTHROPIC_AUTH_TOKEN as
  `Authorization: Bearer` (ANTHROPIC_API_KEY, sent as X-Api-Key, is set
  empty so a key of the user's for Anthropic is not used instead), takes
  its main model from ANTHROPIC_MODEL and the models its opus, sonnet and
  haiku aliases stand for from ANTHROPIC_DEFAULT_{OPUS,SONNET,HAIKU}_MODEL
  (ANTHROPIC_SMALL_FAST_MODEL in its older versions, CLAUDE_CODE_SUBAGENT_MODEL
  for subagents): all the one local model. CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC
  turns off its telemetry, error reports and update checks;
  CLAUDE_CODE_ATTRIBUTION_HEADER=0 and CLAUDE_CODE_TOTAL_TOKENS_REMINDER=off
  keep text that changes from request to request out of the prompt, so the
  server's prompt cache is reused (what ollama sets).
- Codex speaks the Responses API. A model provider is a table under
  `model_providers` in its config.toml, or the same keys given with
  `-c key=value` (values in TOML), which leave the user's file as it is:
  `base_url` (ending in /v1; it adds /responses), `wire_api = "responses"`,
  `env_key` (the variable it reads the token from); `model_provider` picks
  it and `-m`/`model` the model, `model_context_window` its context (in
  tokens: where Codex compacts the conversation; it knows no such number for
  a model it does not know). The names openai, ollama and lmstudio are
  its own, so the provider is called localrun.
- opencode takes a provider of the npm package @ai-sdk/openai-compatible
  with `options.baseURL` (…/v1) and `options.apiKey` (`{env:NAME}` reads a
  variable), its `models`, and the `model` to use as `provider/model`.
  OPENCODE_CONFIG_CONTENT holds a whole configuration as JSON, merged over
  its other files, last: a project's opencode.json cannot change it.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from localrun.errors import AgentNotInstalledError

Agent = Literal["claude", "codex", "opencode"]
AGENTS: tuple[Agent, ...] = ("claude", "codex", "opencode")
PROVIDER = "localrun"  # the provider's name in Codex's and opencode's configuration
TOKEN_VAR = "LOCALRUN_API_KEY"  # Codex and opencode read the token from it (localrun serve does too)
NO_KEY = "localrun"  # the token given where the server needs none: the agents insist on one

NAMES: dict[Agent, str] = {"claude": "Claude Code", "codex": "Codex", "opencode": "opencode"}
INSTALL: dict[Agent, str] = {
    "claude": "npm install -g @anthropic-ai/claude-code",
    "codex": "npm install -g @openai/codex",
    "opencode": "npm install -g opencode-ai",
}


@dataclass(frozen=True)
class Endpoint:
    """A localrun server as an agent reaches it: ``url`` without a path, ``token`` None where it needs none."""

    url: str
    token: str | None = None

    @property
    def v1(self) -> str:
        return f"{self.url.rstrip('/')}/v1"


@dataclass(frozen=True)
class AgentConfig:
    """What one agent is given: ``env`` set over the user's environment,
    ``args`` before the user's own, and ``settings``: the same, in the form
    of the agent's configuration file (`--config --write`)."""

    agent: Agent
    model: str
    env: dict[str, str]
    args: tuple[str, ...] = ()
    settings: dict[str, Any] = field(default_factory=dict)


def _claude(endpoint: Endpoint, model: str, _context_window: int | None) -> AgentConfig:
    env = {
        "ANTHROPIC_BASE_URL": endpoint.url.rstrip("/"),
        "ANTHROPIC_AUTH_TOKEN": endpoint.token or NO_KEY,
        "ANTHROPIC_API_KEY": "",
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
        "CLAUDE_CODE_SUBAGENT_MODEL": model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",  # no per-request text at the prompt's head: the prompt cache holds
        "CLAUDE_CODE_TOTAL_TOKENS_REMINDER": "off",  # nor a changing token count in it (what ollama sets too)
    }
    return AgentConfig("claude", model, env, settings={"env": env})


def codex_provider(endpoint: Endpoint) -> dict[str, str]:
    return {"name": PROVIDER, "base_url": endpoint.v1, "env_key": TOKEN_VAR, "wire_api": "responses"}


def _codex(endpoint: Endpoint, model: str, context_window: int | None) -> AgentConfig:
    provider = codex_provider(endpoint)
    args = ["-c", f"model_provider={json.dumps(PROVIDER)}"]
    for key, value in provider.items():
        args += ["-c", f"model_providers.{PROVIDER}.{key}={json.dumps(value)}"]  # a JSON string is a TOML string
    settings: dict[str, Any] = {"model": model, "model_provider": PROVIDER}
    if context_window is not None:
        args += ["-c", f"model_context_window={context_window}"]
        settings["model_context_window"] = context_window
    args += ["-m", model]
    settings["model_providers"] = {PROVIDER: provider}
    return AgentConfig("codex", model, {TOKEN_VAR: endpoint.token or NO_KEY}, tuple(args), settings)


def _opencode(endpoint: Endpoint, model: str, _context_window: int | None) -> AgentConfig:
    settings: dict[str, Any] = {
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "localrun",
                "options": {"baseURL": endpoint.v1, "apiKey": f"{{env:{TOKEN_VAR}}}"},
                "models": {model: {"name": model}},
            }
        },
        "model": f"{PROVIDER}/{model}",
    }
    env = {TOKEN_VAR: endpoint.token or NO_KEY, "OPENCODE_CONFIG_CONTENT": json.dumps(settings)}
    return AgentConfig("opencode", model, env, settings=settings)


def configure(agent: Agent, endpoint: Endpoint, model: str, context_window: int | None = None) -> AgentConfig:
    """What ``agent`` is given to use ``model`` on the server at ``endpoint``
    (``context_window``: the model's context in tokens, where it is known)."""
    return {"claude": _claude, "codex": _codex, "opencode": _opencode}[agent](endpoint, model, context_window)


def find_program(agent: Agent) -> Path:
    """The agent's program on PATH, or an error saying how to install it."""
    found = shutil.which(agent)
    if found is None:
        raise AgentNotInstalledError(f"{NAMES[agent]} is not installed ({agent} is not on PATH)", hint=INSTALL[agent])
    return Path(found)


def config_file(agent: Agent) -> Path:
    """Where the agent reads its user configuration: Claude Code's
    settings.json (in CLAUDE_CONFIG_DIR, else ~/.claude), Codex's config.toml
    (in CODEX_HOME, else ~/.codex), opencode's opencode.json (in
    $XDG_CONFIG_HOME/opencode, else ~/.config/opencode)."""
    home = Path.home()
    if agent == "claude":
        return Path(os.environ.get("CLAUDE_CONFIG_DIR") or home / ".claude") / "settings.json"
    if agent == "codex":
        return Path(os.environ.get("CODEX_HOME") or home / ".codex") / "config.toml"
    return Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config") / "opencode" / "opencode.json"
