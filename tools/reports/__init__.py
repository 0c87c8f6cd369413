"""Report formats for the verifying commands (``prove``, ``fuzz``, ``audit``).

One public entry point, :func:`render`, turns the versioned JSON report of a command
into one of :data:`FORMATS`:

* ``json``     - the versioned report itself (``"version": 1``), with source locations;
* ``junit``    - JUnit XML (the Jenkins ``junit-10`` dialect), one test case per theorem;
* ``sarif``    - SARIF 2.1.0 with one rule per clause, for code-scanning uploads;
* ``markdown`` - a summary sized for a pull-request comment;
* ``mypy``     - ``path:line: error: [C2] ...`` lines that editors and CI annotators parse;
* ``text``     - a plain, uncoloured table (the CLI draws its own rich table);
* ``github``   - GitHub Actions workflow commands (``::error file=F,line=L,...::``), one
  line per finding, for annotations on a pull request.

Every finding carries a ``fingerprint`` (:mod:`.fingerprint`: clause, theorem, impact
and the witness's shape, nothing of the run or the machine), which SARIF's
``partialFingerprints`` and the findings baseline (:mod:`.gate`) use; with a baseline,
a finding is marked ``new`` or ``baseline`` in every format.

Every format works on the same normalized shape (:func:`normalize`): ``{"version",
"command", "target", "results": [{clause, theorem, verdict, status, domain, seconds,
witness, message, location?}]}``. The fuzz report (per-clause check counts plus a list
of differences) is folded into that shape, so a reader of SARIF or JUnit never needs to
know which engine produced a finding.

Why locations are a field and not computed by the renderers: a finding must point at
the code that is wrong. For the built-in implementations that is the function of the
:class:`~kvcontract.impl.bundle.Implementation` that differs from the reference
(:func:`locate`, via :mod:`inspect`); an audit of upstream code knows better (the
upstream file and line) and supplies ``location: {"path", "line"}`` itself. Renderers use
a result's ``location`` when present and fall back to :func:`locate`, then to the
clause's entry in :mod:`kvcontract.spec.clauses` (SARIF and editors need some line).

All output is deterministic: no timestamps, no host names, stable ordering.

The modules, one job each:

* :mod:`.model`     - the report shape: :func:`normalize`, :func:`exit_code`,
  :func:`load_report`;
* :mod:`.locate`    - where a finding points;
* :mod:`.formats`   - :data:`FORMATS` and :func:`render`, dispatching to
  :mod:`.json_format`, :mod:`.junit`, :mod:`.sarif`, :mod:`.markdown`,
  :mod:`.mypy_lines`, :mod:`.text`, :mod:`.github` (shared pieces in :mod:`.common`);
* :mod:`.outputs`   - output files: suffixes, ``--format``/``--output`` pairing, writing;
* :mod:`.fingerprint` - a finding's stable identity;
* :mod:`.gate`      - the findings baseline file and the pull-request gate (``--fail-on
  new``), with :mod:`.github` the workflow-command renderer.
"""

from __future__ import annotations

from kvcontract.tools.reports.fingerprint import FINGERPRINT_RULE, fingerprint
from kvcontract.tools.reports.formats import FORMATS, render
from kvcontract.tools.reports.locate import (
    clause_location,
    display_path,
    function_location,
    locate,
)
from kvcontract.tools.reports.markdown import MARKDOWN_LIMIT
from kvcontract.tools.reports.model import (
    ERROR,
    FAIL,
    PASS,
    REPORT_VERSION,
    ReportError,
    exit_code,
    load_report,
    normalize,
    write_text,
)
from kvcontract.tools.reports.outputs import (
    FORMAT_SUFFIXES,
    STDOUT,
    format_for_path,
    pair_outputs,
)

__all__ = [
    "ERROR",
    "FAIL",
    "FINGERPRINT_RULE",
    "FORMATS",
    "FORMAT_SUFFIXES",
    "MARKDOWN_LIMIT",
    "PASS",
    "REPORT_VERSION",
    "STDOUT",
    "ReportError",
    "clause_location",
    "display_path",
    "exit_code",
    "fingerprint",
    "format_for_path",
    "function_location",
    "load_report",
    "locate",
    "normalize",
    "pair_outputs",
    "render",
    "write_text",
]
