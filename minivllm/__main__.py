"""`python -m minivllm serve MODEL`: the same as the `minivllm` command."""
from .cli import main

main()
