"""Which kind of checkpoint a model path names: an HF folder (``config.json``, safetensors and
``tokenizer.json``) or a GGUF file (a ``.gguf`` path, or a folder holding one and no
``config.json``). Reads no file, so the router can ask without loading anything."""

from pathlib import Path

from pdserve.engine.errors import CheckpointError

GGUF_SUFFIX = ".gguf"
HF_CONFIG_FILE = "config.json"
# Beside config.json; an HF checkpoint's stop ids and request defaults (a GGUF file has none).
GENERATION_CONFIG_FILE = "generation_config.json"


def gguf_file(path: str | Path) -> Path | None:
    """The GGUF file ``path`` names, or None for an HF checkpoint folder."""
    path = Path(path)
    if path.suffix == GGUF_SUFFIX and not path.is_dir():
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {path}")
        return path
    if not path.is_dir() or (path / HF_CONFIG_FILE).is_file():
        return None
    found = sorted(p for p in path.glob(f"*{GGUF_SUFFIX}") if p.is_file())
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise CheckpointError(f"{path} holds several GGUF files ({names}): pass one of them")
    return found[0] if found else None
