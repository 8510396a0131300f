"""Run everything pytest collects (tests and notebooks) in smoke mode unless told otherwise:
tiny sizes, no progress bars. The GPU run of the notebooks sets MINIVLLM_SMOKE=0."""
import os

os.environ.setdefault("MINIVLLM_SMOKE", "1")
