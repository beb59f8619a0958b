"""The one compiled part of kvemu: the block pool with LRU or S3-FIFO, compiled for the simulator (replica/core/_pool.c).

It is optional: where no C compiler is found the build goes on without it and the simulator
uses the Python pool, which gives the same results (the kernel is tested against it).
The kernel carries the SHA-256 of the source it was built from, so a checkout whose _pool.c has
changed since the last install falls back to the Python pool instead of running a stale kernel.
Everything else is in pyproject.toml.
"""

import hashlib
from pathlib import Path

from setuptools import Extension, setup

SOURCE = "replica/core/_pool.c"
DIGEST = hashlib.sha256(Path(__file__).with_name("replica").joinpath("core", "_pool.c").read_bytes()).hexdigest()

setup(ext_modules=[Extension("replica.core._pool", [SOURCE], optional=True, extra_compile_args=["-O2"],
                             define_macros=[("POOL_SOURCE_SHA256", f'"{DIGEST}"')])])
