"""`localrun embed`: one input per line on stdin (or JSON records with
`--json`), one JSON vector per line on stdout, many inputs to a decode."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

from localrun.cli import _options as opt
from localrun.cli._env import current
from localrun.cli._errors import ExitCode
from localrun.errors import UsageError
from localrun.settings import Options
from localrun.store.registry import EMBEDDINGS

if TYPE_CHECKING:
    from localrun.runtime.embed import Embedder

CHUNK = 512  # lines embedded before their vectors are written out

EmbeddingModel = Annotated[
    str | None,
    typer.Option(
        "-m",
        "--model",
        envvar="LOCALRUN_MODEL",
        help="The embedding model: alias (e.g. nomic-embed-text:v1.5), owner/repo:QUANT, hf://... or a GGUF path. "
        "Needed: the default model is for chat (with --pooling, that model is pooled).",
        show_default=False,
    ),
]
JsonRecords = Annotated[
    bool,
    typer.Option(
        "--json", help='Read {"text": ...} records, one a line; write {"index", "vector"} records (and "id").'
    ),
]


def _records(lines: list[str], as_json: bool) -> list[tuple[str, Any]]:
    """(text, the record's id or None) per line; blank and malformed lines are named."""
    if not any(line.strip() for line in lines):
        raise UsageError("no input to embed: stdin is empty", hint="pipe one text a line, e.g. cat notes.txt |")
    records: list[tuple[str, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            raise UsageError(f"line {number} is empty", hint="every line is one input; drop the blank ones")
        if not as_json:
            records.append((line, None))
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"line {number} is not JSON: {exc.msg}", hint='give {"text": ...} a line') from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise UsageError(f'line {number} has no "text" string', hint='give {"text": ...} a line')
        records.append((record["text"], record.get("id")))
    return records


def _no_model() -> UsageError:
    """embed without -m: the default model is for chat (it declares no pooling),
    so nothing is resolved, let alone pulled, before the user picks one."""
    known = [e.alias for e in current().registry.embedding_models()]
    example = f"e.g. -m {known[0]} (`localrun list --all` lists the {EMBEDDINGS} family), " if known else ""
    return UsageError(
        "embed needs an embedding model: give -m MODEL",
        hint=f"{example}or --pooling mean to pool the default chat model",
    )


def _write(embedder: Embedder, records: list[tuple[str, Any]], as_json: bool) -> None:
    env = current()
    terminal = bool(env.stderr_isatty)
    total = len(records)
    for start in range(0, total, CHUNK):
        chunk = records[start : start + CHUNK]
        tokens = embedder.tokenize([text for text, _ in chunk], line=start + 1)

        def progress(done: int, _total: int, start: int = start) -> None:
            if terminal:
                env.stderr.write(f"\rembedded {start + done}/{total}")
                env.stderr.flush()

        vectors = embedder.embed_tokens(tokens, progress).vectors
        for i, ((_, ident), vector) in enumerate(zip(chunk, vectors, strict=True)):
            values = vector.tolist()
            if as_json:
                record: dict[str, Any] = {"index": start + i, "vector": values}
                if ident is not None:
                    record["id"] = ident
                env.stdout.write(json.dumps(record) + "\n")
            else:
                env.stdout.write(json.dumps(values) + "\n")
        env.stdout.flush()
    if terminal:
        env.stderr.write("\n")


def embed_command(
    model: EmbeddingModel = None,
    as_json: JsonRecords = False,
    pooling: opt.Pooling = "auto",
    ctx: Annotated[
        str | None, typer.Option("--ctx", help="The longest input in tokens (default: 4096, at most the trained).")
    ] = None,
    threads: opt.Threads = None,
    gpu_layers: opt.GpuLayers = None,
    device: opt.Device = None,
    offline: opt.Offline = False,
    verbose: opt.Verbose = False,
) -> ExitCode:
    """Embed text: one input per line on stdin, one JSON vector per line on stdout."""
    from localrun.assemble import OneSequence
    from localrun.cli._input import read_stdin
    from localrun.runtime.embed import open_embedder

    if ctx == "auto":
        raise UsageError("--ctx auto: give the longest input in tokens", hint="e.g. --ctx 8192")
    if model is None and pooling == "auto":
        raise _no_model()
    env = current()
    if env.stdin_isatty:
        raise UsageError("no input to embed", hint="pipe one text a line: cat notes.txt | localrun embed -m MODEL")
    records = _records(read_stdin().splitlines(), as_json)
    options = Options(ctx=ctx, threads=threads, gpu_layers=gpu_layers, device=device, draft="none")
    resolved = opt.resolve_engine(
        model, options, offline=offline, verbose=verbose, with_draft=False, workload=OneSequence()
    )
    with open_embedder(resolved.config, resolved.info, pooling, resolved.settings.n_ctx) as embedder:
        _write(embedder, records, as_json)
    return ExitCode.OK
