"""Case spaces derived from another space's cases, walked in one pass with it.

An ``upstream-*`` theorem (upstream's loop or store path among stand-ins, or vLLM's
engine) observes a catalogue space less the cases the release cannot take
(:func:`filtered_space`, :func:`without_absent_modes`), and says so in the space
(``CaseSpace.shares``), so the engine walks both families over the same cases once
(:func:`shared_cases`).
Its own module because :mod:`.lookup`, :mod:`.store` and :mod:`.on_engine` derive such
spaces and :mod:`.engine` reads the record, none of them through another.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from kvcontract.spec.geometry import Geometry
from kvcontract.spec.properties.base import CaseSpace, Family
from kvcontract.tools.audit.roles import Binding, has_lookahead_hashes


def stand_in_family(family: Family) -> str:
    """The family of the ``upstream-*`` theorems that observe ``family``'s cases on
    upstream's code among kvcontract's stand-ins (``upstream-lookup``)."""
    return f"upstream-{family}"


def engine_family(family: Family) -> str:
    """The family of the ``upstream-*`` theorems that observe ``family``'s cases on
    vLLM's own engine (``engine-lookup``)."""
    return f"engine-{family}"


def shared_cases(space: CaseSpace[Any, Any]) -> tuple[CaseSpace[Any, Any],
                                                      Callable[[Any], bool]] | None:
    """``(base space, accepts)`` when ``space``'s cases are the base space's cases that
    ``accepts``, in the base's order (``CaseSpace.shares``: upstream's store and C12
    spaces: the catalogue's or the scoped ones less the Mamba geometries), else None. The
    engine walks such families together, so a case's per-case memos serve both."""
    return space.shares


def every_case(case: Any) -> bool:
    """Every case of the base space (``CaseSpace.shares``)."""
    del case
    return True


def filtered_space(space: CaseSpace[Any, Any], family: str,
                   observe: Callable[[Any, Any], Any], accepts: Callable[[Any], bool],
                   note: str | None) -> CaseSpace[Any, Any]:
    """``space`` observed by ``observe`` as family ``family``, over the cases ``accepts``
    keeps (in ``space``'s order); ``note`` (why the others are left out) ends its domain
    text. Its ``shares`` names ``space``, so the engine walks both together."""
    base_cases, base_describe = space.cases, space.describe
    return dataclasses.replace(
        space, family=family, observe=observe,
        cases=lambda: (c for c in base_cases() if accepts(c)),
        describe=(base_describe if note is None
                  else lambda: f"{base_describe()}; {note}"),
        shares=(space, accepts))


LOOKAHEAD_NOTE = ("geometries with lookahead block hashes are left out: this release's "
                  "offloading connector has no such mode (its code reads no "
                  "use_lookahead_block_hashes; docs/CONTRACT.md 2.1)")


def without_absent_modes(binding: Binding, geometry_of: Callable[[Any], Geometry],
                         ) -> tuple[Callable[[Any], bool], str | None]:
    """``(accepts, note)``: the cases of a geometry the release can take, the lookahead
    hash geometries left out where it has no such mode (:data:`LOOKAHEAD_NOTE`)."""
    if has_lookahead_hashes(binding):
        return every_case, None
    return (lambda case: not geometry_of(case).hash_lookahead), LOOKAHEAD_NOTE
