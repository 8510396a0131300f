"""The made-up word tokenizer of serving benchmarks: text round-trips to the drawn ids, through chat too."""
import random

from minivllm import LLM, SamplingParams
from minivllm_lab.bench.word_model import words, write_word_model

TINY_MISTRAL = {"architectures": ["MistralForCausalLM"], "vocab_size": 211, "hidden_size": 64,
                "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "max_position_embeddings": 256, "eos_token_id": 2}


def test_word_prompts_become_the_drawn_ids(tmp_path):
    folder = write_word_model(tmp_path, TINY_MISTRAL)
    llm = LLM(str(folder), load_format="dummy", max_model_len=128, num_kv_blocks=32)
    rng = random.Random()
    system, user = [rng.randrange(211) for _ in range(10)], [rng.randrange(211) for _ in range(rng.randint(1, 20))]
    out = llm.chat([{"role": "system", "content": words(system)}, {"role": "user", "content": words(user)}],
                   SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)[0]
    assert out.prompt_token_ids == system + user
    # No end-of-sequence token: random weights answer every token asked for.
    assert len(out.outputs[0].token_ids) == 20 and out.outputs[0].finish_reason == "length"
    assert out.outputs[0].text.strip() == words(out.outputs[0].token_ids)  # a space joins it to the prompt
