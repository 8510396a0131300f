"""The runner's persistent block table: each row holds its sequence's blocks however they grew (one block a
decode step, many at a prompt chunk, tails cut by rejected draft tokens), with freed blocks (-1) read as 0."""
import random
from types import SimpleNamespace

import torch

from minivllm.worker.block_table import BlockTable


def test_rows_follow_their_sequences_through_random_growth_cuts_and_releases():
    rng = random.Random(int(torch.randint(0, 2**31, ())))
    table = BlockTable(max_num_seqs=4, max_blocks_per_seq=32)
    seqs = {f"r{i}": SimpleNamespace(request_id=f"r{i}", block_table=[]) for i in range(4)}
    next_block = 0
    for _ in range(300):
        seq = seqs[rng.choice(sorted(seqs))]
        action = rng.random()
        if action < 0.5 and len(seq.block_table) < 32:   # a decode step: one block
            seq.block_table.append(next_block)
        elif action < 0.7:                               # a prompt chunk: several blocks at once
            n = rng.randint(2, 5)
            seq.block_table += list(range(next_block, next_block + n))[:32 - len(seq.block_table)]
        elif action < 0.8 and seq.block_table:           # a sliding window freed its first blocks
            for i in range(rng.randint(1, len(seq.block_table))):
                seq.block_table[i] = -1
        elif action < 0.9 and seq.block_table:           # rejected draft tokens: the tail goes
            kept = rng.randint(0, len(seq.block_table) - 1)
            del seq.block_table[kept:]
            table.truncate({seq.request_id: kept})
        else:                                            # finished: the row is given back, a newcomer takes it
            table.release([seq.request_id])
            seq.block_table = []
        next_block += 5
        row = table.row_of(seq)
        n = len(seq.block_table)
        # Blocks freed after they were written keep their old id in the table (attention never reads them).
        written = table.table[row, :n].tolist()
        assert [w for w, b in zip(written, seq.block_table) if b >= 0] == [b for b in seq.block_table if b >= 0]
    assert len(set(table.rows.values())) == len(table.rows)  # no two live sequences share a row


def test_a_freed_block_is_never_written_as_minus_one():
    table = BlockTable(max_num_seqs=2, max_blocks_per_seq=8)
    seq = SimpleNamespace(request_id="a", block_table=[-1, -1, 7])   # several at once
    assert table.table[table.row_of(seq), :3].tolist() == [0, 0, 7]
    seq.block_table.append(-1)                                        # one at a time
    assert table.table[table.row_of(seq), :4].tolist() == [0, 0, 7, 0]
