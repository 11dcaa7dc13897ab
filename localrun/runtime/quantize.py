"""`localrun quantize`: llama.cpp's own quantizer (`llama_model_quantize`).

The output is written to a temporary file beside the destination, checked
(its GGUF header reads back, it carries the requested file type, llama.cpp
loads it) and only then renamed into place, so an interrupted or failed run
never leaves a half-written model under the requested name.
"""

from __future__ import annotations

import ctypes
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
from gguf import GGMLQuantizationType, LlamaFileType

from localrun.errors import BadModelError, EngineError, UsageError
from localrun.gguf.reader import read_gguf
from localrun.runtime import llama_log
from localrun.runtime.llama import native_call
from localrun.system import default_threads

# The file types offered: name -> llama_ftype (the names llama.cpp's quantize tool uses, lower case)
QUANT_TYPES: dict[str, int] = {
    "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
    "q4_1": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1,
    "q5_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_0,
    "q5_1": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_1,
    "q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
    "q2_k": llama_cpp.LLAMA_FTYPE_MOSTLY_Q2_K,
    "q3_k_s": llama_cpp.LLAMA_FTYPE_MOSTLY_Q3_K_S,
    "q3_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q3_K_M,
    "q3_k_l": llama_cpp.LLAMA_FTYPE_MOSTLY_Q3_K_L,
    "q4_k_s": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_S,
    "q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M,
    "q5_k_s": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_S,
    "q5_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_M,
    "q6_k": llama_cpp.LLAMA_FTYPE_MOSTLY_Q6_K,
    "f16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16,
    "bf16": llama_cpp.LLAMA_FTYPE_MOSTLY_BF16,
}
_FLOAT_TENSORS = {int(GGMLQuantizationType.F32), int(GGMLQuantizationType.F16), int(GGMLQuantizationType.BF16)}
_TENSOR_LINE = re.compile(rb"^\[\s*(\d+)/\s*(\d+)\]")


@dataclass(frozen=True)
class Quantized:
    path: Path
    type: str
    input_bytes: int
    output_bytes: int
    seconds: float


def file_type_name(ftype: int | None) -> str:
    if ftype is None:
        return "unknown"
    try:
        return LlamaFileType(ftype).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        return f"type {ftype}"


def _check_request(src: Path, dst: Path, qtype: str, force: bool, allow_requantize: bool) -> int:
    ftype = QUANT_TYPES.get(qtype.lower())
    if ftype is None:
        raise UsageError(f"unknown quantization type {qtype!r}", hint=f"use one of: {', '.join(QUANT_TYPES)}")
    info = read_gguf(src)  # a missing or damaged input is reported here
    if dst.is_dir():
        raise UsageError(f"{dst} is a directory", hint="give the output file's name, e.g. model-q8_0.gguf")
    if dst.exists() and dst.resolve() == src.resolve():
        raise UsageError("the output would overwrite the input", hint="give another output file name")
    if dst.exists() and not force:
        raise UsageError(f"{dst} already exists", hint="pass --force to overwrite it")
    if not dst.parent.is_dir():
        raise UsageError(f"the folder {dst.parent} does not exist", hint="create it first")
    quantized = sorted({t.type for t in info.tensors if len(t.shape) > 1 and t.type not in _FLOAT_TENSORS})
    if quantized and not allow_requantize:
        names = ", ".join(GGMLQuantizationType(t).name for t in quantized)
        raise UsageError(
            f"{src.name} is already quantized ({names}); quantizing it again loses more quality than "
            "quantizing from the original 16- or 32-bit weights",
            hint="start from an f16/f32 GGUF, or pass --allow-requantize",
        )
    return ftype


def _verify(path: Path, ftype: int, qtype: str, errors: list[str]) -> None:
    """The output reads back, says it is the requested type, and llama.cpp loads it."""
    info = read_gguf(path)
    written = info.metadata.get("general.file_type")
    if written != ftype:
        raise BadModelError(
            f"llama.cpp wrote a {file_type_name(written)} file, not {qtype}",
            hint="this llama.cpp build may not support that type for this model",
        )
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0
    with native_call():
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise BadModelError(
            f"the quantized file does not load: {errors[-1] if errors else 'unknown error'}",
            hint="report this with the input file's details (localrun show)",
        )
    with native_call():
        llama_cpp.llama_model_free(model)


def quantize(
    src: Path,
    dst: Path,
    qtype: str,
    *,
    force: bool = False,
    allow_requantize: bool = False,
    threads: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    verbose: bool = False,
) -> Quantized:
    """Quantize ``src`` into ``dst`` as ``qtype``. ``progress(done, total)``
    is called per tensor, from llama.cpp's own log of its work."""
    ftype = _check_request(src, dst, qtype, force, allow_requantize)
    llama_log.init_backend()

    errors: list[str] = []

    def on_log(level: int, text: bytes) -> None:
        if level == llama_log.LEVEL_ERROR and text.strip(b"=\n "):
            errors.append(text.decode("utf-8", errors="replace").strip())
        found = _TENSOR_LINE.match(text)
        if found and progress is not None:  # logged as each tensor starts
            progress(int(found.group(1)) - 1, int(found.group(2)))

    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = threads or default_threads()
    params.ftype = ftype
    params.allow_requantize = allow_requantize
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.partial")
    start = time.perf_counter()
    try:
        llama_log.set_verbose(verbose)
        with llama_log.listening(on_log):
            with native_call():  # Ctrl-C while it works: raised when it returns, and the partial file goes
                status = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
            if status != 0:
                raise EngineError(
                    f"llama.cpp could not quantize {src.name} to {qtype}: {errors[-1] if errors else status}",
                    hint="run with --verbose to see llama.cpp's log",
                )
            _verify(tmp, ftype, qtype, errors)
        tmp.replace(dst)
    finally:
        tmp.unlink(missing_ok=True)
    return Quantized(
        path=dst,
        type=qtype.lower(),
        input_bytes=src.stat().st_size,
        output_bytes=dst.stat().st_size,
        seconds=time.perf_counter() - start,
    )
