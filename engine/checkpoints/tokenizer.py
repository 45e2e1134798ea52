"""The byte-level tokenizer every offline checkpoint shares (tiny models and random-weight checkpoints): one
token per UTF-8 byte, the Qwen special tokens, and another family's media markers where it needs them."""

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from .tiny_nemotron import MEDIA_TOKENS

_PAD, _EOS = "<|endoftext|>", "<|im_end|>"
SPECIAL_TOKENS = [
    _PAD,
    "<|im_start|>",
    _EOS,
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<think>",  # Qwen3.5 / 3.6 open and close their thinking with these
    "</think>",
]

# ChatML as the Qwen-VL checkpoints write it: media items become <|vision_start|><|…_pad|><|vision_end|>
# and the processor expands the pad into the real token count.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}"
    "{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_tokenizer(extra_special: tuple[str, ...] = ()) -> PreTrainedTokenizerFast:
    """A byte-level tokenizer: one token per UTF-8 byte (no merges) plus the Qwen special tokens, then
    `extra_special` (another family's media markers) with the ids after them."""
    # The 256 printable stand-ins ByteLevel maps bytes to; sorted so ids are the same everywhere.
    vocab = {symbol: i for i, symbol in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    special = [*SPECIAL_TOKENS, *extra_special]
    core.add_special_tokens(special)  # ids 256.. in list order
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        model_max_length=32768,
        pad_token=_PAD,
        eos_token=_EOS,
        additional_special_tokens=[t for t in special if t not in (_PAD, _EOS)],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def special_token_ids(tokenizer) -> dict[str, int]:
    """The config fields that name the media tokens, as ids of `tokenizer`."""
    ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in SPECIAL_TOKENS}
    return {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
    }


# Media markers a family's processor needs beyond the Qwen ones, by model type.
EXTRA_SPECIAL_TOKENS = {"nemotron_h_omni": MEDIA_TOKENS}
