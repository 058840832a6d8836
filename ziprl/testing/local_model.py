"""A tiny random Llama with a tokenizer trained here, from nothing downloaded or packaged (GPU check boxes).

The tokenizer is a byte-level BPE trained on a few protocol-like lines, with ChatML special tokens and a
ChatML chat template, so prompts, stop strings and end-of-turn tokens behave as with the real one.
"""

from __future__ import annotations

from pathlib import Path

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
LINES = ["<search>who wrote the book</search>", "<open>doc 3</open>", "<answer>Paris</answer>",
         "Question: what is the capital of France? Scott Derrickson is an American director.",
         "The quick brown fox jumps over the lazy dog 0123456789."]


def build_tiny_model(path: Path, hidden: int = 64, layers: int = 2) -> Path:
    """Write the tokenizer and a random-initialised Llama (tied embeddings) to ``path``; returns it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(LINES * 20, trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   pad_token="<|im_end|>", unk_token="<|endoftext|>")
    fast.chat_template = CHATML
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         tie_word_embeddings=True, bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                         pad_token_id=fast.pad_token_id)
    path.mkdir(parents=True, exist_ok=True)
    LlamaForCausalLM(config).save_pretrained(path)
    fast.save_pretrained(path)
    return path


def passing_model_dir(root: Path) -> Path:
    """A directory that passes for a model directory without being one (config.json with a model type, safetensors
    weights whose header parses): for checks of arguments that must pass before any model loads."""
    import struct

    root.mkdir(parents=True)
    (root / "config.json").write_text('{"model_type": "llama"}')
    (root / "model.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")
    return root
