"""GPU types: the vendor-sheet figures a scenario's `device: {gpu: NAME}` stands for, each with its source.

Peaks are dense (no structured sparsity). `fp16_tflops` is the half-precision peak that
mixed-precision training uses: tensor cores with FP32 accumulate where the chip has
them (GeForce cards run that at half their FP16-accumulate rate), plain FP16 math on
Pascal. `fp32_tflops` is the single-precision (non-tensor) peak; `memory_bandwidth_gbs` the memory's. Where a sheet gives no
number, the source says how it is derived from ones it gives (cores x clock x rate).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPUType:
    name: str
    fp16_tflops: float
    fp32_tflops: float
    memory_gb: float
    memory_bandwidth_gbs: float  # GB/s: bounds memory-bound work (the optimizer step)
    source: str


GPU_TYPES: dict[str, GPUType] = {g.name: g for g in (
    GPUType("V100", 125.0, 15.7, 16, 900,
            "memory 900 GB/s HBM2 bandwidth; "
            "NVIDIA Tesla V100 datasheet (V100 SXM2: 125 TFLOPS tensor, 15.7 TFLOPS FP32, 16 GB HBM2), "
            "https://images.nvidia.com/content/technologies/volta/pdf/tesla-volta-v100-datasheet-letter-fnl-web.pdf"),
    GPUType("A100", 312.0, 19.5, 80, 2039,
            "memory 2039 GB/s (2,039 GB/s) HBM2e bandwidth; "
            "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM: 312 TFLOPS FP16 tensor dense, 19.5 TFLOPS FP32), "
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
            "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    GPUType("H100", 989.4, 67.0, 80, 3350,
            "memory 3350 GB/s (3.35 TB/s) HBM3 bandwidth; "
            "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM: 1,979 TFLOPS FP16 tensor with sparsity = 989.4 dense, "
            "67 TFLOPS FP32, 80 GB), https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"),
    GPUType("A40", 149.7, 37.4, 48, 696,
            "memory 696 GB/s bandwidth; "
            "NVIDIA A40 datasheet (149.7 TFLOPS FP16 tensor dense, 37.4 TFLOPS FP32, 48 GB GDDR6), "
            "https://images.nvidia.com/content/Solutions/data-center/a40/nvidia-a40-datasheet.pdf"),
    GPUType("T4", 65.0, 8.1, 16, 320,
            "memory 320 GB/s (320+ GB/s) bandwidth; "
            "NVIDIA T4 Tensor Core GPU datasheet (65 TFLOPS mixed precision FP16/FP32, 8.1 TFLOPS FP32, 16 GB), "
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/"
            "t4-tensor-core-datasheet-951643.pdf"),
    GPUType("P100", 21.2, 10.6, 16, 732,
            "memory 732 GB/s bandwidth; "
            "NVIDIA Tesla P100 datasheet (P100 SXM2: 21.2 TFLOPS FP16, 10.6 TFLOPS FP32, 16 GB; no tensor cores), "
            "https://images.nvidia.com/content/tesla/pdf/nvidia-tesla-p100-datasheet.pdf"),
    GPUType("RTX 3080", 59.5, 29.8, 10, 760,
            "memory 760 GB/s bandwidth; "
            "NVIDIA Ampere GA102 GPU architecture whitepaper v2, Table 2, RTX 3080 (dense FP16 tensor with FP32 "
            "accumulate 59.5 TFLOPS, FP32 29.8 TFLOPS, 10 GB GDDR6X), "
            "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf"),
    GPUType("TITAN V", 110.0, 14.9, 12, 653,
            "memory 653 GB/s (HetPipe Table 1); "
            "NVIDIA TITAN V product page (110 TFLOPS tensor, 12 GB HBM2; HetPipe ref. [38] and Table 1), FP32 = "
            "5120 CUDA cores x 2 x 1455 MHz boost = 14.9 TFLOPS, https://www.nvidia.com/en-us/titan/titan-v/"),
    GPUType("TITAN RTX", 130.0, 16.3, 24, 672,
            "memory 672 GB/s (HetPipe Table 1); "
            "NVIDIA TITAN RTX product page (130 TFLOPS tensor, 24 GB GDDR6; HetPipe ref. [37] and Table 1), FP32 = "
            "4608 CUDA cores x 2 x 1770 MHz boost = 16.3 TFLOPS, https://www.nvidia.com/en-us/titan/titan-rtx/"),
    GPUType("RTX 2060", 25.8, 6.45, 6, 336,
            "memory 336 GB/s (HetPipe Table 1); "
            "HetPipe Table 1 (1920 CUDA cores, 1680 MHz boost, 6 GB; NVIDIA GeForce RTX 2060 page, HetPipe ref. [35]) "
            "with the Turing whitepaper's per-SM rates: 240 tensor cores x 64 FP16 FMA x 2 x 1.68 GHz = 51.6 TFLOPS "
            "FP16-accumulate, half on GeForce with FP32 accumulate = 25.8; FP32 1920 x 2 x 1.68 GHz = 6.45, "
            "https://www.nvidia.com/en-us/geforce/graphics-cards/rtx-2060/"),
    GPUType("Quadro P4000", 5.3, 5.3, 8, 243,
            "memory 243 GB/s (HetPipe Table 1); "
            "NVIDIA Quadro P4000 datasheet (5.3 TFLOPS FP32, 8 GB GDDR5; HetPipe ref. [36] and Table 1); GP104 runs "
            "FP16 math at 1/64 rate, so mixed precision computes at the FP32 peak, "
            "https://www.nvidia.com/content/dam/en-zz/Solutions/design-visualization/productspage/quadro/"
            "quadro-desktop/quadro-pascal-p4000-data-sheet-us-nv-704358-r1.pdf"),
)}


def find_gpu(name: str) -> GPUType | None:
    """The table's entry for `name` (case and spacing ignored), or None."""
    key = " ".join(str(name).split()).lower()
    return next((g for n, g in GPU_TYPES.items() if n.lower() == key), None)
