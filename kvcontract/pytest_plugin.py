"""The kvcontract pytest plugin: the implementation under test as a fixture, and a marker
that proves clauses for it.

Installed with kvcontract (entry point ``pytest11``), or named with
``pytest -p kvcontract.pytest_plugin``:

* ``--kvcontract-impl NAME|module:FILE.py`` (default: the ``KVCONTRACT_IMPL`` environment
  variable, else ``reference``) chooses the implementation; a name or file that does
  not load is a usage error before any test runs;
* the fixture ``kvcontract_impl`` is that :class:`~kvcontract.impl.bundle.Implementation`
  (session scope), for tests that replay witnesses or draw from
  :mod:`kvcontract.strategies`;
* the marker ``@pytest.mark.kvcontract("C2", "C4", **options)`` proves those clauses for
  it before the test body runs (:func:`kvcontract.assert_contract`; ``options`` are
  :func:`kvcontract.prove`'s, ``impl=`` included) and fails the test with each
  counterexample, its impact and its witness.

```python
import pytest

import kvcontract

@pytest.mark.kvcontract("C4")
def test_window_formula_is_exact():
    pass  # the marker has proved C4 for --kvcontract-impl

def test_a_witness(kvcontract_impl):
    witness = {"kind": "arith", "theorem": "C2/first-run-covers-load",
               "values": {"bs": 4, "bpc": 1, "N": 5, "Lb": 0, "sw": 2, "e": 1}}
    assert kvcontract.replay(witness["theorem"], witness, kvcontract_impl) is None
```

Importing this module loads neither Z3 nor torch (pytest imports it at every start).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from kvcontract.api import IMPL_ENV

MARKER = "kvcontract"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvcontract", "kvcontract (KV-offloading contract)")
    group.addoption(
        "--kvcontract-impl", dest="kvcontract_impl", metavar="NAME|module:FILE.py",
        default=None,
        help=f"implementation for the kvcontract_impl fixture and the kvcontract marker: "
             f"a registered name or module:FILE.py (default: ${IMPL_ENV}, else reference)",
    )


def _spec(config: pytest.Config) -> str:
    given: str | None = config.getoption("kvcontract_impl", default=None)
    return given or os.environ.get(IMPL_ENV) or "reference"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*clauses, **options): prove these clauses (kvcontract.assert_contract) "
        "for --kvcontract-impl before the test runs; the test fails with the counterexample",
    )
    if config.getoption("kvcontract_impl", default=None) is not None:
        from kvcontract.api import load_implementation
        from kvcontract.errors import KvContractError

        try:
            load_implementation(_spec(config))
        except KvContractError as exc:
            raise pytest.UsageError(f"--kvcontract-impl: {exc}") from None


def pytest_report_header(config: pytest.Config) -> str | None:
    if config.getoption("kvcontract_impl", default=None) is None:
        return None
    return f"kvcontract: implementation {_spec(config)}"


@pytest.fixture(scope="session")
def kvcontract_impl(pytestconfig: pytest.Config) -> Any:
    """The implementation under test (``--kvcontract-impl``, ``$KVCONTRACT_IMPL`` or the
    reference), loaded once per session."""
    from kvcontract.api import load_implementation

    return load_implementation(_spec(pytestconfig))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    """A test marked ``kvcontract`` first proves its clauses; a finding fails it."""
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return
    __tracebackhide__ = True
    from kvcontract.api import assert_contract

    options = dict(marker.kwargs)
    clauses = list(marker.args) + list(_listed(options.pop("clauses", None)))
    impl = options.pop("impl", None) or _spec(item.config)
    assert_contract(impl, clauses or None, **options)


def _listed(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)
