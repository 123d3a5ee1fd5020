"""A small document model rendered twice: to Markdown and to a self-contained HTML page.

The report is built once as a list of blocks; :func:`render_markdown` and :func:`render_html`
turn it into report.md and report.html (figures embedded as base64 PNG, no server needed).
Inline markup in text: ``**bold**`` and ```code```; nothing else is interpreted.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Heading:
    text: str
    level: int = 2


@dataclass
class Paragraph:
    text: str


@dataclass
class BulletList:
    items: list[str]


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]
    row_classes: list[str] = field(default_factory=list)  # per row: "" or a verdict name, for HTML colouring


@dataclass
class CodeBlock:
    text: str


@dataclass
class Figure:
    path: Path  # relative to the report's folder
    caption: str


@dataclass
class Details:
    summary: str
    blocks: list[Block]


Block = Heading | Paragraph | BulletList | Table | CodeBlock | Figure | Details

_INLINE = re.compile(r"(\*\*[^*]+\*\*|`[^`]+`)")


def _inline_html(text: str) -> str:
    parts = []
    for piece in _INLINE.split(text):
        if piece.startswith("**") and piece.endswith("**") and len(piece) > 4:
            parts.append(f"<strong>{html.escape(piece[2:-2])}</strong>")
        elif piece.startswith("`") and piece.endswith("`") and len(piece) > 2:
            parts.append(f"<code>{html.escape(piece[1:-1])}</code>")
        else:
            parts.append(html.escape(piece))
    return "".join(parts)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(blocks: list[Block]) -> str:
    """The blocks as GitHub-flavoured Markdown (figures as relative image links)."""
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            out.append("#" * block.level + " " + block.text)
        elif isinstance(block, Paragraph):
            out.append(block.text)
        elif isinstance(block, BulletList):
            out.append("\n".join(f"- {item}" for item in block.items))
        elif isinstance(block, Table):
            lines = [
                "| " + " | ".join(_md_cell(h) for h in block.header) + " |",
                "|" + "|".join("---" for _ in block.header) + "|",
            ]
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in block.rows]
            out.append("\n".join(lines))
        elif isinstance(block, CodeBlock):
            out.append("```\n" + block.text.rstrip("\n") + "\n```")
        elif isinstance(block, Figure):
            out.append(f"![{block.caption}]({block.path.as_posix()})\n\n*{block.caption}*")
        elif isinstance(block, Details):
            out.append(
                f"<details><summary>{html.escape(block.summary)}</summary>\n\n"
                + render_markdown(block.blocks)
                + "\n</details>"
            )
        else:
            raise ValueError(f"unknown block type {type(block).__name__}")
    return "\n\n".join(out) + "\n"


_CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; max-width: 1200px; margin: 2em auto;
       padding: 0 1em; color: #222; line-height: 1.45; }
h1 { border-bottom: 2px solid #444; padding-bottom: .2em; }
h2 { border-bottom: 1px solid #ccc; padding-bottom: .15em; margin-top: 1.8em; }
table { border-collapse: collapse; margin: .8em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: .3em .6em; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
tr.regression td { background: #fde2e1; }
tr.improvement td { background: #e3f4e1; }
tr.diverged td { background: #f3d9f5; }
pre { background: #f6f6f6; padding: .8em; overflow-x: auto; font-size: 0.85em; }
code { background: #f1f1f1; padding: 0 .2em; }
figure { margin: 1em 0; }
figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-style: italic; color: #555; }
details { margin: .5em 0; }
summary { cursor: pointer; font-weight: 600; }
"""


def render_html(blocks: list[Block], title: str, base_dir: Path) -> str:
    """A self-contained HTML page: figures read from ``base_dir / figure.path`` and embedded as base64 PNG.

    Refuses a figure whose file does not exist (ValueError)."""

    def body(items: list[Block]) -> list[str]:
        out: list[str] = []
        for block in items:
            if isinstance(block, Heading):
                out.append(f"<h{block.level}>{_inline_html(block.text)}</h{block.level}>")
            elif isinstance(block, Paragraph):
                out.append(f"<p>{_inline_html(block.text)}</p>")
            elif isinstance(block, BulletList):
                out.append("<ul>" + "".join(f"<li>{_inline_html(i)}</li>" for i in block.items) + "</ul>")
            elif isinstance(block, Table):
                head = "".join(f"<th>{_inline_html(h)}</th>" for h in block.header)
                rows = []
                for i, row in enumerate(block.rows):
                    cls = block.row_classes[i] if i < len(block.row_classes) else ""
                    cells = "".join(f"<td>{_inline_html(c)}</td>" for c in row)
                    rows.append(f'<tr class="{html.escape(cls)}">{cells}</tr>' if cls else f"<tr>{cells}</tr>")
                out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")
            elif isinstance(block, CodeBlock):
                out.append(f"<pre>{html.escape(block.text)}</pre>")
            elif isinstance(block, Figure):
                path = base_dir / block.path
                if not path.is_file():
                    raise ValueError(f"figure {path} does not exist")
                data = base64.b64encode(path.read_bytes()).decode("ascii")
                out.append(
                    f'<figure><img alt="{html.escape(block.caption)}" src="data:image/png;base64,{data}">'
                    f"<figcaption>{_inline_html(block.caption)}</figcaption></figure>"
                )
            elif isinstance(block, Details):
                out.append(
                    f"<details><summary>{_inline_html(block.summary)}</summary>{''.join(body(block.blocks))}</details>"
                )
            else:
                raise ValueError(f"unknown block type {type(block).__name__}")
        return out

    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>\n"
        + "\n".join(body(blocks))
        + "\n</body></html>\n"
    )
