"""``kvcontract mutate``: a mutation campaign over an implementation's functions.

Each mutant is one small change of one function's AST (:mod:`.operators`), run in a
fresh child process that imports the mutated module under the original module name
before anything else imports it (:mod:`.worker`); the prover's properties that exercise
the function, then the fuzzer's seed scenarios and its quick matrix, try to kill it; a
survivor is shown equivalent (rules read off the source, Z3 or an exhaustive grid,
:mod:`.equivalence`) or reported with the clauses that should have caught it.
:mod:`.targets` says what is mutated and which theorems judge each function;
:mod:`.campaign` runs the mutants in parallel and scores them.

This ``__init__`` deliberately imports nothing from the package: the worker is
imported through it in a child process that must not load ``kvcontract.impl`` before
the mutant is in place. Import the submodules directly.
"""
