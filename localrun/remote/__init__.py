"""Running the commands on a remote OpenAI-compatible server (vLLM, SGLang,
llama-server, `localrun serve`): its definition, the HTTP client, the events
out of its streams, and `--batch` over it."""
