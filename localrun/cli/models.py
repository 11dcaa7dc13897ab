"""`localrun pull`, `list`, `rm`: parse, call the store, show the result."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer

from localrun import openmp, store
from localrun.cli import _options as opt
from localrun.cli._env import current
from localrun.cli._output import out
from localrun.cli._resolve import model_name, pull_with_progress
from localrun.errors import ModelNotFoundError, UsageError
from localrun.units import count, human_bytes, parse_size

if TYPE_CHECKING:
    from localrun.gguf.info import ModelInfo
    from localrun.runtime.placement import DeviceFit


def _flash_attn_auto(path: Path) -> tuple[str, str]:
    """What `--flash-attn auto` does for an f16 cache: (mode, why)."""
    from localrun.tune.apply import find

    wisdom = find(path, hint_once=False).wisdom
    if wisdom is not None and wisdom.rates is not None:
        return "by shape", "chosen with the KV types for each run's prompt and answer from localrun tune's rates"
    curve = wisdom.flash_attn if wisdom is not None else None
    if curve is None:
        return "auto", "llama.cpp decides as it loads the model; `localrun tune` measures which is faster here"
    mode = curve.choice()
    cross = curve.crossover
    where = f", crossing near depth {cross}" if cross is not None else ""
    if mode is None:
        return "auto", f"llama.cpp decides as it loads the model: on and off measured alike here{where}"
    return mode, f"{mode}: measured faster here over depths {', '.join(map(str, curve.depths))}{where}"


def _by_shape(path: Path) -> tuple[list[dict[str, object]], list[str]]:
    """What this machine's rates pick for a few shapes of run (none without
    them), as --json's rows and as lines."""
    from localrun.tune.apply import examples, find, pick_text

    picks = examples(find(path, hint_once=False).wisdom)
    rows: list[dict[str, object]] = [
        {
            "shape": {"prompt": run.prompt, "answer": run.answer, "start": run.start, "what": run.what},
            "setting": pick.label or pick.default,
            "source": "wisdom" if pick.label is not None else "default",
            "why": pick_text(pick),
            "seconds": {k: round(v, 3) for k, v in pick.seconds.items()},
        }
        for run, pick in picks
    ]
    return rows, [f"    {run.describe()}: {pick_text(pick)}" for run, pick in picks]


def pull(
    name: Annotated[
        str | None,
        typer.Argument(
            help="Alias (family:tag), owner/repo[:QUANT] (Q4_K_M unless named), hf.co/owner/repo[:QUANT], "
            "hf://owner/repo/file.gguf, a hub file's address, or a path. Default: config.toml's model, "
            "else the registry's default.",
            show_default=False,
        ),
    ] = None,
    no_draft: Annotated[bool, typer.Option("--no-draft", help="Do not pull the matched draft model.")] = False,
    source: Annotated[str, typer.Option("--source", help="auto, hub or mirror.")] = "auto",
    no_tune: Annotated[
        bool, typer.Option("--no-tune", help="Do not measure the model's speed settings on this machine afterwards.")
    ] = False,
) -> None:
    """Download a model (and its matched draft) into the local cache, then
    measure its speed settings on this machine (`localrun tune`) unless it was."""
    if source not in ("auto", "hub", "mirror"):
        raise UsageError(f"unknown source {source!r}", hint="use --source auto, hub or mirror")
    chosen = cast(store.Source, source)
    reg = current().registry
    target = store.parse(model_name(name) or reg.default, reg)
    targets = [target]
    entry = target.entry
    if not no_draft and entry is not None and entry.draft and target.label == entry.alias:  # not by a hub name
        targets.append(store.parse(entry.draft, reg))
    paths = []
    for t in targets:
        pulled = pull_with_progress(t, chosen)
        out().result(f"{t.label}\t{pulled.path}")
        paths.append(pulled.path)
    if not no_tune:
        _tune_once(paths[0])


def busy_now(readings: int = 5, gap_s: float = 0.2) -> str | None:
    """Whether other processes keep the CPUs busy now, read ``readings`` times
    over about a second (`localrun.runtime.load`): why, or None on a quiet machine."""
    import time

    from localrun.runtime.load import LoadWatch

    watch = LoadWatch()
    for i in range(readings):
        if i:
            time.sleep(gap_s)
        watch.read()
    why = watch.busy()
    return None if why is None else why.replace("samples", "readings")


def _tune_once(path: Path) -> None:
    """`localrun tune` on a model this machine has no wisdom for; a model that
    cannot be measured is a warning: the download stands."""
    from localrun.cli.tune import run_tune
    from localrun.errors import LocalrunError
    from localrun.tune.apply import find

    if find(path, hint_once=False).wisdom is not None:
        return
    busy = busy_now()
    if busy is not None:  # what it measured would be discarded: the minute is not spent
        out().note(f"not measuring {path.name} now ({busy}); `localrun tune` measures it on a quiet machine")
        return
    try:
        run_tune(path)
    except (LocalrunError, OSError) as exc:
        why = exc.message if isinstance(exc, LocalrunError) else str(exc)
        out().warn(f"could not measure {path.name}: {why}; `localrun tune` tries again")


@dataclass(frozen=True)
class ListRow:
    alias: str
    family: str
    present: bool
    size_bytes: int  # on disk; 0 when not downloaded
    download_bytes: int | None  # the catalogue's size of the download, when models.toml gives it
    quant: str
    draft: str | None
    source: str
    mirrors: int
    default: bool
    path: str | None
    description: str


def _default_alias() -> str | None:
    """The alias a command without -m runs (config.toml's `model`, else the
    registry's default); None when that is not a registry alias."""
    reg = current().registry
    try:
        entry = store.parse(model_name(None) or reg.default, reg).entry
    except (ModelNotFoundError, UsageError):
        return None
    return entry.alias if entry is not None else None


def _rows() -> list[ListRow]:
    """Every registry entry, grouped by family in the order models.toml first names each."""
    reg = current().registry
    default = _default_alias()
    families = list(dict.fromkeys(e.group for e in reg.entries.values()))
    entries = sorted(reg.entries.values(), key=lambda e: families.index(e.group))
    rows = []
    for entry in entries:
        path = store.locate(store.Target.from_entry(entry))
        rows.append(
            ListRow(
                alias=entry.alias,
                family=entry.group,
                present=path is not None,
                size_bytes=store.size_on_disk(path) if path else 0,
                download_bytes=entry.size,
                quant=entry.quant,
                draft=entry.draft,
                source=str(entry.path) if entry.path is not None else f"hf://{entry.repo}/{entry.file}",
                mirrors=len(entry.mirrors),
                default=entry.alias == default,
                path=str(path) if path else None,
                description=entry.description,
            )
        )
    return rows


def list_models(
    catalogue: Annotated[
        bool,
        typer.Option("--all", "-a", "--catalogue", help="The whole catalogue, grouped by family, with download sizes."),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout.")] = False,
) -> None:
    """The models on this machine (and the default one); --all: every model
    the registry knows, grouped by family, marking what is downloaded."""
    everything = _rows()
    rows = everything if catalogue else [r for r in everything if r.present or r.default]
    total = sum(r.size_bytes for r in everything)
    remotes = _remote_rows()
    if as_json:
        record: dict[str, object] = {"models": [asdict(r) for r in rows], "total_bytes": total}
        if catalogue:
            record["families"] = list(dict.fromkeys(r.family for r in rows))
        if remotes:
            record["remotes"] = [asdict(r) for r in remotes]
        out().json(record, indent=2)
        return
    footer = f"total on disk: {human_bytes(total)}"
    if not catalogue:
        footer += f"; `localrun list --all` shows the catalogue ({count(len(everything), 'model')})"
    out().table(_catalogue_table(rows) if catalogue else _local_table(rows), footer)
    if remotes:
        out().table("", _remote_table(remotes))


def _local_table(rows: list[ListRow]) -> object:
    from localrun.ui.table import Column, FitTable

    # the alias (what -m takes) is never cut; the source wraps, and goes first on a narrow terminal
    columns = (
        Column("MODEL"),
        Column("PULLED", drop=1),  # as `list --all` says it
        Column("SIZE", drop=2),
        Column("QUANT", drop=3),
        Column("DRAFT", drop=4),
        Column("SOURCE", wrap=20, drop=5),
    )
    table = FitTable(columns, box=None, pad_edge=False)
    for r in rows:
        table.add_row(
            f"{r.alias} (default)" if r.default else r.alias,
            "yes" if r.present else "-",
            human_bytes(r.size_bytes) if r.present else "-",
            r.quant,
            r.draft or "-",
            r.source + (f" +{r.mirrors} mirror" if r.mirrors else ""),
        )
    return table


def _catalogue_table(rows: list[ListRow]) -> object:
    """A line per family, its models under it: downloaded or not, the download's size, the draft."""
    from localrun.ui.table import Column, FitTable

    columns = (
        Column("MODEL"),
        Column("PULLED", drop=2),
        Column("SIZE", justify="right", drop=1),
        Column("QUANT", drop=3),
        Column("DRAFT", drop=4),
        Column("ABOUT", wrap=24, drop=5),
    )
    table = FitTable(columns, box=None, pad_edge=False)
    family = None
    for r in rows:
        if r.family != family:
            family = r.family
            table.add_row(family, "", "", "", "", "", style="bold")
        size = r.size_bytes if r.present else r.download_bytes
        table.add_row(
            f"  {r.alias}" + (" (default)" if r.default else ""),
            "yes" if r.present else "-",
            human_bytes(size) if size else "?",
            r.quant,
            r.draft or "-",
            r.description,
        )
    return table


@dataclass(frozen=True)
class RemoteRow:
    name: str
    url: str
    model: str | None  # the model id sent; None: the first the server lists
    answers: bool  # GET /models answered within a few seconds
    models: list[str]  # what the server lists
    error: str | None  # why it did not answer


def _remote_rows() -> list[RemoteRow]:
    """The registry's remotes, each asked GET /models at once (a few seconds at most)."""
    from concurrent.futures import ThreadPoolExecutor

    from localrun.remote.client import probe
    from localrun.remote.config import find_remote

    reg = current().registry
    remotes = [find_remote(name, reg) for name in reg.remotes]
    found = [r for r in remotes if r is not None]
    if not found:
        return []
    with ThreadPoolExecutor(max_workers=min(len(found), 16)) as pool:
        probes = list(pool.map(probe, found))
    return [
        RemoteRow(r.label, r.url, r.model, p.answers, list(p.models), p.error)
        for r, p in zip(found, probes, strict=True)
    ]


def _remote_table(rows: list[RemoteRow]) -> object:
    from localrun.ui.table import Column, FitTable

    columns = (Column("REMOTE"), Column("URL", drop=2), Column("MODEL", drop=1), Column("ANSWERS", wrap=16, drop=3))
    table = FitTable(columns, box=None, pad_edge=False)
    for r in rows:
        answers = "yes" if r.answers else f"no: {r.error}"
        if r.answers and r.model is not None and r.model not in r.models:
            answers = f"yes, without {r.model}"
        table.add_row(f"remote:{r.name}", r.url, r.model or (r.models[0] if r.models else "-"), answers)
    return table


def rm(
    name: Annotated[str, typer.Argument(help="The alias to delete.")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
) -> None:
    """Delete a model's downloaded files (asks first on a terminal)."""
    reg = current().registry
    target = store.parse(name, reg, paths=False)
    if target.path is not None:
        raise UsageError("rm deletes downloaded models, not files given by path", hint="delete the file yourself")
    users = [e.alias for e in reg.drafted_by(target.label)]
    if users:
        out().warn(f"{target.label} is the draft model of {', '.join(users)}")
    found = store.locate(target)
    if found is None:
        out().note(f"{target.label} is not downloaded")
        return
    if not yes:
        if not current().stdin_isatty:
            raise UsageError(f"refusing to delete {target.label} without --yes (stdin is not a terminal)")
        if not typer.confirm(f"delete {target.label} ({human_bytes(store.size_on_disk(found))})?", err=True):
            out().note(f"kept {target.label}")
            return
    freed = store.remove(target)
    out().note(f"deleted {target.label}, {human_bytes(freed)} freed")


def show(
    name: Annotated[
        str, typer.Argument(help="Alias, owner/repo[:QUANT], hf.co/..., a hub file's address or a GGUF path.")
    ],
    budget: Annotated[
        str | None,
        typer.Option(
            "--budget", help="Memory for weights + KV cache, e.g. 4GiB. Default: the available RAM less a reserve."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout.")] = False,
    rpc: opt.Rpc = None,
) -> None:
    """What the model file says: architecture, size, attention, context, KV cache cost."""
    from localrun.gguf.info import KV_BYTES_PER_ELEMENT, describe
    from localrun.gguf.reader import read_gguf
    from localrun.runtime import devices
    from localrun.runtime.placement import device_fits, place

    reg = current().registry
    target = store.parse(name, reg)
    path = store.locate(target) if target.path is None else target.path
    if path is None:
        size = f" ({human_bytes(target.entry.size)})" if target.entry and target.entry.size else ""
        raise ModelNotFoundError(f"{target.label} is not downloaded", hint=f"localrun pull {target.label}{size}")
    checksum = store.checksum(target, path)
    try:
        budget_given = parse_size(budget) if budget else None
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    header = read_gguf(path)
    info = describe(header)
    opt.use_rpc(rpc)
    found = devices.probe()
    placement = place(found, memory_budget=budget_given, shape=info)
    per_device = device_fits(info, found)
    budget_bytes = placement.budget
    kv = {t: info.kv_bytes_per_token(t) for t in KV_BYTES_PER_ELEMENT}
    with_head = info.with_mtp_cache(0)  # a run that drafts with the MTP head holds its cache too
    head_kv = {t: with_head.kv_bytes_per_token(t) - b for t, b in kv.items()} if info.mtp_kv_heads else None
    fa_mode, fa_why = _flash_attn_auto(path)
    by_shape, by_shape_lines = _by_shape(path)
    fits = {t: info.max_context(budget_bytes, t) for t in KV_BYTES_PER_ELEMENT}
    record = {
        "name": info.name,
        "path": str(info.path),
        "source": _source(target, path),
        "family": target.entry.group if target.entry else None,
        "sha256": checksum.sha256,
        "checksum": checksum.origin,
        "architecture": info.architecture,
        "parameters": info.parameters,
        "weights_bytes": info.weights_bytes,
        "quantization": info.quantization,
        "layers": info.layers,
        "mtp_layers": header.nextn_layers,  # multi-token-prediction blocks: --spec mtp drafts with them
        "mtp_kv_bytes_per_token": head_kv,  # the head's own cache, where localrun drafts with it
        "attention_heads": info.heads,
        "kv_heads": info.kv_heads,
        "grouped_query_attention": info.grouped_query_attention,
        "attention": info.attention,
        "memory": info.memory,
        "attention_layers": info.attention_layers,
        "recurrent_state_bytes": info.recurrent_bytes(),
        "context_length": info.context_length,
        "vocab_size": info.vocab_size,
        "chat_template": info.has_chat_template,
        "kv_bytes_per_token": kv,
        "compute_bytes_estimate": info.compute_bytes(),
        "budget_bytes": budget_bytes,
        "max_context": fits,
        "flash_attn_auto": fa_mode,
        "kv_flash_attn_by_shape": by_shape,
        "placement": placement.to_json(),
        "wait": openmp.policy().as_setting(),
        "gpus": [
            {"name": f.device.name, "free": f.device.free, "layers": f.layers, "max_context": dict(f.max_context)}
            for f in per_device
        ],
    }
    if as_json:
        out().json(record, indent=2)
        return
    shared = {
        "multi-query": f" (multi-query attention: the {info.heads} query heads share it)",
        "grouped-query": f" (grouped-query attention, {info.heads // max(info.kv_heads, 1)} query heads per KV head)",
    }
    gqa = shared.get(info.attention, "")
    mtp = f"  MTP layers       {header.nextn_layers} (--spec mtp drafts with them{_head_text(head_kv)})"
    mtp_lines = [mtp] if header.nextn_layers else []
    heads = f"{count(info.heads, 'head')} of {info.key_length}, {count(info.kv_heads, 'KV head')}{gqa}"
    lines = [
        f"{info.name}  {info.path}",
        f"  source           {_source(target, path)}",
        f"  checksum         {_checksum_text(checksum)}",
        f"  architecture     {info.architecture}",
        f"  parameters       {info.parameters / 1e9:.2f} B"
        if info.parameters >= 1e8
        else f"  parameters       {info.parameters / 1e6:.1f} M",
        f"  quantization     {info.quantization}, weights {human_bytes(info.weights_bytes)}",
        f"  layers           {info.layers}",
        *mtp_lines,
        f"  memory           {_memory_text(info)}",
        f"  attention        {heads if info.attention_layers else 'none'}",
        f"  flash attention  auto: {fa_why}",
        *by_shape_lines,
        f"  trained context  {info.context_length} tokens",
        f"  vocabulary       {info.vocab_size} tokens",
        f"  chat template    {'yes' if info.has_chat_template else 'no (use --raw)'}",
        "  KV cache / token " + ", ".join(f"{t} {b / 1024:.1f} KiB" for t, b in kv.items()),
        f"  context in {human_bytes(budget_bytes)}: " + _fits_text(fits, info.weights_bytes, info.compute_bytes()),
        f"  placement        {dict(placement.reasons)['model']}",
        f"  waiting threads  {_wait_text(openmp.policy())}",
        *(_gpu_line(f, info.layers) for f in per_device),
    ]
    out().result("\n".join(lines))


def _head_text(head_kv: dict[str, int] | None) -> str:
    """The MTP head's own KV cache a token, which a run that drafts with it holds beside the model's."""
    if not head_kv:
        return ""
    return "; their own KV cache / token " + ", ".join(f"{t} {b / 1024:.1f} KiB" for t, b in head_kv.items())


def _memory_text(info: ModelInfo) -> str:
    """What a context holds: a KV cache in how many layers, and a recurrent
    model's state, one per sequence whatever its length."""
    from localrun.gguf.info import ATTENTION, RECURRENT

    kv = f"a KV cache in {info.attention_layers} of {info.layers} layers"
    if info.memory == ATTENTION:
        return f"attention: {kv}"
    per_sequence = f"({human_bytes(info.recurrent_bytes())} per sequence)"
    if info.memory == RECURRENT:
        return f"recurrent: a state in {info.recurrent_layers} of {info.layers} layers {per_sequence}, no KV cache"
    return f"hybrid: {kv}, a recurrent state in {info.recurrent_layers} {per_sequence}"


def _wait_text(policy: openmp.WaitPolicy) -> str:
    """How llama.cpp's idle threads wait in this process, and why."""
    spins = "libgomp's default spin count" if policy.spincount is None else f"{policy.spincount} spins"
    return f"{policy.name} ({spins}): {policy.why}"


def _source(target: store.Target, path: Path) -> str:
    """Where the model came from: the hub file a name points at (or its
    quantization picked), or the path given."""
    if target.path is not None:
        return str(target.path)
    file = target.file or path.name
    at = f"@{target.revision}" if target.revision else ""
    return f"hf://{target.repo}/{file}{at}"


def _checksum_text(checksum: store.Checksum) -> str:
    return f"sha256 {checksum.sha256}, {checksum.origin}" if checksum.sha256 else checksum.origin


def _gpu_line(fit: DeviceFit, layers: int) -> str:
    """What fits one GPU: its layers for a default context, and the longest
    context per KV type with the whole model there."""
    line = f"  on {fit.device.name:<13} {human_bytes(fit.device.free)} free: {count(min(fit.layers, layers), 'layer')}"
    if any(fit.max_context.values()):
        line += "; the whole model with context " + ", ".join(f"{t} {n}" for t, n in fit.max_context.items())
    return line


def _fits_text(fits: dict[str, int], weights_bytes: int, compute_bytes: int) -> str:
    """The context each KV type fits, or, when none fits any, what the budget is short of."""
    if any(fits.values()):
        return ", ".join(f"{t} {n}" for t, n in fits.items())
    if compute_bytes:
        return (
            f"none: the weights alone need {human_bytes(weights_bytes)}, "
            f"{human_bytes(weights_bytes + compute_bytes)} with llama.cpp's compute buffer"
        )
    return f"none: the weights alone need {human_bytes(weights_bytes)}"
