"""Regression reports of a study folder: report.md, report.html, summary.json and figures/*.png.

``write_report(study_dir) -> dict[str, Path]`` renders a study from its files;
``compare_studies(dir_a, dir_b) -> str`` shows how two studies differ (Markdown).
"""

from __future__ import annotations

from mxlab.report.build import write_report
from mxlab.report.compare import compare_studies

__all__ = ["write_report", "compare_studies"]
