"""CUDA graphs' shapes and padding, on the CPU: which graph a step takes; that the padded batch a graph
records (`padded_forward`, here run eagerly through the Triton kernels in Triton's interpreter) gives every
real row the logits of the eager step; and the runner's whole graph path, with stand-ins for the captured
graphs that run the recorded forward at each replay. Real captures and replays: tests/test_gpu.py."""
import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.worker.cuda_graphs import GraphBuffers, choose_graph, graph_ladders, padded_forward


def test_graph_ladders_and_the_graph_a_step_takes():
    ladders = graph_ladders(max_batch=40, num_speculative_tokens=4)
    assert ladders == {1: [1, 2, 4, 8, 16, 32, 40], 5: [1, 2, 4, 8, 16, 32, 40]}
    assert graph_ladders(256, 4)[5] == [1, 2, 4, 8, 16, 32, 48, 51]  # 51 x 5 tokens: no more than 256 decodes
    assert graph_ladders(512, 7)[8][-1] == 64                          # 64 x 8 tokens: no more than 512 decodes
    assert graph_ladders(2, 8) == {1: [1, 2], 9: [1, 2]}
    assert graph_ladders(8) == {1: [1, 2, 4, 8]}
    assert choose_graph(ladders, num_seqs=3, max_query_len=1) == (1, 4)    # decodes, or guesses found for none
    assert choose_graph(ladders, num_seqs=3, max_query_len=5) == (5, 4)    # a verify, padded to 4 sequences
    assert choose_graph(ladders, num_seqs=3, max_query_len=2) == (5, 4)    # fewer guesses: the same graph
    assert choose_graph(ladders, num_seqs=9, max_query_len=1) == (1, 16)
    assert choose_graph(graph_ladders(256, 4), num_seqs=60, max_query_len=3) is None  # past the verify graphs
    assert choose_graph(graph_ladders(256, 4), num_seqs=60, max_query_len=1) == (1, 64)
    assert choose_graph(ladders, num_seqs=1, max_query_len=6) is None      # a prefill chunk
    assert choose_graph(ladders, num_seqs=41, max_query_len=1) is None


# The padding rows' attention output is never written (whatever memory held): their garbage may overflow in the
# interpreter's numpy, in their own rows only.
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_a_padded_step_gives_the_eager_logits_on_every_real_row(tiny_llama):
    # Three requests speculating with k = 3 guesses (some steps find fewer, or none): every step the engine runs
    # is also run the way its graph would run it, padded to the graph's shape, and the real rows must agree.
    k = 3
    llm = LLM(tiny_llama[0], attention_backend="triton", max_model_len=64, block_size=4, num_kv_blocks=40,
              max_num_seqs=4, speculative_config={"method": "ngram", "num_speculative_tokens": k})
    runner = llm.llm_engine.runner
    ladders = graph_ladders(runner.max_num_seqs, k)
    buffers = GraphBuffers(16, runner.max_num_seqs, 16, runner.block_size, "cpu")
    eager, shapes = runner.execute_batch, []

    def both(layout, flat=None):
        logits = eager(layout, flat)
        input_ids, positions, meta, sample_index = runner._unpack(flat, layout)
        shape = choose_graph(ladders, meta.num_seqs, meta.max_query_len)
        if shape is not None:
            shapes.append(shape)
            query_len, batch = shape
            buffers.load(query_len * batch, batch, input_ids, positions, meta)
            hidden = padded_forward(runner.model, buffers, query_len * batch, batch, query_len,
                                    runner.attn_backend.build_metadata)
            padded = runner.model.compute_logits(hidden)[:input_ids.shape[0]]
            if sample_index.shape[0] != input_ids.shape[0]:
                padded = padded[sample_index]
            torch.testing.assert_close(padded, logits, rtol=1e-4, atol=1e-4)
        return logits

    runner.execute_batch = both
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 211, (n,), generator=g).tolist() for n in (3, 9, 14)]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 16 for o in outs)
    assert {(k + 1, 4), (k + 1, 2), (1, 4)} <= set(shapes)  # verify graphs (3 sequences padded to 4), decode graphs
    assert llm.llm_engine.get_stats()["num_accepted_tokens"] > 0


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_the_runners_graph_path_gives_the_plain_engines_tokens(tiny_llama, stand_in_graphs, method):
    # Everything of the graph path but the capture itself: the runner captures (here: keeps) its graphs for k,
    # picks one per step, loads the buffers, replays, keeps the rows that sample; a draft's runner too.
    k, folder = 3, tiny_llama[0]
    g = torch.Generator().manual_seed(2)
    prompts = [(torch.randint(0, 211, (6,), generator=g).tolist() * 3)[:n] for n in (18, 11, 15)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    args = dict(attention_backend="triton", max_model_len=64, num_kv_blocks=40, max_num_seqs=4)
    plain = [o.outputs[0].token_ids for o in LLM(folder, **args).generate(prompts, params, use_tqdm=False)]
    spec = ({"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3} if method == "ngram"
            else {"method": "draft_model", "model": folder, "num_speculative_tokens": k})
    llm = LLM(folder, speculative_config=spec, **args)
    engine = llm.llm_engine
    runners = [engine.runner] + ([engine.proposer.runner] if method == "draft_model" else [])
    for runner in runners:
        runner.capture_cuda_graphs(k)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == plain
    assert engine.get_stats()["num_accepted_tokens"] > 0
    assert all(runner.graph_replays["verify"] > 0 for runner in runners)
    if method == "draft_model":  # its guesses are decodes
        assert engine.proposer.runner.graph_replays["decode"] > 0
