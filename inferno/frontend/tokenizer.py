"""The text tokenizer: HF `tokenizer.json` (byte-level BPE) through the `tokenizers` library.

Encoding adds no BOS and parses added tokens (`<|im_start|>`, `<think>`, ...) written in the
text. Decoding with `skip_special=True` drops the tokens marked special (`<|im_end|>`, vision
pads, ...) but keeps tag tokens the model writes as text (`<think>`, `<tool_call>`, ...).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from tokenizers import AddedToken
from tokenizers import Tokenizer as _HFTokenizer

from inferno.errors import InfernoError

RESOURCE_FILES = ("tokenizer.json", "tokenizer_config.json")


class TokenizerError(InfernoError):
    """Tokenizer files that are missing or cannot be loaded."""


def _token_content(value: object) -> str | None:
    """A token named in tokenizer_config: a string or an {"content": ...} object."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


class Tokenizer:
    """Encode text to token ids and back, with the ids of the chat-format tokens."""

    def __init__(self, tokenizer_json: str, config: Mapping | None = None):
        try:
            self._tok = _HFTokenizer.from_str(tokenizer_json)
        except Exception as e:  # the library raises bare Exception subclasses
            raise TokenizerError(
                f"tokenizer.json cannot be loaded ({' '.join(str(e).split())}); "
                "replace it with the checkpoint's own"
            ) from None
        self.config = dict(config or {})
        self._add_config_tokens()
        self._tok.no_padding()
        self._tok.no_truncation()

    @classmethod
    def from_resources(cls, resources: Mapping[str, bytes]) -> Tokenizer:
        """From a model's resources (tokenizer.json, optional tokenizer_config.json bytes)."""
        raw = resources.get("tokenizer.json")
        if raw is None:
            raise TokenizerError(
                "the model has no tokenizer.json; add the checkpoint's tokenizer.json"
            )
        config: dict = {}
        if "tokenizer_config.json" in resources:
            try:
                config = json.loads(resources["tokenizer_config.json"])
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise TokenizerError(
                    "tokenizer_config.json is not valid JSON; repair or replace it"
                ) from None
            if not isinstance(config, dict):
                raise TokenizerError("tokenizer_config.json must hold a JSON object")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise TokenizerError("tokenizer.json is not UTF-8 text; replace it") from None
        return cls(text, config)

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """From a directory holding tokenizer.json (and optionally tokenizer_config.json)."""
        path = Path(path)
        if not (path / "tokenizer.json").is_file():
            raise TokenizerError(f"no tokenizer.json in {path}; point at the model directory")
        resources = {
            name: (path / name).read_bytes() for name in RESOURCE_FILES if (path / name).is_file()
        }
        return cls.from_resources(resources)

    def _add_config_tokens(self) -> None:
        """Add tokens that tokenizer_config.json defines but tokenizer.json lacks, at their ids.

        (Qwen3.5's config defines its audio/tts tokens only there.)
        """
        decoder = self.config.get("added_tokens_decoder")
        if not isinstance(decoder, Mapping):
            return
        entries = []
        for key, value in decoder.items():
            content = _token_content(value)
            if content is not None and str(key).isdigit():
                entries.append((int(key), content, bool(value.get("special", False))))
        for token_id, content, special in sorted(entries):
            if self._tok.token_to_id(content) is not None:
                continue
            if token_id != self._tok.get_vocab_size(with_added_tokens=True):
                continue  # cannot be placed at its id; leave it out rather than shift ids
            token = AddedToken(content, special=special, normalized=False)
            if special:
                self._tok.add_special_tokens([token])
            else:
                self._tok.add_tokens([token])

    # -- text <-> ids -------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`: no BOS, added tokens in the text parsed as such."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of `ids`; with `skip_special`, tokens marked special are left out."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special)

    def count(self, text: str) -> int:
        """Number of tokens `text` encodes to."""
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    # -- vocabulary ---------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Number of token ids (BPE vocabulary plus added tokens; excludes padding rows)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def _require(self, token: str) -> int:
        token_id = self._tok.token_to_id(token)
        if token_id is None:
            raise TokenizerError(
                f"the tokenizer has no {token} token; use the checkpoint's Qwen3.5 tokenizer"
            )
        return token_id

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids of the added tokens marked special (dropped by `decode(skip_special=True)`)."""
        return frozenset(
            token_id
            for token_id, added in self._tok.get_added_tokens_decoder().items()
            if added.special
        )

    @property
    def endoftext_id(self) -> int:
        return self._require("<|endoftext|>")

    @property
    def im_start_id(self) -> int:
        return self._require("<|im_start|>")

    @property
    def im_end_id(self) -> int:
        return self._require("<|im_end|>")

    @property
    def think_id(self) -> int:
        return self._require("<think>")

    @property
    def think_end_id(self) -> int:
        return self._require("</think>")

    @property
    def tool_call_id(self) -> int:
        return self._require("<tool_call>")

    @property
    def tool_call_end_id(self) -> int:
        return self._require("</tool_call>")

    @property
    def tool_response_id(self) -> int:
        return self._require("<tool_response>")

    @property
    def tool_response_end_id(self) -> int:
        return self._require("</tool_response>")

    @property
    def vision_start_id(self) -> int:
        return self._require("<|vision_start|>")

    @property
    def vision_end_id(self) -> int:
        return self._require("<|vision_end|>")

    @property
    def image_pad_id(self) -> int:
        return self._require("<|image_pad|>")

    @property
    def video_pad_id(self) -> int:
        return self._require("<|video_pad|>")

    @property
    def pad_id(self) -> int | None:
        name = _token_content(self.config.get("pad_token"))
        return self._tok.token_to_id(name) if name else self._tok.token_to_id("<|endoftext|>")

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """Ids that end a reply: the config's eos token (`<|im_end|>`), then `<|endoftext|>`."""
        names = [_token_content(self.config.get("eos_token")), "<|im_end|>", "<|endoftext|>"]
        ids: list[int] = []
        for name in names:
            token_id = self._tok.token_to_id(name) if name else None
            if token_id is not None and token_id not in ids:
                ids.append(token_id)
        return tuple(ids)
