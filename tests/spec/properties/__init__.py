"""Tests of :mod:`kvcontract.spec.properties` (a package: its module names repeat
those of ``tests/spec``, e.g. ``test_lookup``, ``test_formulas``)."""
