"""Theorems, the solver driver and the prover (see ARCHITECTURE.md)."""
