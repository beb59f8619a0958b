"""The flags that choose the device a command prices time on: ``--gpu NAME|FILE.json``,
``--gpu-file FILE`` (a profile from ``kvemu calibrate``) and ``--tp N``."""

from __future__ import annotations

import argparse
import os

from shared.devprofile import is_profile_path, load_profile
from shared.errors import InputError
from shared.gpu_presets import GPUS, get_gpu, split_tp


def add_gpu_args(p) -> None:
    """``--gpu NAME|FILE.json``, ``--gpu-file FILE`` and ``--tp N``, for every command that prices time."""
    p.add_argument("--gpu", default="h200",
                   help=f"GPU preset ({', '.join(GPUS)}) or a device profile from `kvemu calibrate`; a card without"
                        " NVLink prices --tp's all-reduce on its PCIe link")
    p.add_argument("--gpu-file", dest="gpu", default=argparse.SUPPRESS, metavar="FILE",
                   help="a device profile written by `kvemu calibrate` (the same as --gpu FILE)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs per replica (splits the work; adds all-reduces)")


def gpu_setting(args) -> str:
    """The one string the settings carry: a preset name or an absolute profile path, with ``@tpN``."""
    base, tp = split_tp(args.gpu)
    tp = getattr(args, "tp", 1) if getattr(args, "tp", 1) != 1 else tp
    if not isinstance(tp, int) or tp < 1:
        raise InputError("--tp", f"must be an integer >= 1, got {tp!r}")
    if is_profile_path(base):
        base = os.path.abspath(base)
        load_profile(base)  # a bad file fails here, naming the flag
    else:
        get_gpu(base)
    return with_tp(base, tp)


def with_tp(base: str, tp: int) -> str:
    """``NAME@tpN`` (``NAME`` alone for one GPU): how ``--tp`` travels inside the gpu setting, the inverse of
    ``shared.costmodel.split_tp``."""
    return base if tp == 1 else f"{base}@tp{tp}"
