"""The OpenAI-compatible request body built from messages encoded once each
(`OpenAICompatibleProvider.wire_body`): byte for byte what encoding the whole payload gives, turn
after turn, with the history's rebuilt messages re-encoded and nothing stale kept."""

import json

from agents.catalogue.providers import Message, ToolCallRequest, ToolSpec
from agents.catalogue.providers.openai_compat import OpenAICompatibleProvider


def _provider() -> OpenAICompatibleProvider:
    return OpenAICompatibleProvider(base_url="http://127.0.0.1:9/v1", api_key="")


def _whole(provider, messages, tools):
    body = provider.payload("m", messages, tools, 100)
    return json.dumps(body, ensure_ascii=False).encode()


def _spliced(provider, messages, tools):
    body = provider.payload("m", [], tools, 100)
    del body["messages"]
    return provider.wire_body(body, messages)


def test_the_spliced_body_is_the_whole_payload_encoded_turn_after_turn():
    provider = _provider()
    tools = [ToolSpec(name="list_files", description="d", parameters={"type": "object"})]
    messages = [
        Message(role="system", content="sys \x00 \u2028 ünïcode"),
        Message(role="user", content="go"),
    ]
    for turn in range(5):
        call = ToolCallRequest(
            id=f"c{turn}", name="list_files", arguments={"p": turn}, arguments_raw="{}"
        )
        messages.append(Message(role="assistant", content="", tool_calls=[call]))
        assert _spliced(provider, messages, tools) == _whole(provider, messages, tools)
        messages.append(Message(role="tool", tool_call_id=f"c{turn}", content="a.txt\n" * turn))
        assert _spliced(provider, messages, tools) == _whole(provider, messages, tools)


def test_a_rebuilt_message_is_encoded_again_and_the_old_one_let_go():
    provider = _provider()
    messages = [Message(role="user", content=f"turn {i}") for i in range(40)]
    _spliced(provider, messages, [])
    for i in range(40):  # the history rebuilt every message (compaction)
        messages[i] = Message(role="user", content=f"compacted {i}")
    body = _spliced(provider, messages, [])
    assert body == _whole(provider, messages, [])
    assert b"turn 3" not in body
    messages[20] = Message(role="user", content="rebuilt in the middle")  # a compaction's
    messages.append(Message(role="user", content="new"))
    assert _spliced(provider, messages, []) == _whole(provider, messages, [])
    assert _spliced(provider, messages[:10], []) == _whole(provider, messages[:10], [])
    assert _spliced(provider, [], []) == _whole(provider, [], [])
