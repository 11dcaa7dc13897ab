"""`localrun launch`: a coding agent (Claude Code, Codex, opencode) run
against a localrun server. `agents` says what each agent reads to talk to
it, `server` finds a running server or starts one, `write` puts an agent's
configuration where the agent reads it, `session` runs it all."""
