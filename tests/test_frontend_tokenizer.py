"""Tokenizer building, the Tokenizer wrapper, and incremental detokenization."""

import json

import pytest

from inferno.errors import InfernoError
from inferno.frontend.detokenizer import IncrementalDetokenizer
from inferno.frontend.tokenizer import Tokenizer, TokenizerError
from inferno.frontend.tokenizer_build import (
    ADDED_TOKENS,
    REAL_FIRST_ADDED_ID,
    build_tiny_tokenizer,
    build_tokenizer_config,
)

TINY_VOCAB = 1024


def _resources(vocab_size: int) -> dict[str, bytes]:
    return {
        "tokenizer.json": build_tiny_tokenizer(vocab_size).encode(),
        "tokenizer_config.json": json.dumps(build_tokenizer_config(vocab_size)).encode(),
    }


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_resources(_resources(TINY_VOCAB))


@pytest.fixture(scope="module")
def real_tok() -> Tokenizer:
    return Tokenizer.from_resources(_resources(248320))


# -- tokenizer_build ---------------------------------------------------------------------------


def test_build_is_deterministic():
    assert build_tiny_tokenizer(512) == build_tiny_tokenizer(512)


def test_tiny_layout_puts_added_tokens_in_top_block(tok):
    first = TINY_VOCAB - 64
    for i, (content, _special) in enumerate(ADDED_TOKENS):
        assert tok.token_to_id(content) == first + i
    assert tok.vocab_size == first + len(ADDED_TOKENS)
    assert tok.vocab_size <= TINY_VOCAB  # the rows above are padding, as in the real model
    # The BPE learned merges from its corpus: common words are single tokens.
    assert len(tok.encode(" the")) == 1


def test_real_size_layout_uses_real_ids(real_tok):
    assert real_tok.endoftext_id == 248044
    assert real_tok.im_start_id == 248045
    assert real_tok.im_end_id == 248046
    assert real_tok.tool_call_id == 248058
    assert real_tok.tool_call_end_id == 248059
    assert real_tok.tool_response_id == 248066
    assert real_tok.think_id == 248068
    assert real_tok.think_end_id == 248069
    assert real_tok.token_to_id("<|vision_start|>") == 248053
    assert real_tok.image_pad_id == 248056
    assert real_tok.video_pad_id == 248057
    assert real_tok.token_to_id("<|audio_pad|>") == 248076
    assert real_tok.vocab_size == 248077
    assert real_tok.eos_ids == (248046, 248044)
    assert real_tok.encode("hello world") == real_tok.encode("hello world")
    # Filler tokens below the added block are never produced by encoding.
    ids = real_tok.encode("The quick brown fox 123 <think>x</think>")
    assert all(i < 4096 or i >= REAL_FIRST_ADDED_ID for i in ids)


def test_tokenizer_config_matches_layout():
    config = build_tokenizer_config(TINY_VOCAB, chat_template="{{ messages }}")
    decoder = config["added_tokens_decoder"]
    assert decoder[str(TINY_VOCAB - 64)]["content"] == "<|endoftext|>"
    assert config["eos_token"] == "<|im_end|>" and config["pad_token"] == "<|endoftext|>"
    assert config["add_bos_token"] is False and config["bos_token"] is None
    assert config["chat_template"] == "{{ messages }}"
    flags = {v["content"]: v["special"] for v in decoder.values()}
    assert flags["<|im_end|>"] is True and flags["<|image_pad|>"] is True
    for tag in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>"):
        assert flags[tag] is False


def test_too_small_vocab_is_refused():
    with pytest.raises(InfernoError, match="at least"):
        build_tiny_tokenizer(100)


# -- Tokenizer --------------------------------------------------------------------------------


def test_encode_has_no_bos_and_parses_added_tokens(tok):
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == tok.im_start_id and ids[-1] == tok.im_end_id
    assert tok.encode("<think>") == [tok.think_id]
    assert tok.count("<|im_start|>user\nhi<|im_end|>") == len(ids)


@pytest.mark.parametrize(
    "text",
    ["Hello, world!", "café naïve 你好，世界 😀👍🏽 👨‍👩‍👧", "def f(x):\n    return x**2\n", " \t\n\n"],
)
def test_roundtrip(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_nfc_normalisation(tok):
    decomposed = "cafe\u0301"
    assert tok.decode(tok.encode(decomposed)) == "caf\u00e9"


def test_skip_special_keeps_tag_tokens(tok):
    text = "<|im_start|>assistant\n<think>\nhm\n</think>\n\n<tool_call>x</tool_call><|im_end|>"
    ids = tok.encode(text)
    text = tok.decode(ids, skip_special=True)
    assert text == "assistant\n<think>\nhm\n</think>\n\n<tool_call>x</tool_call>"
    assert tok.im_end_id in tok.special_ids and tok.think_id not in tok.special_ids


def test_tokens_defined_only_in_config_are_added_at_their_ids():
    resources = _resources(TINY_VOCAB)
    spec = json.loads(resources["tokenizer.json"])
    spec["added_tokens"] = spec["added_tokens"][:-7]  # like Qwen3.5: audio tokens only in config
    resources["tokenizer.json"] = json.dumps(spec).encode()
    t = Tokenizer.from_resources(resources)
    assert t.token_to_id("<|audio_pad|>") == TINY_VOCAB - 64 + 32
    assert t.encode("<tts_pad>") == [TINY_VOCAB - 64 + 28]


def test_from_dir(tmp_path):
    for name, data in _resources(512).items():
        (tmp_path / name).write_bytes(data)
    t = Tokenizer.from_dir(tmp_path)
    assert t.im_end_id == 512 - 64 + 2
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        Tokenizer.from_dir(tmp_path / "missing")


def test_bad_resources_raise_inferno_errors():
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        Tokenizer.from_resources({})
    with pytest.raises(TokenizerError, match="cannot be loaded"):
        Tokenizer.from_resources({"tokenizer.json": b"{not json"})
    good = _resources(512)
    with pytest.raises(TokenizerError, match="tokenizer_config.json"):
        Tokenizer.from_resources({**good, "tokenizer_config.json": b"[oops"})


def test_missing_chat_token_names_the_token():
    t = Tokenizer(build_tiny_tokenizer(512).replace("<think>", "<thonk>"))
    with pytest.raises(TokenizerError, match="<think>"):
        _ = t.think_id


# -- IncrementalDetokenizer -------------------------------------------------------------------

MULTIBYTE = [
    "你好，世界！今天天气很好。",
    "emoji: 😀👍🏽🎉 family 👨‍👩‍👧‍👦 flag 🇯🇵 done",
    "Ünïcödé — “quotes” … ½ ∑ √ 𝔘𝔫𝔦",
    "mixed 日本語 and English 한국어 text\nwith newlines\n\n and   spaces ",
    "<think>\n推理\n</think>\n\n答案 42<|im_end|>",
]


@pytest.mark.parametrize("text", MULTIBYTE)
@pytest.mark.parametrize("skip_special", [False, True])
def test_detokenizer_token_by_token_equals_decode(tok, text, skip_special):
    ids = tok.encode(text)
    assert len(ids) > len(text) // 4  # the tiny BPE splits multibyte characters across tokens
    detok = IncrementalDetokenizer(tok, skip_special=skip_special)
    deltas = [detok.push(i) for i in ids]
    deltas.append(detok.flush())
    assert "".join(deltas) == tok.decode(ids, skip_special=skip_special)
    assert detok.text == "".join(deltas)
    assert not any("\ufffd" in d for d in deltas)
    assert any(d == "" for d in deltas[:-1])  # some tokens completed no character


def test_detokenizer_flush_releases_unfinished_bytes(tok):
    ids = tok.encode("ok 😀")
    detok = IncrementalDetokenizer(tok)
    out = "".join(detok.push(i) for i in ids[:-1])  # the emoji's last byte never comes
    assert out in ("ok", "ok ")
    rest = detok.flush()
    assert "\ufffd" in rest and out + rest == tok.decode(ids[:-1])
    assert detok.flush() == ""
