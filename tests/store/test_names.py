"""Model names that point at the hub: repo names with or without a
quantization, the hub's addresses, and the file a quantization picks."""

from __future__ import annotations

import pytest

from localrun.errors import ModelNotFoundError, UsageError
from localrun.store import ggufs, parse, registry


@pytest.mark.parametrize(
    ("file", "quant"),
    [
        ("Qwen3-8B-Q4_K_M.gguf", "Q4_K_M"),
        ("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "Q4_K_M"),
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
        ("gpt-oss-20b-mxfp4.gguf", "MXFP4"),
        ("gpt-oss-120b-mxfp4-00002-of-00003.gguf", "MXFP4"),
        ("Qwen3-30B-A3B-IQ4_XS.gguf", "IQ4_XS"),
        ("gemma-3-27b-it-f16-00001-of-00002.gguf", "F16"),
        ("gemma-3-1b-it-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"),
        ("Q4_K_M/Big-Model-Q4_K_M-00001-of-00002.gguf", "Q4_K_M"),
        ("gemma-3-4b-it.gguf", None),
    ],
)
def test_a_file_name_says_its_quantization(file: str, quant: str | None) -> None:
    assert ggufs.quant_of(file) == quant


LISTING = [
    ".gitattributes",
    "README.md",
    "model-Q8_0.gguf",
    "model-Q4_K_M.gguf",
    "model-UD-Q4_K_XL.gguf",
    "mmproj-model-f16.gguf",
    "F16/model-F16-00002-of-00002.gguf",
    "F16/model-F16-00001-of-00002.gguf",
]


def test_a_quantization_picks_its_file_like_ollama_and_llama_cpp() -> None:
    assert ggufs.pick_quant_file(LISTING, None) == "model-Q4_K_M.gguf"  # no quantization named: Q4_K_M
    assert ggufs.pick_quant_file(LISTING, "q8_0") == "model-Q8_0.gguf"  # any case
    assert ggufs.pick_quant_file(LISTING, "Q4_K_XL") == "model-UD-Q4_K_XL.gguf"  # unsloth's dynamic quants
    assert ggufs.pick_quant_file(LISTING, "F16") == "F16/model-F16-00001-of-00002.gguf"  # a split one: its first shard
    with pytest.raises(ModelNotFoundError, match="no Q2_K GGUF file in me/model-GGUF") as info:
        ggufs.pick_quant_file(LISTING, "Q2_K", "me/model-GGUF")
    assert info.value.hint == "quantizations there: F16, Q4_K_M, Q8_0, UD-Q4_K_XL; name one, e.g. me/model-GGUF:F16"


def test_a_repo_of_one_quantization_needs_no_name() -> None:
    mxfp4 = ["gpt-oss-20b-mxfp4.gguf", "README.md"]
    assert ggufs.pick_quant_file(mxfp4, None) == "gpt-oss-20b-mxfp4.gguf"
    with pytest.raises(ModelNotFoundError) as info:
        ggufs.pick_quant_file(mxfp4, "Q4_K_M", "ggml-org/gpt-oss-20b-GGUF")  # named, and not there: an error
    assert info.value.hint is not None and "MXFP4" in info.value.hint
    two = ["a-Q8_0.gguf", "a-F16.gguf"]
    with pytest.raises(ModelNotFoundError, match="no Q4_K_M GGUF file") as none:
        ggufs.pick_quant_file(two, None, "me/a")  # two others and no Q4_K_M: the user chooses
    assert none.value.hint is not None and "F16, Q8_0" in none.value.hint
    with pytest.raises(ModelNotFoundError, match="holds no GGUF file"):
        ggufs.pick_quant_file(["model.safetensors", "mmproj-f16.gguf"], None, "me/a")


def test_a_split_file_names_all_its_shards() -> None:
    assert ggufs.shards("m-Q4_K_M-00002-of-00003.gguf") == [
        "m-Q4_K_M-00001-of-00003.gguf",
        "m-Q4_K_M-00002-of-00003.gguf",
        "m-Q4_K_M-00003-of-00003.gguf",
    ]
    assert ggufs.shards("m-Q4_K_M.gguf") == ["m-Q4_K_M.gguf"]


@pytest.mark.parametrize(
    ("name", "repo", "file", "quant", "revision", "label"),
    [
        ("me/model-GGUF", "me/model-GGUF", None, None, None, "me/model-GGUF"),
        ("me/model-GGUF:q8_0", "me/model-GGUF", None, "Q8_0", None, "me/model-GGUF:Q8_0"),
        ("hf.co/me/model-GGUF", "me/model-GGUF", None, None, None, "me/model-GGUF"),
        ("hf.co/me/model-GGUF:Q8_0", "me/model-GGUF", None, "Q8_0", None, "me/model-GGUF:Q8_0"),
        ("hf.co/me/model-GGUF:latest", "me/model-GGUF", None, None, None, "me/model-GGUF"),
        ("https://huggingface.co/me/model-GGUF", "me/model-GGUF", None, None, None, "me/model-GGUF"),
        ("https://huggingface.co/me/model-GGUF/tree/main", "me/model-GGUF", None, None, None, "me/model-GGUF"),
        (
            "https://huggingface.co/me/model-GGUF/blob/main/model-Q4_K_M.gguf",
            "me/model-GGUF",
            "model-Q4_K_M.gguf",
            None,
            "main",
            "hf://me/model-GGUF/model-Q4_K_M.gguf",
        ),
        (
            "https://huggingface.co/me/model-GGUF/resolve/0123abc/Q8_0/model-Q8_0.gguf?download=true",
            "me/model-GGUF",
            "Q8_0/model-Q8_0.gguf",
            None,
            "0123abc",
            "hf://me/model-GGUF/Q8_0/model-Q8_0.gguf@0123abc",
        ),
        ("hf://me/model-GGUF/model-Q4_K_M.gguf", "me/model-GGUF", "model-Q4_K_M.gguf", None, None, None),
        ("hf://me/model-GGUF:Q4_0", "me/model-GGUF", None, "Q4_0", None, "me/model-GGUF:Q4_0"),
    ],
)
def test_hub_names_and_addresses(
    name: str, repo: str, file: str | None, quant: str | None, revision: str | None, label: str | None
) -> None:
    target = parse(name, registry.load())
    assert (target.repo, target.file, target.quant, target.revision) == (repo, file, quant, revision)
    assert target.path is None and target.entry is None
    assert target.label == (label or name)


@pytest.mark.parametrize(
    "name",
    [
        "https://huggingface.co/me",  # no repo
        "hf.co/me/model-GGUF/blob/main/README.md",  # not a GGUF file
        "https://huggingface.co/me/model-GGUF/discussions/3",
        "me/model-GGUF/extra",  # one slash too many for owner/repo
        "https://huggingface.co/me/model-GGUF/resolve/main/../x.gguf",
    ],
)
def test_what_is_not_a_hub_name_is_refused_with_the_forms(name: str) -> None:
    with pytest.raises(UsageError) as info:
        parse(name, registry.load())
    assert info.value.hint is not None and "hf.co/owner/repo[:QUANT]" in info.value.hint


def test_every_label_is_a_name_that_points_at_the_same_file() -> None:
    """History and messages name a model by its label: parsed again, it means the same."""
    reg = registry.load()
    for name in (
        "hf.co/me/model-GGUF:q8_0",
        "https://huggingface.co/me/model-GGUF/resolve/0123abc/model-Q8_0.gguf",
        "https://huggingface.co/me/model-GGUF/blob/main/model-Q8_0.gguf",
        "qwen3",
    ):
        target = parse(name, reg)
        again = parse(target.label, reg)
        assert (again.repo, again.file, again.quant, again.entry) == (
            target.repo,
            target.file,
            target.quant,
            target.entry,
        )
        assert again.revision in (target.revision, None if target.revision == "main" else target.revision)


def test_a_path_stays_a_path_and_an_alias_an_alias() -> None:
    reg = registry.load()
    assert parse("models/mine-Q4_K_M.gguf", reg).path is not None  # a relative path, its slash kept
    assert parse("qwen3", reg).label == "qwen3:8b"
    assert parse("gemma3:27b", reg).repo == "unsloth/gemma-3-27b-it-GGUF"
