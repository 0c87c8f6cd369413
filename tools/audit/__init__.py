"""``kvcontract audit``: check real vLLM code (a checkout, a wheel, a patched file) against
the contract, without importing vLLM.

* :mod:`.targets` - what ``--target`` names (``vllm:PATH``, ``module:FILE.py``,
  ``builtin:NAME``) and which files it provides (:mod:`.audited_files`: which ones);
* :mod:`.binding` - finds the upstream functions by AST, execs them among small
  stand-ins and adapts them to :class:`~kvcontract.impl.bundle.Implementation`
  (:mod:`.roles`: what is looked for and the record of what was bound;
  :mod:`.stand_ins`: the stand-ins; :mod:`.upstream_calls`: calling upstream code, its
  time limit and the stand-in gap);
* :mod:`.sandbox` - runs each check in a child process with time limits;
* :mod:`.engine` - the clause checks (the prover catalogue, grids, Hypothesis;
  :mod:`.recheck`: a witness re-checked, the fields a theorem reads;
  :mod:`.derived_spaces`: the upstream theorems' spaces, walked with the catalogue's);
* :mod:`.lookup` - upstream's own multi-group lookup, driven through a stand-in scheduler;
* :mod:`.system` - the seed scenarios of the executable system, on the bound code;
* :mod:`.baseline` - per-clause comparison of two targets;
* :mod:`.report` - the report dict, the human table and the exit code;
* :mod:`.reproduce` - pytest reproducers that bind the upstream file and replay a witness;
* :mod:`.command` - what ``kvcontract audit`` does (the CLI only parses options);
* :mod:`.wheels` - fetch released wheels (tests, benchmark) into a cache, .py only.
"""
