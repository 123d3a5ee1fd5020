"""The numerics contract: element formats and E8M0 (formats), the PyTorch reference (reference),
the random Hadamard transform (hadamard), and quant, the one door that validates a call and
dispatches it to a Triton kernel or the reference."""

# The version of the numerics' results: raised whenever a change gives other bits for the same call (a rounding,
# a scale rule, a kernel). Run records carry it; records of different versions are never merged into one study.
NUMERICS_VERSION = 1
