"""The unit suite's longest-first order (tests/unit/conftest.py) names files that exist, each once."""
from __future__ import annotations

import importlib.util
from pathlib import Path

HERE = Path(__file__).resolve().parent
_SPEC = importlib.util.spec_from_file_location("unit_conftest", HERE / "conftest.py")
unit_conftest = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(unit_conftest)


def test_every_file_the_order_names_exists_once():
    names = unit_conftest.LONGEST + unit_conftest.LAST
    assert len(set(names)) == len(names)
    assert [name for name in names if not (HERE / name).is_file()] == []


def test_longest_first_in_their_order_then_the_others_then_the_last():
    first, second = (Path(name) for name in unit_conftest.LONGEST[:2])
    other, last = Path("test_not_named_here.py"), Path(unit_conftest.LAST[0])
    assert sorted([last, other, second, first], key=unit_conftest.order_key) == [first, second, other, last]
