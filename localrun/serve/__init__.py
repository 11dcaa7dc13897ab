"""`localrun serve`: an OpenAI-compatible HTTP API over the continuous batching scheduler."""
