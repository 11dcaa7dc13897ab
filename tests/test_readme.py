"""The README's list of documents: each once, each there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_documentation_list_names_each_document_once() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Documentation\n", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^- \[docs/([\w.-]+)\]", section, re.MULTILINE)
    assert sorted(listed) == sorted(set(listed)), listed  # none twice
    assert listed and all((ROOT / "docs" / name).is_file() for name in listed)
