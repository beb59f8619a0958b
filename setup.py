"""The compiled parts of kvemu: the simulator's block pool with LRU or S3-FIFO
(replica/core/_pool.c) and SHARDS's exact LRU stack (replica/core/_lru_stack.c).

Both are optional: where no C compiler is found the build goes on without them and the
simulator uses their Python definitions, which give the same results (the compiled parts are
tested against them). Each carries the SHA-256 of the source it was built from, so a checkout
whose C source changed since the last install uses the Python definition instead of a stale
build (replica/core/native.py). Everything else is in pyproject.toml.
"""

import hashlib
from pathlib import Path

from setuptools import Extension, setup

HERE = Path(__file__).parent


def extension(name: str) -> Extension:
    source = f"replica/core/{name}.c"
    digest = hashlib.sha256((HERE / source).read_bytes()).hexdigest()
    return Extension(f"replica.core.{name}", [source], optional=True, extra_compile_args=["-O2"],
                     define_macros=[("SOURCE_SHA256", f'"{digest}"')])


setup(ext_modules=[extension("_pool"), extension("_lru_stack")])
