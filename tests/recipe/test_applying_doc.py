"""Every ```python block of docs/applying.md runs, each on its own in a fresh namespace on the CPU; a block whose
first line is `# needs: cuda` or `# needs: torchrec` (or that imports torchrec) is skipped, with the reason, where
that is missing."""

from __future__ import annotations

import importlib.util
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

DOC = Path(__file__).resolve().parents[2] / "docs" / "applying.md"
FENCE = re.compile(r"^(?P<indent>[ \t]*)```python[ \t]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
NEEDS = re.compile(r"#\s*needs:\s*(?P<names>[\w, ]+)")
IMPORTS_TORCHREC = re.compile(r"^\s*(import|from)\s+torchrec\b", re.M)


@dataclass(frozen=True)
class Snippet:
    """One fenced python block: its first code line in the document, its dedented code, what it needs."""

    line: int
    code: str
    needs: frozenset[str]


def snippets(text: str) -> list[Snippet]:
    """The ```python blocks of a markdown `text`, in order (indented ones, inside list items, too)."""
    found = []
    for match in FENCE.finditer(text):
        code = textwrap.dedent(match["body"])
        first = code.lstrip().splitlines()[0] if code.strip() else ""
        marked = NEEDS.match(first)
        needs = {name.strip() for name in marked["names"].split(",") if name.strip()} if marked else set()
        if IMPORTS_TORCHREC.search(code):
            needs.add("torchrec")
        found.append(Snippet(text.count("\n", 0, match.start("body")) + 1, code, frozenset(needs)))
    return found


def missing(needs: frozenset[str]) -> str | None:
    """Why a block cannot run here (None: it can); refuses a need it does not know (ValueError)."""
    unknown = sorted(needs - {"cuda", "torchrec"})
    if unknown:
        raise ValueError(f"unknown '# needs:' {unknown}; accepted: cuda, torchrec")
    if "cuda" in needs and not torch.cuda.is_available():
        return "needs a CUDA device"
    if "torchrec" in needs and importlib.util.find_spec("torchrec") is None:
        return "needs torchrec (pip install mxlab[torchrec]; docs/applying.md)"
    return None


def run_snippet(snippet: Snippet, source: str) -> None:
    """Execute `snippet` in a fresh namespace; an error's traceback names `source`:line."""
    code = "\n" * (snippet.line - 1) + snippet.code  # tracebacks give the line in the document
    exec(compile(code, source, "exec"), {"__name__": "__doc_snippet__"})


DOC_SNIPPETS = snippets(DOC.read_text())


def test_every_python_block_of_the_doc_is_found():
    assert len(DOC_SNIPPETS) == DOC.read_text().count("```python") >= 5


@pytest.mark.parametrize("snippet", DOC_SNIPPETS, ids=[f"line{snippet.line}" for snippet in DOC_SNIPPETS])
def test_the_doc_snippet_runs(snippet):
    reason = missing(snippet.needs)
    if reason is not None:
        pytest.skip(f"docs/applying.md:{snippet.line}: {reason}")
    try:
        run_snippet(snippet, str(DOC))
    finally:
        if dist.is_available() and dist.is_initialized():  # a block that failed before its own cleanup
            dist.destroy_process_group()


PLANTED = """# A page

```python
x = 1
assert x == 1
```

  ```python
  y = undefined_name
  ```

```python
# needs: cuda
import torch
```

```python
from torchrec import EmbeddingBagConfig
```
"""


def test_a_planted_broken_block_fails_with_its_line():
    found = snippets(PLANTED)
    assert [snippet.line for snippet in found] == [4, 9, 13, 18]
    assert [snippet.needs for snippet in found] == [frozenset(), frozenset(), {"cuda"}, {"torchrec"}]
    run_snippet(found[0], "planted.md")
    with pytest.raises(NameError, match="undefined_name") as failure:
        run_snippet(found[1], "planted.md")
    assert failure.traceback[-1].frame.code.path == "planted.md" and failure.traceback[-1].lineno + 1 == 9
    assert missing(found[2].needs) == (None if torch.cuda.is_available() else "needs a CUDA device")
    with pytest.raises(ValueError, match=r"unknown '# needs:' \['gpu'\]; accepted: cuda, torchrec"):
        missing(frozenset({"gpu"}))
