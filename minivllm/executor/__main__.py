"""`python -m minivllm.executor`: one worker rank of a tensor-parallel engine.

stdout carries replies to rank 0, so it is kept aside and prints go to stderr."""
import os

reply = os.fdopen(os.dup(1), "wb")
os.dup2(2, 1)

from .workers import worker_main  # noqa: E402

worker_main(reply)
