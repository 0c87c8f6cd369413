"""Which files of the ``vllm`` package hold the audited functions.

Its own module because both ends of a target need the list and neither may import the
other for it: :mod:`.targets` checks that a tree holds them, and :mod:`.wheels` unpacks
only them from a release's wheel (while :mod:`.targets` fetches a base release through
:mod:`.wheels`).
"""

from __future__ import annotations

SCHEDULER = "distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py"
OFFLOAD_CONFIG = "distributed/kv_transfer/kv_connector/v1/offloading/config.py"
MANAGER = "v1/core/single_type_kv_cache_manager.py"
"""Files (relative to the ``vllm`` package folder) that hold the audited functions in
0.28.0 to 0.33.0; see :mod:`.binding` for which function lives where in which release."""

KNOWN_FILES = (SCHEDULER, OFFLOAD_CONFIG, MANAGER)
