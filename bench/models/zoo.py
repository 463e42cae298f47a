"""Hugging Face models for bench/models/*.yaml, built from their configs with random weights: no
download, no tokenizer. transformers is imported inside each function, so this module (and every
config naming it) loads where transformers is not installed; only building the model needs it."""

from __future__ import annotations

from typing import Any


def bert_base(**overrides: Any) -> Any:
    """The BERT-base encoder (BertConfig's defaults: 12 layers, hidden 768, 12 heads, vocabulary
    30522), with its pooler; the library's default attention implementation."""
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig(**overrides))


def gpt2(**overrides: Any) -> Any:
    """GPT-2 (124M: 12 layers, hidden 768, vocabulary 50257) with its LM head and no key/value
    cache: one forward pass per request, the logits out."""
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(**{"use_cache": False, **overrides}))
