"""`python -m minivllm`: the `minivllm` command."""
from .cli import main

main()
