"""Streams output text token by token, as vLLM's incremental detokenizer does.

Decoding one token on its own is wrong in two ways: a token may hold only part of a UTF-8 character
(byte-level BPE splits emoji and CJK into byte tokens), and SentencePiece-style decoders drop a
token's leading space at the start of a string. So each step decodes a short window of recent
tokens twice — up to ``read`` (already emitted) and to the end — and emits the difference.
"""

from collections.abc import Sequence

from pdserve.engine.tokenizer import Tokenizer

# Decoded text ending in this means the last token stopped inside a UTF-8 character.
REPLACEMENT_CHAR = "\ufffd"
# Prompt tokens decoded with the first output tokens, so the first delta has the right leading
# space (vLLM's INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET).
PROMPT_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        # The window: tokens from vLLM's prefix_offset on; _read is read_offset within it.
        # Tokens before the window are final and never decoded again.
        self._window = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self._read = len(self._window)
        self.text = ""  # all output text emitted so far

    def add_token(self, token_id: int) -> str:
        """Appends one output token and returns the text it completes ('' while it waits)."""
        self._window.append(token_id)
        prefix_text = self._decode(self._window[: self._read])
        new_text = self._decode(self._window)
        # Nothing new (a skipped special token) or an unfinished character: wait for more tokens.
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR):
            return ""
        delta = new_text[len(prefix_text) :]
        # The tokens just emitted become the next prefix; the ones before them are done.
        self._window = self._window[self._read :]
        self._read = len(self._window)
        self.text += delta
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)
