"""Eviction policies by name. Add one: write a class in this package and register it here."""

from __future__ import annotations

import importlib

from replica.core.cache.policies.base import Access, EvictionPolicy
from shared.errors import InputError, UnknownNameError

# name -> "module:Class", imported on first use so a new policy costs nothing until chosen
_REGISTRY: dict[str, str] = {
    "lru": "replica.core.cache.policies.lru:LRUPolicy",
    "s3fifo": "replica.core.cache.policies.s3fifo:S3FIFOPolicy",
    "arc": "replica.core.cache.policies.arc:ARCPolicy",
    "adaptive": "replica.core.cache.policies.adaptive:AdaptivePolicy",
    "session_lru": "replica.core.cache.policies.session_lru:SessionLRUPolicy",
    "random_compute": "replica.core.cache.policies.random_compute:RandomComputePolicy",
    "partial_node": "replica.core.cache.policies.partial_node:PartialNodePolicy",
    "belady": "replica.core.cache.policies.belady:BeladyPolicy",
    "belady_compute": "replica.core.cache.policies.belady:BeladyComputePolicy",
}

def policy_names() -> list[str]:
    return sorted(_REGISTRY)


def policy_class(name: str) -> type[EvictionPolicy]:
    key = name.strip().lower()
    if key not in _REGISTRY:
        raise UnknownNameError("policy", name, list(_REGISTRY))
    module_name, _, cls_name = _REGISTRY[key].partition(":")
    return getattr(importlib.import_module(module_name), cls_name)


def make_policy(name: str, **params) -> EvictionPolicy:
    cls = policy_class(name)
    try:
        return cls(**params)
    except TypeError as exc:  # an unknown or missing parameter name
        raise InputError("params", f"{name}: {exc}") from None


__all__ = ["Access", "EvictionPolicy", "make_policy", "policy_class", "policy_names"]
