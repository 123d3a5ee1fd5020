"""House rules a reader relies on: the linter's config can fail, no file over the size limit, and
names and text that describe the software rather than when or by whom it was worked on."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 500  # per Python file of the library (mxlab/) and the kernels (kernels/)
LIMITED_FOLDERS = ("mxlab", "kernels")
SESSION_TEXT = re.compile(r"\bsessions? ?#?\d+\b|\bsession\d+", re.IGNORECASE)
# a working session, a date or a commit hash in a file name:
# `ab_session13.txt`, `x_2026-12-06.txt`, `anatomy_40f6a39.txt`
WORK_DATE_NAME = re.compile(r"session\d*|\d{4}-\d{2}-\d{2}|[_.-][0-9a-f]{7,40}(?=[_.-])", re.IGNORECASE)


def tracked_files() -> list[Path]:
    """The files git tracks in the checkout (a clean clone in CI)."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]


def shown(path: Path) -> str:
    """`path` relative to the checkout where it lies inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def oversized_python_files(paths: list[Path], limit: int = MAX_LINES) -> list[str]:
    """`path: N lines` for each .py file among `paths` longer than `limit` lines."""
    found = []
    for path in paths:
        if path.suffix == ".py" and path.is_file():
            count = len(path.read_text(errors="replace").splitlines())
            if count > limit:
                found.append(f"{shown(path)}: {count} lines")
    return found


def session_mentions(paths: list[Path]) -> list[str]:
    """`path:line: text` for each line of a tracked text file naming a numbered working session."""
    found = []
    for path in paths:
        if path == Path(__file__).resolve():
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if SESSION_TEXT.search(line):
                found.append(f"{shown(path)}:{number}: {line.strip()[:100]}")
    return found


def test_no_library_or_kernel_file_over_the_limit():
    limited = [p for p in tracked_files() if p.relative_to(ROOT).parts[0] in LIMITED_FOLDERS]
    assert oversized_python_files(limited) == []


def test_the_size_check_finds_a_planted_long_file(tmp_path):
    long_file = tmp_path / "long.py"
    long_file.write_text("x = 1\n" * (MAX_LINES + 1))
    short_file = tmp_path / "short.py"
    short_file.write_text("x = 1\n" * MAX_LINES)
    assert oversized_python_files([long_file, short_file]) == [f"{long_file}: {MAX_LINES + 1} lines"]


def test_no_tracked_file_named_after_a_session_a_date_or_a_commit():
    named = [str(p.relative_to(ROOT)) for p in tracked_files() if WORK_DATE_NAME.search(p.name)]
    assert named == []


def test_the_name_check_finds_planted_names():
    for name in ("ab_session13.txt", "gpu_tests_session4.txt", "anatomy_40f6a39.txt", "bench_2026-12-06.txt"):
        assert WORK_DATE_NAME.search(name), name
    for name in ("bench_step.h100.txt", "bench_quant.json", "anatomy.txt", "test_house.py"):
        assert not WORK_DATE_NAME.search(name), name


def test_no_tracked_text_names_a_numbered_session():
    assert session_mentions(tracked_files()) == []


def test_the_text_check_finds_a_planted_mention(tmp_path):
    planted = tmp_path / "notes.md"
    planted.write_text("measured in Session 25 on one H100\nthe process session starts\nsession24's figure\n")
    assert session_mentions([planted]) == [
        f"{planted}:1: measured in Session 25 on one H100",
        f"{planted}:3: session24's figure",
    ]


def ruff() -> str:
    """The ruff executable beside this interpreter (installed by the test extra), or on PATH."""
    beside = Path(sys.executable).with_name("ruff")
    found = str(beside) if beside.exists() else shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed: `pip install -e '.[test]'` installs it (make test does)")
    return found


@pytest.mark.parametrize(
    "source, rule",
    [
        ("import os\n", "F401"),  # unused import
        ("x = 1\n" + "y = '" + "a" * 130 + "'\n", "E501"),  # line over 120 characters
        ("def f(x=[]):\n    return x\n", "B006"),  # mutable default
    ],
)
def test_the_linter_fails_on_a_planted_violation(tmp_path, source, rule):
    planted = tmp_path / "planted.py"
    planted.write_text(source)
    config = ["--config", str(ROOT / "pyproject.toml")]
    result = subprocess.run([ruff(), "check", *config, str(planted)], capture_output=True, text=True)
    assert result.returncode == 1 and rule in result.stdout, result.stdout + result.stderr
    planted.write_text('"""Clean."""\n\nX = 1\n')
    assert subprocess.run([ruff(), "check", *config, str(planted)], capture_output=True).returncode == 0


def test_the_formatter_check_fails_on_unformatted_code(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("x = {  'a':1 }\n")
    config = ["--config", str(ROOT / "pyproject.toml")]
    result = subprocess.run([ruff(), "format", "--check", *config, str(planted)], capture_output=True, text=True)
    assert result.returncode == 1, result.stdout
    subprocess.run([ruff(), "format", *config, str(planted)], capture_output=True, check=True)
    assert planted.read_text() == 'x = {"a": 1}\n'
