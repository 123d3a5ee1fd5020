"""Speed benchmarks behind `mxlab bench ...` (CUDA): ratios against baselines measured in the same run."""

from __future__ import annotations


def parse_dims(text: str, names: str, example: str) -> tuple[int, ...]:
    """The positive integers of `text` written as `names` says ("MxKxN", "ROWSxCOLS"); refuses anything else
    (ValueError naming the text, the form and `example`)."""
    parts = text.lower().split("x")
    if len(parts) != len(names.split("x")) or not all(part.isdigit() and int(part) > 0 for part in parts):
        raise ValueError(f"shape {text!r}: expected {names} with positive integers, e.g. {example}")
    return tuple(int(part) for part in parts)
