"""A GGUF checkpoint written again with its matrices in another tensor type, so that llama.cpp
serves exactly the weights pdserve does: pdserve dequantizes a GGUF at load, so its fp32 weights
are those of the F32 file written from the same checkpoint.

The metadata (tokenizer, chat template, hyper-parameters) is copied as it is, but for the file
type, which names the new one; 1-D tensors (norms, biases) stay F32, as llama.cpp's converter
keeps them.
"""

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter, Keys, LlamaFileType
from gguf.quants import dequantize, quantize

from pdserve.engine.gguf_checkpoint import metadata, open_gguf

Q = GGMLQuantizationType
# --weights NAME -> the matrices' tensor type and the file type the header says.
TARGETS = {
    "f32": (Q.F32, LlamaFileType.ALL_F32),
    "f16": (Q.F16, LlamaFileType.MOSTLY_F16),
    "q8_0": (Q.Q8_0, LlamaFileType.MOSTLY_Q8_0),
}
# Written by GGUFWriter itself (the header's counts, the architecture) or replaced (file type).
NOT_COPIED = (Keys.General.ARCHITECTURE, Keys.General.FILE_TYPE, Keys.General.ALIGNMENT)


def _stored(weights: np.ndarray, qtype: Q) -> np.ndarray:
    if weights.ndim == 1 or qtype == Q.F32:
        return weights.astype(np.float32)
    if qtype == Q.F16:
        return weights.astype(np.float16)
    return quantize(weights, qtype)


def retype(src: Path, dst: Path, target: str) -> Path:
    """Writes ``src``'s checkpoint to ``dst`` with its matrices as ``target`` (a key of
    ``TARGETS``); returns ``dst``."""
    if target not in TARGETS:
        raise ValueError(f"unknown weight type {target!r}; choose one of: {', '.join(TARGETS)}")
    qtype, file_type = TARGETS[target]
    reader = open_gguf(src)
    writer = GGUFWriter(dst, metadata(reader, Keys.General.ARCHITECTURE))
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in NOT_COPIED:
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type)
    writer.add_file_type(file_type)
    for tensor in reader.tensors:
        data = _stored(dequantize(tensor.data, tensor.tensor_type), qtype)
        writer.add_tensor(tensor.name, data, raw_dtype=None if data.dtype != np.uint8 else qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst
