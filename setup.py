"""The one compiled part of kvemu: the cache-only replay's kernel (replica/core/_replay.c).

It is optional: where no C compiler is found the build goes on without it and the simulator
replays through the Python pool, which gives the same results (the kernel is tested against it).
The kernel carries the SHA-256 of the source it was built from, so a checkout whose _replay.c has
changed since the last install falls back to the Python pool instead of running a stale kernel.
Everything else is in pyproject.toml.
"""

import hashlib
from pathlib import Path

from setuptools import Extension, setup

SOURCE = "replica/core/_replay.c"
DIGEST = hashlib.sha256(Path(__file__).with_name("replica").joinpath("core", "_replay.c").read_bytes()).hexdigest()

setup(ext_modules=[Extension("replica.core._replay", [SOURCE], optional=True, extra_compile_args=["-O2"],
                             define_macros=[("REPLAY_SOURCE_SHA256", f'"{DIGEST}"')])])
