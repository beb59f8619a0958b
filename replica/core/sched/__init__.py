"""The continuous-batching scheduler: admission, chunked prefill, decode KV, preemption."""

import shared  # noqa: F401, E402 - installs the compiled modules' finder before the scheduler is imported
