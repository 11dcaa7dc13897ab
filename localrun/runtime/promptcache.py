"""A prompt cache on disk: the KV state after a long shared prefix.

An entry is keyed by the model file, the KV cache types and the prefix's
tokens. Its file holds a header (what it was made from, the state's size and
sha256) and llama.cpp's sequence state. Nothing in a file is trusted: a file
that does not parse, is truncated, fails its hash or was made from another
model or prefix is ignored, reported, and rebuilt. The directory has a size
cap; the least recently used entries go first.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import llama_cpp

from localrun import paths
from localrun.errors import UsageError
from localrun.runtime.decoder import Decoder
from localrun.runtime.engine import Engine
from localrun.runtime.prompt import Prompt
from localrun.units import parse_size

MAGIC = b"localrun-prompt-cache/1\n"
SUFFIX = ".kv"
DEFAULT_CAP = 4 * 1024**3
AUTO_MIN_TOKENS = 1024  # a system prompt or piped material this long is cached without --prompt-cache
Outcome = Literal["hit", "miss"]


def model_id(engine: Engine) -> str:
    """The model file's identity: its resolved path, size and modification time."""
    path = Path(engine.info.path).resolve()
    st = path.stat()
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def tokens_digest(tokens: Sequence[int]) -> str:
    return hashlib.sha256(b"".join(t.to_bytes(4, "little", signed=True) for t in tokens)).hexdigest()


def default_cache() -> PromptCache:
    """The user's prompt cache; LOCALRUN_PROMPT_CACHE_MAX (e.g. 2G) sets its cap."""
    cap = os.environ.get("LOCALRUN_PROMPT_CACHE_MAX")
    try:
        cap_bytes = parse_size(cap) if cap else DEFAULT_CAP
    except ValueError as exc:
        raise UsageError(f"LOCALRUN_PROMPT_CACHE_MAX: {exc}") from None
    return PromptCache(paths.cache_dir() / "prompts", cap_bytes)


def checkpoint_for(prompt: Prompt, engine: Engine, requested: bool | None) -> Checkpoint | None:
    """The checkpoint a run uses: ``requested`` True (--prompt-cache) caches the
    shared prefix (the whole prompt when nothing else is shared), None caches
    a shared prefix of AUTO_MIN_TOKENS or more, False never caches."""
    shared = prompt.shared
    if requested and shared == 0:
        shared = len(prompt.tokens) - 1
    if requested is False or shared < 1 or (requested is None and shared < AUTO_MIN_TOKENS):
        return None
    return default_cache().checkpoint(engine, prompt.tokens[:shared])


@dataclass
class PromptCache:
    directory: Path
    cap_bytes: int = DEFAULT_CAP

    def entries(self) -> list[Path]:
        """The cache's files, least recently used first (anything else found there is left alone)."""
        if not self.directory.is_dir():
            return []
        return sorted((p for p in self.directory.glob(f"*{SUFFIX}") if p.is_file()), key=lambda p: p.stat().st_mtime_ns)

    def mark_used(self, path: Path) -> None:
        """Make ``path`` the most recently used entry: its modification time
        after every other entry's (the file system's clock may tick coarser
        than a save and a hit apart)."""
        others = self.entries()
        newest = max((p.stat().st_mtime_ns for p in others if p != path), default=0)
        stamp = max(time.time_ns(), newest + 1_000_000)  # 1 ms: kept by file systems storing microseconds
        os.utime(path, ns=(stamp, stamp))

    def size(self) -> int:
        return sum(p.stat().st_size for p in self.entries())

    def clear(self) -> tuple[int, int]:
        """Remove every entry; returns (files, bytes) removed."""
        files = self.entries()
        total = sum(p.stat().st_size for p in files)
        for p in files:
            p.unlink(missing_ok=True)
        return len(files), total

    def evict(self, keep: Path | None = None) -> list[Path]:
        """Remove the least recently used entries until the cache fits its cap."""
        files = self.entries()
        total = sum(p.stat().st_size for p in files)
        removed = []
        for p in files:
            if total <= self.cap_bytes:
                break
            if p == keep:
                continue
            total -= p.stat().st_size
            p.unlink(missing_ok=True)
            removed.append(p)
        return removed

    def checkpoint(self, engine: Engine, prefix: Sequence[int]) -> Checkpoint:
        return Checkpoint(self, engine, list(prefix))


@dataclass
class Checkpoint:
    """The prefix of one prompt, restored from or saved to the cache by `Decoder.prefill`."""

    cache: PromptCache
    engine: Engine
    prefix: list[int]
    outcome: Outcome | None = None
    warnings: list[str] = field(default_factory=list)
    touched: bool = False  # the last load_into emptied its sequence before llama.cpp refused the state

    def __post_init__(self) -> None:
        config = self.engine.config
        self.header = {
            "model": model_id(self.engine),
            "type_k": config.type_k,
            "type_v": config.type_v,
            "n_tokens": len(self.prefix),
            "tokens_sha256": tokens_digest(self.prefix),
        }
        key = hashlib.sha256(json.dumps(self.header, sort_keys=True).encode()).hexdigest()[:32]
        self.path = self.cache.directory / f"{key}{SUFFIX}"

    @property
    def length(self) -> int:
        return len(self.prefix)

    def restore(self, decoder: Decoder) -> bool:
        """Load the prefix's KV state into the decoder's sequence; False on a
        miss (nothing there, or a file that cannot be trusted)."""
        if self.load_into(0):
            decoder.tokens[:] = self.prefix
            return True
        if self.touched:
            decoder.tokens.clear()
        return False

    def load_into(self, seq_id: int) -> bool:
        """Load the prefix's KV state into sequence ``seq_id``, replacing what
        it held; False on a miss. A miss leaves the sequence as it was, unless
        ``touched``: a state llama.cpp refused midway leaves it empty."""
        self.touched = False
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            self.outcome = "miss"
            return False
        except OSError as exc:
            return self._distrust(f"cannot be read ({paths.why_failed(exc)})")
        state = self._verified_state(data)
        if state is None:
            return False
        cuts = self.engine.cuts  # the whole sequence's state, a recurrent memory's too
        cuts.clear(seq_id)  # and no snapshot of a decode before it may be cut back to
        self.touched = True
        buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        if not llama_cpp.llama_state_seq_set_data(self.engine.ctx, buf, len(state), seq_id):
            cuts.clear(seq_id)
            return self._distrust("was refused by llama.cpp")
        with contextlib.suppress(OSError):  # another process evicting meanwhile: the hit stands
            self.cache.mark_used(self.path)  # evicted last
        self.outcome = "hit"
        return True

    def _verified_state(self, data: bytes) -> bytes | None:  # noqa: PLR0911  each return is a reason a checkpoint misses
        if not data.startswith(MAGIC) or b"\n" not in data[len(MAGIC) :]:
            self._distrust("is not a prompt cache file")
            return None
        line, _, state = data[len(MAGIC) :].partition(b"\n")
        try:
            header = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            self._distrust("has a damaged header")
            return None
        if not isinstance(header, dict):
            self._distrust("has a damaged header")
            return None
        if header.get("model") != self.header["model"]:
            self._distrust(f"was made from another model ({str(header.get('model')).split(':')[0]})")
            return None
        if {k: header.get(k) for k in self.header} != self.header:
            self._distrust("was made from another prompt or KV cache type")
            return None
        if len(state) != header.get("state_bytes"):
            self._distrust(f"is truncated ({len(state)} of {header.get('state_bytes')} bytes)")
            return None
        if hashlib.sha256(state).hexdigest() != header.get("state_sha256"):
            self._distrust("fails its checksum")
            return None
        return state

    def _distrust(self, why: str) -> bool:
        self.warnings.append(f"prompt cache file {self.path.name} {why}: ignored, rebuilding it")
        with contextlib.suppress(OSError):  # a folder in its place, a read-only cache: saving it again says so
            self.path.unlink(missing_ok=True)
        self.outcome = "miss"
        return False

    def save(self, decoder: Decoder) -> None:
        """Store the decoder's state, which holds exactly the prefix."""
        self.save_from(0)

    def save_from(self, seq_id: int) -> None:
        """Store sequence ``seq_id``'s state, which holds exactly the prefix."""
        self.write(self.capture(seq_id))

    def capture(self, seq_id: int) -> bytes:
        """Sequence ``seq_id``'s state (on the engine's thread); `write` may then run on another."""
        ctx = self.engine.ctx
        size = llama_cpp.llama_state_seq_get_size(ctx, seq_id)
        buf = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(ctx, buf, size, seq_id)
        return bytes(buf)[:written]

    def write(self, state: bytes) -> None:
        """Store ``state`` (from `capture`) as this prefix's entry; a cache that
        cannot be written costs a warning."""
        header = {**self.header, "state_bytes": len(state), "state_sha256": hashlib.sha256(state).hexdigest()}
        try:  # a cache that cannot be written costs a warning, never the run
            paths.ensure_dir(self.cache.directory)
            paths.atomic_write(self.path, MAGIC + json.dumps(header).encode() + b"\n" + state)
            self.cache.mark_used(self.path)
            self.cache.evict(keep=self.path)
        except OSError as exc:
            self.warnings.append(
                f"could not write the prompt cache {exc.filename or self.path}: {paths.why_failed(exc)}"
            )
