"""The live backend: vLLM's own scheduler, KV-cache manager and offloading connector in
the loop (issue 20).

The core (``spec``, ``impl``, ``proofs``) never imports this package nor vLLM; this
package depends on the core. Importing it imports no vLLM: :mod:`kvcontract.live.env`
says whether vLLM can run here, :mod:`~kvcontract.live.capabilities` what the installed
release offers the driver (it adapts to that, never to a version),
:mod:`~kvcontract.live.gaps` tells the driver's own gaps from vLLM's failures,
:mod:`~kvcontract.live.build` turns a geometry into the
real objects, :mod:`~kvcontract.live.worker` is the host-only worker,
:mod:`~kvcontract.live.trace` the request traces, :mod:`~kvcontract.live.run` drives the
scheduler, :mod:`~kvcontract.live.observation` is what it saw, :mod:`~kvcontract.live.confirm`
replays an end-to-end case live against the spec's promise, and
:mod:`~kvcontract.live.scenarios` names the lifecycle scenarios.
"""

from kvcontract.live.env import prepare_environment as _prepare_environment

# vLLM reads its platform and logging settings when it is first imported, whichever
# module of this package (or of the caller) imports it first: set them now (only those
# the user has not set).
_prepare_environment()
