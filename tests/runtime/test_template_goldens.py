"""Every vendored chat template renders byte for byte as llama-server ``--jinja``
renders it: the golden files (tests/data/template_goldens*, made by
scripts/template_goldens.py with llama.cpp's own renderer) hold, per template
and conversation, the prompt llama-server answered on ``POST /apply-template``
(or that it refused the conversation). ``template_goldens_heldout`` and
``template_goldens_heldout2`` hold other conversations, made the same way: the
second was made after the renderer was done, and passed on its first run."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest

from localrun.errors import LocalrunError
from localrun.runtime.chat_request import render_request
from tests.vendored import template

DATA = Path(__file__).resolve().parent.parent / "data"
SETS = ("template_goldens", "template_goldens_heldout", "template_goldens_heldout2")

# (set, template, scenario) -> why localrun's render differs from llama.cpp's there
KNOWN: dict[tuple[str, str, str], str] = {}


def _goldens() -> list[Any]:
    params = []
    for name in SETS:
        folder = DATA / name
        scenarios = json.loads((folder / "scenarios.json").read_text(encoding="utf-8"))
        for path in sorted(folder.glob("*.json")):
            if path.name == "scenarios.json":
                continue
            golden = json.loads(path.read_text(encoding="utf-8"))
            for scenario, expected in golden["cases"].items():
                key = (name, path.stem, scenario)
                marks = [pytest.mark.xfail(reason=KNOWN[key], strict=True)] if key in KNOWN else []
                case = (golden, scenarios[scenario], expected)
                params.append(
                    pytest.param(
                        *case, id=f"{name.removeprefix('template_goldens')}{path.stem}:{scenario}", marks=marks
                    )
                )
    return params


GOLDENS = _goldens()


def test_every_vendored_template_has_goldens() -> None:
    from tests.vendored import templates

    for name in SETS:
        made = {p.stem for p in (DATA / name).glob("*.json")} - {"scenarios"}
        assert made == {n.removesuffix(".jinja") for n in templates()}, name


@pytest.mark.parametrize(("golden", "body", "expected"), GOLDENS)
def test_renders_as_llama_server(golden: dict[str, Any], body: dict[str, Any], expected: dict[str, str]) -> None:
    source = template(golden["template"])
    now = datetime.datetime.fromisoformat(golden["date"])

    def render() -> str:
        return render_request(source, body, bos_token=golden["bos_token"], eos_token=golden["eos_token"], now=now)

    if "error" in expected:
        with pytest.raises(LocalrunError):
            render()
    else:
        assert render() == expected["prompt"]
