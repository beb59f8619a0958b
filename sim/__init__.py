"""Virtual time: the simulator, sweeps of simulator runs, the mean-field estimator and their plots.

The simulator runs the live replica's cache core (``replica.core``) and the live router's
strategies (``router.strategies``) over a trace, with a virtual clock.
"""
