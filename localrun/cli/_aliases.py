"""Spellings of llama.cpp and ollama that localrun takes another way: the
hint a parsing error gives for one, naming localrun's spelling. (The common
ones it takes as they are: `-ngl`, `-c`, `-p`, `-f`, `run`, chat's `/bye`.)"""

from __future__ import annotations

# an option another tool's user types -> what localrun calls it, for every command that has it
ELSEWHERE: dict[str, str] = {
    "--n-gpu-layers": "--gpu-layers (-ngl)",
    "--ctx-size": "--ctx",
    "-c": "--ctx",
    "--n-predict": "--max-tokens (-n)",
    "--temp": "--temperature (-t)",
    "-sys": "--system (-s)",
    "--system-prompt": "--system (-s)",
    "--hf-repo": "-m owner/repo:QUANT",
    "-hf": "-m owner/repo:QUANT",
    "-fa": "--flash-attn on",
    "-ctk": "--kv-k",
    "-ctv": "--kv-v",
    "--cache-type-k": "--kv-k",
    "--cache-type-v": "--kv-v",
    "--json-schema": "--schema",
}

# per command: an option it lacks that another command has
BY_COMMAND: dict[tuple[str, str], str] = {
    ("chat", "-p"): "chat takes its messages at its prompt or one per line on stdin; "
    "`localrun generate -p TEXT` (or `localrun run MODEL TEXT`) answers one prompt",
    ("chat", "--prompt"): "chat takes its messages at its prompt or one per line on stdin; "
    "`localrun generate -p TEXT` answers one prompt",
    ("chat", "-f"): "chat takes one message per line of stdin (`localrun chat < FILE`); "
    "`localrun generate -f FILE` answers the whole file as one prompt",
    ("chat", "--file"): "chat takes one message per line of stdin (`localrun chat < FILE`); "
    "`localrun generate -f FILE` answers the whole file as one prompt",
}


def hint_for(command: str, option: str) -> str | None:
    """What to type instead of ``option`` in ``command`` (its name: `chat`), if it is a known spelling."""
    specific = BY_COMMAND.get((command, option))
    if specific is not None:
        return specific
    theirs = ELSEWHERE.get(option)
    return f"localrun spells {option} as {theirs}" if theirs is not None else None


def continue_hint(extra: str) -> str | None:
    """`chat -c 4096`: chat's -c continues the last conversation (as llm's);
    the number was meant for llama.cpp's -c, the context size."""
    if extra.isdigit():
        return f"in chat, -c continues the last conversation; the context size is --ctx {extra}"
    return None
