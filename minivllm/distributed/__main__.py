"""`python -m minivllm.distributed`: one worker rank of a tensor-parallel engine (the engine starts it)."""
from .workers import worker_main

worker_main()
