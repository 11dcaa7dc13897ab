"""Mutants of a real GGUF file, for fuzzing the model-file check.

`parse` splits a well-formed GGUF into its parts (header, key/values, tensor
infos, the data blob) and records where every field lies, so that mutations
hit structure boundaries and fields rather than only random bytes. `mutate`
applies one to three mutations chosen by a `random.Random`: hypothesis drives
it in the test suite (`st.randoms`), a seeded generator in scripts/fuzz_gguf.py.

This module imports nothing from localrun: it must not share the reader's bugs.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

MAGIC = b"GGUF"
ARRAY, STRING = 9, 8
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
DEFAULT_ALIGNMENT = 32

U64_EDGES = [0, 1, 2, 3, 31, 32, 33, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1]
U32_EDGES = [0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 14, 15, 30, 31, 39, 40, 41, 255, 2**16, 2**31 - 1, 2**31, 2**32 - 1]


@dataclass
class KV:
    key: bytes
    vtype: int
    value: bytes  # the raw encoded value, after the type field
    start: int = 0  # where the entry begins in the original file
    vtype_at: int = 0
    value_at: int = 0


@dataclass
class Tensor:
    name: bytes
    dims: list[int]
    ttype: int
    offset: int
    start: int = 0
    dims_at: int = 0  # the n_dims field
    ttype_at: int = 0
    offset_at: int = 0


@dataclass
class Layout:
    version: int
    kvs: list[KV]
    tensors: list[Tensor]
    infos_end: int  # end of the tensor infos
    data_start: int  # after the alignment padding
    data: bytes  # the data blob
    size: int
    u64_fields: list[int] = field(default_factory=list)  # offsets of counts, lengths, dims, tensor offsets
    u32_fields: list[int] = field(default_factory=list)  # offsets of value, element and tensor types, n_dims

    def boundaries(self) -> list[int]:
        points = {0, 4, 8, 16, 24, self.infos_end, self.data_start, self.size}
        for kv in self.kvs:
            points |= {kv.start, kv.start + 8, kv.vtype_at, kv.value_at}
        for t in self.tensors:
            points |= {t.start, t.dims_at, t.ttype_at, t.offset_at, self.data_start + t.offset}
        return sorted(p for p in points if 0 <= p <= self.size)


class _Reader:
    def __init__(self, data: bytes, layout_u64: list[int], layout_u32: list[int]) -> None:
        self.data, self.pos, self.u64, self.u32 = data, 0, layout_u64, layout_u32

    def take(self, fmt: str, record: bool = True) -> int:
        n = struct.calcsize(fmt)
        if record:
            (self.u64 if fmt == "<Q" else self.u32).append(self.pos)
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += n
        return int(value)

    def string(self) -> bytes:
        n = self.take("<Q")
        raw = self.data[self.pos : self.pos + n]
        self.pos += n
        return raw

    def skip_value(self, vtype: int) -> None:
        if vtype in _SCALAR_SIZES:
            self.pos += _SCALAR_SIZES[vtype]
        elif vtype == STRING:
            self.string()
        elif vtype == ARRAY:
            item = self.take("<I")
            length = self.take("<Q")
            if item in _SCALAR_SIZES:
                self.pos += _SCALAR_SIZES[item] * length
            else:
                for _ in range(length):
                    self.skip_value(item)
        else:
            raise ValueError(f"value type {vtype}")


def parse(data: bytes) -> Layout:
    """The layout of a well-formed GGUF file (the seeds are; mutants need not be)."""
    u64: list[int] = []
    u32: list[int] = []
    r = _Reader(data, u64, u32)
    assert data[:4] == MAGIC
    r.pos = 4
    version = r.take("<I", record=False)
    n_tensors = r.take("<Q")
    n_kv = r.take("<Q")
    kvs: list[KV] = []
    alignment = DEFAULT_ALIGNMENT
    for _ in range(n_kv):
        start = r.pos
        key = r.string()
        vtype_at = r.pos
        vtype = r.take("<I")
        value_at = r.pos
        r.skip_value(vtype)
        kvs.append(KV(key, vtype, data[value_at : r.pos], start, vtype_at, value_at))
        if key == b"general.alignment" and vtype == 4:
            alignment = struct.unpack_from("<I", data, value_at)[0]
    tensors: list[Tensor] = []
    for _ in range(n_tensors):
        start = r.pos
        name = r.string()
        dims_at = r.pos
        n_dims = r.take("<I")
        dims = [r.take("<Q") for _ in range(n_dims)]
        ttype_at = r.pos
        ttype = r.take("<I")
        offset_at = r.pos
        offset = r.take("<Q")
        tensors.append(Tensor(name, dims, ttype, offset, start, dims_at, ttype_at, offset_at))
    infos_end = r.pos
    data_start = -(-infos_end // alignment) * alignment
    return Layout(version, kvs, tensors, infos_end, data_start, data[data_start:], len(data), u64, u32)


# ------------------------------------------------------------ re-writing --


def _string(raw: bytes) -> bytes:
    return struct.pack("<Q", len(raw)) + raw


def encode_kv(kv: KV) -> bytes:
    return _string(kv.key) + struct.pack("<I", kv.vtype) + kv.value


def encode_tensor(t: Tensor) -> bytes:
    dims = b"".join(struct.pack("<Q", d % 2**64) for d in t.dims)
    return _string(t.name) + _u32(len(t.dims)) + dims + _u32(t.ttype) + struct.pack("<Q", t.offset % 2**64)


def build(
    layout: Layout,
    kvs: list[KV] | None = None,
    tensors: list[Tensor] | None = None,
    *,
    version: int | None = None,
    alignment: int = DEFAULT_ALIGNMENT,
    data: bytes | None = None,
) -> bytes:
    """A GGUF file from (possibly changed) parts: the header, padding to ``alignment``, the data."""
    kvs = layout.kvs if kvs is None else kvs
    tensors = layout.tensors if tensors is None else tensors
    head = MAGIC + struct.pack("<IQQ", layout.version if version is None else version, len(tensors), len(kvs))
    head += b"".join(encode_kv(kv) for kv in kvs) + b"".join(encode_tensor(t) for t in tensors)
    pad = (-len(head)) % alignment if alignment > 0 else 0
    return head + b"\0" * min(pad, 1 << 16) + (layout.data if data is None else data)


def nested_array(depth: int, length: int = 1) -> bytes:
    """The value of an array of arrays ``depth`` deep, ending in bytes."""
    inner = struct.pack("<IQ", 0, 4) + b"abcd"
    for _ in range(depth):
        inner = struct.pack("<IQ", ARRAY, length) + inner * length
    return inner


# ------------------------------------------------------------ mutations --

Mutation = Callable[[bytes, Layout, random.Random], bytes]


def truncate_at_boundary(data: bytes, layout: Layout, rng: random.Random) -> bytes:
    point = rng.choice(layout.boundaries()) + rng.choice([0, 0, 0, -1, 1, -4, 4])
    return data[: max(point, 0)]


def truncate_anywhere(data: bytes, layout: Layout, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


def flip_bytes(data: bytes, layout: Layout, rng: random.Random) -> bytes:
    out = bytearray(data)
    end = layout.data_start if rng.random() < 0.85 else len(out)  # mostly the header
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(min(end, len(out)) or 1)
        if i < len(out):
            out[i] ^= 1 << rng.randrange(8) if rng.random() < 0.7 else rng.randrange(1, 256)
    return bytes(out)


def _put(data: bytes, at: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    size = struct.calcsize(fmt)
    if at + size <= len(out):
        out[at : at + size] = struct.pack(fmt, value % (256**size))
    return bytes(out)


def huge_u64(data: bytes, layout: Layout, rng: random.Random) -> bytes:
    """A count, a string or array length, a dimension or a tensor offset set to an edge value."""
    at = rng.choice(layout.u64_fields)
    old = struct.unpack_from("<Q", data, at)[0] if at + 8 <= len(data) else 0
    value = rng.choice([*U64_EDGES, old + 1, old - 1, old * 2, -old, rng.getrandbits(64), len(data)])
    return _put(data, at, "<Q", value)


def odd_u32(data: bytes, layout: Layout, rng: random.Random) -> bytes:
    """A value type, an element type, a tensor type or a dimension count set to an edge value."""
    at = rng.choice(layout.u32_fields)
    return _put(data, at, "<I", rng.choice([*U32_EDGES, rng.getrandbits(32)]))


def header_field(data: bytes, layout: Layout, rng: random.Random) -> bytes:
    """The version, tensor count or key/value count."""
    which = rng.choice([(4, "<I"), (8, "<Q"), (16, "<Q")])
    edges = U32_EDGES if which[1] == "<I" else U64_EDGES
    return _put(data, which[0], which[1], rng.choice([*edges, rng.getrandbits(32)]))


def tensor_offsets(data: bytes, layout: Layout, rng: random.Random) -> bytes:
    """Negative, overlapping, misaligned or out-of-file tensor offsets."""
    tensors = [Tensor(t.name, list(t.dims), t.ttype, t.offset) for t in layout.tensors]
    t = rng.choice(tensors)
    other = rng.choice(layout.tensors)
    t.offset = rng.choice(
        [
            other.offset,  # overlapping
            other.offset + 1,
            t.offset + rng.choice([1, 4, 16, 31]),  # misaligned, or overlapping the next
            -rng.choice([1, 32, layout.data_start]),  # negative
            len(layout.data),
            len(layout.data) - 1,
            len(layout.data) + 32,
            2**63,
            2**64 - 32,
        ]
    )
    return build(layout, tensors=tensors)


def tensor_shapes(data: bytes, layout: Layout, rng: random.Random) -> bytes:
    """Dimensions changed, added or removed, tensors duplicated, renamed or dropped, types swapped."""
    tensors = [Tensor(t.name, list(t.dims), t.ttype, t.offset) for t in layout.tensors]
    i = rng.randrange(len(tensors))
    t = tensors[i]
    kind = rng.randrange(7)
    if kind == 0:
        t.dims[rng.randrange(len(t.dims))] = rng.choice([0, 1, 2, 3, 31, 33, 2**32, 2**62, 2**64 - 1])
    elif kind == 1:
        t.dims = t.dims + [rng.choice([1, 2, 0])] * rng.randint(1, 5)  # up to 7: more than ggml's 4
    elif kind == 2:
        t.dims = t.dims[:-1] if len(t.dims) > 1 else []
    elif kind == 3:
        tensors.insert(rng.randrange(len(tensors) + 1), Tensor(t.name, list(t.dims), t.ttype, t.offset))  # duplicate
    elif kind == 4:
        t.name = rng.choice([b"", b"\xff\xfe", b"x" * 200, tensors[(i + 1) % len(tensors)].name])
    elif kind == 5:
        del tensors[i]
    else:
        t.ttype = rng.choice([1, 2, 3, 4, 5, 6, 8, 10, 12, 14, 16, 20, 24, 28, 30, 34, 39, 40, 41, 1000])
    return build(layout, tensors=tensors)


def _u32(v: int) -> bytes:
    return struct.pack("<I", v % 2**32)


def alignment_kv(data: bytes, layout: Layout, rng: random.Random) -> bytes:
    """general.alignment with a good, bad or oddly typed value; the padding follows a good one."""
    value = rng.choice([0, 1, 2, 3, 8, 16, 24, 32, 64, 100, 256, 4096, 2**31, 2**32 - 1])
    vtype, raw = rng.choice(
        [
            (4, _u32(value)),
            (4, _u32(value)),
            (5, struct.pack("<i", value - 2**32 if value >= 2**31 else value)),
            (10, struct.pack("<Q", value)),
            (6, struct.pack("<f", float(value))),
            (6, struct.pack("<f", rng.choice([float("nan"), float("inf"), -float("inf"), 0.5, 1e30]))),
            (12, struct.pack("<d", rng.choice([float("nan"), float("inf"), 1e300, 32.0]))),
            (STRING, _string(rng.choice([b"32", b"abc", b"", b"1e9"]))),
            (7, bytes([rng.randrange(2)])),
            (ARRAY, struct.pack("<IQ", 4, 1) + _u32(value)),
        ]
    )
    kvs = [*layout.kvs, KV(b"general.alignment", vtype, raw)]
    pad_to = value if vtype == 4 and value and not value & (value - 1) and value <= 4096 else DEFAULT_ALIGNMENT
    return build(layout, kvs=kvs, alignment=pad_to)


def odd_kvs(data: bytes, layout: Layout, rng: random.Random) -> bytes:
    """Duplicate keys, deep nested arrays, odd keys, values of the wrong type, unknown types."""
    kvs = list(layout.kvs)
    i = rng.randrange(len(kvs))
    kind = rng.randrange(7)
    if kind == 0:
        kvs.insert(rng.randrange(len(kvs) + 1), kvs[i])  # a duplicate key, same value
    elif kind == 1:
        kvs.append(KV(kvs[i].key, 4, _u32(rng.getrandbits(32))))  # a duplicate key, another type
    elif kind == 2:
        depth = rng.choice([1, 2, 8, 64, 1000])
        kvs.insert(i, KV(rng.choice([b"general.deep", kvs[i].key]), ARRAY, nested_array(depth)))
    elif kind == 3:
        kvs[i] = KV(rng.choice([b"", b"\xff\xfe\xfd", b"k" * 70000, kvs[i].key + b"\0"]), kvs[i].vtype, kvs[i].value)
    elif kind == 4:  # a known key with a value of another type
        vtype, raw = rng.choice(
            [(STRING, _string(b"llama")), (4, _u32(7)), (6, struct.pack("<f", 1.5)), (7, b"\x01"), (10, b"\xff" * 8)]
        )
        kvs[i] = KV(kvs[i].key, vtype, raw)
    elif kind == 5:
        kvs[i] = KV(kvs[i].key, rng.choice([13, 14, 255, 2**31, 2**32 - 1]), kvs[i].value)  # unknown value type
    else:
        del kvs[i]
    return build(layout, kvs=kvs)


def arrays(data: bytes, layout: Layout, rng: random.Random) -> bytes:
    """An array's element type or length changed in place."""
    candidates = [kv for kv in layout.kvs if kv.vtype == ARRAY]
    kv = rng.choice(candidates)
    if rng.random() < 0.5:
        return _put(data, kv.value_at, "<I", rng.choice([*U32_EDGES, ARRAY]))
    return _put(data, kv.value_at + 4, "<Q", rng.choice(U64_EDGES))


def version_change(data: bytes, layout: Layout, rng: random.Random) -> bytes:
    return build(layout, version=rng.choice([0, 1, 2, 4, 2**32 - 1]))


def splice(data: bytes, layout: Layout, rng: random.Random) -> bytes:
    """A range of bytes deleted, repeated or inserted at a boundary."""
    at = rng.choice(layout.boundaries())
    n = rng.choice([1, 4, 8, 12, 24, 100])
    kind = rng.randrange(3)
    if kind == 0:
        return data[:at] + data[at + n :]
    if kind == 1:
        return data[:at] + data[at : at + n] + data[at:]
    return data[:at] + bytes(rng.getrandbits(8) for _ in range(n)) + data[at:]


MUTATIONS: dict[str, Mutation] = {
    "truncate_at_boundary": truncate_at_boundary,
    "truncate_anywhere": truncate_anywhere,
    "flip_bytes": flip_bytes,
    "huge_u64": huge_u64,
    "odd_u32": odd_u32,
    "header_field": header_field,
    "tensor_offsets": tensor_offsets,
    "tensor_shapes": tensor_shapes,
    "alignment_kv": alignment_kv,
    "odd_kvs": odd_kvs,
    "arrays": arrays,
    "version_change": version_change,
    "splice": splice,
}


def mutate(data: bytes, layout: Layout, rng: random.Random) -> tuple[list[str], bytes]:
    """One to three mutations of ``data``, the first chosen from all, the rest
    byte-level (a structural one rebuilds from ``layout``, which would undo earlier ones)."""
    names = [rng.choice(list(MUTATIONS))]
    out = MUTATIONS[names[0]](data, layout, rng)
    byte_level = ["truncate_at_boundary", "flip_bytes", "huge_u64", "odd_u32", "header_field", "arrays", "splice"]
    for _ in range(rng.choice([0, 0, 0, 1, 2])):
        name = rng.choice(byte_level)
        names.append(name)
        out = MUTATIONS[name](out, layout, rng)
    return names, out
