"""docs/templates.md lists the chat-format families as the registry holds them."""

from __future__ import annotations

from localrun import chatformat
from scripts import templates_doc


def test_the_committed_list_of_families_is_the_registrys() -> None:
    doc = templates_doc.DOC.read_text(encoding="utf-8")
    assert templates_doc.written(doc) == doc, "run .venv/bin/python scripts/templates_doc.py"


def test_the_list_names_every_family_once_with_what_it_supports() -> None:
    table = templates_doc.families().splitlines()[2:]
    assert [row.split(" | ")[0].removeprefix("| ") for row in table] == [
        f.name for f in (*chatformat.FORMATS, chatformat.HERMES)
    ]
    gpt_oss = next(row for row in table if row.startswith("| gpt-oss |"))
    assert gpt_oss.endswith("| no | yes |")  # one call a reply, constrained
    assert "harmony's analysis channel" in gpt_oss
