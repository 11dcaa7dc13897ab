"""Model names: what a name the user types points at.

A name is a registry alias, a path to a GGUF file, a file in a hub repo
(`hf://owner/repo/file.gguf[@REVISION]`, or the file's page or download
address), or a
repo with an optional quantization (`owner/repo[:QUANT]`, `hf.co/owner/repo[:QUANT]`,
or the repo's page address), as ollama and llama.cpp's `-hf` take them."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import unquote, urlsplit

from localrun.errors import UsageError
from localrun.store.ggufs import DEFAULT_QUANT, quant_of
from localrun.store.registry import ModelEntry, Registry

# the hub's web addresses, as people copy them from a browser or from ollama's `hf.co/...`
_HUB_HOSTS = ("hf.co", "huggingface.co", "www.huggingface.co")
_FORMS = "owner/repo[:QUANT], hf.co/owner/repo[:QUANT], hf://owner/repo/file.gguf or the file's hub address"


@dataclass(frozen=True)
class Target:
    """What a model name points at."""

    label: str
    entry: ModelEntry | None = None
    repo: str | None = None
    file: str | None = None  # None: picked from the repo's listing by `quant` (default Q4_K_M)
    quant: str | None = None
    revision: str | None = None  # None: the repo's main branch
    path: Path | None = None  # a local file, used in place

    @classmethod
    def from_entry(cls, entry: ModelEntry) -> Target:
        if entry.path is not None:  # models.toml's `path`: the file here, under its alias
            return cls(entry.alias, entry=entry, file=entry.file, quant=entry.quant, path=entry.path)
        return cls(entry.alias, entry=entry, repo=entry.repo, file=entry.file, quant=entry.quant)


def _bad(name: str, paths: bool) -> UsageError:
    return UsageError(f"bad model reference {name!r}", hint=f"use {_FORMS}" + (" or a .gguf path" if paths else ""))


def _repo_target(name: str, repo: str, quant: str, paths: bool) -> Target:
    """`owner/repo` with an optional quantization (`latest`, as ollama writes it, is the default)."""
    owner, _, rest = repo.partition("/")
    if not owner or not rest or "/" in rest or ".." in repo:
        raise _bad(name, paths)
    chosen = quant.upper() if quant and quant.lower() != "latest" else None
    return Target(f"{repo}:{chosen}" if chosen else repo, repo=repo, quant=chosen)


def _file_target(name: str, repo_and_file: list[str], revision: str | None, paths: bool) -> Target:
    if len(repo_and_file) < 3 or not repo_and_file[-1].lower().endswith(".gguf") or ".." in repo_and_file:
        raise _bad(name, paths)
    repo, file = "/".join(repo_and_file[:2]), "/".join(repo_and_file[2:])
    at = f"@{revision}" if revision and revision != "main" else ""
    return Target(f"hf://{repo}/{file}{at}", repo=repo, file=file, revision=revision)


def is_hub_address(name: str) -> bool:
    """Whether ``name`` is an address on the hub's web site (`hf.co/...`,
    `https://huggingface.co/...`): a model name, not a server's URL."""
    url = urlsplit(name if "://" in name else "https://" + name)
    return url.scheme in ("http", "https") and url.netloc.lower() in _HUB_HOSTS


def _hub_address(name: str, paths: bool) -> Target | None:
    """`hf.co/owner/repo[:QUANT]`, `https://huggingface.co/owner/repo` and a file's
    `/blob/REV/FILE.gguf` or `/resolve/REV/FILE.gguf` address; None: not the hub's."""
    if not is_hub_address(name):
        return None
    url = urlsplit(name if "://" in name else "https://" + name)
    parts = [unquote(p) for p in url.path.strip("/").split("/")]
    if len(parts) == 2:
        repo, _, quant = "/".join(parts).partition(":")
        return _repo_target(name, repo, quant, paths)
    if len(parts) >= 3 and parts[2] == "tree":
        return _repo_target(name, "/".join(parts[:2]), "", paths)
    if len(parts) >= 5 and parts[2] in ("blob", "resolve"):
        return _file_target(name, parts[:2] + parts[4:], parts[3], paths)
    raise _bad(name, paths)


def _known(target: Target, registry: Registry) -> Target:
    """A hub name of a registry entry's file (`hf://`, `owner/repo[:QUANT]`,
    `hf.co/...`, the file's address, on the main branch) takes that entry, so
    it finds the file wherever the alias pulled it (a mirror's copy too), pulls
    it as the alias does (the pinned sha256, the mirrors) and runs with the
    entry's defaults: every name of a file is the same model."""
    if target.revision not in (None, "main"):
        return target
    in_repo = [e for e in registry.entries.values() if e.repo == target.repo]
    if target.file is not None:
        found = [e for e in in_repo if e.file == target.file][:1]
    else:  # the quantization the repo's listing picks a file by (ggufs.pick_quant_file): one entry's, or unsure
        found = [e for e in in_repo if quant_of(e.file) == (target.quant or DEFAULT_QUANT)]
    return replace(target, entry=found[0]) if len(found) == 1 else target


def parse(name: str, registry: Registry, *, paths: bool = True) -> Target:
    """What ``name`` refers to (``paths`` False: a command that takes no .gguf path, whose hints offer none)."""
    target = _parse(name.strip(), registry, paths)
    return _known(target, registry) if target.entry is None and target.repo is not None else target


def _parse(name: str, registry: Registry, paths: bool) -> Target:
    if name.startswith("hf://"):
        rest = name[5:].strip("/")
        if rest.count("/") == 1:
            repo, _, quant = rest.partition(":")
            return _repo_target(name, repo, quant, paths)
        rest, _, revision = rest.partition("@")  # hf://owner/repo/file.gguf@REVISION, as a label writes it
        return _file_target(name, rest.split("/"), revision or None, paths)
    hub = _hub_address(name, paths)
    if hub is not None:
        return hub
    as_path = Path(name).expanduser()
    if name.endswith(".gguf") or as_path.exists():
        return Target(name, path=as_path)
    if "/" in name:
        repo, _, quant = name.partition(":")
        return _repo_target(name, repo, quant, paths)
    entry = registry.resolve(name, paths=paths)
    return Target.from_entry(entry)
