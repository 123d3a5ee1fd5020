"""The numerics contract: element formats and E8M0 (formats), the PyTorch reference (reference),
the random Hadamard transform (hadamard), and quant, the one door that validates a call and
dispatches it to a Triton kernel or the reference."""
