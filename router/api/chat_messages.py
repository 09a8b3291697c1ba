"""Chat messages as OpenAI reads them: what each ``role`` needs.

A system, developer, user or tool message needs ``content`` (and a tool message the
``tool_call_id`` it answers); an assistant message needs ``content`` or ``tool_calls`` (a turn
that only called tools). Content is text: a string, or text parts. Extra keys (``name``, ...) are
passed on to the chat template, as vLLM does. The rules are checked here and stated in the
OpenAPI document (``BY_ROLE``), so a client's validator agrees with the server's.
"""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Role = Literal["system", "developer", "user", "assistant", "tool"]
NOT_NULL = {"not": {"type": "null"}}
HAS_CONTENT = {"required": ["content"], "properties": {"content": NOT_NULL}}
BY_ROLE = [
    {
        "properties": {"role": {"enum": ["system", "developer", "user"]}, "content": NOT_NULL},
        "required": ["content"],
    },
    {
        "properties": {"role": {"const": "tool"}, "content": NOT_NULL, "tool_call_id": NOT_NULL},
        "required": ["content", "tool_call_id"],
    },
    {
        "properties": {"role": {"const": "assistant"}},
        "anyOf": [
            HAS_CONTENT,
            {"required": ["tool_calls"], "properties": {"tool_calls": NOT_NULL}},
        ],
    },
]


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True)

    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    model_config = ConfigDict(strict=True)

    name: str
    arguments: str  # JSON, as the model wrote it


class ToolCall(BaseModel):
    model_config = ConfigDict(strict=True)

    id: str
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra={"oneOf": BY_ROLE})

    role: Role
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = Field(default=None, min_length=1)
    tool_call_id: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, content: Any) -> Any:
        # Checked first, so the error names the field rather than each member of its union type.
        if isinstance(content, list) and any(
            not isinstance(part, dict) or part.get("type") != "text" for part in content
        ):
            raise ValueError("only text content parts are supported")
        return content

    @model_validator(mode="after")
    def _has_what_its_role_needs(self) -> "ChatMessage":
        if self.role == "assistant" and self.content is None and self.tool_calls is None:
            raise ValueError("an assistant message needs content or tool_calls")
        if self.role != "assistant" and self.content is None:
            raise ValueError(f"a {self.role} message needs content")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs tool_call_id")
        return self
