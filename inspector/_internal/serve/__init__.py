"""Will it serve? Parallel plans and memory per GPU for the serving engines (vLLM, SGLang),
from the stored tensors and config.json, before a GPU is rented (`ckpt-inspect fit`)."""
