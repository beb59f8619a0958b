"""Virtual time: the simulator, sweeps of simulator runs, the mean-field estimator and their plots.

The simulator runs the live replica's cache core (``replica.core``) and the live router's
strategies (``router.strategies``) over a trace, with a virtual clock.
"""

import shared  # noqa: F401, E402 - installs the compiled modules' finder before sim.simulator is imported
