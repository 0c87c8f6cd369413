"""The contract monitored inside vLLM's own tests and serving engine.

As a pytest plugin, named on the command line (never loaded by itself)::

    VLLM_TARGET_DEVICE=cpu python -m pytest -p kvcontract.monitor \\
        --kvcontract-report monitor.json tests/v1/kv_connector/unit/offloading_connector/

every lookup, load and store the tests drive through vLLM's offloading connector is judged
against the contract as it happens (:mod:`kvcontract.tools.runtime_monitor`). Options:

* ``--kvcontract-report FILE.json``: the report (``tests``, ``events``, ``judged`` per
  clause, ``checks`` per check of a clause judged several ways (``C12/junction-registered``:
  the shared-prefix junction a lookup leaves on its request), ``not_judged``,
  ``violations`` with test id, clause, impact, witness and reproducer, ``errors``: the
  monitor's own); a one-screen summary is printed at the end either way;
* ``--kvcontract-reproducers DIR``: a pytest reproducer per violation with a replayable
  witness (a lookup's states; a store step's request schedule as a ``StoreCase``),
  runnable without vLLM's test harness (and on vLLM's engine where vLLM is installed);
  a store-step violation whose request maps onto no ``StoreCase`` says why
  (``no reproducer: ...``);
* ``--kvcontract-fail``: a test with a violation fails (otherwise the tests' outcomes
  are their own);
* ``--kvcontract-deferral-bound D``: C13's bound in scheduler steps (the contract's 4 by
  default; a deployment states its own);
* ``--kvcontract-vllm-variant NAME``: a kvcontract variant's rule put in place of vLLM's
  own for the session (``stale-pending``, ``unaligned-hit``, ``mtp-extra-retained``:
  historic defects driven through vLLM's code, to see the monitor catch them).

As a serving hook: with ``KVCONTRACT_MONITOR=1`` in its environment, ``vllm serve`` loads
:func:`vllm_plugin` through vLLM's general-plugin entry point (``vllm.general_plugins``)
in each process; violations are logged as they are found and, with
``KVCONTRACT_MONITOR_REPORT=FILE.jsonl``, appended to that file, one JSON object a line.

Importing this module loads neither vLLM, Z3 nor torch; the monitor is installed when
pytest is configured with the plugin named.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvcontract.errors import UsageError

if TYPE_CHECKING:
    from kvcontract.tools.runtime_monitor import Finding, RuntimeMonitor

MONITOR_ENV = "KVCONTRACT_MONITOR"
"""``1`` switches the serving hook on."""
REPORT_ENV = "KVCONTRACT_MONITOR_REPORT"
"""A JSON-lines file the serving hook appends each violation to."""

_KEY = "kvcontract_monitor"
_log = logging.getLogger("kvcontract.monitor")


# -- pytest ---------------------------------------------------------------------------------
def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("kvcontract-monitor", "kvcontract: the contract monitored in vLLM")
    group.addoption("--kvcontract-report", metavar="FILE.json", default=None,
                    help="write the monitor's report (JSON) to FILE.json")
    group.addoption("--kvcontract-reproducers", metavar="DIR", default=None,
                    help="write a pytest reproducer per violation with a replayable "
                         "witness (lookups, store steps) into DIR")
    group.addoption("--kvcontract-fail", action="store_true", default=False,
                    help="fail a test in which the monitor found a violation")
    group.addoption("--kvcontract-vllm-variant", metavar="NAME", default=None,
                    help="put a kvcontract variant's rule in place of vLLM's for the session")
    group.addoption("--kvcontract-deferral-bound", metavar="D", type=int, default=None,
                    help="C13's bound: scheduler steps a request may stay deferred "
                         "(default: the contract's, 4)")


def pytest_configure(config: Any) -> None:
    try:
        _configure(config)
    except UsageError as exc:
        import pytest

        raise pytest.UsageError(f"kvcontract monitor: {exc}") from None


def _configure(config: Any) -> None:
    from kvcontract.tools.runtime_monitor import MonitorOptions, RuntimeMonitor

    report = config.getoption("--kvcontract-report")
    folder = config.getoption("--kvcontract-reproducers")
    if report is not None:
        _check_writable(Path(report), "--kvcontract-report")
    bound = config.getoption("--kvcontract-deferral-bound")
    if bound is not None and bound < 1:
        raise UsageError(f"--kvcontract-deferral-bound {bound}: a number of steps, at least 1")
    options = MonitorOptions(reproducers=Path(folder) if folder else None)
    if bound is not None:
        options = dataclasses.replace(options, deferral_bound=bound)
    monitor = RuntimeMonitor(options)
    variant = config.getoption("--kvcontract-vllm-variant")
    undo = _patch_variant(monitor, variant) if variant else None
    monitor.install()
    setattr(config, _KEY, (monitor, undo))


def _check_writable(path: Path, option: str) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir() or (parent.exists() and not os.access(parent, os.W_OK)):
        raise UsageError(f"{option} {path}: not a writable file path")


def _patch_variant(monitor: RuntimeMonitor, name: str) -> Any:
    context = monitor.variant(name)  # a UsageError naming the variant when it cannot
    context.__enter__()
    return context


def _monitor(config: Any) -> RuntimeMonitor | None:
    found = getattr(config, _KEY, None)
    return found[0] if found else None


def pytest_runtest_setup(item: Any) -> None:
    monitor = _monitor(item.config)
    if monitor is not None:
        monitor.begin_test(item.nodeid)


try:  # the hook wrapper below needs pytest; importing this module does not
    import pytest

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(item: Any, call: Any) -> Any:
        outcome = yield
        monitor = _monitor(item.config)
        if (monitor is None or not item.config.getoption("--kvcontract-fail")
                or call.when == "setup"):
            return
        # The call phase fails with what the fixtures and the test's body drove; teardown
        # with anything the fixtures drove after it.
        found = monitor.unreported_violations()
        report = outcome.get_result()
        if found and report.passed:
            report.outcome = "failed"
            report.longrepr = "kvcontract monitor:\n" + "\n".join(
                f"  {f.clause} ({f.impact}): {f.message}" for f in found)
except ImportError:  # pragma: no cover - pytest is how this module is used
    pass


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    monitor = _monitor(config)
    if monitor is None:
        return
    monitor.flush()  # the last test's open deferrals
    terminalreporter.section("kvcontract monitor")
    for line in monitor.report.summary_lines():
        terminalreporter.write_line(line)
    path = config.getoption("--kvcontract-report")
    if path:
        terminalreporter.write_line(f"  report: {path}")


def pytest_unconfigure(config: Any) -> None:
    found = getattr(config, _KEY, None)
    if not found:
        return
    monitor, undo = found
    monitor.flush()
    path = config.getoption("--kvcontract-report")
    if path:
        monitor.report.write(Path(path))
    monitor.uninstall()
    if undo is not None:
        undo.__exit__(None, None, None)
    delattr(config, _KEY)


# -- vllm serve -----------------------------------------------------------------------------
_SERVING: list[RuntimeMonitor] = []
"""The serving hook's monitor (one per process), kept so a second load installs nothing."""


def vllm_plugin() -> None:
    """vLLM's general plugin (``vllm.general_plugins``): installs the monitor in this
    process when ``KVCONTRACT_MONITOR=1``; otherwise does nothing."""
    if os.environ.get(MONITOR_ENV) != "1" or _SERVING:
        return
    from kvcontract.tools.runtime_monitor import MonitorOptions, RuntimeMonitor

    report = os.environ.get(REPORT_ENV)
    monitor = RuntimeMonitor(MonitorOptions(max_requests=1024,
                                            on_violation=_serving_sink(report)))
    monitor.begin_test("serve")
    if monitor.install():
        _SERVING.append(monitor)
        _log.info("kvcontract monitor installed (vLLM %s)", monitor.report.vllm)
    else:
        _log.warning("kvcontract monitor not installed: %s", "; ".join(monitor.report.gaps))


def _serving_sink(report: str | None) -> Any:
    def sink(finding: Finding) -> None:
        _log.warning("kvcontract monitor: %s (%s): %s", finding.clause, finding.impact,
                     finding.message)
        if report:
            with open(report, "a", encoding="utf-8") as stream:
                stream.write(json.dumps(finding.to_json(), default=str) + "\n")

    return sink


__all__ = ["MONITOR_ENV", "REPORT_ENV", "vllm_plugin"]
