"""Text <-> token ids for an HF checkpoint: ``tokenizer.json`` plus ``tokenizer_config.json``
(or for a GGUF checkpoint, from its metadata: ``engine/gguf_tokenizer.py``).

Encoding and decoding go through the ``tokenizers`` library; chat templates are rendered with jinja2
exactly as transformers renders them, so prompts match what the model was trained on.
"""

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as Backend

from pdserve.engine.checkpoint_format import GENERATION_CONFIG_FILE, gguf_file

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # where newer checkpoints keep the template instead
# The named special tokens transformers exposes to chat templates (bos_token, eos_token, ...).
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)

Message = Mapping[str, Any]


class Tokenizer:
    def __init__(
        self,
        backend: Backend,
        special_tokens: dict[str, str],
        chat_template: str | None = None,
        model_max_length: int | None = None,
        generation_eos_token_ids: Sequence[int] = (),
    ) -> None:
        self.backend = backend
        self.special_tokens = special_tokens  # e.g. {"bos_token": "<s>", "eos_token": "</s>"}
        self.chat_template = chat_template
        self.model_max_length = model_max_length
        self._generation_eos_token_ids = tuple(generation_eos_token_ids)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "Tokenizer":
        """Loads the tokenizer of the HF checkpoint directory (or GGUF checkpoint) ``path``."""
        gguf = gguf_file(path)
        if gguf is not None:
            # Imported here: only a GGUF checkpoint needs the gguf package.
            from pdserve.engine.gguf_tokenizer import gguf_tokenizer

            return gguf_tokenizer(gguf)
        path = Path(path)
        backend = Backend.from_file(str(_required(path / TOKENIZER_FILE)))
        config = json.loads(_required(path / TOKENIZER_CONFIG_FILE).read_text(encoding="utf-8"))
        legacy_map = path / SPECIAL_TOKENS_MAP_FILE
        if "added_tokens_decoder" not in config and legacy_map.is_file():
            # Older checkpoints name their special tokens here; transformers then reads it too.
            config |= json.loads(legacy_map.read_text(encoding="utf-8"))
        special_tokens = {
            name: _token_content(config[name])
            for name in SPECIAL_TOKEN_NAMES
            if config.get(name) is not None
        }
        # add_bos_token/add_eos_token are not read: with a tokenizer.json, transformers 5 drops them
        # and the file's post-processor alone decides which special tokens encode() adds.
        return cls(
            backend,
            special_tokens,
            chat_template=_chat_template(path, config.get("chat_template")),
            model_max_length=config.get("model_max_length"),
            generation_eos_token_ids=_generation_eos_ids(path / GENERATION_CONFIG_FILE),
        )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        tokens = [self.backend.id_to_token(i) for i in ids]
        if None in tokens:
            unknown = [i for i, t in zip(ids, tokens, strict=True) if t is None]
            raise ValueError(f"token ids {unknown} are outside the vocabulary ({self.vocab_size})")
        return tokens

    def apply_chat_template(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        tokenize: bool = False,
        *,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str | list[int]:
        """Renders ``messages`` with the model's template; extra kwargs reach the template."""
        if self.chat_template is None:
            raise ValueError(
                "this model has no chat template (no 'chat_template' in tokenizer_config.json and "
                f"no {CHAT_TEMPLATE_FILE}); send a plain completion prompt instead"
            )
        # transformers drops None-valued keys (OpenAI clients send content=None with tool calls).
        chat = [{k: v for k, v in message.items() if v is not None} for message in messages]
        text = _compile(self.chat_template).render(
            messages=chat,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            **{**self.special_tokens, **kwargs},
        )
        # The template writes its own special tokens, so encoding must not add BOS again.
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def _token_id(self, name: str) -> int | None:
        token = self.special_tokens.get(name)
        return None if token is None else self.backend.token_to_id(token)

    @property
    def bos_token_id(self) -> int | None:
        return self._token_id("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._token_id("eos_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._token_id("pad_token")

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The tokenizer's EOS first, then any further stop ids from generation_config.json."""
        ids = [self.eos_token_id, *self._generation_eos_token_ids]
        return tuple(dict.fromkeys(i for i in ids if i is not None))

    @property
    def vocab_size(self) -> int:
        """Every id the tokenizer can decode, added tokens included (= ``len()`` of an HF one)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def all_special_ids(self) -> list[int]:
        # The named tokens plus every added token flagged special: what skip_special_tokens drops.
        named = (self._token_id(name) for name in self.special_tokens)
        added = (i for i, t in self.backend.get_added_tokens_decoder().items() if t.special)
        return sorted({i for i in (*named, *added) if i is not None})


def _required(file: Path) -> Path:
    if not file.is_file():
        raise FileNotFoundError(f"tokenizer file not found: {file}")
    return file


def _token_content(value: str | dict[str, Any]) -> str:
    # Older configs serialise special tokens as AddedToken dicts: {"content": "<s>", ...}.
    return value["content"] if isinstance(value, dict) else value


def _chat_template(path: Path, configured: str | list[dict[str, str]] | None) -> str | None:
    # As in transformers, a chat_template.jinja file wins over the config's entry.
    if (path / CHAT_TEMPLATE_FILE).is_file():
        return (path / CHAT_TEMPLATE_FILE).read_text(encoding="utf-8")
    if isinstance(configured, list):
        # Several named templates (e.g. "default", "tool_use"): the default one serves chat.
        return {t["name"]: t["template"] for t in configured}.get("default")
    return configured


def _generation_eos_ids(file: Path) -> tuple[int, ...]:
    if not file.is_file():
        return ()
    eos = json.loads(file.read_text(encoding="utf-8")).get("eos_token_id")
    return tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` marks assistant text for training masks; at
    inference it renders its body unchanged, but templates using it must still parse."""

    tags = frozenset({"generation"})

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # jinja's own tojson HTML-escapes; templates expect plain JSON (as transformers provides).
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    # Cached per template text, so Tokenizer stays picklable (Ray ships it) and compiles once.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)
