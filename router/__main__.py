"""``python -m router``: the same program as ``kvemu router``."""

import sys

from kvemu import router_cmd
from kvemu.program import run_module

sys.exit(run_module(router_cmd, "python -m router", "run the cache-aware router in front of replicas"))
