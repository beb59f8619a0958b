"""``python -m replica``: the same program as ``kvemu replica``."""

import sys

from kvemu import replica_cmd
from kvemu.program import run_module

sys.exit(run_module(replica_cmd, "python -m replica", "run one replica: an emulated GPU serving over HTTP"))
