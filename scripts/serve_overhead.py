"""W3 offline with every request at t=0, the engine two ways: token ids only, and detokenizing (as a server must).

1. offline, token ids only (no tokenizer: no text is made);
2. offline, with the word tokenizer (the engine detokenizes every token, as a server needs);
3. the same with one intra-op thread for torch's host-side work (torch.set_num_threads(1)).
scripts/gpu_engine_core.sh runs it first, then the same W3 through `minivllm serve`, for the comparison.
Usage on the GPU machine: python scripts/serve_overhead.py --out gpu-out/serve_overhead.json
"""
import argparse
import tempfile
import time

import torch

from minivllm import LLM, SamplingParams
from minivllm.models.presets import MISTRAL_7B_CONFIG
from minivllm_lab.bench.metrics import hardware_name, save_json
from minivllm_lab.bench.word_model import write_word_model
from minivllm_lab.bench.workloads import w3

parser = argparse.ArgumentParser()
parser.add_argument("--out", default="bench-results/serve_overhead.json")
parser.add_argument("--num-requests", type=int, default=1000)
args = parser.parse_args()
work = w3(32000, num_requests=args.num_requests)
params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in work.max_tokens]
folder = write_word_model(tempfile.mkdtemp(), MISTRAL_7B_CONFIG)
rows = []
default_threads = torch.get_num_threads()
for label, model, threads in [("offline, token ids only", "mistral-7b", default_threads),
                              ("offline, detokenizing", str(folder), default_threads),
                              ("offline, detokenizing, 1 host thread", str(folder), 1)]:
    torch.set_num_threads(threads)
    llm = LLM(model, load_format="dummy", max_model_len=4096)
    llm.generate(work.prompts[:8], params[:8], use_tqdm=False)  # warm-up: kernels compiled, graphs replayed
    torch.cuda.synchronize()
    start = time.perf_counter()
    outs = llm.generate(work.prompts, params, use_tqdm=False)
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    rows.append({"engine": label, "workload": "W3 offline", "output_tok_s": tokens / wall, "wall_s": wall,
                 "torch_threads": threads})
    print(rows[-1], flush=True)
    del llm
    torch.cuda.empty_cache()
save_json(args.out, {"hardware": hardware_name(), "model": "Mistral-7B-Instruct shape, bf16, random weights",
                     "rows": rows})
