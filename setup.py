"""The compiled parts of kvemu: the simulator's block pool with LRU, S3-FIFO, Belady or
BeladyCompute (replica/core/compiled/_pool.c) and SHARDS's exact LRU stack (replica/core/compiled/_lru_stack.c).

Both are optional: where no C compiler is found the build goes on without them and the
simulator uses their Python definitions, which give the same results (the compiled parts are
tested against them). Each carries the SHA-256 of the source it was built from, so a checkout
whose C source changed since the last install uses the Python definition instead of a stale
build (replica/core/compiled/native.py). Everything else is in pyproject.toml.
"""

import importlib.util
from pathlib import Path

from setuptools import Extension, setup

HERE = Path(__file__).parent
# replica/core/compiled/native.py lists each module's sources and digests them; it needs only the stdlib
_spec = importlib.util.spec_from_file_location("native", HERE / "replica" / "core" / "compiled" / "native.py")
native = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(native)


def extension(name: str) -> Extension:
    sources = [f"replica/core/compiled/{file}" for file in native.SOURCES[name] if file.endswith(".c")]
    digest = native.source_digest(HERE / "replica" / "core" / "compiled", name)
    return Extension(f"replica.core.compiled.{name}", sources, optional=True, extra_compile_args=["-O2"],
                     depends=[f"replica/core/compiled/{file}" for file in native.SOURCES[name]],
                     define_macros=[("SOURCE_SHA256", f'"{digest}"')])


setup(ext_modules=[extension("_pool"), extension("_lru_stack")])
