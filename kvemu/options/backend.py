"""``--backend``, ``--device``, ``--layers``: a replica's compute backend, for ``kvemu replica`` and
``kvemu up`` (which hands them to every replica). Their checks are ``replica.backends``'s."""

from __future__ import annotations

from kvemu.options.option import Option

BACKEND = Option("--backend", "emulated", choices=("emulated", "torch"),
                 help="emulated: step times from the cost model; torch: the model's real layers (random weights)"
                      " over a real paged KV tensor, timed on --device (pip install 'kvemu[torch]')")
DEVICE = Option("--device", "cpu", help="torch backend: cpu, cuda, cuda:N")
LAYERS = Option("--layers", None, type=int, help="torch backend: run this many of the model's layers")
BACKEND_OPTIONS = (BACKEND, DEVICE, LAYERS)
