"""Model names: what a name the user types points at."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from localrun.errors import ModelNotFoundError, UsageError
from localrun.store.registry import ModelEntry, Registry


@dataclass(frozen=True)
class Target:
    """What a model name points at."""

    label: str
    entry: ModelEntry | None = None
    repo: str | None = None
    file: str | None = None  # None with `quant`: picked from the repo's listing
    quant: str | None = None
    path: Path | None = None  # a local file, used in place

    @classmethod
    def from_entry(cls, entry: ModelEntry) -> Target:
        return cls(entry.alias, entry=entry, repo=entry.repo, file=entry.file)


def parse(name: str, registry: Registry, *, paths: bool = True) -> Target:
    """What ``name`` refers to (``paths`` False: a command that takes no .gguf path, whose hints offer none)."""
    if name.startswith("hf://"):
        parts = name[5:].split("/")
        if len(parts) < 3 or not parts[-1].endswith(".gguf"):
            raise UsageError(f"bad model reference {name!r}", hint="use hf://owner/repo/file.gguf")
        return Target(name, repo="/".join(parts[:2]), file="/".join(parts[2:]))
    as_path = Path(name).expanduser()
    if name.endswith(".gguf") or as_path.exists():
        return Target(name, path=as_path)
    if "/" in name:
        repo, _, quant = name.partition(":")
        if repo.count("/") != 1 or not quant:
            raise UsageError(
                f"bad model reference {name!r}",
                hint="use owner/repo:QUANT (e.g. Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF:Q4_K_M)"
                + (" or a .gguf path" if paths else ""),
            )
        return Target(name, repo=repo, quant=quant)
    entry = registry.resolve(name, paths=paths)
    return Target.from_entry(entry)


def pick_quant_file(files: list[str], quant: str) -> str:
    """The single-file GGUF of a quantization in a repo listing (like llama.cpp's -hf)."""
    q = quant.lower()
    ggufs = [f for f in files if f.lower().endswith(".gguf") and "mmproj" not in f.lower()]
    matches = [f for f in ggufs if re.search(rf"(^|[-_.]){re.escape(q)}([-_.]|$)", Path(f).stem.lower())]
    unsplit = [f for f in matches if not re.search(r"-\d{5}-of-\d{5}", f)] or matches
    if not unsplit:
        have = sorted(
            {
                m.group(1).upper()
                for f in ggufs
                if (m := re.search(r"[-_.]((?:i?q\d|f16|bf16|f32)[a-z0-9_]*)$", Path(f).stem, re.I))
            }
        )
        raise ModelNotFoundError(
            f"no {quant} GGUF file in the repo", hint=f"quantizations there: {', '.join(have) or 'none'}"
        )
    return sorted(unsplit, key=len)[0]
