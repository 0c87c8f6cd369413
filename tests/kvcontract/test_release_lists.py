"""The release lists (kvcontract/releases.py) agree with the install script and with
each other: a new release is named once, there, and the script follows."""

from __future__ import annotations

import re
from pathlib import Path

from kvcontract.releases import (
    AUDITED_RELEASES,
    LIVE_RELEASES,
    NEWEST_RELEASE,
    PLANNING_RELEASE,
)

ROOT = Path(__file__).resolve().parents[2]


def _key(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in release.split("."))


def test_the_install_script_installs_the_newest_release() -> None:
    script = (ROOT / ".ci" / "install-live").read_text(encoding="utf-8")
    found = re.search(r"VLLM_VERSION=\$\{VLLM_VERSION:-([0-9.]+)\}", script)
    assert found is not None, ".ci/install-live lost its default VLLM_VERSION"
    assert found.group(1) == NEWEST_RELEASE


def test_the_lists_are_ordered_and_nested() -> None:
    for releases in (AUDITED_RELEASES, LIVE_RELEASES):
        assert list(releases) == sorted(releases, key=_key)
        assert len(set(releases)) == len(releases)
    assert set(LIVE_RELEASES) <= set(AUDITED_RELEASES)
    assert NEWEST_RELEASE == AUDITED_RELEASES[-1] == LIVE_RELEASES[-1]
    assert PLANNING_RELEASE in AUDITED_RELEASES
