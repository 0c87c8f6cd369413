"""kvcontract.spec._without_z3: the stand-in for ``z3`` that lets the spec's int
arithmetic import where the solver is not installed (the gen-tests reproducers)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvcontract.spec import _without_z3 as stand_in


def test_nothing_is_a_term() -> None:
    for value in (0, 1.5, True, "x", None, (1, 2)):
        assert not isinstance(value, stand_in.ExprRef)
    assert issubclass(stand_in.ArithRef, stand_in.ExprRef)
    assert issubclass(stand_in.BoolRef, stand_in.ExprRef)


@pytest.mark.parametrize("name", ["If", "And", "Or", "Not", "Implies", "BoolVal", "IntVal",
                                  "Int"])
def test_building_a_term_says_what_to_install(name: str) -> None:
    with pytest.raises(ModuleNotFoundError, match="pip install z3-solver"):
        getattr(stand_in, name)(1, 2)


def test_the_spec_runs_on_ints_without_z3() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'z3':\n"
        "            raise ModuleNotFoundError('no z3 here', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from kvcontract.spec import arith, _without_z3\n"
        "from kvcontract.spec.retention import load_chunk_range\n"
        "from kvcontract.spec.lookup import HIT, MISS, sliding_window_answer\n"
        "assert arith.z3 is _without_z3 and 'z3' not in sys.modules\n"
        "assert arith.cdiv(-7, 2) == -3 and arith.mod(-7, 2) == 1\n"
        "assert not arith.is_symbolic(3, True)\n"
        "assert load_chunk_range(3904, 0, 64, 4, 128, 0) == (14, 16)\n"
        "assert sliding_window_answer([HIT, HIT, MISS, HIT, HIT], 3, 2).concrete() == 2\n"
        "try:\n"
        "    arith.z3.Int('n')\n"
        "except ModuleNotFoundError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('a term was built without z3')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
