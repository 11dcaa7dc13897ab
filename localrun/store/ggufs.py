"""GGUF files in a hub repository: the quantization a file name says, the
file a quantization picks (as `ollama run hf.co/owner/repo:QUANT` and
llama.cpp's `-hf owner/repo:QUANT` do), and the shards of a split file."""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from localrun.errors import ModelNotFoundError

DEFAULT_QUANT = "Q4_K_M"

_SPLIT = re.compile(r"^(?P<head>.*-)(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")
# the last word of a file name's stem: Q4_K_M, IQ4_XS, Q4_0_4_4, F16, BF16, MXFP4, UD-Q4_K_XL (unsloth's)
_QUANT = re.compile(r"(?:^|[-_.])((?:ud-)?(?:i?q\d(?:_[a-z0-9]+)*|f16|bf16|f32|mxfp4(?:_moe)?))$", re.IGNORECASE)


def ggufs(files: list[str]) -> list[str]:
    """The model files of a listing: .gguf files, less the vision projectors."""
    return [f for f in files if f.lower().endswith(".gguf") and "mmproj" not in PurePosixPath(f).name.lower()]


def shards(file: str) -> list[str]:
    """Every file of a split GGUF named by its first (or any) shard,
    `name-00001-of-00003.gguf`; a whole file is its only shard."""
    found = _SPLIT.match(file)
    if found is None:
        return [file]
    count = int(found["count"])
    return [f"{found['head']}{i:05d}-of-{found['count']}.gguf" for i in range(1, count + 1)]


def is_split(file: str) -> bool:
    return _SPLIT.match(file) is not None


def quant_of(file: str) -> str | None:
    """The quantization a GGUF file's name says (upper case), if it says one."""
    name = PurePosixPath(file).name
    split = _SPLIT.match(name)
    stem = split["head"][:-1] if split else name.removesuffix(".gguf").removesuffix(".GGUF")
    found = _QUANT.search(stem)
    return found.group(1).upper() if found else None


def quants(files: list[str]) -> list[str]:
    """The quantizations a listing holds, sorted."""
    return sorted({q for f in ggufs(files) if (q := quant_of(f)) is not None})


def pick_quant_file(files: list[str], quant: str | None, repo: str = "the repo") -> str:
    """The GGUF file of ``quant`` in a repo listing (its first shard when it is
    split); no ``quant``: Q4_K_M, else the repo's only quantization. A clear
    error names the quantizations the repo has."""
    models = ggufs(files)
    wanted = (quant or DEFAULT_QUANT).upper()
    matches = [f for f in models if quant_of(f) == wanted] or [
        f for f in models if (quant_of(f) or "").endswith("-" + wanted)
    ]
    if not matches and quant is None and len(quants(models)) == 1:
        matches = models  # one quantization only (gpt-oss's MXFP4): that is the model
    if not matches and quant is None and len(models) == 1:
        matches = models  # one file whose name says no quantization
    if not matches:
        have = quants(models)
        if not models:
            raise ModelNotFoundError(f"{repo} holds no GGUF file", hint="check the repo: localrun runs GGUF models")
        hint = f"quantizations there: {', '.join(have) or 'none named'}"
        hint += f"; name one, e.g. {repo}:{have[0]}" if have and "/" in repo else ""
        raise ModelNotFoundError(f"no {wanted} GGUF file in {repo}", hint=hint)
    first = [f for f in matches if not is_split(f) or shards(f)[0] == f]
    return sorted(first or matches, key=lambda f: (is_split(f), len(f), f))[0]
