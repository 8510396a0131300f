"""Piecewise CUDA graphs of mixed steps, on the CPU: the token counts captured and the one a step takes; and the
runner's piecewise path (buffers, pieces, attention between them, padding rows that hold an earlier step's
values) with stand-ins for the captured graphs that run each piece at its replay. Real captures: tests/test_gpu.py."""
import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.worker.piecewise_graphs import MAX_PIECEWISE_TOKENS, PiecewiseGraphs, choose_size, token_ladder


def test_token_ladder_and_the_size_a_step_takes():
    ladder = token_ladder(8192)
    assert ladder[:5] == [8, 16, 32, 64, 128] and ladder[-1] == MAX_PIECEWISE_TOKENS
    assert all(b - a == 64 for a, b in zip(ladder[3:], ladder[4:]) if b <= 1024)
    assert all(b - a == 128 for a, b in zip(ladder, ladder[1:]) if a >= 1024)
    assert token_ladder(300) == [8, 16, 32, 64, 128, 192, 256, 300]  # the budget itself is the last size
    assert token_ladder(5) == [5]
    assert choose_size(ladder, 1) == 8 and choose_size(ladder, 8) == 8 and choose_size(ladder, 9) == 16
    assert choose_size(ladder, 256 + 512) == 768       # 256 decodes and a 512-token chunk: no padding
    assert choose_size(ladder, 769) == 832
    assert choose_size(ladder, 1025) == 1152
    assert choose_size(ladder, MAX_PIECEWISE_TOKENS + 1) is None  # eager: the GPU's work outlasts the launches


class _CPUPiecewise(PiecewiseGraphs):
    """A stand-in on the CPU: replaying a piece runs it."""

    def _capture(self, piece):
        return piece


@pytest.mark.parametrize("backend, model", [("torch", "tiny_llama"), ("triton", "tiny_mistral")])
def test_piecewise_steps_give_the_eager_logits_and_tokens(request, backend, model):
    # Chunked prompts of random lengths beside decodes (a budget of 24 tokens a step): every step runs through the
    # pieces, padded to its size (on the CPU there are no decode graphs), and eagerly; every kept row must agree.
    folder = request.getfixturevalue(model)[0]
    args = dict(attention_backend=backend, max_model_len=96, block_size=4, num_kv_blocks=80, max_num_seqs=6,
                max_num_batched_tokens=24)
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    prompts = [torch.randint(0, 211, (int(n),), generator=g).tolist() for n in torch.randint(3, 40, (6,), generator=g)]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    plain = [o.outputs[0].token_ids for o in LLM(folder, **args).generate(prompts, params, use_tqdm=False)]

    llm = LLM(folder, **args)
    runner = llm.llm_engine.runner
    runner.piecewise = _CPUPiecewise(runner.model, 24, "cpu")
    eager_forward, sizes, mixed = runner.model.forward, [], []

    def both(layout, flat=None):
        logits = piecewise_execute(layout, flat)
        batch = runner._unpack(flat, layout)
        size = choose_size(runner.piecewise.ladder, batch.input_ids.shape[0])
        mixed.append(batch.metadata.num_decodes < batch.metadata.num_seqs)
        if size is not None:
            sizes.append(size)
            meta = runner.attn_backend.build_metadata(batch.metadata)
            # The eager step's KV writes are the ones the pieces' step already made: the same values, rewritten.
            hidden = eager_forward(batch.input_ids, batch.positions, meta)
            eager = runner.model.compute_logits(hidden[batch.sample_index])
            torch.testing.assert_close(logits, eager, rtol=1e-4, atol=1e-4)
        return logits

    piecewise_execute, runner.execute_batch = runner.execute_batch, both
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == plain
    assert runner.graph_replays["mixed"] == len(sizes) == len(mixed) and sum(mixed) > 3
    assert len(set(sizes)) > 1  # several sizes, so padding rows held other steps' values


def test_a_step_past_the_largest_size_runs_eagerly(tiny_llama):
    llm = LLM(tiny_llama[0], max_model_len=64, block_size=4, num_kv_blocks=40, max_num_seqs=4)
    runner = llm.llm_engine.runner
    runner.piecewise = _CPUPiecewise(runner.model, 16, "cpu")
    assert runner.piecewise.ladder == [8, 16]
    prompt = list(range(5, 45))  # 40 tokens in one step: past 16
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3
    assert runner.graph_replays["mixed"] == 2  # the two decodes; the 40-token step ran eagerly
