"""Kernels: every GPU and CPU kernel, with its sources (csrc/), and KernelOptions (options.py), the one object that
says which of them run.

- fused_ops.py: residual add + layer norm, bias + GELU in the product, one-row products, float8 quantization.
- decode_attention.py: a decode step's K/V write and self-attention in one Triton kernel.
- int8_attention.py (+ csrc/int8_attention.cu): cross-attention over the int8 cache, and its quantization.
- greedy_pick.py: a greedy step's token and log-probability in one pass.
- fp8.py: float8 products for the encoder (opt-in).
- cpu_kernels.py (+ csrc/cpu_decode.c): the native CPU decode kernels, built on first use.
- cpu_team.py: how many threads a CPU decode step runs on (the full team or one), measured as it runs.
- invariant_ops.py: batch-invariant GPU products, the encoder's convolutions and attention (each row's arithmetic
  whatever the batch).
- invariant_few_rows.py: the same products for up to 4 rows, the weight in shared memory before the wait (Gluon).
- encoder_attention.py: the encoder's self-attention, each (window, head, query block) computed alone.
- row_logsumexp.py: a row-invariant logsumexp on the GPU (the timestamp rules' comparison).
- timestamp_rules.py: the timestamp rules on the GPU in one kernel, a program per row.
- lora.py: a decode step's LoRA deltas, each row on its own adapter, in two Triton kernels per product.
- lora_merge.py: weights with adapters merged in (an encoder pass's runs of windows), several adapters a launch.

Each function falls back to torch where its kernel cannot run. Imports only torch, Triton and each other.
"""
