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


def distilbert(**overrides: Any) -> Any:
    """DistilBERT (DistilBertConfig's defaults: 6 layers, hidden 768, 12 heads, vocabulary 30522),
    the encoder without a task head; the library's default attention implementation."""
    from transformers import DistilBertConfig, DistilBertModel

    return DistilBertModel(DistilBertConfig(**overrides))


def llama_small(**overrides: Any) -> Any:
    """A small Llama-style decoder with its LM head (4 layers, hidden 512, MLP 1376, 8 heads and 8
    key/value heads, vocabulary 32000) and LlamaConfig's other defaults, the key/value cache on."""
    from transformers import LlamaConfig, LlamaForCausalLM

    sizes = {
        "hidden_size": 512,
        "intermediate_size": 1376,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
    }
    return LlamaForCausalLM(LlamaConfig(**{**sizes, **overrides}))


def t5_encoder(**overrides: Any) -> Any:
    """T5's encoder alone (T5Config's defaults are t5-small's: 6 layers, d_model 512, 8 heads,
    vocabulary 32128): what an encoder-decoder runs once per request before decoding."""
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(**overrides))


def t5(**overrides: Any) -> Any:
    """T5 as an encoder-decoder with its LM head (T5Config's defaults, t5-small's sizes: 6 layers
    each side, d_model 512, 8 heads, vocabulary 32128; 60M parameters): the encoder over the input
    ids, the decoder over the decoder's ids, the logits out. One forward pass per request, so
    the key/value cache is off (the decoder would build one inside its forward)."""
    from transformers import T5Config, T5ForConditionalGeneration

    return T5ForConditionalGeneration(T5Config(**{"use_cache": False, **overrides}))


def clip(**overrides: Any) -> Any:
    """CLIP with text and image towers (CLIPConfig's defaults, ViT-B/32's sizes: a 12-layer text
    transformer of width 512 over 77 token ids, a 12-layer ViT of width 768 over 32x32 patches of a
    224x224 image; 150M parameters): both embeddings and the image-text similarities out."""
    from transformers import CLIPConfig, CLIPModel

    return CLIPModel(CLIPConfig(**overrides))


def wav2vec2(**overrides: Any) -> Any:
    """A wav2vec2-style audio encoder (Wav2Vec2Config's defaults, wav2vec2-base's sizes: a 1-D
    convolution feature extractor with GroupNorm, then 12 transformer layers of hidden 768), raw
    16 kHz audio in, `last_hidden_state` and `extract_features` out. float32 with TF32 convolutions
    on: eager itself is inexact, which the gate's float64 reference is for."""
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    return Wav2Vec2Model(Wav2Vec2Config(**overrides))
