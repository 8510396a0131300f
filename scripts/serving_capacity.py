"""The capacity a user gets from `minivllm serve` with default flags, and W3 offline with default arguments, in one run.

Mistral-7B's shape, bf16, random weights, with the word tokenizer of minivllm_lab.bench.word_model (so that the
server detokenizes as it would with a real model). First W3 offline through `LLM` with no engine arguments but
the weights' format, token ids only and detokenizing, on prompts no other run uses; then `minivllm serve` with no
flags beyond the model (the weights' format, the port), driven by minivllm_lab.bench.serve with 1000 W3 requests
per rate, fresh prompts at each rate, several client processes, rates swept upwards. Capacity is the highest
rate within the reading-speed SLO that asks for no more output tokens a second than W3 offline made (token ids
only): a faster rate can last out 1000 requests without being sustained (serve_stats.sustainable_rate).
Usage on the GPU machine: python scripts/serving_capacity.py --out $OUT/serving_capacity_h200.json
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch

from minivllm import LLM, SamplingParams
from minivllm.models.presets import MISTRAL_7B_CONFIG
from minivllm_lab.bench.metrics import hardware_name, source_commit
from minivllm_lab.bench.word_model import write_word_model
from minivllm_lab.bench.workloads import w3

parser = argparse.ArgumentParser()
parser.add_argument("--out", default="bench-results/serving_capacity_h200.json")
parser.add_argument("--rates", default="60,80,100,120,140,160")
parser.add_argument("--num-prompts", type=int, default=1000)
parser.add_argument("--num-clients", type=int, default=4)
parser.add_argument("--port", type=int, default=8017)
args = parser.parse_args()
out = Path(args.out)
folder = write_word_model(tempfile.mkdtemp(), MISTRAL_7B_CONFIG)
hardware = f"{hardware_name()}, Mistral-7B shape, bf16, random weights"


def offline(model: str) -> dict:
    llm = LLM(model, load_format="dummy")
    warm = w3(32000, num_requests=16, seed=1000)
    llm.generate(warm.prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in warm.max_tokens], use_tqdm=False)
    work = w3(32000, num_requests=args.num_prompts, seed=1001)  # prompts no other run sees
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in work.max_tokens]
    torch.cuda.synchronize()
    start = time.perf_counter()
    outs = llm.generate(work.prompts, params, use_tqdm=False)
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    scheduler = llm.llm_engine.scheduler
    row = {"output_tok_s": sum(len(o.outputs[0].token_ids) for o in outs) / wall, "wall_s": wall,
           "max_num_seqs": scheduler.max_num_seqs, "max_num_batched_tokens": scheduler.max_num_batched_tokens,
           "graph_replays": dict(llm.llm_engine.runner.graph_replays)}
    llm.shutdown()
    del llm
    torch.cuda.empty_cache()
    print(model, row, flush=True)
    return row


ids_only, detokenizing = offline("mistral-7b"), offline(str(folder))
log = open(out.with_suffix(".server.log"), "w")
server = subprocess.Popen([sys.executable, "-m", "minivllm", "serve", str(folder), "--load-format", "dummy",
                           "--port", str(args.port), "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT)
try:
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{args.port}/health", timeout=1)
            break
        except OSError:
            if server.poll() is not None:
                raise SystemExit(f"the server exited: see {log.name}")
            time.sleep(1)
    served = out.with_suffix(".served.json")
    subprocess.run([sys.executable, "-m", "minivllm_lab.bench.serve", "--base-url", f"http://127.0.0.1:{args.port}",
                    "--request-rate", args.rates, "--num-prompts", str(args.num_prompts),
                    "--num-clients", str(args.num_clients), "--hardware", hardware,
                    "--max-output-tok-s", str(ids_only["output_tok_s"]),
                    "--label", "minivllm serve (defaults)", "--out", str(served)], check=True)
finally:
    server.send_signal(2)
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        server.kill()
sweep = json.loads(served.read_text())
result = {
    "hardware": hardware,
    "commit": source_commit(),
    "command": "python scripts/serving_capacity.py",
    "capacity_req_s_default_flags": sweep["capacity_req_s"],
    "sustainable_rate_req_s": sweep["sustainable_rate_req_s"],
    "w3_offline_tok_s": ids_only["output_tok_s"],
    "w3_offline_detokenizing_tok_s": detokenizing["output_tok_s"],
    "offline": {"token ids only": ids_only, "detokenizing": detokenizing},
    "slo": sweep["slo"], "workload": sweep["workload"], "rates": sweep["rates"],
}
out.write_text(json.dumps(result, indent=1))
print(json.dumps({k: v for k, v in result.items() if k not in ("rates", "offline", "workload")}, indent=1))
