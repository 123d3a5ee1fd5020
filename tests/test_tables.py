"""mxlab.tables: one validator turns a TOML table into a dataclass, refusing unknown keys and wrong types."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from mxlab.tables import table_to_dataclass


@dataclass(frozen=True)
class Table:
    count: int = 1
    rate: float = 0.5
    name: str = ""
    flag: bool = False
    sizes: tuple[int, ...] = ()
    limit: float | None = None


def test_a_table_becomes_its_dataclass_with_ints_as_floats_and_lists_as_tuples():
    table = table_to_dataclass(Table, {"count": 2, "rate": 1, "sizes": [3, 4], "limit": 2}, "t")
    assert table == Table(count=2, rate=1.0, sizes=(3, 4), limit=2.0)
    assert isinstance(table.rate, float) and isinstance(table.sizes, tuple)
    assert table_to_dataclass(Table, {"extra": 1}, "t", ignore=("extra",)) == Table()


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ([1], r"\[t\] must be a table, got \[1\]"),
        ({"colour": 1}, r"unknown key 't\.colour'; accepted keys in \[t\]: count, rate, name, flag, sizes, limit"),
        ({"count": 1.5}, r"t\.count must be an integer, got 1\.5 \(float\)"),
        ({"count": True}, r"t\.count must be an integer, got True \(bool\)"),
        ({"rate": "fast"}, r"t\.rate must be a number, got 'fast' \(str\)"),
        ({"flag": 1}, r"t\.flag must be true or false, got 1 \(int\)"),
        ({"sizes": [1, "a"]}, r"t\.sizes must be a list of integers, got \[1, 'a'\] \(list\)"),
        ({"limit": "x"}, r"t\.limit must be a number, got 'x' \(str\)"),
    ],
)
def test_a_bad_table_is_refused_naming_the_key_the_value_and_the_type(table, message):
    with pytest.raises(ValueError, match=message):
        table_to_dataclass(Table, table, "t")


def test_a_table_named_in_words_is_so_named_in_the_messages():
    with pytest.raises(ValueError, match=r"unknown key 'data\.x'; accepted keys in \[data\] for source 's': count"):
        table_to_dataclass(Table, {"x": 1}, "data", where="[data] for source 's'")
