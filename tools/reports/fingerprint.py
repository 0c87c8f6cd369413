"""A finding's stable identity: :func:`fingerprint`.

A findings baseline (``--write-baseline``/``--baseline-file``), SARIF's
``partialFingerprints`` and the ``new``/``baseline`` mark of every report format all
name a finding by its fingerprint, so it must not change when nothing about the defect
changed. The rule (:data:`FINGERPRINT_RULE`, documented in the README, "Pull-request
gate"):

* **what goes in**: the clause, the theorem id (``fuzz-<kind>-<n>``'s order number
  dropped), the finding's impact, and the *shape* of its witness;
* **the shape of a witness**: for a formula (``arith``) witness, the configuration part
  of its values, i.e. the values of the names the theorem's case split fixes (``bs``,
  ``bpc``, the mask sizes), not its free variables (``N``, ``j``, ``sw``, ...), which the
  solver may choose differently after an unrelated edit; for a case witness (lookup,
  store, end to end, scanner), its geometry and the case's own fields (tokens, hits,
  states, steps, consumer), without the catalogue's display label (``geometry_name``)
  and the ``kind``/``theorem`` echo; for a fuzz witness, everything but the drawn
  ``program`` (Hypothesis's steps);
* **what stays out**: the target (``vllm:.`` on a runner, ``vllm:~/src/vllm`` on a
  laptop), run time, seconds and Z3 resources, the machine, the position of the result
  in the report (catalogue or case order), source locations and line numbers, messages.

The fingerprint is ``sha256`` of the canonical JSON (sorted keys, no spaces) of those
parts, its first 16 hex digits. Two findings with the same fingerprint are the same
finding for a baseline.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

FINGERPRINT_RULE = "kvcontract-finding/v1"
"""The name of the rule above; a baseline file records it, and a new rule means new
fingerprints (a baseline written under another rule is rejected, naming both)."""

FINGERPRINT_LENGTH = 16
"""Hex digits kept of the sha256 digest (64 bits: no collision among a report's
findings in practice, short enough to read in a baseline file)."""

_LABELS = frozenset({"geometry_name"})
"""Witness keys that only label a case (a catalogue's display name), at any depth."""
_ECHO = frozenset({"kind", "theorem"})
"""Top-level witness keys that repeat what the result already says."""
_FUZZ_ORDER = re.compile(r"^(fuzz-.+?)-\d+$")


def theorem_identity(theorem: str) -> str:
    """The theorem name as a fingerprint reads it: a fuzz report numbers repeated
    differences of one kind (``fuzz-lookup-2``) in the order they were found; the
    number is dropped (the witness shape tells them apart)."""
    match = _FUZZ_ORDER.match(theorem)
    return match.group(1) if match else theorem


def _without_labels(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _without_labels(v) for k, v in value.items() if k not in _LABELS}
    if isinstance(value, (list, tuple)):
        return [_without_labels(v) for v in value]
    return value


def _config_names(theorem_id: str, values: Mapping[str, Any]) -> list[str]:
    """The names of ``values`` the theorem's case split fixes (not its free variables);
    every name for a theorem this kvcontract does not know as a formula property."""
    try:
        from kvcontract.spec.properties import FormulaProperty, get_property

        prop = get_property(theorem_id)
    except Exception:  # an audit-only theorem, or one of another kvcontract version
        return sorted(str(k) for k in values)
    if not isinstance(prop, FormulaProperty):
        return sorted(str(k) for k in values)
    free = set(prop.variables)
    return sorted(str(k) for k in values if k not in free)


def witness_shape(clause: str, theorem: str, witness: Mapping[str, Any] | None) -> Any:
    """The part of a witness that identifies a finding (see the module docstring)."""
    if not witness:
        return None
    kind = witness.get("kind")
    values = witness.get("values")
    if kind == "arith" or (kind is None and isinstance(values, Mapping)):
        if not isinstance(values, Mapping):
            return {"kind": "arith"}
        names = _config_names(f"{clause}/{theorem}", values)
        return {"kind": "arith", "config": {name: values[name] for name in names}}
    shape = {str(k): v for k, v in witness.items() if k not in _ECHO}
    if kind == "fuzz":
        shape.pop("program", None)
    return {"kind": kind, "case": _without_labels(shape)}


def canonical(value: Any) -> str:
    """Canonical JSON: sorted keys, no spaces, non-ASCII kept (stable across runs)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str)


def fingerprint(result: Mapping[str, Any]) -> str:
    """The stable fingerprint of a finding: ``result`` is a report row (raw or
    normalized) with ``clause``, ``theorem``, ``impact`` and ``witness``."""
    clause = str(result.get("clause", ""))
    theorem = theorem_identity(str(result.get("theorem", "")))
    witness = result.get("witness")
    parts = {
        "rule": FINGERPRINT_RULE,
        "clause": clause,
        "theorem": theorem,
        "impact": result.get("impact"),
        "shape": witness_shape(clause, str(result.get("theorem", "")),
                               witness if isinstance(witness, Mapping) else None),
    }
    digest = hashlib.sha256(canonical(parts).encode("utf-8")).hexdigest()
    return digest[:FINGERPRINT_LENGTH]
