"""kvcontract.tools.reports.common: verdict counts, the title line, one-line witnesses."""

from __future__ import annotations

from kvcontract.tools.reports.common import counts, title, witness_text


def test_counts_by_verdict_sorted() -> None:
    results = [{"verdict": v} for v in ("PROVED", "COUNTEREXAMPLE", "PROVED", "UNKNOWN")]
    tally = counts(results)
    assert tally == {"COUNTEREXAMPLE": 1, "PROVED": 2, "UNKNOWN": 1}
    assert list(tally) == ["COUNTEREXAMPLE", "PROVED", "UNKNOWN"]
    assert counts([]) == {}


def test_title_names_the_option_of_the_command() -> None:
    assert title({"command": "prove", "target": "stale-pending"}) == \
        "kvcontract prove --impl stale-pending"
    assert title({"command": "fuzz", "target": "reference"}) == "kvcontract fuzz --impl reference"
    assert title({"command": "audit", "target": "vllm:/src"}) == \
        "kvcontract audit --target vllm:/src"


def test_witness_text() -> None:
    assert witness_text(None) == ""
    assert witness_text({}) == ""
    text = witness_text({"values": {"N": 5, "bs": 4}, "kind": "arith"})
    assert text == '{"kind": "arith", "values": {"N": 5, "bs": 4}}'
    assert "\n" not in witness_text({"states": ["HIT"] * 50})
