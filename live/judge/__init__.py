"""vLLM's own objects as the judge of kvcontract's cases (issue 26).

The audit searches cases (lookup states, store schedules, producer/consumer pairs) as it
always has; this package *observes* each case on vLLM's real scheduler, KV-cache
manager, offload manager and ``OffloadingConnector`` and hands the observation, in the
case family's own words, to the family's unchanged judges:

* :mod:`~kvcontract.live.judge.roots`: which vLLM ``import vllm`` runs (the installed
  wheel, or a release, an unpacked wheel or a checkout of main laid over it);
* :mod:`~kvcontract.live.judge.engines`: one built engine per geometry, what the
  release offers (capabilities), why a geometry is not built;
* :mod:`~kvcontract.live.judge.lookups`: a lookup case (chunk states, local hit,
  budget) installed in vLLM's own offload manager and asked of the real connector,
  allocation and load set included;
* :mod:`~kvcontract.live.judge.stores`: a store case (a chunked-prefill schedule,
  finished or aborted) run through ``schedule()``/``update_from_output()``, every store
  job's keys, GPU block ids and offsets read, each block's provenance checked;
* :mod:`~kvcontract.live.judge.resends`: a producer/consumer case: the producer's
  stores, then the consumer's lookup over exactly what vLLM's manager holds;
* :mod:`~kvcontract.live.judge.rebinding`: an upstream function of the running vLLM
  replaced by the reference's rule in its own signature (root causes, costs).

Nothing here imports vLLM at import time; every module reaches it through
:func:`kvcontract.live.env.vllm_names` once :func:`~kvcontract.live.judge.roots.activate`
has chosen the root.
"""
