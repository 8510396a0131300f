"""The core: what happens to requests, with no tensor in sight.

- `sequence.py`: one request's tokens and state;
- `block_manager.py`: the paged KV pool's books (blocks, reference counts, prefix hashes, sliding-window release);
- `scheduler.py`: continuous batching, chunked prefill, preemption; which tokens each step computes;
- `detokenizer.py`: text that grows token by token, and stop strings.
"""
