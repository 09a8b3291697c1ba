"""Chat messages are checked as OpenAI checks them: content where each role needs it, an
assistant turn that only called tools, no role OpenAI does not know; and the OpenAPI document
states the same rules, so a body it allows is one the server takes."""

import jsonschema
import pytest
from pydantic import ValidationError

from pdserve.router.api.chat_messages import ChatMessage

TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
ACCEPTED = [
    {"role": "system", "content": "be brief"},
    {"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
    {"role": "user", "content": "hi", "name": "ann"},
    {"role": "assistant", "content": "hello"},
    {"role": "assistant", "tool_calls": [TOOL_CALL]},
    {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
    {"role": "tool", "content": "42", "tool_call_id": "call_1"},
]
# (message, words in the error)
REFUSED = [
    ({"role": "user"}, "a user message needs content"),
    ({"role": "system", "content": None}, "a system message needs content"),
    ({"role": "assistant"}, "needs content or tool_calls"),
    ({"role": "assistant", "content": None, "tool_calls": None}, "content or tool_calls"),
    ({"role": "assistant", "tool_calls": []}, "at least 1 item"),
    ({"role": "tool", "content": "42"}, "tool_call_id"),
    ({"role": "robot", "content": "hi"}, "role"),
    ({"role": "user", "content": [{"type": "image_url"}]}, "only text content parts"),
]


@pytest.mark.parametrize("message", ACCEPTED)
def test_what_openai_accepts_is_accepted_and_documented(message: dict) -> None:
    ChatMessage.model_validate(message)
    jsonschema.validate(message, _schema())


@pytest.mark.parametrize(("message", "words"), REFUSED)
def test_what_openai_refuses_is_refused_and_documented(message: dict, words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        ChatMessage.model_validate(message)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(message, _schema())


def _schema() -> dict:
    schema = ChatMessage.model_json_schema()
    return {**schema, "$schema": "https://json-schema.org/draft/2020-12/schema"}
