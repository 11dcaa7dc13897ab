"""Tools for `chat` and `generate` from MCP servers: which servers
(`servers`), their connections (`host`), and the tool loop that offers
their tools to the model, runs its calls as the user allows, and gives the
results back (`loop`). The package is `localrun.mcp`; the SDK it uses is the
top-level `mcp` (imports here are absolute, so the names never mix)."""
