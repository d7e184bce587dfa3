"""The lab policy's tokenizer: one token per printable ASCII character, built with HF ``tokenizers``.

Character-level on purpose: a few dozen symbols cover the prompts and answers of the arithmetic-style tasks the lab
trains on, the embedding table stays tiny, and no merge table has to be learned. Saved as an ordinary
``PreTrainedTokenizerFast`` with a chat template, so every path of the product (both engines, prompts, trainer,
eval) loads it with ``AutoTokenizer`` unchanged.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

__all__ = ["CHAT_TEMPLATE", "SPECIAL_TOKENS", "build_char_tokenizer"]

#: pad, end of turn (the EOS), unknown character, and the two role markers of the chat template.
SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>", "<user>", "<assistant>", "<system>")

#: A minimal chat template: ``<user>TEXT<eos><assistant>`` (+ an optional ``<system>TEXT<eos>`` first).
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}<eos>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer over printable ASCII (letters, digits, punctuation, space, newline, tab).

    Ids: the special tokens 0..5 (pad 0, eos 1), then one id per character. Any other character maps to ``<unk>``.
    """
    chars = sorted(set(string.printable) - {"\r", "\x0b", "\x0c"})
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in chars:
        vocab[ch] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")  # every character its own token
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok
