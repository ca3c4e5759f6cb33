"""Decode-time kernels for the OCRia engine.

Each op lives in its own module with a plain-torch reference `<op>_ref`, a Triton launcher `<op>_triton` and a
dispatcher `<op>` (Triton for CUDA tensors or when OCRIA_FORCE_TRITON=1, otherwise the reference).
Ops never synchronise with the host, so they can be captured in CUDA graphs.
"""
