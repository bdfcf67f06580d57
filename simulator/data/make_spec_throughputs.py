#!/usr/bin/env python3
"""Builds spec_throughputs.csv: a second throughput table for kudos-sim, from public GPU specs.

Not measurements. Each model family's steps/s on a GPU is modelled roofline-style as
    k_family * compute^a * bandwidth^(1-a)
where compute is the peak the family uses (FP32 or dense FP16 tensor), a in [0, 1] says how
compute-bound it is, and k_family sets its scale. A family whose memory need exceeds a GPU's
memory has no entry there. Multi-GPU rows scale by n * eff^log2(n) (0.92 on one server, 0.75
spread over servers). Peak numbers are from the vendors' data sheets (dense, no sparsity).
Run: python3 make_spec_throughputs.py > spec_throughputs.csv
"""
import math

# name: (fp32 TFLOPS, dense fp16 tensor TFLOPS, memory GB/s, memory GB, release year)
GPUS = {
    "t4": (8.1, 65.0, 320.0, 16, 2018),
    "a10": (31.2, 125.0, 600.0, 24, 2021),
    "a100": (19.5, 312.0, 2039.0, 80, 2020),
    "h100": (67.0, 989.5, 3350.0, 80, 2022),
    "l40s": (91.6, 362.05, 864.0, 48, 2023),
}
# family: (precision, a, memory need GB, k, batch sizes)
FAMILIES = {
    "ResNet-50 FP32": ("fp32", 0.9, 10, 0.08, [32, 64]),
    "CycleGAN FP32": ("fp32", 1.0, 12, 0.05, [1]),
    "BERT-Large AMP": ("fp16", 0.6, 20, 0.02, [16, 32]),
    "GPT-2 Medium AMP": ("fp16", 0.2, 30, 0.01, [8, 16]),
    "DLRM": ("fp16", 0.05, 60, 0.01, [2048]),
    "wav2vec2 FP32": ("fp32", 0.7, 14, 0.03, [8]),
}
SCALES = [1, 2, 4, 8]


def tput(family, gpu):
    prec, a, mem, k, _ = FAMILIES[family]
    fp32, fp16, bw, gb, _ = GPUS[gpu]
    if mem > gb:
        return None
    compute = fp32 if prec == "fp32" else fp16
    return k * compute**a * bw ** (1 - a)


cols = []
for g in GPUS:
    cols += [f"{g}_steps_per_s", f"{g}_unconsolidated_steps_per_s"]
print("job_type,model,batch_size,scale_factor," + ",".join(cols))
for fam, (_, _, _, _, batches) in FAMILIES.items():
    for b in batches:
        # A larger batch takes proportionally longer per step (slightly sub-linear).
        bfac = (b / batches[0]) ** 0.9
        for n in SCALES:
            cells = []
            for g in GPUS:
                t = tput(fam, g)
                for eff in (0.92, 0.75):
                    if t is None:
                        cells.append("0.0")
                    else:
                        cells.append(f"{t / bfac * n * eff ** math.log2(n):.4f}")
            print(f"{fam} (batch size {b}),{fam},{b},{n}," + ",".join(cells))
