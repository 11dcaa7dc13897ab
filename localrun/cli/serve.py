"""`localrun serve`: resolve and load the models as `generate` does, then
serve the OpenAI-compatible API (localrun/serve) until Ctrl-C or SIGTERM."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from localrun.cli import _history
from localrun.cli import _options as opt
from localrun.cli._env import current
from localrun.cli._errors import ExitCode
from localrun.cli._output import out
from localrun.errors import UsageError
from localrun.settings import Options

if TYPE_CHECKING:
    from collections.abc import Sequence

    from localrun.history.record import RunContext
    from localrun.runtime.devices import Device
    from localrun.serve.router import Servable
    from localrun.serve.served import ModelPlan
    from localrun.store import Target

Models = Annotated[
    list[str] | None,
    typer.Option(
        "-m",
        "--model",
        help="A model to serve (repeatable), loaded at start and kept: alias, owner/repo:QUANT, hf://... "
        "or a GGUF path. Every other pulled model loads when a request names it.",
        show_default=False,
    ),
]


def model_id(target: Target) -> str:
    """What a request names the model by: its registry alias, else the file's name without .gguf."""
    if target.entry is not None:
        return target.entry.alias
    if target.path is not None:
        return target.path.stem
    return target.label


def _plans(
    names: list[str | None],
    options: Options,
    *,
    offline: bool,
    verbose: bool,
    queue: int,
    spec: str = "lookup",
    prompt_cache: bool = True,
    pooling: str = "auto",
    contexts: dict[str, RunContext] | None = None,
    found: Sequence[Device] | None = None,
) -> list[ModelPlan]:
    """Each model's plan, on the devices measured once for all of them;
    ``contexts`` gets each one's run history context, by id."""
    from localrun.assemble import Slots
    from localrun.runtime import devices
    from localrun.serve.served import ModelPlan, looks_like_path

    found = devices.probe() if found is None else found
    plans: list[ModelPlan] = []
    slots = Slots(speculative=spec == "lookup")
    for name in names:
        resolved = opt.resolve_engine(
            name, options, offline=offline, verbose=verbose, with_draft=False, workload=slots, devices=found
        )
        assert resolved.run is not None  # planned just now
        opt.say_template(resolved, refused=True)  # one without any: the server says so once loaded
        ident = model_id(resolved.target)
        if any(p.id == ident for p in plans):
            raise UsageError(f"two models would both be called {ident!r}", hint="serve each once")
        given = {n for n in (name, resolved.target.label) if n and not looks_like_path(n)}  # never a path
        file = resolved.config.model_path  # its file's own name, with .gguf or without, as a pulled model answers
        given |= {file.name, file.stem}
        if contexts is not None:
            contexts[ident] = _history.context("serve", resolved, draft=spec)
        plans.append(
            ModelPlan(
                id=ident,
                names=frozenset(given - {ident}),
                run=resolved.run,
                max_queue=queue,
                system=resolved.settings.system,
                speculate=spec == "lookup",
                prompt_cache=prompt_cache,
                pooling=pooling,
            )
        )
    return plans


def _check(*, port: int, queue: int, grace: float, spec: str, ctx: str | None, template: str | None) -> None:
    """The flags that must be right before anything loads."""
    if not 0 <= port <= 65535:
        raise UsageError("--port must be from 0 to 65535")
    if queue < 0:
        raise UsageError("--queue must be 0 or more")
    if grace < 0:
        raise UsageError("--grace must be 0 or more")
    if spec not in ("lookup", "none"):
        raise UsageError(f"--spec {spec!r}: use lookup or none", hint="a server drafts by prompt lookup only")
    if ctx == "auto":
        raise UsageError("--ctx auto gives one context all the memory; a server has slots", hint="use --ctx N")
    if template is not None:
        from localrun.runtime.model_template import given_template

        given_template(template)  # a file that cannot be read or compiled is refused before any model loads


def _idle_unload(text: str, parse: Callable[[object, str], float]) -> float | None:
    """--idle-unload in seconds; None: never (0, or a negative duration)."""
    try:
        seconds = parse(text, "--idle-unload")
    except UsageError:  # its wording is keep_alive's, where -1 is never and 0 is at once
        raise UsageError(f'--idle-unload: {text!r} is not a duration (say "5m", "30s", seconds, or 0: never)') from None
    return None if seconds == 0 or seconds == float("inf") else seconds


def _pulled(plan: Callable[[str], ModelPlan]) -> list[Servable]:
    """Every registry model pulled here, servable on demand: planned (offline) when it loads."""
    from localrun import store
    from localrun.serve.router import Servable

    registry = current().registry
    pulled = []
    for entry in registry.entries.values():
        path = store.locate(store.Target.from_entry(entry))
        if path is not None:
            pulled.append(Servable(entry.alias, frozenset({path.name}), functools.partial(plan, entry.alias)))
    return pulled


def _in_dir(folder: Path, plan: Callable[[str], ModelPlan]) -> list[Servable]:
    """`--models-dir`: each GGUF in ``folder`` and its subfolders one level
    down (a split model by its first shard; no projector file), servable on
    demand under its file's name without .gguf."""
    from localrun.serve.router import Servable
    from localrun.store.ggufs import is_split

    files = sorted(folder.glob("*.gguf")) + sorted(folder.glob("*/*.gguf"))
    servable = []
    for file in files:
        if file.name.startswith("mmproj") or (is_split(file.name) and "-00001-of-" not in file.name):
            continue
        servable.append(Servable(file.stem, frozenset({file.name}), FilePlan(plan, file)))
    return servable


@dataclass(frozen=True)
class FilePlan:
    """A --models-dir model's plan (called when it loads), and its file: what
    a listing reads before it loads (ollama's /api/tags gives its size)."""

    plan: Callable[[str], ModelPlan]
    path: Path

    def __call__(self) -> ModelPlan:
        return self.plan(str(self.path))


def _servable(plan: Callable[[str], ModelPlan], folder: Path | None) -> Callable[[], list[Servable]]:
    """What the server may load on demand, looked up again when a request names a model it does not know:
    every model pulled (or named by a `path` in models.toml), and the GGUFs of --models-dir."""

    def servable() -> list[Servable]:
        return _pulled(plan) + (_in_dir(folder, plan) if folder is not None else [])

    return servable


def serve_command(
    model: Models = None,
    models_dir: Annotated[
        Path | None,
        typer.Option(
            "--models-dir",
            help="Serve the GGUF files of this folder (and its subfolders) on demand, each by its file's name.",
            show_default=False,
        ),
    ] = None,
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on; other than loopback needs --api-key or --no-auth.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on (0: any free one).")] = 8080,
    parallel: Annotated[
        int | None,
        typer.Option(
            "--parallel",
            help="Requests decoded together per model (default: what localrun tune measured, else 4, as fit).",
            show_default=False,
        ),
    ] = None,
    queue: Annotated[
        int,
        typer.Option(
            "--queue",
            help="Requests that may wait for a slot (each model), or for a loaded model to make room "
            "for theirs (all together); "
            "more get 503 with Retry-After.",
        ),
    ] = 16,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="LOCALRUN_API_KEY",
            help="Requests need Authorization: Bearer KEY (also LOCALRUN_API_KEY).",
            show_default=False,
            show_envvar=False,
        ),
    ] = None,
    no_auth: Annotated[
        bool, typer.Option("--no-auth", help="Serve a non-loopback --host without a key, on purpose.")
    ] = False,
    cors: Annotated[
        list[str] | None,
        typer.Option("--cors", help="Let web pages from this origin call the API (repeatable).", show_default=False),
    ] = None,
    no_metrics: Annotated[
        bool, typer.Option("--no-metrics", help="Do not serve GET /metrics (Prometheus' format, behind the key).")
    ] = False,
    grace: Annotated[
        float, typer.Option("--grace", help="Seconds in-flight requests may finish after Ctrl-C or SIGTERM.")
    ] = 10.0,
    offline: opt.Offline = False,
    system: opt.System = None,
    template: opt.Template = None,
    ctx: Annotated[
        str | None,
        typer.Option("--ctx", help="Each slot's context in tokens (default: 4096, at most the trained context)."),
    ] = None,
    threads: opt.Threads = None,
    gpu_layers: opt.GpuLayers = None,
    device: opt.Device = None,
    rpc: opt.Rpc = None,
    kv: opt.Kv = None,
    kv_k: opt.KvK = None,
    kv_v: opt.KvV = None,
    flash_attn: opt.FlashAttn = None,
    sample_on: opt.SampleOn = None,
    spec: Annotated[
        str,
        typer.Option(
            "--spec",
            help="lookup: a request decoding alone drafts from its prompt where that pays; none: never.",
        ),
    ] = "lookup",
    no_prompt_cache: Annotated[
        bool,
        typer.Option(
            "--no-prompt-cache",
            help="Do not keep long system prompts' KV state on disk (kept by default from "
            "1,024 tokens on, as `generate` does, and loaded by the next server or run that starts the same way).",
        ),
    ] = False,
    models_max: Annotated[
        int,
        typer.Option(
            "--models-max",
            help="Models loaded at once; past it the least recently used idle one unloads (0: no limit).",
        ),
    ] = 0,
    idle_unload: Annotated[
        str,
        typer.Option(
            "--idle-unload",
            help="Unload a model idle this long (5m, 30s, seconds; 0: never); a request's keep_alive overrides it. "
            "Models given with -m stay.",
        ),
    ] = "5m",
    queue_timeout: Annotated[
        str,
        typer.Option(
            "--queue-timeout",
            help="How long a request for a model that cannot load yet (--models-max reached, or no memory) "
            "waits for a loaded one to go idle and make room (5m, 30s, seconds); then 503 with Retry-After.",
        ),
    ] = "5m",
    runner_timeout: Annotated[
        str,
        typer.Option(
            "--runner-timeout",
            help="A model's runner process silent, or stuck with requests running, this long is replaced "
            "(2m, 30s, seconds).",
        ),
    ] = "2m",
    in_process: Annotated[
        bool,
        typer.Option(
            "--in-process",
            help="Run every model in the server's own process, not each in a runner process of its own "
            "(a crash then ends every model's requests, and an unload gives back less memory).",
        ),
    ] = False,
    pooling: opt.Pooling = "auto",
    verbose: opt.Verbose = False,
    no_log: _history.NoLog = False,
) -> ExitCode:
    """Serve models over an OpenAI-compatible HTTP API (chat, completions, streaming)."""
    from localrun.runtime import devices
    from localrun.runtime.embed import check_pooling
    from localrun.serve.app import AppSettings
    from localrun.serve.heap import one_arena
    from localrun.serve.router import ModelTable, parse_duration
    from localrun.serve.runner import MIN_HANG_S, start_runner
    from localrun.serve.served import Loader, load_model, load_models
    from localrun.serve.server import check_exposure, serve
    from localrun.ui.serve import ServeView

    opt.check_positive(parallel=parallel)
    _check(port=port, queue=queue, grace=grace, spec=spec, ctx=ctx, template=template)
    check_pooling(pooling)
    if models_max < 0:
        raise UsageError("--models-max must be 0 or more")
    idle_s = _idle_unload(idle_unload, parse_duration)
    queue_timeout_s = parse_duration(queue_timeout, "--queue-timeout")
    hang_s = parse_duration(runner_timeout, "--runner-timeout")
    if not MIN_HANG_S <= hang_s < math.inf:
        raise UsageError(f"--runner-timeout must be {MIN_HANG_S:g} s or more (2m, 30s, seconds)")
    if rpc and not in_process:  # llama.cpp's rpc-server serves one client at a time: one process for all models
        out().note("--rpc: every model runs in the server's own process (an RPC server serves one client at a time)")
        in_process = True
    loader: Loader = load_model if in_process else functools.partial(start_runner, hang_s=hang_s)
    check_exposure(host, api_key, no_auth)
    opt.use_rpc(rpc)
    env = current()
    options = Options(
        ctx=ctx,
        kv=kv,
        kv_k=kv_k,
        kv_v=kv_v,
        flash_attn=flash_attn,
        sample_on=sample_on,
        threads=threads,
        gpu_layers=gpu_layers,
        device=device,
        system=system,
        draft="none",
        parallel=parallel,
        template=template,
    )
    contexts: dict[str, RunContext] = {}
    one_arena()  # before any model's thread: what an unload frees can go back to the system
    found = devices.probe()

    def plans(names: list[str | None], offline: bool) -> list[ModelPlan]:
        return _plans(
            names,
            options,
            offline=offline,
            verbose=verbose,
            queue=queue,
            spec=spec,
            prompt_cache=not no_prompt_cache,
            pooling=pooling,
            contexts=contexts,
            found=found,
        )

    if models_dir is not None and not models_dir.is_dir():
        raise UsageError(f"--models-dir {models_dir}: not a folder")
    pinned = plans(list(model), offline) if model else []
    discover = _servable(lambda name: plans([name], True)[0], models_dir)  # beside the -m ones (the table skips those)
    servable = discover()
    if not pinned and not servable:
        out().note(
            "no model is pulled yet: the server starts, and serves a model once it is pulled "
            f"(localrun pull MODEL, e.g. localrun pull {env.registry.default}; localrun list --all names them)"
        )
    table = ModelTable(
        load_models(pinned, loader),
        env.registry,
        servable=servable,
        discover=discover,
        models_max=models_max,
        idle_unload_s=idle_s,
        queue_timeout_s=queue_timeout_s,
        max_waiting=queue,
        loader=loader,
    )
    for served in table.models:
        for notice in served.notices:
            out().warn(f"{served.id}: {notice}")
    settings = AppSettings(api_key=api_key, cors=tuple(cors or ()), metrics=not no_metrics)
    with (
        ServeView(env.stderr, terminal=bool(env.stderr_isatty)) as view,
        _history.ServeLog(contexts, no_log=no_log) as log,
    ):
        cut_short = serve(table, settings, host=host, port=port, grace_s=grace, on_event=log.tee(view.handle))
    if cut_short:  # a second Ctrl-C: 130 and the message, from the one place that gives them
        raise KeyboardInterrupt
    return ExitCode.OK
