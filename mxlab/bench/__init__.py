"""Speed benchmarks behind `mxlab bench ...` (CUDA): ratios against baselines measured in the same run."""
