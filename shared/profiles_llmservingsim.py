"""LLMServingSim's operator profiles (casys-kaist/LLMServingSim, MIT) as measured steps for the fit.

Its profiler runs vLLM with ``enforce_eager`` on a one-layer copy of the model and records each
module's CUDA kernel time (vLLM's layerwise profile), in microseconds, under
``perf/<hw>/<org>/<model>/<dtype>/``: ``meta.yaml`` (versions, the engine's arguments, the per-rank
shape in ``hf_overrides``) and, per tensor-parallel degree, ``tp<N>/dense.csv`` (each layer kind
by token count), ``attention.csv`` (prefill chunk, its KV, decoders, each decoder's KV ->
time), ``per_sequence.csv`` (LM head and sampler by sequences), ``moe.csv`` (MoE block by tokens
and experts touched; MoE models only) and ``skew.csv`` (batches whose decoders hold uneven
contexts). A step is priced as LLMServingSim's simulator prices it: the embedding and the final
norm once, every layer's operators (both RMSNorms, QKV, optional QK norm, rotary, attention, output
projection, the MLP or the MoE block) times the model's layers, and the LM head and sampler once
over the step's sequences; each operator interpolated linearly in its token or sequence count.

Each row of ``attention.csv`` becomes one step; ``skew.csv`` is a held-out check of the form (the
cost model prices only the decoders' total KV, as if each held the mean context).
What the times are not: launch gaps (kernel times only, so neither eager mode's CPU launches nor
a CUDA graph's smaller gaps are in them) and tensor-parallel all-reduces (one GPU runs a rank's
shapes). docs/calibration.md says what that means for a serving run.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from shared.costfit import StepPoint
from shared.costmodel import ModelSpec
from shared.errors import InputError
from shared.moe_cost import MoeTable

FIELD = "--from-profile"
PER_LAYER = ("layernorm", "qkv_proj", "qk_norm", "rotary_emb", "o_proj", "gate_up_proj", "act_fn", "down_proj")
TWICE = ("layernorm",)  # the input and post-attention RMSNorms: one catalog entry, two calls a layer
ONCE = ("embedding", "final_layernorm")
REQUIRED = ("embedding", "final_layernorm", "layernorm", "qkv_proj", "rotary_emb", "o_proj")
DENSE_MLP = ("gate_up_proj", "act_fn", "down_proj")


@dataclass(frozen=True, slots=True)
class OperatorProfile:
    """One profile folder at one tensor-parallel degree, times in microseconds."""

    folder: str
    tp: int
    meta: dict
    dense: dict[str, tuple[np.ndarray, np.ndarray]]  # layer -> (tokens, us)
    per_sequence: dict[str, tuple[np.ndarray, np.ndarray]]  # lm_head, sampler -> (sequences, us)
    attention: np.ndarray  # rows of prefill_chunk, kv_prefill, n_decode, kv_decode, us
    moe: np.ndarray | None  # rows of tokens, activated_experts, us
    skew: np.ndarray | None  # rows of n, nb, pc, kp, kvs, kv_big, t_mean_us, t_skew_us

    @property
    def device(self) -> str:
        return str(self.meta.get("gpu") or self.meta.get("hardware") or "")

    @property
    def limits(self) -> tuple[int, int]:
        """The engine's max_num_batched_tokens and max_num_seqs the grid was swept under."""
        eng = self.meta.get("engine_effective") or {}
        return int(eng.get("max_num_batched_tokens") or 2048), int(eng.get("max_num_seqs") or 256)


def find_folder(path: str) -> str:
    """The folder holding ``meta.yaml``: ``path`` itself, or the one such folder below it."""
    if os.path.isfile(os.path.join(path, "meta.yaml")):
        return path
    if not os.path.isdir(path):
        raise InputError(FIELD, f"{path}: no such folder")
    found = sorted(root for root, _, files in os.walk(path) if "meta.yaml" in files)
    if not found:
        raise InputError(FIELD, f"{os.path.join(path, 'meta.yaml')}: missing (no LLMServingSim profile below {path})")
    if len(found) > 1:
        raise InputError(FIELD, f"{path} holds {len(found)} profiles; name one: {', '.join(found[:4])}")
    return found[0]


def read_profile(path: str, tp: int = 1) -> OperatorProfile:
    folder = find_folder(path)
    meta_path = os.path.join(folder, "meta.yaml")
    with open(meta_path) as fh:
        meta = parse_meta(fh.read(), meta_path)
    tp_dir = os.path.join(folder, f"tp{tp}")
    profiled = sorted(d for d in os.listdir(folder) if d.startswith("tp") and d[2:].isdigit())
    if not os.path.isdir(tp_dir):
        raise InputError(FIELD, f"{os.path.join(tp_dir, 'dense.csv')}: missing: no profile for --tp {tp} "
                                f"(this one has {', '.join(profiled) or 'none'})")
    dense = _by_layer(os.path.join(tp_dir, "dense.csv"), "tokens")
    per_seq = _by_layer(os.path.join(tp_dir, "per_sequence.csv"), "sequences")
    attention = _table(os.path.join(tp_dir, "attention.csv"),
                       ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"))
    for name in REQUIRED:
        if name not in dense:
            raise InputError(FIELD, f"{os.path.join(tp_dir, 'dense.csv')}: no row for layer {name!r}")
    for name in ("lm_head", "sampler"):
        if name not in per_seq:
            raise InputError(FIELD, f"{os.path.join(tp_dir, 'per_sequence.csv')}: no row for {name!r}")
    moe_path, skew_path = os.path.join(tp_dir, "moe.csv"), os.path.join(tp_dir, "skew.csv")
    if not os.path.exists(moe_path) and os.path.exists(os.path.join(folder, "tp1", "moe.csv")):
        # the profiler times the expert block at tp 1 only; its simulator reads that file at every degree
        moe_path = os.path.join(folder, "tp1", "moe.csv")
    moe = _table(moe_path, ("tokens", "activated_experts", "time_us")) if os.path.exists(moe_path) else None
    skew = (_table(skew_path, ("n", "nb", "pc", "kp", "kvs", "kv_big", "t_mean_us", "t_skew_us"))
            if os.path.exists(skew_path) else None)
    return OperatorProfile(folder, tp, meta, dense, per_seq, attention, moe, skew)


def check_model(profile: OperatorProfile, spec: ModelSpec) -> None:
    """Refuse a model whose shape is not the profiled one (``hf_overrides`` is one rank's shape at
    one of the profiled degrees: every field must be the model's divided by that degree)."""
    where = os.path.join(profile.folder, "meta.yaml")
    over = (profile.meta.get("engine_effective") or {}).get("hf_overrides") or {}
    pairs = {"num_attention_heads": spec.q_heads, "num_key_value_heads": spec.kv_heads, "vocab_size": spec.vocab}
    if not spec.moe:  # an MoE config's intermediate_size is not its experts' width
        pairs["intermediate_size"] = spec.intermediate
    degrees = profile.meta.get("tp_degrees") or [profile.tp]
    for t in degrees if isinstance(degrees, list) else [degrees]:
        if all(key not in over or int(over[key]) * int(t) == want for key, want in pairs.items()):
            break
    else:
        got = ", ".join(f"{k} {over[k]}" for k in pairs if k in over)
        raise InputError(FIELD, f"{where}: the profiled model ({profile.meta.get('model')}: {got} a rank at tp "
                                f"{degrees}) is not --model {spec.name}'s shape")
    if spec.moe and profile.moe is None:
        raise InputError(FIELD, f"{os.path.join(profile.folder, f'tp{profile.tp}', 'moe.csv')}: missing "
                                f"(--model {spec.name} is a mixture of experts)")
    if not spec.moe:
        for name in DENSE_MLP:
            if name not in profile.dense:
                raise InputError(FIELD, f"{os.path.join(profile.folder, f'tp{profile.tp}', 'dense.csv')}: "
                                        f"no row for layer {name!r}")


def interp(x: np.ndarray, y: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Linear in ``x``, extended from the two last (or first) samples outside the grid."""
    at = np.asarray(at, dtype=float)
    if len(x) == 1:
        return np.full(at.shape, float(y[0]))
    out = np.interp(at, x, y)
    hi, lo = at > x[-1], at < x[0]
    out[hi] = y[-1] + (y[-1] - y[-2]) / (x[-1] - x[-2]) * (at[hi] - x[-1])
    out[lo] = y[0] + (y[1] - y[0]) / (x[1] - x[0]) * (at[lo] - x[0])
    return out


def _moe_us(profile: OperatorProfile, spec: ModelSpec, tokens: np.ndarray) -> np.ndarray:
    """The MoE block of steps of ``tokens`` tokens over the experts they touch (uniform routing), as kvemu
    prices it (shared/moe_cost.py): linear in tokens, then in experts; one rank of ``--tp N`` at tokens / N
    and experts / N (its simulator splits the experts over the ranks and looks each rank's share up)."""
    assert profile.moe is not None
    table, tp = MoeTable.of(profile.moe.tolist()), profile.tp
    return np.array([table.us_at(t / tp, spec.touched_experts(int(t)) / tp) for t in tokens])


def step_us(profile: OperatorProfile, spec: ModelSpec, tokens: np.ndarray, sequences: np.ndarray,
            attention_us: np.ndarray) -> np.ndarray:
    """Steps of ``tokens`` tokens over ``sequences`` sequences through every layer, in us (arrays, one a step)."""
    d = profile.dense
    layer = np.asarray(attention_us, dtype=float).copy()
    for name in PER_LAYER:
        if name in d and not (spec.moe and name in DENSE_MLP):
            layer += interp(*d[name], tokens) * (2 if name in TWICE else 1)
    if spec.moe:
        layer += _moe_us(profile, spec, tokens)
    once = sum(interp(*d[name], tokens) for name in ONCE)
    head = sum(interp(*profile.per_sequence[name], sequences) for name in ("lm_head", "sampler"))
    return spec.layers * layer + once + head


def kind_of(point: StepPoint) -> str:
    if not point.contexts:
        return "prefill"
    return "mixed" if point.chunks else "decode"


Shape = tuple[tuple[tuple[int, int], ...], tuple[int, ...], float]  # chunks, decoder contexts, attention us


def steps(profile: OperatorProfile, spec: ModelSpec, kv_capacity: int) -> dict[str, list[StepPoint]]:
    """Every grid point of attention.csv a serving run of this engine could execute as one step: at
    most the profile's max_num_batched_tokens and max_num_seqs, and a KV footprint (prefix, chunk
    and every decoder's context) within ``kv_capacity`` tokens. By kind: prefill, decode, mixed."""
    grid: list[Shape] = []
    for pc, kp, nd, kvd, us in profile.attention.tolist():
        grid.append((((int(pc), int(kp)),) if pc else (), (int(kvd),) * int(nd), us))
    out: dict[str, list[StepPoint]] = {"prefill": [], "decode": [], "mixed": []}
    for point in _points(profile, spec, grid, kv_capacity):
        out[kind_of(point)].append(point)
    return out


def skew_errors(profile: OperatorProfile, kv_capacity: int) -> list[float]:
    """What pricing a batch's decoders by their total KV alone (every decoder at the mean context, the
    cost model's form) misses on skew.csv's uneven batches: the attention kernel's time at the mean
    over its time at the actual mix, less 1, per row a serving run could execute. skew.csv's own
    times are taken another way than attention.csv's (a uniform batch there is slower than the same
    batch here), so only the ratio within a row is compared."""
    if profile.skew is None:
        return []
    budget, max_seqs = profile.limits
    out = []
    for n, nb, pc, kp, kvs, big, t_mean, t_skew in profile.skew.tolist():
        if pc + n <= budget and n <= max_seqs and pc + kp + nb * big + (n - nb) * kvs <= kv_capacity and t_skew > 0:
            out.append(t_mean / t_skew - 1)
    return out


def _points(profile: OperatorProfile, spec: ModelSpec, shapes: list[Shape], kv_capacity: int) -> list[StepPoint]:
    budget, max_seqs = profile.limits
    kept = [(c, d, us) for c, d, us in shapes
            if 0 < sum(n for n, _ in c) + len(d) <= budget and len(d) <= max_seqs
            and sum(n + k for n, k in c) + sum(d) <= kv_capacity]
    tokens = np.array([sum(n for n, _ in c) + len(d) for c, d, _ in kept], dtype=float)
    seqs = np.array([len(c) + len(d) for c, d, _ in kept], dtype=float)
    secs = step_us(profile, spec, tokens, seqs, np.array([us for *_, us in kept])) * 1e-6
    return [StepPoint(c, d, float(s)) for (c, d, _), s in zip(kept, secs)]


# ---- the files --------------------------------------------------------------------------------------
def _rows(path: str, columns: tuple[str, ...]) -> Iterator[tuple[int, list[str]]]:
    try:
        fh = open(path, newline="")
    except OSError:
        raise InputError(FIELD, f"{path}: missing") from None
    with fh:
        reader = csv.reader(fh)
        header = next(reader, None) or []
        missing = [c for c in columns if c not in header]
        if missing:
            raise InputError(FIELD, f"{path}: no column {missing[0]!r} (expected {', '.join(columns)})")
        idx = [header.index(c) for c in columns]
        for line, row in enumerate(reader, start=2):
            if row:
                yield line, [row[i] if i < len(row) else "" for i in idx]


def _number(path: str, line: int, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InputError(FIELD, f"{path}:{line}: {text!r} is not a number") from None
    if not np.isfinite(value) or value < 0:
        raise InputError(FIELD, f"{path}:{line}: {text!r} must be a finite number >= 0")
    return value


def _table(path: str, columns: tuple[str, ...]) -> np.ndarray:
    rows = [[_number(path, line, v) for v in values] for line, values in _rows(path, columns)]
    if not rows:
        raise InputError(FIELD, f"{path}: no rows")
    return np.array(rows, dtype=float)


def _by_layer(path: str, count_column: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """layer -> (counts ascending, times), from (layer, count, time_us) rows."""
    acc: dict[str, list[tuple[float, float]]] = {}
    for line, (name, count, us) in _rows(path, ("layer", count_column, "time_us")):
        acc.setdefault(name, []).append((_number(path, line, count), _number(path, line, us)))
    out = {}
    for name, pts in acc.items():
        pts.sort()
        out[name] = (np.array([p[0] for p in pts]), np.array([p[1] for p in pts]))
    return out


def parse_meta(text: str, path: str) -> dict:
    """The block-style YAML subset ``meta.yaml`` is written in: nested mappings by indentation,
    scalars, quoted strings and ``[a, b]`` lists (PyYAML is not a dependency)."""
    root: dict = {}
    stack: list[tuple[int, dict]] = [(-1, root)]
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.split(" #")[0].rstrip()
        if not line.strip() or line.lstrip().startswith(("#", "- ")):
            continue
        indent = len(line) - len(line.lstrip())
        key, sep, value = line.strip().partition(":")
        if not sep:
            raise InputError(FIELD, f"{path}:{n}: expected 'key: value', got {raw.strip()!r}")
        while indent <= stack[-1][0]:
            stack.pop()
        parent = stack[-1][1]
        if value.strip():
            parent[key] = _scalar(value.strip())
        else:
            parent[key] = {}
            stack.append((indent, parent[key]))
    return root


def _scalar(text: str):
    if text.startswith("[") and text.endswith("]"):
        return [_scalar(v.strip()) for v in text[1:-1].split(",") if v.strip()]
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "null": None}.get(text, text)
