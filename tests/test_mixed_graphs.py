"""CUDA graphs of mixed steps, on the CPU: the token counts captured and the one a step takes; and the runner's
mixed-graph path (buffers padded to a token count and a sequence count, one forward for any mix of decodes and
prompt chunks, logits of the sampling rows after it) with stand-ins for the captured graphs that run the
recorded forward at each replay (the `stand_in_graphs` fixture), through the Triton kernels in Triton's
interpreter. Real captures: tests/test_gpu.py."""
import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.worker.cuda_graphs import MAX_MIXED_GRAPH_TOKENS, choose_size, token_ladder


def test_token_ladder_and_the_size_a_step_takes():
    ladder = token_ladder(8192)
    assert ladder[:5] == [8, 16, 32, 64, 128] and ladder[-1] == MAX_MIXED_GRAPH_TOKENS
    assert all(b - a == 64 for a, b in zip(ladder[3:], ladder[4:]) if b <= 1024)
    assert all(b - a == 128 for a, b in zip(ladder, ladder[1:]) if a >= 1024)
    assert token_ladder(300) == [8, 16, 32, 64, 128, 192, 256, 300]  # the budget itself is the last size
    assert token_ladder(5) == [5]
    assert choose_size(ladder, 1) == 8 and choose_size(ladder, 8) == 8 and choose_size(ladder, 9) == 16
    assert choose_size(ladder, 256 + 512) == 768       # 256 decodes and a 512-token chunk: no padding
    assert choose_size(ladder, 769) == 832
    assert choose_size(ladder, 1025) == 1152
    assert choose_size(ladder, MAX_MIXED_GRAPH_TOKENS + 1) is None  # eager: the GPU's work outlasts the launches


# The padding rows' attention output is never written (whatever memory held): their garbage may overflow in the
# interpreter's numpy, in their own rows only.
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("model", ["tiny_llama", "tiny_mistral"])
def test_mixed_steps_give_the_eager_logits_and_tokens(request, stand_in_graphs, model):
    # Chunked prompts of random lengths beside decodes (a budget of 24 tokens a step): every step with a chunk
    # replays (here: runs) the mixed graph of its size, and is also run eagerly; every kept row must agree, and
    # the tokens must be the eager engine's.
    folder = request.getfixturevalue(model)[0]
    args = dict(attention_backend="triton", max_model_len=96, block_size=4, num_kv_blocks=80, max_num_seqs=3,
                max_num_batched_tokens=24)  # few decodes: a prompt's last chunk leaves a step part-empty
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    prompts = [torch.randint(0, 211, (int(n),), generator=g).tolist() for n in torch.randint(3, 40, (6,), generator=g)]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    plain = [o.outputs[0].token_ids for o in LLM(folder, **args).generate(prompts, params, use_tqdm=False)]

    llm = LLM(folder, **args)
    runner = llm.llm_engine.runner
    runner.max_mixed_graph_tokens = 24  # what reserve_graph_memory records on a GPU
    runner.capture_cuda_graphs()
    assert runner.graphs.mixed_ladder == [8, 16, 24]
    eager_forward, sizes = runner.model.forward, []

    def both(layout, flat=None):
        logits = graphed_execute(layout, flat)
        batch = runner._unpack(flat, layout)
        if batch.metadata.max_query_len > 1:
            sizes.append(choose_size(runner.graphs.mixed_ladder, batch.input_ids.shape[0]))
            # The eager step's KV writes are the ones the graph's step already made: the same values, rewritten.
            hidden = eager_forward(batch.input_ids, batch.positions, runner.attn_backend.build_metadata(batch.metadata))
            torch.testing.assert_close(logits, runner.model.compute_logits(hidden[batch.sample_index]),
                                       rtol=1e-4, atol=1e-4)
        return logits

    graphed_execute, runner.execute_batch = runner.execute_batch, both
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == plain
    assert runner.graph_replays["mixed"] == len(sizes) > 3 and runner.graph_replays["decode"] > 0
    assert len(set(sizes)) > 1  # several sizes, so padding rows and sequences held other steps' values


def test_a_step_past_the_largest_size_runs_eagerly(tiny_llama, stand_in_graphs):
    llm = LLM(tiny_llama[0], attention_backend="triton", max_model_len=64, block_size=4, num_kv_blocks=40,
              max_num_seqs=4)
    runner = llm.llm_engine.runner
    runner.max_mixed_graph_tokens = 16
    runner.capture_cuda_graphs()
    assert runner.graphs.mixed_ladder == [8, 16]
    prompt = list(range(5, 45))  # 40 tokens in one step: past 16
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3
    assert runner.graph_replays["mixed"] == 0 and runner.graph_replays["decode"] == 2  # the 40-token step: eager
