"""Run everything pytest collects (tests and notebooks) in smoke mode unless told otherwise:
tiny sizes, no progress bars. The GPU run of the notebooks sets MINIVLLM_SMOKE=0.

Without a GPU, Triton kernels run in Triton's interpreter on CPU tensors: the variable must be
set before triton is first imported, so it is set here, before any test module loads."""
import os

import torch

os.environ.setdefault("MINIVLLM_SMOKE", "1")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
