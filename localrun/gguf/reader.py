"""Read and check a GGUF file's header before llama.cpp is allowed to open it.

llama.cpp aborts the process on some malformed files, so every model is checked
here first: magic, version, every key/value, every tensor's type, shape and
byte range against the file size. The format constants come from the `gguf`
package. `gguf.GGUFReader` itself is not used on the load path: it builds a
numpy view per vocabulary string, which is slow on a large vocabulary; this
reader skips arrays by their lengths.
"""

from __future__ import annotations

import math
import mmap
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

from localrun.errors import BadModelError, ModelNotFoundError

_SCALARS: dict[int, str] = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
_KNOWN_TENSOR_TYPES = {int(t) for t in GGML_QUANT_SIZES}
_MAX_DIMS = 4
_U64 = struct.Struct("<Q")
_TENSOR_ALIGNMENT = 32  # ggml's TENSOR_ALIGNMENT: where a tensor may start in a mapped file
_MAX_LAYERS = 512  # llama.cpp's LLAMA_MAX_LAYERS: it asserts a block count within it


# the architectures whose MTP ("nextn") head localrun drafts with: Qwen3.5's,
# whose MTP context llama.cpp gives a plain attention cache of its own (tested)
MTP_ARCHITECTURES = ("qwen35", "qwen35moe")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    type: int
    offset: int
    n_bytes: int


@dataclass(frozen=True)
class ArrayInfo:
    """An array value: its element type and length, and where its elements
    lie in the file (`read_strings` reads them). A short array of numbers (a
    per-layer value: at most LLAMA_MAX_LAYERS elements) keeps its elements in
    ``values``; a long one (a vocabulary's token types, scores) is only skipped."""

    item_type: int
    length: int
    start: int = 0  # byte offset of the first element
    end: int = 0  # byte offset just past the last element
    values: tuple[int | float | bool, ...] | None = None  # a short array of numbers, else None


@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo] = field(repr=False)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    def arch_value(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.architecture}.{key}", default)

    @property
    def name(self) -> str:
        return str(self.metadata.get("general.name", self.path.stem))

    @property
    def context_length(self) -> int | None:
        value = self.arch_value("context_length")
        if isinstance(value, int | float) and math.isfinite(value):
            return int(value)
        return None  # absent, or not a number (a string, an array)

    @property
    def chat_template(self) -> str | None:
        value = self.metadata.get("tokenizer.chat_template")
        return value if isinstance(value, str) and value.strip() else None

    @property
    def mtp_head(self) -> bool:
        """Whether localrun can draft with its MTP blocks: it has some, and
        llama.cpp gives its architecture's head a cache of its own
        (`MTP_ARCHITECTURES`); other heads share the model's memory or have
        no MTP graph in this llama.cpp."""
        return self.nextn_layers > 0 and self.architecture in MTP_ARCHITECTURES

    @property
    def nextn_layers(self) -> int:
        """Its multi-token-prediction ("nextn", MTP) blocks: the last ones of
        ``block_count``, which llama.cpp loads only when asked (``load_mtp``)."""
        value = self.arch_value("nextn_predict_layers", 0)
        return value if isinstance(value, int) and value > 0 else 0

    @property
    def n_vocab(self) -> int | None:
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        return tokens.length if isinstance(tokens, ArrayInfo) else None


class _Cursor:
    def __init__(self, buf: mmap.mmap | bytes, path: Path) -> None:
        self.buf = buf
        self.pos = 0
        self.path = path
        self.size = len(buf)

    def fail(self, what: str) -> BadModelError:
        return BadModelError(
            f"{self.path}: {what} (at byte {self.pos} of {self.size})",
            hint="the file is damaged or incomplete: download it again",
        )

    def need(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail("truncated GGUF header")

    def unpack(self, fmt: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        self.need(n)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        n = self.unpack("<Q")
        self.need(n)
        self.pos += n

    def skip_strings(self, length: int, distinct: bool = False) -> None:
        """Skip ``length`` strings (a tight loop: a vocabulary has 100,000s); with
        ``distinct``, refuse a repeated one, as llama.cpp reads them (`_as_read`)."""
        buf, pos, size, unpack = self.buf, self.pos, self.size, _U64.unpack_from
        start = pos
        seen: set[bytes] = set()
        odd = 0  # NUL bytes in the lengths beyond 7 each (a length of 256 or more, or 0, holds another count)
        for _ in range(length):
            if pos + 8 > size:
                break
            (n,) = unpack(buf, pos)
            pos += 8
            if pos + n > size:
                break
            if distinct:
                seen.add(buf[pos : pos + n])
                if n > 255 or not n:
                    odd += n.to_bytes(8, "little").count(0) - 7
            pos += n
        else:
            self.pos = pos
            # a NUL byte in a string (the lengths' own aside), or an empty one: read them as llama.cpp does (rare)
            if distinct and len(seen) == length and (b"" in seen or buf[start:pos].count(b"\0") > 7 * length + odd):
                seen = set(_as_read(buf, start, length))
            if distinct and len(seen) < length:
                raise self.fail(f"{length - len(seen)} repeated token texts")
            return
        self.pos = pos
        raise self.fail("truncated GGUF header")

    def value(self, vtype: int, distinct: bool = False) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            item_type = self.unpack("<I")
            length = self.unpack("<Q")
            start = self.pos
            values = None
            if item_type in _SCALARS:
                n = struct.calcsize(_SCALARS[item_type]) * length
                self.need(n)
                if length <= _MAX_LAYERS:  # per-layer values (head counts, which layers recur) are read
                    values = struct.unpack_from(f"<{length}{_SCALARS[item_type][1:]}", self.buf, self.pos)
                self.pos += n
            elif item_type == GGUFValueType.STRING:
                self.skip_strings(length, distinct)
            else:
                raise self.fail(f"unsupported array element type {item_type}")
            return ArrayInfo(item_type, length, start, self.pos, values)
        raise self.fail(f"unknown value type {vtype}")


def _as_read(buf: mmap.mmap | bytes, pos: int, length: int) -> Iterator[bytes]:
    """The ``length`` strings from ``pos`` as llama.cpp's vocabulary takes
    them: up to a first NUL byte (a C string), an empty one as `[EMPTY_i]`
    (the strings were checked to lie in ``buf``)."""
    for i in range(length):
        (n,) = _U64.unpack_from(buf, pos)
        text = buf[pos + 8 : pos + 8 + n].partition(b"\0")[0]
        yield text or f"[EMPTY_{i}]".encode()
        pos += 8 + n


def _tensor_bytes(cur: _Cursor, name: str, shape: tuple[int, ...], ttype: int) -> int:
    if ttype not in _KNOWN_TENSOR_TYPES:
        raise cur.fail(f"tensor {name!r} has unknown type {ttype}")
    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
    n_elements = 1
    for d in shape:
        if d <= 0:
            raise cur.fail(f"tensor {name!r} has a bad dimension {d}")
        n_elements *= d
    if shape[0] % block:
        raise cur.fail(f"tensor {name!r} rows are not a whole number of blocks")
    return n_elements // block * type_size


def read_gguf(path: str | Path) -> GGUFInfo:
    """Check ``path`` is a complete, well-formed GGUF file and return its metadata."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelNotFoundError(f"model file not found: {p}", hint="check the path to the .gguf file")
    if p.is_dir():
        raise BadModelError(f"{p} is a directory, not a GGUF file", hint="pass the .gguf file inside it")
    try:
        with p.open("rb") as f:
            size = p.stat().st_size
            if size < 24:
                raise BadModelError(f"{p}: not a GGUF file ({size} bytes)", hint="pass a .gguf model file")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(buf, p)
    except OSError as exc:
        raise BadModelError(f"cannot read {p}: {exc.strerror}") from exc


@contextmanager
def _at_element(path: str | Path, array: ArrayInfo, start: int) -> Iterator[tuple[mmap.mmap, _Cursor]]:
    """The file mapped, and a cursor on element ``start`` of a string array in it."""
    p = Path(path).expanduser()
    with p.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cur = _Cursor(buf, p)
        cur.pos = array.start
        for _ in range(start):
            cur.skip_string()
        yield buf, cur


def read_strings(path: str | Path, array: ArrayInfo, start: int = 0, stop: int | None = None) -> list[bytes]:
    """Elements ``start`` to ``stop`` of a string array that `read_gguf` found
    in ``path`` (say, the vocabulary's token texts), as raw bytes."""
    if array.item_type != GGUFValueType.STRING:
        raise ValueError("not an array of strings")
    stop = array.length if stop is None else min(stop, array.length)
    with _at_element(path, array, start) as (buf, cur):
        out = []
        for _ in range(max(stop - start, 0)):
            n = cur.unpack("<Q")
            cur.need(n)
            out.append(bytes(buf[cur.pos : cur.pos + n]))
            cur.pos += n
        return out


def string_span(path: str | Path, array: ArrayInfo, start: int, stop: int | None = None) -> bytes:
    """The encoded bytes of elements ``start`` to ``stop`` of a string array:
    two arrays hold equal elements in that range exactly when these bytes are equal."""
    stop = array.length if stop is None else min(stop, array.length)
    with _at_element(path, array, start) as (buf, cur):
        begin = cur.pos
        if stop == array.length:
            cur.pos = array.end
        else:
            for _ in range(max(stop - start, 0)):
                cur.skip_string()
        return bytes(buf[begin : cur.pos])


def _tensor_infos(cur: _Cursor, n_tensors: int) -> list[tuple[str, tuple[int, ...], int, int]]:
    """Each tensor's name, shape, type and offset, as the header lists them."""
    raw: list[tuple[str, tuple[int, ...], int, int]] = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.unpack("<I")
        if not 1 <= n_dims <= _MAX_DIMS:
            raise cur.fail(f"tensor {name!r} has {n_dims} dimensions")
        shape = tuple(cur.unpack("<Q") for _ in range(n_dims))
        ttype = cur.unpack("<I")
        offset = cur.unpack("<Q")
        raw.append((name, shape, ttype, offset))
    return raw


def _data_start(cur: _Cursor, metadata: dict[str, Any], alignment_type: int | None) -> int:
    """Where the tensor data begins: the end of the header, padded to the file's alignment."""
    alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if alignment_type not in (None, GGUFValueType.UINT32):  # as llama.cpp, which refuses another type
        raise cur.fail(f"general.alignment is of type {alignment_type}, not uint32")
    if alignment <= 0 or alignment & (alignment - 1):
        raise cur.fail(f"bad alignment {alignment}")
    return int(-(-cur.pos // alignment) * alignment)


def _check_layers(cur: _Cursor, metadata: dict[str, Any]) -> None:
    """The layer counts llama.cpp asserts (aborts) on: 1 to LLAMA_MAX_LAYERS
    blocks, and no more next-token-prediction layers than blocks."""
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        return  # llama.cpp refuses a file without one, cleanly
    blocks = metadata.get(f"{arch}.block_count")
    if isinstance(blocks, int) and not 0 < blocks <= _MAX_LAYERS:
        raise cur.fail(f"{arch}.block_count is {blocks}; llama.cpp takes 1 to {_MAX_LAYERS}")
    nextn = metadata.get(f"{arch}.nextn_predict_layers")
    if isinstance(blocks, int) and isinstance(nextn, int) and nextn > blocks:
        raise cur.fail(f"{arch}.nextn_predict_layers is {nextn}, more than the {blocks} blocks")


def _parse(buf: mmap.mmap, path: Path) -> GGUFInfo:
    cur = _Cursor(buf, path)
    if cur.unpack("<I") != GGUF_MAGIC:
        raise BadModelError(f"{path}: not a GGUF file (bad magic)", hint="pass a .gguf model file")
    version = cur.unpack("<I")
    if version not in (2, 3):
        raise cur.fail(f"unsupported GGUF version {version}")
    n_tensors = cur.unpack("<Q")
    n_kv = cur.unpack("<Q")
    metadata: dict[str, Any] = {}
    alignment_type: int | None = None
    for _ in range(n_kv):
        key = cur.string()
        vtype = cur.unpack("<I")
        # llama.cpp asserts (aborts) on a repeated token text, which one flipped byte makes
        metadata[key] = cur.value(vtype, distinct=key == "tokenizer.ggml.tokens")
        if key == "general.alignment":
            alignment_type = vtype

    _check_layers(cur, metadata)
    raw = _tensor_infos(cur, n_tensors)
    data_start = _data_start(cur, metadata, alignment_type)
    tensors: list[TensorInfo] = []
    for name, shape, ttype, offset in raw:
        n_bytes = _tensor_bytes(cur, name, shape, ttype)
        if (data_start + offset) % _TENSOR_ALIGNMENT:  # llama.cpp asserts (aborts) on a mapped one
            raise cur.fail(f"tensor {name!r} at byte {data_start + offset} is not {_TENSOR_ALIGNMENT}-byte aligned")
        end = data_start + offset + n_bytes
        if end > cur.size:
            raise BadModelError(
                f"{path}: truncated: tensor {name!r} ends at byte {end}, the file has {cur.size}",
                hint="the download is incomplete: fetch the model again",
            )
        tensors.append(TensorInfo(name, shape, ttype, offset, n_bytes))
    if n_tensors == 0:
        raise BadModelError(
            f"{path}: the GGUF file holds no tensors", hint="pass a model file, not a vocabulary-only file"
        )
    return GGUFInfo(path=path, version=version, metadata=metadata, tensors=tensors)
