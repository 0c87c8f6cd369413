"""The finite domains theorems are case-split over (docs/CONTRACT.md section 2).

Token counts, windows and extra-retained tokens are always unbounded; sizes are split
over every realistic value when a symbolic proof does not go through.
"""

from __future__ import annotations

from kvcontract.spec.properties.base import Config

BLOCK_SIZES: tuple[int, ...] = (4, 8, 16, 32, 64, 128, 256, 528, 1648)
"""GPU block sizes: powers of two and Mamba-hybrid odd sizes."""
BLOCKS_PER_CHUNK: tuple[int, ...] = (1, 2, 4, 8, 16)
MASK_BLOCKS_PER_CHUNK: tuple[int, ...] = (1, 2, 4)


def _fmt(values: tuple[int, ...]) -> str:
    return "{" + ",".join(str(v) for v in values) + "}"


def block_configs() -> list[Config]:
    return [Config(f"bs={bs}", {"bs": bs}) for bs in BLOCK_SIZES]


def chunk_configs() -> list[Config]:
    return [
        Config(f"bs={bs}, bpc={bpc}", {"bs": bs, "bpc": bpc})
        for bs in BLOCK_SIZES
        for bpc in BLOCKS_PER_CHUNK
    ]


BLOCK_DOMAIN = f"bs in {_fmt(BLOCK_SIZES)}"
CHUNK_DOMAIN = f"bs in {_fmt(BLOCK_SIZES)}, bpc in {_fmt(BLOCKS_PER_CHUNK)}"


def mask_configs(eagle: bool, retention: str) -> list[Config]:
    """FA block size x SWA block size x bpc where the mask applies (A a multiple of B).

    ``retention`` is ``none`` (segments of A), ``zero`` (replay boundaries only) or
    ``interval`` (segments of 2A plus replay boundaries).
    """
    configs = []
    for bs_fa in BLOCK_SIZES:
        for bs_swa in BLOCK_SIZES:
            for bpc in MASK_BLOCKS_PER_CHUNK:
                align = bs_fa * bpc
                if align % bs_swa:
                    continue  # store-all geometry: nothing to reason about
                interval = {"none": -1, "zero": 0, "interval": 2 * align}[retention]
                configs.append(
                    Config(
                        f"FA bs={bs_fa}, SWA bs={bs_swa}, bpc={bpc}, eagle={eagle}, "
                        f"retention={retention}",
                        {"A": align, "B": bs_swa, "bpc": bpc, "eagle": int(eagle),
                         "R": interval},
                    )
                )
    return configs


MASK_DOMAIN = (
    f"FA bs x SWA bs in {_fmt(BLOCK_SIZES)}, bpc in {_fmt(MASK_BLOCKS_PER_CHUNK)}, "
    "A a multiple of B"
)
