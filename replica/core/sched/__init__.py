"""The continuous-batching scheduler: admission, chunked prefill, decode KV, preemption."""
