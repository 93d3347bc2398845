"""The byte-level BPE tokenizer trained on the corpus, and document encoding."""

from __future__ import annotations

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from tiny_pair_training.scale import BOS, EOS, MAX_POSITIONS, PAD, SPECIAL_TOKENS


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE with <pad>/<s>/</s> = 0/1/2; encoding prepends <s> like Llama."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS)]
    )
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [PAD, BOS, EOS]
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        model_max_length=MAX_POSITIONS,
    )


def encode_docs(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> list[list[int]]:
    """Each document as <s> tokens </s>."""
    encodings = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    return [[BOS, *e.ids, EOS] for e in encodings]
