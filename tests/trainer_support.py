"""Pieces of the trainer tests: a tokenizer of the grid alphabet and a scripted tiny model.

Nothing is downloaded.  The tokenizer is word-level, built by ``tokenizers``
from the grid alphabet (one token per cell symbol and per whitespace
character, so decoding gives the text back), Qwen2.5's chat markers and tool
tags, and a few whole answers added as single tokens; its chat template is
TRL's own copy of Qwen2.5's, which TRL recognises for tool calls.

The model is a ``LlamaForCausalLM`` built from a config whose weights write a
bigram table: one-hot embeddings, attention and MLP outputs zeroed (the
residual stream carries the last token), and ``lm_head`` giving equal high
logits to the listed successors of each token and the end of turn to every
other.  Sampling then picks uniformly among the successors: after the
generation prompt, one of the whole answers (or tool calls), then the end.
"""

from __future__ import annotations

import json
import pathlib

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "[UNK]"]
TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
ALPHABET = ["0", "1", "L", "S", "V", ".", " ", "\n"]
WORDS = ["system", "user", "assistant", "tool"]


def grid_tokenizer(whole: list[str] = ()):
    """The word-level tokenizer (see the module docstring); ``whole`` texts are single tokens."""
    import trl
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIAL + ALPHABET + WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s"), behavior="isolated")
    core.decoder = decoders.Fuse()  # tokens joined as they are: decode(encode(grid)) == grid
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]",
                                  pad_token="<|endoftext|>", eos_token="<|im_end|>",
                                  additional_special_tokens=["<|im_start|>"])
    tok.add_tokens(TAGS + list(whole))  # plain added tokens: kept when decoding
    tok.chat_template = (pathlib.Path(trl.__file__).parent / "chat_templates"
                         / "qwen2_5.jinja").read_text()
    tok.padding_side = "left"
    return tok


def tool_call_text(grid: str) -> str:
    """The body of a ``<tool_call>`` asking ``simulate`` for ``grid`` (one token)."""
    return "\n" + json.dumps({"name": "simulate", "arguments": {"grid": grid}}) + "\n"


def scripted_model(tok, successors: dict[str, list[str]]):
    """A tiny Llama whose next token is drawn uniformly from ``successors[last token]``
    (the end of turn after any other token)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    size = len(tok)
    hidden = size + size % 2  # rotary embeddings need an even head size
    config = LlamaConfig(vocab_size=size, hidden_size=hidden, intermediate_size=8,
                         num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
                         head_dim=hidden, max_position_embeddings=4096,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                         bos_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    ids = tok.convert_tokens_to_ids
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.eye(size, hidden))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        head = model.lm_head.weight
        head.zero_()
        for t in range(size):
            head[tok.eos_token_id, t] = 20.0
        for after, nexts in successors.items():
            t = ids(after)
            head[:, t] = 0.0
            for n in nexts:
                head[ids(n), t] = 20.0
    return model
