"""The reference implementation and its historic variants."""

from kvcontract.impl.bundle import Implementation
from kvcontract.impl.variants import REFERENCE, VARIANTS, get_implementation, variant_names

__all__ = ["REFERENCE", "VARIANTS", "Implementation", "get_implementation", "variant_names"]
