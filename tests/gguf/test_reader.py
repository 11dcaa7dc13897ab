from __future__ import annotations

from pathlib import Path

import pytest

from localrun.errors import BadModelError, ModelNotFoundError
from localrun.gguf.reader import read_gguf
from tests.tinymodel import vocabulary


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
