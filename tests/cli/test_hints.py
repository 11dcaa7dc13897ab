"""Hints that are whole and true: every alias (or an ellipsis) and the nearest
names for an unknown model, nothing a command would refuse, and what a memory
budget too small for the weights is short of."""

from __future__ import annotations

from pathlib import Path

import pytest

from localrun.errors import ModelNotFoundError
from localrun.gguf.info import describe
from localrun.gguf.reader import read_gguf
from localrun.store.registry import KNOWN_LISTED, ModelEntry, Registry, load
from localrun.units import human_bytes
from tests.helpers import cli


def _hint(args: tuple[str, ...], code: int = 3) -> str:
    res = cli(*args)
    assert res.returncode == code, res.stderr
    (hint,) = [line.removeprefix("hint: ") for line in res.stderr.splitlines() if line.startswith("hint: ")]
    return hint


def test_an_unknown_model_lists_every_alias_and_the_nearest() -> None:
    hint = _hint(("generate", "-m", "qwn2.5-coder:1.5b", "hi"))
    assert hint.startswith("did you mean qwen2.5-coder:1.5b")
    aliases = list(load().entries)  # a dozen, then an ellipsis and where to see the whole catalogue
    assert all(alias in hint for alias in aliases[:KNOWN_LISTED]) and aliases[KNOWN_LISTED] not in hint
    assert "…" in hint and "`localrun list --all`" in hint
    assert hint.endswith("or pass a path to a .gguf file")
    assert _hint(("show", "lama3.2")).startswith("did you mean llama3.2 ")  # a family name, which picks its default
    assert _hint(("show", "qwen")).startswith("did you mean qwen3 ")


def test_a_long_registry_ends_its_list_with_an_ellipsis() -> None:
    entries = {f"m{i}:1b": ModelEntry(f"m{i}:1b", "o/r", f"m{i}.gguf", "Q4_0") for i in range(KNOWN_LISTED + 3)}
    with pytest.raises(ModelNotFoundError) as caught:
        Registry(entries, default="m0:1b").resolve("zzz")
    hint = caught.value.hint or ""
    assert hint.count(":1b") == KNOWN_LISTED and ", …" in hint and "did you mean" not in hint


def test_rm_offers_no_path_which_it_refuses() -> None:
    hint = _hint(("rm", "nosuch"))
    assert "path" not in hint and "known: " in hint
    refused = cli("rm", "some/file.gguf")
    assert refused.returncode == 2 and "not files given by path" in refused.stderr


def test_quantize_does_not_suggest_an_option_it_lacks(tmp_path: Path) -> None:
    hint = _hint(("quantize", str(tmp_path / "nope.gguf"), str(tmp_path / "out.gguf"), "--type", "q4_0"))
    assert "-m" not in hint and "path" in hint


def test_show_says_what_a_too_small_budget_is_short_of(tiny_model: Path) -> None:
    res = cli("show", str(tiny_model), "--budget", "1KiB")
    assert res.returncode == 0, res.stderr
    (line,) = [line for line in res.stdout.splitlines() if "context in" in line]
    weights = describe(read_gguf(tiny_model)).weights_bytes
    assert f"none: the weights alone need {human_bytes(weights)}" in line and "f16 0" not in line
