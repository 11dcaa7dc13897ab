"""Patch an unpacked llama-cpp-python source tree before scripts/setup builds it.

    python scripts/_patch_sdist.py SRC [--no-amx FLAGS]   patch the tree at SRC
    python scripts/_patch_sdist.py --key [--no-amx FLAGS]  print the patches, for the wheel key

Each patch replaces one exact piece of text that must occur exactly once in its
file. When a new llama-cpp-python version moves or changes that text, nothing is
written and the build stops, naming the patch, instead of building silently
without it (with libllama-common or the AMX kernels back on). Runs on the
interpreter that builds the wheel, before any .venv exists: standard library only.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

GGML_CPU = "vendor/llama.cpp/ggml/src/ggml-cpu/CMakeLists.txt"


@dataclass(frozen=True)
class Patch:
    """Replace `old` by `new` in `path` (relative to the source tree)."""

    name: str
    path: str
    old: str
    new: str


def patches(no_amx: str = "") -> list[Patch]:
    """The patches setup applies; `no_amx` is the compiler flags that switch AMX off, empty on CPUs without it."""
    common = 'set(LLAMA_BUILD_COMMON {} CACHE BOOL "Build llama.cpp common library" FORCE)'
    found = [
        # the sdist forces libllama-common on; the Python package never loads it
        Patch("LLAMA_BUILD_COMMON off", "CMakeLists.txt", common.format("ON"), common.format("OFF")),
    ]
    if no_amx:
        # the flags must follow -march=native, which would switch AMX back on
        native = "list(APPEND ARCH_FLAGS -march=native{})"
        found.append(Patch("AMX off", GGML_CPU, native.format(""), native.format(" " + no_amx)))
    return found


def problems(src: Path, todo: list[Patch]) -> list[str]:
    """Why each patch that cannot be applied to the tree at `src` cannot be; empty when all can."""
    found = []
    for patch in todo:
        file = src / patch.path
        if not file.is_file():
            found.append(f"patch {patch.name!r}: {patch.path} is missing")
            continue
        count = file.read_text(encoding="utf-8").count(patch.old)
        if count != 1:
            found.append(f"patch {patch.name!r}: {patch.path} has this text {count} times, not once:\n    {patch.old}")
    return found


def apply(src: Path, todo: list[Patch]) -> None:
    """Apply every patch, or none: raises SystemExit naming each patch that does not fit."""
    wrong = problems(src, todo)
    if wrong:
        raise SystemExit(
            "setup: llama-cpp-python's sources are not what scripts/_patch_sdist.py expects "
            "(a new version?); nothing was built:\n" + "\n".join(wrong)
        )
    for patch in todo:
        file = src / patch.path
        text = file.read_text(encoding="utf-8")
        file.write_text(text.replace(patch.old, patch.new), encoding="utf-8")


def key(todo: list[Patch]) -> str:
    """The patches as text: part of the wheel key, so a changed patch builds a new wheel."""
    return "".join(f"{p.path}: {p.old} -> {p.new}\n" for p in todo)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", nargs="?", type=Path, help="the unpacked llama-cpp-python source tree")
    parser.add_argument("--key", action="store_true", help="print the patches instead of applying them")
    parser.add_argument("--no-amx", default="", metavar="FLAGS", help="compiler flags that switch AMX off")
    args = parser.parse_args(argv)
    todo = patches(args.no_amx)
    if args.key:
        sys.stdout.write(key(todo))
    elif args.src is None:
        parser.error("give the source tree, or --key")
    else:
        apply(args.src, todo)


if __name__ == "__main__":
    main()
