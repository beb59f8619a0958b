"""Pieces of ``bench/chaos.py``: a cluster of real processes, an open-loop load, the scenarios."""
