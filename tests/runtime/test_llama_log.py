"""llama.cpp's buffer-size log lines on each backend, as llama.cpp writes them
(its LLAMA_LOG_INFO format strings in llama-model.cpp, llama-kv-cache.cpp and
llama-context.cpp, with the buffer type names of ggml's backends)."""

from __future__ import annotations

from pathlib import Path

import pytest

from localrun.runtime import llama_log
from localrun.runtime.engine import Engine
from localrun.runtime.llama_log import DeviceBuffers, buffer_device, parse_device_buffers
from tests.helpers import engine_config

MIB = 1024 * 1024

# captured from the CPU build on gemma-3-270m (a sliding-window model: two KV caches)
CPU_LOG = """\
print_info: file size   = 235.16 MiB (7.36 BPW)
load_tensors:   CPU_Mapped model buffer size =   235.16 MiB
load_tensors:   CPU_REPACK model buffer size =    12.66 MiB
llama_context:        CPU  output buffer size =     1.00 MiB
llama_kv_cache:        CPU KV buffer size =     1.50 MiB
llama_kv_cache: size =    1.50 MiB (   512 cells,   3 layers,  1/1 seqs), K (f16):    0.75 MiB, V (f16):    0.75 MiB
llama_kv_cache:        CPU KV buffer size =     7.50 MiB
llama_kv_cache: size =    7.50 MiB (   512 cells,  15 layers,  1/1 seqs), K (f16):    3.75 MiB, V (f16):    3.75 MiB
sched_reserve:        CPU compute buffer size =   515.75 MiB
~llama_context:        CPU compute buffer size is 515.7520 MiB, matches expectation of 515.7520 MiB
"""

# a Qwen2.5 1.5B wholly on an NVIDIA GPU: the embeddings stay mapped on the host
CUDA_LOG = """\
load_tensors: offloading output layer to GPU
load_tensors: offloaded 29/29 layers to GPU
load_tensors:        CUDA0 model buffer size =   934.85 MiB
load_tensors:   CPU_Mapped model buffer size =   125.19 MiB
llama_context:  CUDA_Host  output buffer size =     0.58 MiB
llama_kv_cache:      CUDA0 KV buffer size =   112.00 MiB
llama_kv_cache: size =  112.00 MiB (  4096 cells,  28 layers,  1/1 seqs), K (f16):   56.00 MiB, V (f16):   56.00 MiB
sched_reserve:      CUDA0 compute buffer size =   299.75 MiB
sched_reserve:  CUDA_Host compute buffer size =    11.01 MiB
"""

# Apple Silicon: current builds name the device MTL0, older ones Metal
METAL_LOG = """\
load_tensors: offloaded 29/29 layers to GPU
load_tensors:   CPU_Mapped model buffer size =   125.19 MiB
load_tensors:  MTL0_Mapped model buffer size =   934.86 MiB
llama_context:        CPU  output buffer size =     0.58 MiB
llama_kv_cache:       MTL0 KV buffer size =   112.00 MiB
llama_kv_cache: size =  112.00 MiB (  4096 cells,  28 layers,  1/1 seqs), K (f16):   56.00 MiB, V (f16):   56.00 MiB
sched_reserve:       MTL0 compute buffer size =   299.75 MiB
sched_reserve:        CPU compute buffer size =    11.01 MiB
"""

OLD_METAL_LOG = """\
llm_load_tensors:        CPU buffer size =   125.19 MiB
load_tensors: Metal_Mapped model buffer size =   934.86 MiB
llama_kv_cache:      Metal KV buffer size =   112.00 MiB
sched_reserve:      Metal compute buffer size =   299.75 MiB
"""

# a Vulkan GPU holding 20 of 29 layers: the rest, and their KV cache, on the CPU
VULKAN_LOG = """\
load_tensors: offloaded 20/29 layers to GPU
load_tensors:      Vulkan0 model buffer size =   640.50 MiB
load_tensors:   CPU_Mapped model buffer size =   419.54 MiB
llama_context: Vulkan_Host  output buffer size =     0.58 MiB
llama_kv_cache:    Vulkan0 KV buffer size =    80.00 MiB
llama_kv_cache:        CPU KV buffer size =    32.00 MiB
llama_kv_cache: size =  112.00 MiB (  4096 cells,  28 layers,  1/1 seqs), K (f16):   56.00 MiB, V (f16):   56.00 MiB
sched_reserve:    Vulkan0 compute buffer size =   299.75 MiB
sched_reserve: Vulkan_Host compute buffer size =    15.01 MiB
"""


def mib(n: float) -> int:
    return round(n * MIB)


@pytest.mark.parametrize(
    ("name", "device"),
    [
        ("CPU", "CPU"),
        ("CPU_Mapped", "CPU"),
        ("CPU_REPACK", "CPU"),
        ("CUDA0", "CUDA0"),
        ("CUDA1", "CUDA1"),
        ("CUDA0_Split", "CUDA0"),
        ("CUDA_Host", "CPU"),
        ("ROCm0", "ROCm0"),
        ("MTL0", "MTL0"),
        ("MTL0_Mapped", "MTL0"),
        ("MTL0_Private", "MTL0"),
        ("Metal", "Metal"),
        ("Metal_Mapped", "Metal"),
        ("Vulkan0", "Vulkan0"),
        ("Vulkan_Host", "CPU"),
        ("RPC0[127.0.0.1:50052]", "RPC0"),  # ggml-rpc.cpp: the device's name, then its server's endpoint
        ("RPC1[10.0.0.2:50052]", "RPC1"),
    ],
)
def test_buffer_types_map_to_their_device(name: str, device: str) -> None:
    assert buffer_device(name) == device


def test_cpu_buffers_sum_on_the_host() -> None:
    assert parse_device_buffers(CPU_LOG) == (
        DeviceBuffers("CPU", model=mib(235.16) + mib(12.66), kv=mib(1.5) + mib(7.5), compute=mib(515.75), output=MIB),
    )


def test_cuda_buffers_split_between_the_gpu_and_pinned_host_memory() -> None:
    gpu, cpu = parse_device_buffers(CUDA_LOG)
    assert gpu == DeviceBuffers("CUDA0", model=mib(934.85), kv=mib(112), compute=mib(299.75))
    assert cpu == DeviceBuffers("CPU", model=mib(125.19), compute=mib(11.01), output=mib(0.58))
    assert gpu.total == mib(934.85) + mib(112) + mib(299.75)


def test_metal_buffers_in_current_and_older_names() -> None:
    cpu, gpu = parse_device_buffers(METAL_LOG)
    assert gpu == DeviceBuffers("MTL0", model=mib(934.86), kv=mib(112), compute=mib(299.75))
    assert cpu.device == "CPU" and cpu.compute == mib(11.01)
    # the old loader's line (no buffer kind) is not a buffer line of the current format
    assert parse_device_buffers(OLD_METAL_LOG) == (
        DeviceBuffers("Metal", model=mib(934.86), kv=mib(112), compute=mib(299.75)),
    )


def test_vulkan_partial_offload_keeps_the_kv_beside_its_layers() -> None:
    gpu, cpu = parse_device_buffers(VULKAN_LOG)
    assert gpu == DeviceBuffers("Vulkan0", model=mib(640.5), kv=mib(80), compute=mib(299.75))
    assert cpu == DeviceBuffers("CPU", model=mib(419.54), kv=mib(32), compute=mib(15.01), output=mib(0.58))


def feed(text: str) -> None:
    for line in text.splitlines(keepends=True):
        llama_log._on_log(2, line.encode(), None)  # type: ignore[arg-type]


def test_logged_buffers_keeps_its_cpu_contract() -> None:
    llama_log.logged_buffers()
    feed(CPU_LOG)
    # both of the sliding-window model's caches: its 3 full-attention layers' and its 15 window layers'
    assert llama_log.logged_buffers() == (mib(1.5 + 7.5), 512, mib(515.75))
    assert llama_log.logged_buffers() == (None, None, None)  # read once


def test_logged_buffers_count_the_last_context_only() -> None:
    llama_log.logged_buffers()
    context = CPU_LOG[CPU_LOG.index("llama_context:") :]
    window = context.replace("7.50 MiB (   512 cells", "0.75 MiB (   256 cells")  # a window cache of its own size
    feed(CPU_LOG + window)
    assert llama_log.logged_buffers() == (mib(1.5 + 0.75), 512, mib(515.75))
    feed("llama_kv_cache: size =    2.00 MiB (   256 cells,   3 layers,  1/1 seqs)\n")  # no context line before it
    assert llama_log.logged_buffers() == (mib(2), 256, None)


def test_logged_buffers_on_a_gpu_reports_the_whole_kv_and_no_host_compute() -> None:
    llama_log.logged_buffers()
    feed(CUDA_LOG)
    assert llama_log.logged_buffers() == (mib(112), 4096, None)


def test_device_buffers_follow_the_last_load() -> None:
    model, context = CUDA_LOG.split("llama_context:", 1)
    feed(model)
    llama_log.logged_buffers()  # what the engine does after a model load: the load's record stays
    feed("llama_context:" + context)
    assert [d.device for d in llama_log.device_buffers()] == ["CUDA0", "CPU"]
    assert llama_log.device_buffers()[0].kv == mib(112)  # reading forgets nothing
    feed("llama_context:" + context.replace("112.00 MiB", "224.00 MiB"))  # a second context on the same weights
    gpu, _ = llama_log.device_buffers()
    assert gpu.model == mib(934.85) and gpu.kv == mib(224)  # the model's, and the last context's
    feed(VULKAN_LOG)  # the next model's lines start a new record
    assert [d.device for d in llama_log.device_buffers()] == ["Vulkan0", "CPU"]
    assert llama_log.device_buffers()[0].model == mib(640.5)


def test_a_real_load_on_the_cpu_build_is_read_per_device(tiny_model: Path) -> None:
    with Engine(engine_config(tiny_model, n_ctx=512)) as engine:
        kv, compute = engine.kv_cache_bytes, engine.compute_buffer_bytes
    (cpu,) = llama_log.device_buffers()
    assert cpu.device == "CPU" and cpu.model > 0
    assert kv is not None and cpu.kv == kv
    assert compute is not None and cpu.compute == compute
