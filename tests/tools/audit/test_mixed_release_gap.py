"""tools/audit/binding.stand_in_gap on a patch laid over another release: a name the
function's own module defines at top level (the audit compiles a function on its own)
and a call whose bound callee takes another number of arguments than the caller's own
module defines it with are the tool's gaps (UNKNOWN); a call that does not fit the
caller's own module's definition, or an unknown name, stays upstream's (a crash)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvcontract.tools.audit.upstream_calls import stand_in_gap

BASE = '''
KNOWN_TABLE = {}


class Scheduler:
    def helper(self, a, b, c):
        return a

    def caller(self):
        return self.helper(1, 2, 3)

    def own_mismatch(self):
        return self.helper(1)

    def reads_table(self):
        return KNOWN_TABLE[1]

    def reads_nothing_known(self):
        return UNKNOWN_NAME
'''


def _raised(tmp_path: Path, method: str, patched_helper: Any = None) -> BaseException:
    path = tmp_path / "base_scheduler.py"
    path.write_text(BASE)
    namespace: dict[str, Any] = {}
    # Compiled on its own, as the audit does: the module's top-level names are absent.
    source = compile(path.read_text(), str(path), "exec")
    exec(source, namespace)
    cls = namespace["Scheduler"]
    for name in ("KNOWN_TABLE",):
        del namespace[name]
    if patched_helper is not None:
        cls.helper = patched_helper
    try:
        getattr(cls(), method)()
    except Exception as exc:  # the exception under test
        return exc
    raise AssertionError("nothing raised")


def test_a_patch_helper_with_another_signature_is_a_gap(tmp_path: Path) -> None:
    def helper(self: Any, a: Any) -> Any:  # the patch's older signature
        return a

    gap = stand_in_gap(_raised(tmp_path, "caller", helper))
    assert gap is not None and "disagree on its signature" in gap
    # Both counts include self, so the message compares like with like.
    assert "takes 2 positional arguments" in gap and "defines it with 4" in gap


def test_an_own_module_mismatch_stays_upstreams(tmp_path: Path) -> None:
    assert stand_in_gap(_raised(tmp_path, "own_mismatch")) is None


def test_a_top_level_name_not_compiled_in_is_a_gap(tmp_path: Path) -> None:
    gap = stand_in_gap(_raised(tmp_path, "reads_table"))
    assert gap is not None and "'KNOWN_TABLE'" in gap
    assert stand_in_gap(_raised(tmp_path, "reads_nothing_known")) is None
