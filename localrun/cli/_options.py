"""Options the commands share, declared once, and the one way they become
run settings, a loaded engine and sampling parameters."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from localrun import store
from localrun.cli._env import current
from localrun.cli._output import out
from localrun.cli._resolve import model_name, resolve_model
from localrun.errors import UsageError
from localrun.settings import Options, RunSettings, resolve
from localrun.store import Target

if TYPE_CHECKING:
    from collections.abc import Sequence

    from localrun.assemble import Assembled, Workload
    from localrun.gguf.reader import GGUFInfo
    from localrun.runtime import devices as found_devices
    from localrun.runtime.chat import ChatSession
    from localrun.runtime.devices import Device as Place  # `Device` here is the --device option
    from localrun.runtime.engine import Engine, EngineConfig
    from localrun.runtime.generate import Decoding
    from localrun.runtime.model_template import ChatTemplate
    from localrun.runtime.reasoning import Reasoning, ThinkMode
    from localrun.runtime.sampling import SamplingParams
    from localrun.speculative.control import StepGrowth
    from localrun.structured.spec import OutputSpec
    from localrun.tune.wisdom import Wisdom

Template = Annotated[
    str | None,
    typer.Option(
        "--template",
        metavar="NAME|FILE",
        help="The chat template to render with, in place of the GGUF's: a Jinja file (as llama.cpp's "
        "--chat-template-file) or a built-in (chatml, llama3, gemma, phi3). Without it: the GGUF's own, "
        "else the built-in its architecture implies (gemma3: gemma).",
        show_default=False,
    ),
]

Pooling = Annotated[
    str,
    typer.Option(
        "--pooling",
        help="auto: the model's own (embedding models); mean, cls, last or rank: any model, generative ones too.",
    ),
]
Model = Annotated[
    str | None,
    typer.Option(
        "-m",
        "--model",
        envvar="LOCALRUN_MODEL",
        help="Alias (family:tag), owner/repo:QUANT, hf://... or a GGUF path; a remote's name (remote:NAME) or "
        "URL runs on that server. Default: config.toml's model, else the registry's default.",
        show_default=False,
    ),
]
RemoteUrl = Annotated[
    str | None,
    typer.Option(
        "--remote",
        help="Run on this OpenAI-compatible server (its base URL, e.g. http://gpu-box:8000/v1); -m names the "
        "model there (default: the first it lists). Its API key: LOCALRUN_API_KEY (as serve's).",
        show_default=False,
    ),
]
Offline = Annotated[bool, typer.Option("--offline", help="Never download: use only models already here.")]
MaxTokens = Annotated[
    int | None,
    typer.Option(
        "--max-tokens",
        "-n",
        help="Stop after this many tokens. Default: no limit but the context (config.toml: max_tokens).",
        show_default=False,
    ),
]
Temperature = Annotated[
    float | None,
    typer.Option(
        "--temperature",
        "-t",
        help="0 for greedy decoding. Default: 0.8 (config.toml: temperature).",
        show_default=False,
    ),
]
TopP = Annotated[float, typer.Option("--top-p")]
TopK = Annotated[int, typer.Option("--top-k")]
MinP = Annotated[float, typer.Option("--min-p")]
RepeatPenalty = Annotated[float, typer.Option("--repeat-penalty")]
Seed = Annotated[int | None, typer.Option("--seed", help="Fix the sampling seed.")]
System = Annotated[
    str | None,
    typer.Option("-s", "--system", help="System prompt (config.toml: system).", show_default=False),
]
CTX_HELP = "Context size in tokens, or auto: the longest that fits in memory."
Ctx = Annotated[str | None, typer.Option("--ctx", help=CTX_HELP)]
CtxOrC = Annotated[str | None, typer.Option("--ctx", "-c", help=CTX_HELP)]  # -c as llama.cpp spells it, where free
Threads = Annotated[
    int | None,
    typer.Option(
        "--threads",
        help="CPU threads, fixed (default: what localrun tune measured fastest, else the physical cores, "
        "adapting while the machine is busy).",
        show_default=False,
    ),
]
GpuLayers = Annotated[
    str | None,
    typer.Option(
        "--gpu-layers",
        "-ngl",
        help="Layers on the GPU: auto (every layer when the model fits, else the most that fit), all, "
        "or a count; 0 keeps the model on the CPU. Default: auto.",
        show_default=False,
    ),
]
Device = Annotated[
    str | None,
    typer.Option(
        "--device",
        envvar="LOCALRUN_DEVICE",
        help="Put the model on this device only (a name `localrun doctor` lists, e.g. CUDA0). Default: every GPU.",
        show_default=False,
    ),
]
Rpc = Annotated[
    str | None,
    typer.Option(
        "--rpc",
        envvar="LOCALRUN_RPC",
        help="llama.cpp RPC servers (HOST:PORT, comma-separated; `localrun rpc-server` starts one): their "
        "devices join this machine's as GPUs, for --gpu-layers and --device. For a model larger than one "
        "machine's memory; on one machine it is slower than the CPU.",
        show_default=False,
    ),
]
SampleOn = Annotated[
    str | None,
    typer.Option(
        "--sample-on",
        envvar="LOCALRUN_SAMPLE_ON",
        help="Where decoding samples: host, device (llama.cpp's sampler chain in its graph, on the GPU "
        "that holds the output layer; the host reads the token it drew), or auto: the device when the whole "
        "model is on a GPU, but the host for --batch and serve. A grammar, log-probabilities or speculation "
        "(serve's --spec lookup) sample on the host. Default: auto.",
        show_default=False,
    ),
]
Kv = Annotated[
    str | None,
    typer.Option(
        "--kv",
        help="KV cache type for K and V: auto, f16, q8_0 or q4_0. Default: auto (f16 while the context fits, "
        "else q8_0, else q8_0/q4_0).",
        show_default=False,
    ),
]
KvK = Annotated[str | None, typer.Option("--kv-k", help="KV cache type for K (overrides --kv).")]
KvV = Annotated[str | None, typer.Option("--kv-v", help="KV cache type for V (overrides --kv).")]
FlashAttn = Annotated[
    str | None,
    typer.Option(
        "--flash-attn",
        help="on, off or auto: the faster at the run's depth as localrun tune measured it (else llama.cpp's "
        "auto); on whenever V is quantized. Default: auto.",
        show_default=False,
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Newline-delimited JSON events on stdout.")]
Schema = Annotated[
    str | None,
    typer.Option(
        "--schema",
        help="The output must be JSON following this JSON Schema (inline, a file, or the concise form "
        "'name, age int, tags list[str]').",
        show_default=False,
    ),
]
GrammarFile = Annotated[
    Path | None,
    typer.Option("--grammar", help="The output must follow this grammar file (GBNF or Lark).", show_default=False),
]
Verbose = Annotated[bool, typer.Option("--verbose", help="Show llama.cpp's own log.")]
Think = Annotated[
    str,
    typer.Option(
        "--think",
        help="A reasoning model's thinking: auto (on a terminal in its own section, not into a pipe), show "
        "(into a pipe too, marked off before the answer), on or off (asks the model to think or not, where its "
        "chat template has a switch).",
    ),
]
ReasoningBudget = Annotated[
    int | None,
    typer.Option(
        "--reasoning-budget",
        help="End a reasoning model's thinking after this many tokens (its closing marker is forced).",
        show_default=False,
    ),
]


def use_rpc(servers: str | None) -> None:
    """Add the devices of the RPC servers `--rpc` (LOCALRUN_RPC) names to
    this process's, before any device is probed; a server lost later ends
    the run with its error and exit code."""
    if not servers:
        return
    from localrun.runtime import rpc

    rpc.register(rpc.parse_servers(servers), on_lost=_rpc_lost)


def _rpc_lost(servers: str) -> None:
    """llama.cpp lost an RPC server and is about to abort the process (from
    whatever thread noticed): say so as any error is said, and end it now."""
    import os

    from localrun.cli._errors import report
    from localrun.cli._signals import restore_terminal
    from localrun.errors import RpcError

    env = current()
    restore_terminal(env.stdin, env.stdout, env.stderr)  # as a live panel or a prompt would in its `finally`
    error = RpcError(
        f"lost the RPC server ({servers}) mid-run: it stopped, or the network to it failed",
        hint="restart `localrun rpc-server` there, or drop --rpc",
    )
    code = report(error)
    for stream in (env.stdout, env.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(int(code))


def sampling_params(
    temperature: float, top_k: int, top_p: float, min_p: float, repeat_penalty: float, seed: int | None
) -> SamplingParams:
    """The sampling options, each checked against its range before any model loads."""
    from localrun.runtime.sampling import SamplingParams

    checks = [
        (temperature >= 0, "--temperature must be 0 (greedy) or more"),
        (top_k >= 0, "--top-k must be 0 (off) or more"),
        (0 < top_p <= 1, "--top-p must be more than 0 and at most 1"),
        (0 <= min_p <= 1, "--min-p must be from 0 to 1"),
        (repeat_penalty > 0, "--repeat-penalty must be more than 0 (1 is off)"),
        (seed is None or 0 <= seed < 2**32, "--seed must be from 0 to 4294967295"),
    ]
    for ok, message in checks:
        if not ok:
            raise UsageError(message)

    return SamplingParams(
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty, seed=seed
    )


def checked_sampling(params: SamplingParams) -> SamplingParams:
    """``params`` checked as the options are (chat's `/set parameter`)."""
    sampling_params(params.temperature, params.top_k, params.top_p, params.min_p, params.repeat_penalty, params.seed)
    if params.repeat_last_n < 0:
        raise UsageError("repeat_last_n must be 0 or more")
    return params


def check_stops(stops: list[str] | None) -> tuple[str, ...]:
    if stops and any(not s for s in stops):
        raise UsageError("--stop '' matches nothing", hint="give the text to stop at")
    return tuple(stops or ())


def check_positive(**values: int | None) -> None:
    """Refuse a count option below 1 (`max_tokens=0` -> `--max-tokens must be at least 1`)."""
    for name, value in values.items():
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")


def check_output_file(option: str, path: Path) -> None:
    """Refuse, before any work, a file to write that cannot be: a folder, or
    one whose folder is missing (`--chart out/x.svg` -> names out)."""
    if path.is_dir():
        raise UsageError(f"{option} {path}: is a folder", hint="give a file")
    if not path.parent.is_dir():
        what = "is not a folder" if path.parent.exists() else "does not exist"
        raise UsageError(f"{option} {path}: the folder {path.parent} {what}", hint="create it first")


@dataclass
class PlannedRun:
    """The model file, what its name resolved to, and the run's plan
    (`localrun.assemble`): header, settings, placement, wisdom, the draft placed beside it."""

    config: EngineConfig
    info: GGUFInfo
    target: Target
    settings: RunSettings
    wisdom: Wisdom | None = None  # what `localrun tune` measured for this model on this machine
    draft: Path | None = None  # the draft model, placed in the plan beside the model
    run: Assembled | None = None  # the plan it came from

    @property
    def template(self) -> ChatTemplate | None:
        """The chat template chosen in the plan (`info` carries it), and where it came from."""
        return self.run.template if self.run is not None else None

    @property
    def verify_curve(self) -> tuple[float, ...] | None:
        return self.wisdom.verify_curve if self.wisdom is not None else None

    @property
    def step_growth(self) -> StepGrowth | None:
        """How a decode step grows with the context here (`Assembled.step_growth`)."""
        return self.run.step_growth if self.run is not None else None

    def report(self) -> dict[str, Any]:
        """The settings as `--json` and the history show them, the placement among them."""
        from localrun.assemble import report

        shown = report(self.settings, self.config.placement)
        if self.template is not None:
            shown["chat_template"] = template_setting(self.template, self.info.architecture)
        return shown


@dataclass(frozen=True)
class Settled:
    """A run before it is planned: the model's file and name, the settings
    as settled, and the draft model's file when one will run beside it."""

    path: Path
    target: Target
    settings: RunSettings
    draft: Path | None = None
    template: ChatTemplate | None = None  # --template, read and compiled


def settle(
    model: str | None, options: Options, *, offline: bool = False, with_draft: bool = True, pull_draft: bool = False
) -> Settled:
    """Settle the run's settings, then resolve the model (pulled on first
    use) and, when ``with_draft``, its draft model: the matched one on disk
    for speculation on auto (pulled first with ``pull_draft``, `--draft`),
    or the one `--draft-model` names (pulled if need be)."""
    from localrun.cli._resolve import draft_path
    from localrun.runtime.model_template import given_template

    check_positive(threads=options.threads)
    template = given_template(options.template) if options.template is not None else None  # before any pull
    env = current()
    entry = store.parse(model_name(model) or env.registry.default, env.registry).entry
    settings = resolve(options, entry.defaults if entry else None, env.config)  # bad values fail before a pull
    found = resolve_model(model, offline=offline, with_draft=with_draft and settings.draft == "auto")
    draft = draft_path(settings.draft, found.target, offline=offline, pull=pull_draft) if with_draft else None
    return Settled(found.path, found.target, settings, draft, template)


def plan(
    settled: Settled,
    workload: Workload | None = None,
    *,
    verbose: bool = False,
    devices: Sequence[found_devices.Device] | None = None,
    grows: bool = False,
) -> PlannedRun:
    """Put the run together for ``workload`` (`localrun.assemble`: placement
    with the draft beside the model, what is automatic from this machine's
    wisdom, context and sequences; by default one sequence, decoded by the
    loop ``settled``'s speculation asks for); the model is not loaded. Says
    on a terminal which KV cache type auto chose and why when it is not f16
    (always with ``verbose``). ``devices``: as probed (None: probed now).
    ``grows``: a conversation, which fills the context it gets: on the CPU
    with no --ctx, it needs the model's trained context, the context it will
    have (on a GPU the placement sizes the context)."""
    from localrun.assemble import OneSequence, assemble
    from localrun.runtime import devices as probing

    env = current()
    found = tuple(devices) if devices is not None else probing.probe()  # once, for the run
    settings = without_a_gpu(settled.settings, found)
    if workload is None or isinstance(workload, OneSequence):
        workload = replace(workload or OneSequence(), speculative=settings.draft != "none")
        if grows and workload.need is None and settings.n_ctx is None and not probing.offload_targets(found):
            from localrun.gguf.reader import read_gguf  # its context: the longest that fits, up to the trained one

            workload = replace(workload, need=read_gguf(settled.path).context_length)  # the header alone
    # notes for a person at a terminal; a log (stderr not a terminal) gets warnings only, and --json has it all
    notes = bool(env.stderr_isatty)
    run = assemble(
        settled.path,
        settings,
        workload=workload,
        verbose=verbose,
        hint_once=notes,
        draft=settled.draft,
        devices=found,
        template=settled.template,
    )
    for warning in run.warnings:
        out().warn(warning)
    if run.hint:
        out().note(run.hint)
    if run.gpu_hint and notes:
        out().note(run.gpu_hint)
    if "kv" in run.settings.reasons and (verbose or (run.settings.kv_news and notes)):
        out().note(f"kv cache {run.settings.reasons['kv']}")
    return PlannedRun(run.config, run.info, settled.target, run.settings, run.wisdom, settled.draft, run)


def resolve_engine(
    model: str | None,
    options: Options,
    *,
    offline: bool = False,
    verbose: bool = False,
    with_draft: bool = True,
    pull_draft: bool = False,
    workload: Workload | None = None,
    devices: Sequence[found_devices.Device] | None = None,
    grows: bool = False,
) -> PlannedRun:
    """`settle` the run, then `plan` it for ``workload`` on ``devices``."""
    settled = settle(model, options, offline=offline, with_draft=with_draft, pull_draft=pull_draft)
    return plan(settled, workload, verbose=verbose, devices=devices, grows=grows)


def without_a_gpu(settings: RunSettings, found: tuple[Place, ...]) -> RunSettings:
    """``settings`` for the devices ``found``: `--gpu-layers N` where no GPU
    can take a layer is a warning and the CPU, as in llama.cpp's tools."""
    from localrun.runtime.devices import offload_targets
    from localrun.settings import layers_without_a_gpu

    if offload_targets(found):
        return settings
    settings, warning = layers_without_a_gpu(settings)
    if warning:
        out().warn(warning)
    return settings


def structured_output(schema: str | None, grammar: Path | None) -> OutputSpec | None:
    """`--schema` or `--grammar`, checked before any model loads."""
    from localrun.structured.spec import parse_grammar, parse_schema

    if schema is None and grammar is None:
        return None
    if schema is not None and grammar is not None:
        raise UsageError("--schema and --grammar are two ways to say one thing", hint="give one of them")
    if schema is not None:
        return parse_schema(schema)
    assert grammar is not None
    return parse_grammar(grammar)


def title(resolved: PlannedRun) -> str:
    """What the panel calls the model: the name the user gave (an alias, or a
    file's name) and the quantization read from the file, not the file's own
    `general.name`, which can mislead."""
    from localrun.gguf.info import describe

    target = resolved.target
    name = target.path.name if target.path is not None else target.label
    title = f"{name} ({describe(resolved.info).quantization})"
    placement = resolved.config.placement
    if placement.model.offloaded:  # where it runs, when that is not the CPU
        title += f" on {placement.model.describe()}"
    return title


def reference(resolved: PlannedRun) -> str:
    """What `-m` takes to load this model again: the registry alias, the
    file's path (absolute, so it holds from any folder), or the name given."""
    target = resolved.target
    if target.entry is not None:
        return target.entry.alias
    return str(target.path.absolute()) if target.path is not None else target.label


def template_setting(chosen: ChatTemplate, architecture: str) -> dict[str, Any]:
    """The chat template as `--json` shows a setting: its value, source and why."""
    if chosen.origin == "gguf":
        return {"value": "gguf", "source": "model"}
    if chosen.origin in ("built-in", "file"):
        return {"value": chosen.name, "source": "option"}
    why = f"the GGUF has none; its architecture is {architecture}"
    return {"value": chosen.name or None, "source": "default", "why": why}


def template_unless_raw(template: str | None, raw: bool) -> str | None:
    """`--template`, refused beside `--raw` (which renders with none)."""
    if raw and template is not None:
        raise UsageError("--raw sends the prompt without a chat template; --template names one", hint="drop one")
    return template


def say_template(resolved: PlannedRun, *, raw: bool = False, refused: bool = False) -> None:
    """A note on stderr where the chat template is not the GGUF's own and was
    not given: inferred from the architecture, or none, where the prompt goes
    as is (``refused``: a command that refuses to run without one says so itself)."""
    from localrun.runtime.model_template import template_note

    if resolved.template is None or raw or (refused and resolved.template.source is None):
        return
    target = resolved.target
    name = target.path.name if target.path is not None else target.label
    note = template_note(resolved.template, name, resolved.info.architecture)
    if note is not None:
        out().note(note)


def load(resolved: PlannedRun) -> Engine:
    """The engine, loaded; a retry with fewer GPU layers is said in one warning."""
    from localrun.runtime.engine import Engine

    engine = Engine(resolved.config, resolved.info)
    for notice in engine.notices:
        out().warn(notice)
    return engine


@dataclass(frozen=True)
class Thinking:
    """`--think` and `--reasoning-budget`, checked: the mode, the budget, and
    the chat template switches that ask for the mode."""

    mode: ThinkMode = "auto"
    budget: int | None = None
    switches: dict[str, Any] | None = None
    template: str | None = None  # the chat template the run renders with (None: --raw, or none)

    @property
    def show(self) -> bool:
        return self.mode == "show"

    def reasoning(self, prompt: str) -> Reasoning | None:
        """The run's thinking, from the rendered ``prompt`` (None: the model does not think)."""
        from localrun.runtime.reasoning import reasoning_for

        return reasoning_for(self.template, prompt, budget=self.budget, mode=self.mode)


def refuse_thinking(mode: str, budget: int | None, elsewhere: bool) -> None:
    """`--think` and `--reasoning-budget` for a run ``elsewhere`` (a remote, a batch): an error, never ignored."""
    if elsewhere and (mode != "auto" or budget is not None):
        raise UsageError("--think and --reasoning-budget apply to a local run of one prompt", hint="drop them")


def thinking(mode: str, budget: int | None, template: str | None, model: str) -> Thinking:
    """The run's thinking options against the model's chat template (None: no
    template, or `--raw`): an option the template cannot honour is a usage
    error (`--think off` where it has no switch), before the model loads;
    one a model that never thinks has no use for is a note, and dropped."""
    from localrun.runtime.reasoning import THINK_MODES, check_mode, switches_for

    if mode not in THINK_MODES:
        raise UsageError(f"--think {mode}: not a mode", hint=f"use one of {', '.join(THINK_MODES)}")
    if budget is not None and budget < 0:
        raise UsageError("--reasoning-budget must be 0 or more")
    ignored = check_mode(template, mode, model=model, budget=budget)
    if ignored is not None:
        out().note(f"note: {ignored}")
        return Thinking("auto", None, switches_for(template, "auto") or None, template)  # as without them
    return Thinking(mode, budget, switches_for(template, mode) or None, template)


def warn_past_training(resolved: PlannedRun) -> None:
    """`--ctx` beyond the context the model was trained on: allowed, said."""
    trained, asked = resolved.info.context_length, resolved.settings.n_ctx
    if resolved.settings.sources.get("ctx") == "option" and asked and trained and asked > trained:
        out().warn(
            f"--ctx {asked} is beyond the {trained} tokens {title(resolved)} was trained on: "
            "text past them may lose its way"
        )


def chat_session(
    resolved: PlannedRun,
    engine: Engine,
    speculation: Decoding | None,
    sampling: SamplingParams,
    thinking: Thinking,
    *,
    system: str | None,
    max_tokens: int | None,
    output: OutputSpec | None = None,
) -> ChatSession:
    """A conversation on ``engine``, the model ``resolved`` planned: its own
    chat template, the run's thinking options, and its reference for records."""
    from localrun.runtime.chat import ChatSession
    from localrun.runtime.prompt import chat_template

    return ChatSession(
        engine,
        chat_template(engine),
        sampling,
        system=system,
        max_tokens=max_tokens,
        speculation=speculation,
        output=output,
        model=reference(resolved),
        switches=thinking.switches,
        think=thinking.mode,
        reasoning_budget=thinking.budget,
    )
