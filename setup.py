"""The compiled parts of kvemu: the simulator's block pool with LRU, S3-FIFO, Belady or
BeladyCompute (replica/core/compiled/_pool.c), SHARDS's exact LRU stack (replica/core/compiled/_lru_stack.c),
the trace reader's scan of a well-formed JSON-lines file (loadgen/_traceread.c), and the scheduler step,
simulator loop and session inference compiled from their Python source by mypyc
(shared/compiled_modules.py lists them; KVEMU_MYPYC=0 skips them).

All are optional: where no C compiler (or no mypyc) is found the build goes on without them and
kvemu runs their Python definitions, which give the same results (the compiled parts are tested
against them). Each records the SHA-256 of the source it was built from, so a checkout whose source
changed since the last install runs the Python definition instead of a stale build
(shared/native.py, shared/compiled_modules.py). Everything else is in pyproject.toml.
"""

import importlib.util
import json
import os
import shutil
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
TOP_PACKAGES = ("kvemu", "router", "replica", "shared", "loadgen", "sim")  # pyproject.toml's packages.find
# shared/native.py lists each C extension's sources and digests them; it needs only the stdlib
_spec = importlib.util.spec_from_file_location("native", HERE / "shared" / "native.py")
native = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(native)


def extension(name: str) -> Extension:
    """The C extension ``name`` (a key of ``native.SOURCES``), carrying the digest of its sources."""
    files = native.SOURCES[name]
    return Extension(name, [file for file in files if file.endswith(".c")], optional=True, extra_compile_args=["-O2"],
                     depends=list(files), define_macros=[("SOURCE_SHA256", f'"{native.source_digest(HERE, name)}"')])


_spec = importlib.util.spec_from_file_location("compiled_modules", HERE / "shared" / "compiled_modules.py")
compiled_modules = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compiled_modules)


def mypyc_extensions() -> list[Extension]:
    """The scheduler step and simulator loop compiled by mypyc, or none (no mypyc, no C compiler, or
    KVEMU_MYPYC=0): kvemu then runs them from source, as fast as before."""
    if os.environ.get("KVEMU_MYPYC", "1") == "0":
        return []
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if not (shutil.which(cc) or shutil.which("cc") or shutil.which("gcc")):
        print("kvemu: no C compiler: the scheduler runs from its Python source", file=sys.stderr)
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("kvemu: no mypyc: the scheduler runs from its Python source", file=sys.stderr)
        return []
    paths = [str(compiled_modules.source_path(m, Path("."))) for m in compiled_modules.MODULES]
    try:
        exts = mypycify(paths, opt_level="3")
    except (SystemExit, Exception) as exc:  # mypyc type-checks first: a type error is no reason to fail the install
        print(f"kvemu: mypyc could not compile the scheduler ({exc!r}): it runs from its Python source; the"
              " compiled-build test (KVEMU_REQUIRE_COMPILED=1) names the module", file=sys.stderr)
        return []
    for ext in exts:
        ext.optional = True  # a failed compile leaves the Python source running (the digest is not written)
    return exts


class BuildExt(build_ext):
    """After the build: the digest of the sources the mypyc modules were built from, beside them,
    only where every one of them was built (shared/compiled_modules.py reads it)."""

    def run(self) -> None:
        super().run()
        names = set(compiled_modules.MODULES)
        if self.inplace or getattr(self, "editable_mode", False):
            self._remove_stale(names)
        outputs = {ext.name: Path(self.get_ext_fullpath(ext.name)) for ext in self.extensions if ext.name in names}
        if len(outputs) != len(names) or not all(p.exists() for p in outputs.values()):
            return
        record = json.dumps({"sources_sha256": compiled_modules.source_digest(HERE),
                             "modules": list(compiled_modules.MODULES)}) + "\n"
        # beside the outputs (a wheel's build tree), and in the source tree for an editable install
        # (setuptools copies the modules there; the finder reads the digest there)
        first = compiled_modules.MODULES[0]
        roots = {outputs[first].parents[len(first.split(".")) - 1]}
        if self.inplace or getattr(self, "editable_mode", False):
            roots.add(HERE)
        for root in roots:
            target = root / compiled_modules.DIGEST_FILE
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(record)


    def _remove_stale(self, names: set[str]) -> None:
        """An editable tree keeps what earlier builds put beside the sources: a module dropped from the set
        would still load its old build (and that build's runtime library, gone), so those files go."""
        keep = {Path(self.get_ext_fullpath(ext.name)).name for ext in self.extensions}
        for top in TOP_PACKAGES:  # every package, not only the set's: a module may leave its package's last
            for built in HERE.joinpath(top).rglob("*.cpython-*.so"):
                stem = built.name.split(".", 1)[0]
                module = ".".join((*built.parent.relative_to(HERE).parts, stem))
                if module not in names and (built.parent / (stem + ".py")).exists():  # a C extension has no .py
                    built.unlink()
        for runtime in HERE.glob("*__mypyc.cpython-*.so"):
            if runtime.name not in keep:
                runtime.unlink()


setup(ext_modules=[*map(extension, native.SOURCES), *mypyc_extensions()], cmdclass={"build_ext": BuildExt})
