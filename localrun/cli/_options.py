"""Options that `generate`, `chat` (and later commands) share, declared once,
and the one way they become a loaded engine and sampling parameters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import typer

from localrun.cli.models import resolve_model
from localrun.config import load as load_config
from localrun.runtime.decode import SamplingParams
from localrun.runtime.engine import Engine, EngineConfig
from localrun.errors import UsageError
from localrun.gguf.reader import GGUFInfo, read_gguf
from localrun.store import Target

Model = Annotated[
    str | None,
    typer.Option(
        "-m",
        "--model",
        envvar="LOCALRUN_MODEL",
        help="Alias (family:tag), owner/repo:QUANT, hf://... or a GGUF path. Default: the registry's default.",
        show_default=False,
    ),
]
Offline = Annotated[bool, typer.Option("--offline", help="Never download: use only models already here.")]
MaxTokens = Annotated[int | None, typer.Option("--max-tokens", "-n", help="Stop after this many tokens.")]
Temperature = Annotated[float, typer.Option("--temperature", "-t", help="0 for greedy decoding.")]
TopP = Annotated[float, typer.Option("--top-p")]
TopK = Annotated[int, typer.Option("--top-k")]
MinP = Annotated[float, typer.Option("--min-p")]
RepeatPenalty = Annotated[float, typer.Option("--repeat-penalty")]
Seed = Annotated[int | None, typer.Option("--seed", help="Fix the sampling seed.")]
System = Annotated[str | None, typer.Option("-s", "--system", help="System prompt.")]
Ctx = Annotated[
    str | None, typer.Option("--ctx", help="Context size in tokens, or auto: the longest that fits in memory.")
]
Threads = Annotated[int | None, typer.Option("--threads", help="CPU threads (default: all available).")]
Kv = Annotated[str | None, typer.Option("--kv", help="KV cache type for K and V: f16, q8_0 or q4_0.")]
KvK = Annotated[str | None, typer.Option("--kv-k", help="KV cache type for K (overrides --kv).")]
KvV = Annotated[str | None, typer.Option("--kv-v", help="KV cache type for V (overrides --kv).")]
FlashAttn = Annotated[
    str | None,
    typer.Option(
        "--flash-attn", help="on, off or auto (on whenever V is quantized). Default: auto.", show_default=False
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Newline-delimited JSON events on stdout.")]
Verbose = Annotated[bool, typer.Option("--verbose", help="Show llama.cpp's own log.")]
Debug = Annotated[bool, typer.Option("--debug", help="Tracebacks on errors.")]


def parse_ctx(value: str) -> int | None:
    if value == "auto":
        return None
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"--ctx {value!r} is not a number", hint="use --ctx auto or --ctx 8192") from None


def sampling_params(
    temperature: float, top_k: int, top_p: float, min_p: float, repeat_penalty: float, seed: int | None
) -> SamplingParams:
    return SamplingParams(
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty, seed=seed
    )


@dataclass(frozen=True)
class EngineChoice:
    """What the engine options say, before the model's own defaults apply."""

    model: str | None = None
    offline: bool = False
    ctx: str | None = None
    threads: int | None = None
    kv: str | None = None
    kv_k: str | None = None
    kv_v: str | None = None
    flash_attn: str | None = None  # None: the user's config, else auto
    verbose: bool = False


@dataclass
class Resolved:
    """The model file, what its name resolved to, and the engine settings after
    options, the registry entry's defaults and the user's config.toml."""

    config: EngineConfig
    info: GGUFInfo
    target: Target
    system: str | None  # the option's, else the registry entry's default


@dataclass
class Opened:
    engine: Engine
    target: Target
    system: str | None


def resolve_engine(choice: EngineChoice, *, system: str | None = None) -> Resolved:
    """Resolve (pull on first use) the model and settle its settings: an option
    wins, then the registry entry's defaults, then config.toml, then built-ins."""
    if choice.threads is not None and choice.threads < 1:
        raise UsageError("--threads must be at least 1")
    user = load_config()
    path, target = resolve_model(choice.model, offline=choice.offline, with_draft=True)
    defaults = target.entry.defaults if target.entry else {}
    n_ctx = parse_ctx(choice.ctx) if choice.ctx is not None else defaults.get("ctx")
    type_k = choice.kv_k or choice.kv or defaults.get("kv_k") or defaults.get("kv") or user.kv_k or "f16"
    type_v = choice.kv_v or choice.kv or defaults.get("kv_v") or defaults.get("kv") or user.kv_v or "f16"
    info = read_gguf(path)
    config = EngineConfig(
        model_path=info.path,
        n_ctx=n_ctx,
        n_threads=choice.threads or user.threads,
        memory_budget=user.memory_budget,
        type_k=type_k,
        type_v=type_v,
        flash_attn=choice.flash_attn or user.flash_attn or "auto",
        verbose=choice.verbose,
    )
    return Resolved(config, info, target, system if system is not None else defaults.get("system"))


def open_engine(choice: EngineChoice, *, system: str | None = None) -> Opened:
    """`resolve_engine`, then load the model."""
    resolved = resolve_engine(choice, system=system)
    return Opened(Engine(resolved.config, resolved.info), resolved.target, resolved.system)
