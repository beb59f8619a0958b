"""The pure cache core of one emulated GPU: pool, policies, metrics, reuse tracking, scheduler.

Synchronous and free of I/O. The live replica process (``replica.app``) and the
virtual-time simulator (``sim``) build it with the same function, ``replica.core.build``.
"""
