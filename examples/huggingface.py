"""Hugging Face models for the examples, built from their configs with random weights: no
download, no tokenizer. transformers is imported inside each function, so this file loads where
transformers is not installed; only building the model needs it."""

from typing import Any

from torch import nn


def gpt2(**config: Any) -> nn.Module:
    """GPT-2 with its LM head (`GPT2Config`'s defaults: 124M parameters)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(**config))


def bert(**config: Any) -> nn.Module:
    """A BERT encoder without a head (`BertConfig`'s defaults: BERT-base, 110M parameters): called
    with `input_ids` and `attention_mask`, it returns `last_hidden_state` and `pooler_output`."""
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig(**config))
