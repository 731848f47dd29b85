"""Build Qwen3.5-style tokenizer files for synthetic checkpoints.

`build_tiny_tokenizer(vocab_size)` trains a small byte-level BPE (the `tokenizers` library) on a
built-in English/code corpus and lays the Qwen added tokens out like the real model:

- `vocab_size >= 248077` (e.g. the real 248320): the added tokens sit at their real ids
  (248044 ... 248076); unused filler tokens pad the BPE vocabulary up to 248043.
- smaller sizes: the added tokens form one block starting at `vocab_size - 64`; the ids above the
  block are padding rows, as in the real model (no token maps to them).

`build_tokenizer_config(vocab_size)` returns the matching `tokenizer_config.json` dict.
"""

from __future__ import annotations

import json

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from inferno.errors import ConfigError

#: Qwen pre-tokenizer split pattern (single digits; letters include combining marks).
PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: The Qwen3.5 added tokens in id order, with whether each is "special" (skipped when decoding
#: with skip_special). Tag-like tokens that the model writes as text (think, tool_call, fim...)
#: are not special, as in Qwen's tokenizer_config.
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
    ("<|audio_start|>", True),
    ("<|audio_end|>", True),
    ("<tts_pad>", True),
    ("<tts_text_bos>", True),
    ("<tts_text_eod>", True),
    ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
)

REAL_VOCAB_SIZE = 248320
REAL_FIRST_ADDED_ID = 248044
TINY_BLOCK = 64  # tiny layouts reserve the top 64 ids: added tokens, then padding rows
MIN_TINY_VOCAB = 256 + TINY_BLOCK
MODEL_MAX_LENGTH = 262144

_CORPUS = r'''
The quick brown fox jumps over the lazy dog. A small model still needs a tokenizer, and a
tokenizer needs text to learn from. This corpus is a few kilobytes of plain English and source
code, enough for byte-level merges of common words, spaces and punctuation.

Once upon a time there was a little robot who wanted to learn how to write. Every morning it read
the same book, and every evening it wrote one new sentence. After many days the robot could write
a whole story about the sea, the sky, the mountains and the people who lived in the village near
the river. The people were kind to the robot. They gave it paper, ink and time.

Question: What is the capital of France?
Answer: The capital of France is Paris. It is known for the Eiffel Tower, the Louvre museum and
its cafes along the Seine.

Question: How many days are there in a leap year?
Answer: A leap year has 366 days instead of 365, because February has 29 days.

You are a helpful assistant. Please think step by step, then give the final answer. If you are
not sure, say that you are not sure. Keep the answer short and clear.

User: Can you explain what a hash table is?
Assistant: A hash table stores key and value pairs. It computes a hash of the key to find a
bucket, so looking up, inserting and deleting are fast on average. When two keys land in the
same bucket there is a collision, which the table resolves by chaining or by open addressing.

def fibonacci(n: int) -> list[int]:
    """Return the first n Fibonacci numbers."""
    result = []
    a, b = 0, 1
    for _ in range(n):
        result.append(a)
        a, b = b, a + b
    return result


class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from an empty stack")
        return self.items.pop()

    def __len__(self):
        return len(self.items)


import json
import os


def load_config(path: str) -> dict:
    with open(path, "r", encoding="utf-8") as f:
        return json.load(f)


if __name__ == "__main__":
    config = load_config(os.environ.get("CONFIG", "config.json"))
    print(f"loaded {len(config)} keys")
    for key, value in sorted(config.items()):
        print(key, "=", value)

function add(a, b) {
  return a + b;
}

const numbers = [1, 2, 3, 4, 5];
const doubled = numbers.map((x) => x * 2);
console.log(doubled.join(", "));

#include <stdio.h>

int main(void) {
    for (int i = 0; i < 10; i++) {
        printf("%d\n", i * i);
    }
    return 0;
}

SELECT name, count(*) AS total FROM orders WHERE status = 'shipped'
GROUP BY name ORDER BY total DESC;

{"name": "get_weather", "description": "Get the current weather for a city", "parameters":
{"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string",
"enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}

The weather today is sunny with a high of 24 degrees and a light wind from the west. Tomorrow
there may be rain in the afternoon, so take an umbrella if you go out.

In mathematics, a prime number is a natural number greater than 1 that is not a product of two
smaller natural numbers. The first primes are 2, 3, 5, 7, 11, 13, 17, 19, 23 and 29. There are
infinitely many primes, as Euclid proved more than two thousand years ago.

Water boils at 100 degrees Celsius at sea level. At higher altitudes the air pressure is lower,
so water boils at a lower temperature and cooking takes longer.

To install the package, run pip install inferno, then start the server with inferno serve and
open the health endpoint in your browser. The server speaks the OpenAI and Anthropic protocols.

Let me think about this. First, we read the input. Then we check each value, and finally we
return the sum. The answer is 42. I think that is correct, but let me check again: 40 plus 2 is
42. Yes, the answer is 42.

She said, "I'll be there at 5 o'clock." He replied, "We're going to be late, aren't we?" They'd
already left when the train arrived, and it's a long walk from the station.

Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 2.71828 -1 +1 1e-6 0x1F 50% $20 #1 @home
Punctuation: . , ; : ! ? ' " ( ) [ ] { } < > / \ | - _ = + * & ^ % $ # @ ~ `
Unicode: café, naïve, résumé, über, señor, 你好，世界。こんにちは。안녕하세요.
Привет, мир! 😀 👍 ✨
'''


def _train_bpe(n_tokens: int) -> dict:
    """Train a byte-level BPE with at most `n_tokens` tokens; return its tokenizer.json dict."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=n_tokens,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(_CORPUS.splitlines(keepends=True), trainer=trainer)
    return json.loads(tok.to_str())


def first_added_id(vocab_size: int) -> int:
    """Id of `<|endoftext|>` (the first added token) in the tokenizer built for `vocab_size`."""
    if vocab_size >= REAL_FIRST_ADDED_ID + len(ADDED_TOKENS):
        return REAL_FIRST_ADDED_ID
    if vocab_size < MIN_TINY_VOCAB:
        raise ConfigError(
            f"vocab_size {vocab_size} is too small for a byte-level tokenizer with the Qwen "
            f"added tokens; use at least {MIN_TINY_VOCAB}"
        )
    return vocab_size - TINY_BLOCK


def build_tiny_tokenizer(vocab_size: int) -> str:
    """tokenizer.json text for a small Qwen3.5-style byte-level BPE (see module docstring)."""
    first = first_added_id(vocab_size)
    spec = _train_bpe(min(first, 4096))
    vocab: dict[str, int] = spec["model"]["vocab"]
    assert len(vocab) <= first, "the BPE trainer returned more tokens than asked for"
    # Pad the BPE vocabulary with tokens no merge produces, so added tokens land at `first`.
    next_id = len(vocab)
    filler = 0
    while next_id < first:
        name = f"<|unused_{filler}|>"
        filler += 1
        if name not in vocab:
            vocab[name] = next_id
            next_id += 1
    spec["added_tokens"] = [
        {
            "id": first + i,
            "content": content,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": special,
        }
        for i, (content, special) in enumerate(ADDED_TOKENS)
    ]
    spec["post_processor"] = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": False,
        "use_regex": False,
    }
    text = json.dumps(spec, ensure_ascii=False, separators=(",", ":"))
    Tokenizer.from_str(text)  # validate
    return text


def build_tokenizer_config(
    vocab_size: int, chat_template: str | None = None, model_max_length: int = MODEL_MAX_LENGTH
) -> dict:
    """tokenizer_config.json for `build_tiny_tokenizer(vocab_size)` (Qwen2Tokenizer style)."""
    first = first_added_id(vocab_size)
    decoder = {
        str(first + i): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for i, (content, special) in enumerate(ADDED_TOKENS)
    }
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [content for content, _ in ADDED_TOKENS[1:14]],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": model_max_length,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    return config
