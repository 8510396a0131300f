"""`python -m minivllm.executor`: one worker rank of a tensor-parallel engine (the engine starts it).

Its stdout is the line back to rank 0, so it is set aside first, and anything the worker prints
goes to stderr instead."""
import os

reply = os.fdopen(os.dup(1), "wb")
os.dup2(2, 1)

from .workers import worker_main  # noqa: E402

worker_main(reply)
