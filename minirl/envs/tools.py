"""Tool calls in Qwen2.5's native format, parsed from generated text.

An assistant turn may hold some text and any number of calls:

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "37 * 84"}}
    </tool_call>

Model output is untrusted: a malformed call becomes an error message (to be shown to the model as
an observation it can recover from), never an exception.
"""

import json
import re
from dataclasses import dataclass, field

CALL_PATTERN = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


@dataclass
class ToolCall:
    name: str
    arguments: dict


@dataclass
class AssistantTurn:
    content: str  # the text outside the <tool_call> blocks, stripped
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one per malformed call


def parse_assistant(text: str) -> AssistantTurn:
    """Split generated assistant text (without <|im_end|>) into content, well-formed calls and errors."""
    calls, errors = [], []
    for block in CALL_PATTERN.findall(text):
        try:
            call = json.loads(block)
        except json.JSONDecodeError as e:
            errors.append(f"Error: tool call is not valid JSON ({e.msg} at position {e.pos})")
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            errors.append('Error: a tool call must be a JSON object with a "name" string')
            continue
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        if not isinstance(arguments, dict):
            errors.append(f'Error: "arguments" of {call["name"]} must be a JSON object')
            continue
        calls.append(ToolCall(call["name"], arguments))
    content = CALL_PATTERN.sub("", text)
    if "<tool_call>" in content or "</tool_call>" in content:
        errors.append("Error: unbalanced <tool_call> tags")
        content = content.replace("<tool_call>", "").replace("</tool_call>", "")
    return AssistantTurn(content.strip(), calls, errors)
