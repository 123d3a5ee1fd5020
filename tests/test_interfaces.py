"""docs/INTERFACES.md, "Plug-ins": every signature written there is the code's (inspect.signature)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from mxlab.registry import import_object

DOC = Path(__file__).resolve().parents[1] / "docs" / "INTERFACES.md"
SIGNATURE = re.compile(r"^(?P<path>mxlab[\w.]*:[\w.]+)(?P<signature>\(.*)$")


def documented_signatures(text: str) -> dict[str, str]:
    """{'module:qualname': '(parameters) -> return'} of the code block of the "Plug-ins" section."""
    section = text.split("\n## Plug-ins", 1)[1].split("\n## ", 1)[0]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    return {m["path"]: m["signature"] for line in block.splitlines() if (m := SIGNATURE.match(line))}


def code_signature(path: str) -> str:
    """The signature of the object at `path` as its source writes it (string annotations unquoted)."""
    return str(inspect.signature(import_object(path, "documented object"))).replace("'", "")


def test_the_documented_plug_in_signatures_are_the_code_s():
    documented = documented_signatures(DOC.read_text())
    assert len(documented) >= 15
    wrong = {path: (written, code_signature(path)) for path, written in documented.items()}
    wrong = {path: pair for path, pair in wrong.items() if pair[0] != pair[1]}
    assert wrong == {}


def test_a_changed_signature_is_found():
    text = DOC.read_text().replace("task_set(table: Any) -> TaskSet", "task_set(table: Any, strict: bool) -> TaskSet")
    written = documented_signatures(text)["mxlab.tasks:task_set"]
    assert written != code_signature("mxlab.tasks:task_set")
