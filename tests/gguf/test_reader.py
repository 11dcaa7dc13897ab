from __future__ import annotations

import struct
from pathlib import Path

import pytest

from localrun.errors import BadModelError, ModelNotFoundError
from localrun.gguf.reader import read_gguf
from tests.gguf.mutate import KV, STRING, build, parse
from tests.tinymodel import vocabulary, write_tiny_model


def test_reads_metadata_and_tensors(tiny_model: Path) -> None:
    info = read_gguf(tiny_model)
    assert info.architecture == "llama"
    assert info.context_length == 512
    assert info.n_vocab == len(vocabulary()[0])
    assert info.chat_template is not None and "im_start" in info.chat_template
    assert {t.name for t in info.tensors} >= {"token_embd.weight", "output.weight", "blk.1.ffn_down.weight"}
    assert all(t.n_bytes > 0 for t in info.tensors)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="not found"):
        read_gguf(tmp_path / "nope.gguf")


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(BadModelError, match="directory"):
        read_gguf(tmp_path)


@pytest.mark.parametrize("content", [b"", b"hello world, not a model at all....", b"GGML" + b"\0" * 64])
def test_not_gguf(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(BadModelError, match="not a GGUF file"):
        read_gguf(path)


@pytest.mark.parametrize("keep", [0.05, 0.5, 0.99])
def test_truncated(tiny_model: Path, tmp_path: Path, keep: float) -> None:
    data = tiny_model.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(BadModelError, match="truncated"):
        read_gguf(path)


def test_corrupt_header_count(tiny_model: Path, tmp_path: Path) -> None:
    data = bytearray(tiny_model.read_bytes())
    data[16:24] = (2**40).to_bytes(8, "little")  # absurd key/value count
    path = tmp_path / "corrupt.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(BadModelError):
        read_gguf(path)


# ----------------------------------------------------------- regressions --
# What the fuzzer (tests/gguf/test_fuzz.py) found.


def _alignment(value: bytes, vtype: int) -> KV:
    return KV(b"general.alignment", vtype, value)


@pytest.mark.parametrize(
    ("vtype", "value"),
    [
        (STRING, struct.pack("<Q", 3) + b"abc"),  # was ValueError from int()
        (6, struct.pack("<f", float("nan"))),  # ValueError
        (6, struct.pack("<f", float("inf"))),  # OverflowError
        (9, struct.pack("<IQI", 4, 1, 32)),  # an array: TypeError
        (10, struct.pack("<Q", 32)),  # a uint64 32: accepted, which llama.cpp then refused
    ],
    ids=["string", "nan", "inf", "array", "uint64"],
)
def test_alignment_of_another_type_is_refused(tiny_model: Path, tmp_path: Path, vtype: int, value: bytes) -> None:
    layout = parse(tiny_model.read_bytes())
    path = tmp_path / "align.gguf"
    path.write_bytes(build(layout, kvs=[*layout.kvs, _alignment(value, vtype)]))
    with pytest.raises(BadModelError, match="alignment"):
        read_gguf(path)


def test_tensor_data_not_32_byte_aligned_is_refused(tiny_model: Path, tmp_path: Path) -> None:
    """general.alignment 16 is valid GGUF, but a tensor that starts off ggml's 32-byte
    alignment made llama.cpp abort (GGML_ASSERT "buffer pointer must be aligned")."""
    layout = parse(tiny_model.read_bytes())
    for filler in range(0, 32, 4):  # a filler string that leaves the header 16 past a multiple of 32
        kvs = [
            *layout.kvs,
            _alignment(struct.pack("<I", 16), 4),
            KV(b"x", STRING, struct.pack("<Q", filler) + b"y" * filler),
        ]
        mutant = build(layout, kvs=kvs, alignment=16)
        if (len(mutant) - len(layout.data)) % 32 == 16:
            break
    else:
        pytest.fail("no filler put the data 16 bytes off")
    path = tmp_path / "align16.gguf"
    path.write_bytes(mutant)
    with pytest.raises(BadModelError, match="aligned"):
        read_gguf(path)


def test_context_length_that_is_not_a_number(tiny_model: Path, tmp_path: Path) -> None:
    layout = parse(tiny_model.read_bytes())
    kvs = [
        KV(kv.key, STRING, struct.pack("<Q", 5) + b"large") if kv.key == b"llama.context_length" else kv
        for kv in layout.kvs
    ]
    path = tmp_path / "ctx.gguf"
    path.write_bytes(build(layout, kvs=kvs))
    assert read_gguf(path).context_length is None  # was ValueError from int()


def test_repeated_token_text_is_refused(tmp_path: Path) -> None:
    """llama.cpp aborted (GGML_ASSERT id_to_token.size() == token_to_id.size()) on a
    vocabulary with a token twice: the fuzzer made one by flipping a byte."""
    path = write_tiny_model(tmp_path / "twice.gguf", merges=["Ġ t", "h e", "Ġ t"])
    with pytest.raises(BadModelError, match="repeated token texts"):
        read_gguf(path)


def test_token_texts_repeated_as_llama_cpp_reads_them_are_refused(tmp_path: Path) -> None:
    """llama.cpp takes a token's text up to its first NUL byte (a C string):
    "he" and "he\\0z" are one text there, and it aborted on that pair (the
    fuzzer's seed 805568). A NUL byte that makes no such pair is no matter."""
    path = write_tiny_model(tmp_path / "nul.gguf", merges=["Ġ t", "h e", "h e\x00z"])
    with pytest.raises(BadModelError, match="1 repeated token texts"):
        read_gguf(path)
    alone = write_tiny_model(tmp_path / "nul-alone.gguf", merges=["Ġ t", "h e\x00z"])
    assert read_gguf(alone).metadata["tokenizer.ggml.tokens"].length > 0


def test_vocabulary_truncated_inside_is_refused(tiny_model: Path, tmp_path: Path) -> None:
    data = tiny_model.read_bytes()
    array = read_gguf(tiny_model).metadata["tokenizer.ggml.tokens"]
    for cut in (array.start + 4, array.start + 9, (array.start + array.end) // 2, array.end - 1):
        path = tmp_path / "cut.gguf"
        path.write_bytes(data[:cut])
        with pytest.raises(BadModelError, match="truncated"):
            read_gguf(path)


@pytest.mark.parametrize("blocks", [0, 513, 2097154])
def test_block_count_llama_cpp_asserts_on_is_refused(tiny_model: Path, tmp_path: Path, blocks: int) -> None:
    """llama.cpp aborted (GGML_ASSERT n_layer <= LLAMA_MAX_LAYERS) on a block
    count one flipped byte made 2097154: the long fuzz run found it."""
    layout = parse(tiny_model.read_bytes())
    kvs = [
        KV(kv.key, kv.vtype, struct.pack("<I", blocks)) if kv.key == b"llama.block_count" else kv for kv in layout.kvs
    ]
    path = tmp_path / "blocks.gguf"
    path.write_bytes(build(layout, kvs=kvs))
    with pytest.raises(BadModelError, match="block_count"):
        read_gguf(path)
