"""kvcontract.spec.properties.domains: the size grids of the case splits."""

from __future__ import annotations

import pytest

from kvcontract.spec.properties.domains import (
    BLOCK_DOMAIN,
    BLOCK_SIZES,
    BLOCKS_PER_CHUNK,
    CHUNK_DOMAIN,
    MASK_BLOCKS_PER_CHUNK,
    MASK_DOMAIN,
    block_configs,
    chunk_configs,
    mask_configs,
)


def test_grids() -> None:
    # docs/CONTRACT.md 9: bs in {4, ..., 256, 528, 1648}, bpc in {1, 2, 4, 8, 16}.
    assert BLOCK_SIZES == (4, 8, 16, 32, 64, 128, 256, 528, 1648)
    assert BLOCKS_PER_CHUNK == (1, 2, 4, 8, 16)
    assert MASK_BLOCKS_PER_CHUNK == (1, 2, 4)
    assert BLOCK_DOMAIN == "bs in {4,8,16,32,64,128,256,528,1648}"
    assert CHUNK_DOMAIN == BLOCK_DOMAIN + ", bpc in {1,2,4,8,16}"
    assert MASK_DOMAIN == ("FA bs x SWA bs in {4,8,16,32,64,128,256,528,1648}, "
                           "bpc in {1,2,4}, A a multiple of B")


def test_block_and_chunk_configs() -> None:
    blocks = block_configs()
    assert [c.values for c in blocks] == [{"bs": bs} for bs in BLOCK_SIZES]
    assert blocks[-1].label == "bs=1648"
    chunks = chunk_configs()
    assert len(chunks) == 45
    assert {(c.values["bs"], c.values["bpc"]) for c in chunks} == {
        (bs, bpc) for bs in BLOCK_SIZES for bpc in BLOCKS_PER_CHUNK}
    assert chunks[1].label == "bs=4, bpc=2"


@pytest.mark.parametrize(("retention", "interval"), [("none", None), ("zero", 0),
                                                      ("interval", "2A")])
@pytest.mark.parametrize("eagle", [False, True])
def test_mask_configs(retention: str, interval: object, eagle: bool) -> None:
    configs = mask_configs(eagle, retention)
    triples = [(c.values["A"], c.values["B"], c.values["bpc"]) for c in configs]
    assert len(set(triples)) == len(triples)
    assert len({c.label for c in configs}) == len(configs)
    for config in configs:
        values = config.values
        assert values["A"] % values["B"] == 0
        assert values["eagle"] == int(eagle)
        expected = {None: -1, 0: 0, "2A": 2 * values["A"]}[interval]  # type: ignore[index]
        assert values["R"] == expected
        assert config.label.endswith(f"eagle={eagle}, retention={retention}")
    # FA 528 + SWA 32: A = 528 is not a multiple of 32 (store all), A = 1056 is.
    assert (528, 32, 1) not in triples
    assert (1056, 32, 2) in triples
    assert (1648, 16, 1) in triples and (1648, 32, 1) not in triples
    # Every (FA bs, SWA bs, bpc) whose A is a multiple of B is present.
    every = {(fa * bpc, swa, bpc) for fa in BLOCK_SIZES for swa in BLOCK_SIZES
             for bpc in MASK_BLOCKS_PER_CHUNK if (fa * bpc) % swa == 0}
    assert set(triples) == every


def test_mask_configs_reject_an_unknown_retention() -> None:
    with pytest.raises(KeyError):
        mask_configs(False, "sometimes")
