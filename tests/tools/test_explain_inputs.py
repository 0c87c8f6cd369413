"""``kvcontract explain``'s scene options (issue 22 item 3), a sweep in the manner of
``test_bad_inputs.py``: zero or negative sizes, states for chunks that do not exist, hits
larger than the prompt. Each bad input exits 2 with one line that names the value and the
limit, draws nothing and prints no traceback; each input just inside a limit draws."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner, Result

from kvcontract.tools.cli import cli

TRACEBACK = "Traceback (most recent call last)"

SWA = ["--swa-block", "4", "--sliding-window", "8"]
"""One SWA group of 4-token blocks: bpc 1, so a chunk is 4 tokens."""

HYBRID = ["--fa-block", "16", "--swa-block", "4", "--sliding-window", "8"]
"""A full-attention group of 16-token blocks (group 0) and the SWA group (group 1)."""

GEOMETRY = json.dumps({"groups": [{"kind": "sliding_window", "block_size": 4,
                                   "sliding_window": 8}], "blocks_per_chunk": 2})
"""Inline ``--geometry``: 8-token chunks."""

BAD: dict[str, tuple[list[str], tuple[str, ...]]] = {
    # the prompt
    "tokens-zero": ([*SWA, "--tokens", "0"], ("--tokens", "at least 1", "not 0")),
    "tokens-negative": ([*SWA, "--tokens", "-5"], ("--tokens", "at least 1", "not -5")),
    "tokens-below-one-chunk": ([*SWA, "--tokens", "3"],
                               ("--tokens 3", "no complete chunk", "4 tokens",
                                "--tokens 4 or more")),
    "tokens-below-one-chunk-geometry": (["--geometry", GEOMETRY, "--tokens", "7"],
                                        ("--tokens 7", "8 tokens", "--tokens 8 or more")),
    "tokens-zero-geometry": (["--geometry", GEOMETRY, "--tokens", "0"],
                             ("--tokens", "at least 1", "not 0")),
    "tokens-too-many-chunks": ([*SWA, "--tokens", "100000000"],
                               ("100000000 tokens", "at most")),
    # the sizes
    "swa-block-zero": (["--swa-block", "0", "--sliding-window", "8", "--tokens", "16"],
                       ("--swa-block", "at least 1", "not 0")),
    "swa-block-negative": (["--swa-block", "-4", "--sliding-window", "8", "--tokens", "16"],
                           ("--swa-block", "at least 1", "not -4")),
    "fa-block-zero": (["--fa-block", "0", *SWA, "--tokens", "16"],
                      ("--fa-block", "at least 1", "not 0")),
    "sliding-window-zero": (["--swa-block", "4", "--sliding-window", "0", "--tokens", "16"],
                            ("--sliding-window", "at least 1", "not 0")),
    "sliding-window-one": (["--swa-block", "4", "--sliding-window", "1", "--tokens", "16"],
                           ("sliding_window=1", ">= 2")),
    "e-negative": ([*SWA, "--e", "-1", "--tokens", "16"], ("--e", "at least 0", "not -1")),
    "bpc-zero": ([*SWA, "--bpc", "0", "--tokens", "16"], ("--bpc", "at least 1", "not 0")),
    "bpc-negative": ([*SWA, "--bpc", "-2", "--tokens", "16"],
                     ("--bpc", "at least 1", "not -2")),
    "retention-negative": ([*SWA, "--retention", "-1", "--tokens", "16"],
                           ("--retention", "at least 0", "not -1")),
    "geometry-block-zero": (["--geometry", json.dumps({"groups": [{
        "kind": "sliding_window", "block_size": 0, "sliding_window": 8}]}), "--tokens", "16"],
        ("block_size=0", ">= 1")),
    "geometry-bpc-negative": (["--geometry", json.dumps({"groups": [{
        "kind": "sliding_window", "block_size": 4, "sliding_window": 8}],
        "blocks_per_chunk": -1}), "--tokens", "16"], ("blocks_per_chunk=-1", ">= 1")),
    # the hits
    "hit-negative": ([*SWA, "--tokens", "16", "--hit", "-1"],
                     ("--hit", "at least 0", "not -1")),
    "hit-past-prompt": ([*SWA, "--tokens", "16", "--hit", "17"],
                        ("--hit 17", "larger than the prompt", "--tokens 16")),
    "local-negative": ([*SWA, "--tokens", "16", "--local", "-4"],
                       ("--local", "at least 0", "not -4")),
    "local-past-prompt": ([*SWA, "--tokens", "16", "--local", "20"],
                          ("--local 20", "larger than the prompt", "--tokens 16")),
    "local-past-hit": ([*SWA, "--tokens", "16", "--hit", "4", "--local", "8"],
                       ("--local 8", "larger than --hit 4")),
    "local-off-block": ([*SWA, "--tokens", "16", "--hit", "8", "--local", "2"],
                        ("--local 2", "not a multiple of 4 tokens")),
    # the states
    "states-past-prompt": ([*SWA, "--tokens", "16", "--states", "0=HHHHHHHHHHHH"],
                           ("--states 0=", "12 states", "4 complete chunks",
                            "16-token prompt", "at most 4 letters")),
    "states-one-past-prompt": ([*SWA, "--tokens", "16", "--states", "0=HHHHM"],
                               ("5 states", "4 complete chunks", "at most 4 letters")),
    "states-past-prompt-bpc": ([*SWA, "--bpc", "2", "--tokens", "16", "--states", "0=HHH"],
                               ("3 states", "2 complete chunks of 8 tokens")),
    "states-past-prompt-second-group": ([*HYBRID, "--tokens", "32", "--states", "0=HH",
                                         "--states", "1=HHHHHHHHH"],
                                        ("--states 1=", "9 states", "group 1 has 8",
                                         "at most 8 letters")),
    "states-past-prompt-coarse-group": ([*HYBRID, "--tokens", "32", "--states", "0=HHH"],
                                        ("--states 0=", "3 states", "group 0 has 2",
                                         "16 tokens")),
    "states-no-letters": ([*SWA, "--tokens", "16", "--states", "0="],
                          ("--states 0=", "no letters", "4 complete chunks")),
    "states-unknown-group": ([*SWA, "--tokens", "16", "--states", "1=HH"],
                             ("--states 1=", "1 groups", "0 to 0")),
    "states-unknown-letter": ([*SWA, "--tokens", "16", "--states", "0=HXH"],
                              ("'0=HXH'", "unknown letters", "H (hit)")),
    "states-no-group": ([*SWA, "--tokens", "16", "--states", "HHMP"],
                        ("'HHMP'", "GROUP=LETTERS")),
}

GOOD: dict[str, list[str]] = {
    "one-chunk": [*SWA, "--tokens", "4"],
    "hit-is-prompt": [*SWA, "--tokens", "16", "--hit", "16"],
    "hit-zero": [*SWA, "--tokens", "16", "--hit", "0"],
    "local-is-hit": [*SWA, "--tokens", "16", "--hit", "8", "--local", "8"],
    "states-every-chunk": [*SWA, "--tokens", "16", "--hit", "16", "--states", "0=HHPM"],
    "states-fewer-chunks": [*SWA, "--tokens", "16", "--hit", "8", "--states", "0=HH"],
    "states-every-chunk-bpc": [*SWA, "--bpc", "2", "--tokens", "17", "--states", "0=HR"],
    "states-both-groups": [*HYBRID, "--tokens", "32", "--hit", "32", "--states", "0=HH",
                           "--states", "1=HHHHHHHP"],
    "retention-zero": [*SWA, "--retention", "0", "--tokens", "16", "--hit", "8"],
    "geometry-one-chunk": ["--geometry", GEOMETRY, "--tokens", "8", "--states", "0=M"],
}


def _explain(argv: list[str]) -> Result:
    return CliRunner().invoke(cli, ["explain", *argv])


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_scene_option_is_a_usage_error(name: str) -> None:
    argv, fragments = BAD[name]
    done = _explain(argv)
    output = done.output
    assert done.exit_code == 2, f"{name}: exit {done.exit_code}\n{output}"
    assert TRACEBACK not in output, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvcontract: error: "), output
    for fragment in fragments:
        assert fragment in output, f"{name}: {fragment!r} not in {output!r}"


@pytest.mark.parametrize("name", sorted(GOOD))
def test_scene_just_inside_the_limits_is_drawn(name: str) -> None:
    done = _explain(GOOD[name])
    assert done.exit_code == 0, f"{name}: exit {done.exit_code}\n{done.output}"
    assert "kvcontract: error" not in done.output
    assert "legend:" in done.output  # the scene was drawn in the terminal


def test_drawn_states_are_the_ones_given() -> None:
    """Every given state is drawn on its chunk (none silently dropped)."""
    done = _explain([*SWA, "--tokens", "16", "--hit", "16", "--states", "0=HPMR"])
    assert done.exit_code == 0, done.output
    row = next(line for line in done.output.splitlines() if line.startswith("g0 "))
    assert [c for c in row if c in "HPMR"] == list("HPMR"), row
