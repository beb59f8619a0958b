"""A model's config.json written where a test can pass it as --model."""

import json
from pathlib import Path


def config_file(tmp_path: Path, name: str, config: dict) -> str:
    """``config`` as ``tmp_path/name/config.json``; its path."""
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    return str(path)
