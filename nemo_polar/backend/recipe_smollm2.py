# SPDX-License-Identifier: Apache-2.0
"""Build the `smollm2` model folder from the SmolLM2-135M-Instruct GGUF (a script, run inside the vllm venv).

`python recipe_smollm2.py --gguf FILE --out DIR --dtype bfloat16 --chat-template FILE [--max-positions 40960]`

transformers de-quantizes the Q4_1 GGUF into a model that still carries a `quantization_config` and cannot be
saved as is, so its state dict is copied into a plain `LlamaForCausalLM` built from a clean config and saved as
an HF folder (safetensors, tokenizer.json, tokenizer_config.json with the shipped tool-capable template).

SmolLM2 was trained to 8,192 positions; past them its plain RoPE gives garbage and then non-finite logits.
`--max-positions` above that writes YaRN RoPE scaling into the config (`rope_type: yarn`, `factor` =
max_positions / 8192, `original_max_position_embeddings` = 8192, `max_position_embeddings` = max_positions, the
transformers convention vLLM reads), so vLLM serves the whole length without `VLLM_ALLOW_LONG_MAX_MODEL_LEN`.
It does not download anything and imports nothing from nemo_polar (the project's venv has no `gguf`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

# Keys of the GGUF-derived config that describe where it came from, not the model.
_DROP_CONFIG_KEYS = ("quantization_config", "_model_name_or_path", "dtype", "torch_dtype", "transformers_version")
TRAINED_POSITIONS = 8192  # SmolLM2's max_position_embeddings (its long-context training length)


def long_context(fields: dict, max_positions: int) -> dict:
    """`fields` with YaRN RoPE scaling up to `max_positions` (unchanged when that is within the trained length)."""
    trained = int(fields.get("max_position_embeddings") or TRAINED_POSITIONS)
    if max_positions <= trained:
        return fields
    rope = dict(fields.get("rope_parameters") or {})
    theta = rope.get("rope_theta", fields.get("rope_theta", 100000.0))
    out = {k: v for k, v in fields.items() if k not in ("rope_scaling", "rope_theta")}
    out["rope_parameters"] = {
        "rope_type": "yarn",
        "rope_theta": theta,
        "factor": max_positions / trained,
        "original_max_position_embeddings": trained,
    }
    out["max_position_embeddings"] = max_positions
    return out


def build(gguf: Path, out: Path, dtype: str, chat_template: Path, max_positions: int = TRAINED_POSITIONS) -> None:
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)

    fields = {k: v for k, v in loaded.config.to_dict().items() if k not in _DROP_CONFIG_KEYS}
    fields = long_context(fields, max_positions)
    config = LlamaConfig(**fields)
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # lm_head is tied to the embeddings; anything else missing means the copy went wrong.
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise SystemExit(f"state dict mismatch: missing={missing} unexpected={unexpected}")
    model = model.to(getattr(torch, dtype))
    model.config.dtype = dtype
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)

    tokenizer.save_pretrained(out)
    _portable_tokenizer_config(out, chat_template.read_text(), max(max_positions, TRAINED_POSITIONS))
    # Only token ids: no sampling defaults that vLLM would pick up from the folder.
    gen = {
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
    }
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


def _portable_tokenizer_config(out: Path, chat_template: str, max_length: int) -> None:
    """Make tokenizer_config.json loadable by transformers 4.x too, with the chat template inside it.

    transformers 5 writes its backend class name and a separate chat_template.jinja; consumers (vLLM, our proxy,
    NeMo RL's environment) read tokenizer_config.json, as for the real SmolLM2 and Qwen3 folders.
    """
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    for key in ("backend", "is_local", "local_files_only"):
        cfg.pop(key, None)
    cfg["tokenizer_class"] = "GPT2Tokenizer"
    cfg["model_max_length"] = max_length  # what the backend serves
    cfg["add_prefix_space"] = False
    cfg["clean_up_tokenization_spaces"] = False
    cfg["chat_template"] = chat_template
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    (out / "chat_template.jinja").unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), required=True)
    parser.add_argument("--chat-template", type=Path, required=True)
    parser.add_argument(
        "--max-positions", type=int, default=TRAINED_POSITIONS, help="serve this many (YaRN above 8192)"
    )
    args = parser.parse_args()
    build(args.gguf, args.out, args.dtype, args.chat_template, args.max_positions)


if __name__ == "__main__":
    main()
