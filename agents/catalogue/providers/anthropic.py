"""``anthropic``: the Anthropic Messages API.

``base_url`` defaults to ``https://api.anthropic.com``; requests go to
``{base_url}/v1/messages`` (a base_url that already ends in ``/v1`` is accepted too).
Extended thinking is never requested; thinking blocks in answers are dropped.

Asked for a turn with an ``on_delta`` callback, the request is streamed (``"stream": true``): the
events (message_start, content_block_start / _delta / _stop, message_delta, message_stop) are
assembled as they arrive into the message a whole answer gives, visible text and tool input
pieces handed to ``on_delta`` on the way (thinking never). A whole JSON body is read as one; a
server that refuses the ``stream`` field (a 400 naming it) is asked again without, and the
instance (a run's) asks its later turns whole at once; a stream that ends before message_stop is
an interrupted request.

The output-per-turn limit (``max_tokens``) is held as the stream grows, not only asked for: a
server that writes clearly past it (`_http.OutputMeter`) is cut off at once, and the turn is one
truncated at the limit (``stop_reason`` "length", nothing of it kept); a whole answer whose usage
counts clearly more output tokens than asked is truncated at the limit too.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

from core import telemetry

from . import _http
from .base import (
    PROVIDER_BAD_REQUEST,
    PROVIDER_BAD_RESPONSE,
    PROVIDER_SERVER_ERROR,
    Completion,
    Message,
    OnDelta,
    ProbeResult,
    Provider,
    ProviderError,
    ToolCallRequest,
    ToolSpec,
    probe_by_chat,
    register,
)

DEFAULT_BASE_URL = "https://api.anthropic.com"
ANTHROPIC_VERSION = "2023-06-01"
#: Prompt caching of the stable prefix (tools, then the system prompt).
CACHE_CONTROL = {"type": "ephemeral"}

_STOP_MAP = {
    "end_turn": "end",
    "stop_sequence": "end",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "refusal",
}


class _MessageStream:
    """The events of one streamed Messages answer, assembled as they arrive (on the loop) into
    the message a whole answer would have been."""

    def __init__(self, provider: Provider, on_delta: OnDelta, meter: _http.OutputMeter) -> None:
        self.provider, self.on_delta, self.meter = provider, on_delta, meter
        self.message: dict[str, Any] = {}
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial: dict[int, list[str]] = {}  # a tool_use block's input JSON, in pieces
        self.call_of: dict[int, int] = {}  # block index -> the tool call's position
        self.done = False

    def event(self, _name: str, data: str) -> None:
        if self.done:
            return
        try:
            event = json.loads(data)
        except ValueError:
            snippet = self.provider.redact(data[:2000])[:200]
            raise self.provider.error(
                PROVIDER_BAD_RESPONSE, f"a streamed event is not valid JSON: {snippet!r}"
            ) from None
        if not isinstance(event, dict):
            raise self.provider.error(PROVIDER_BAD_RESPONSE, "a streamed event is not an object")
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), dict):
            self.message = dict(event["message"])
        elif kind == "content_block_start" and isinstance(event.get("content_block"), dict):
            self._start(event)
        elif kind == "content_block_delta" and isinstance(event.get("delta"), dict):
            self._delta(event)
        elif kind == "message_delta":
            delta = event.get("delta")
            ending = isinstance(delta, dict) and bool(delta.get("stop_reason"))
            if isinstance(delta, dict) and "stop_reason" in delta:
                self.message["stop_reason"] = delta["stop_reason"]
            usage = event.get("usage")
            if isinstance(usage, dict):  # counts so far, output_tokens the final one
                self.message["usage"] = {**(self.message.get("usage") or {}), **usage}
                if not ending:  # the last count is the whole answer's (`at_output_limit`)
                    self.meter.report(_http.as_int(usage.get("output_tokens")))
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            summary, _ = _http.error_text(json.dumps(event).encode(), self.provider.redact)
            raise self.provider.error(PROVIDER_SERVER_ERROR, f"error in the stream: {summary}")

    def _start(self, event: dict[str, Any]) -> None:
        index = event.get("index")
        index = index if isinstance(index, int) else len(self.blocks)
        block = dict(event["content_block"])
        self.blocks[index] = block
        if block.get("type") == "text" and isinstance(block.get("text"), str) and block["text"]:
            self.meter.add(block["text"])
            self.on_delta("text", {"text": block["text"]})
        elif block.get("type") == "tool_use":
            position = self.call_of[index] = len(self.call_of)
            self.partial[index] = []
            name = block["name"] if isinstance(block.get("name"), str) else ""
            self.meter.add(name)
            self.on_delta("tool_call", {"index": position, "name": name, "arguments": ""})

    def _delta(self, event: dict[str, Any]) -> None:
        index = event.get("index")
        if not isinstance(index, int) or index not in self.blocks:
            return
        block = self.blocks[index]
        delta = event["delta"]
        if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
            self.meter.add(delta["text"])
            block["text"] = str(block.get("text") or "") + delta["text"]
            self.on_delta("text", {"text": delta["text"]})
        elif (
            delta.get("type") == "input_json_delta"
            and isinstance(delta.get("partial_json"), str)
            and index in self.partial
        ):
            self.meter.add(delta["partial_json"])
            self.partial[index].append(delta["partial_json"])
            position = self.call_of[index]
            self.on_delta(
                "tool_call", {"index": position, "name": "", "arguments": delta["partial_json"]}
            )
        # thinking_delta, signature_delta: hidden reasoning, neither kept nor shown

    def cut(self) -> dict[str, Any]:
        """What the stream said before it was cut at the output limit (message_start's usage
        and model), none of what it wrote (`OutputMeter.cut` makes the turn of it)."""
        return {**self.message, "content": [], "stop_reason": "max_tokens"}

    def body(self, status: int) -> dict[str, Any]:
        """The message a whole answer would have been; a stream cut off before message_stop is
        an interrupted request (nothing of it is kept)."""
        if not self.done:
            raise self.provider.error(
                PROVIDER_SERVER_ERROR,
                "the streamed answer ended before the turn was complete",
                status=status,
            )
        for index, pieces in self.partial.items():
            raw = "".join(pieces)
            try:
                self.blocks[index]["input"] = json.loads(raw) if raw.strip() else {}
            except ValueError:
                self.blocks[index]["input"] = raw  # unparsable: the loop refuses the call
        return {**self.message, "content": [self.blocks[i] for i in sorted(self.blocks)]}


@register
class AnthropicProvider(Provider):
    kind = "anthropic"
    label = "Anthropic"
    supports_tools = True
    supports_cancel = True
    price_provider_id = "anthropic"

    @classmethod
    def credential_destination(cls, *, base_url: str, command: list[str] | None) -> str:
        return (base_url or "").strip() or DEFAULT_BASE_URL

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        base = self.base_url or DEFAULT_BASE_URL
        if base.endswith("/v1"):
            base = base[: -len("/v1")]
        self.base_url = base

    # -- wire mapping --------------------------------------------------------------------

    def headers(self) -> dict[str, str]:
        headers = {
            "accept": "application/json",
            "anthropic-version": ANTHROPIC_VERSION,
            **self.extra_headers,
        }
        if self.api_key:
            headers["x-api-key"] = self.api_key
        return headers

    @staticmethod
    def wire_messages(messages: list[Message]) -> tuple[str, list[dict[str, Any]]]:
        """Return ``(system, messages)`` in Messages API shape.

        System messages are joined into ``system``; tool results become ``tool_result``
        blocks in a user message; adjacent messages of the same role are merged (so
        consecutive tool results, and a user note after them, form one user message).
        """
        system_parts: list[str] = []
        turns: list[tuple[str, list[dict[str, Any]]]] = []
        for msg in messages:
            if msg.role == "system":
                if msg.content:
                    system_parts.append(msg.content)
                continue
            blocks: list[dict[str, Any]] = []
            if msg.role == "tool":
                role = "user"
                blocks.append(
                    {
                        "type": "tool_result",
                        "tool_use_id": msg.tool_call_id or "",
                        "content": msg.content,
                    }
                )
            else:
                role = msg.role
                if msg.content:
                    blocks.append({"type": "text", "text": msg.content})
                if msg.role == "assistant":
                    for call in msg.tool_calls:
                        blocks.append(
                            {
                                "type": "tool_use",
                                "id": call.id,
                                "name": call.name,
                                "input": call.arguments if call.arguments is not None else {},
                            }
                        )
            if not blocks:
                continue
            if turns and turns[-1][0] == role:
                turns[-1][1].extend(blocks)
            else:
                turns.append((role, blocks))
        wire = [{"role": role, "content": blocks} for role, blocks in turns]
        return "\n\n".join(system_parts), wire

    @staticmethod
    def wire_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
        wire = [
            {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}
            for tool in tools
        ]
        if wire:  # the tools are part of the stable prefix: cache up to the last one
            wire[-1]["cache_control"] = dict(CACHE_CONTROL)
        return wire

    def payload(
        self, model: str, messages: list[Message], tools: list[ToolSpec], max_tokens: int
    ) -> dict[str, Any]:
        system, wire = self.wire_messages(messages)
        body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "messages": wire}
        if tools:
            body["tools"] = self.wire_tools(tools)
        if system:
            # The system prompt is stored once per task and byte-stable: mark it (tools come
            # first in Anthropic's cache order, so this breakpoint covers tools + system).
            body["system"] = [
                {"type": "text", "text": system, "cache_control": dict(CACHE_CONTROL)}
            ]
        return body

    def parse_completion(self, data: Any, model: str, status: int) -> Completion:
        if not isinstance(data, dict):
            raise _http.bad_shape(self, "body is not a JSON object", status)
        if data.get("type") == "error":
            summary, _ = _http.error_text(json.dumps(data).encode(), self.redact)
            raise _http.bad_shape(self, f"error object in a 2xx answer: {summary}", status)
        content = data.get("content")
        if not isinstance(content, list):
            raise _http.bad_shape(self, "missing content list", status)
        texts: list[str] = []
        calls: list[ToolCallRequest] = []
        for block in content:
            if not isinstance(block, dict):
                raise _http.bad_shape(self, "content block is not an object", status)
            kind = block.get("type")
            if kind == "text":
                value = block.get("text")
                if not isinstance(value, str):
                    raise _http.bad_shape(self, "text block without text", status)
                texts.append(value)
            elif kind == "tool_use":
                name = block.get("name")
                if not isinstance(name, str) or not name:
                    raise _http.bad_shape(self, "tool_use block without a name", status)
                raw_input = block.get("input")
                call_id = block.get("id")
                if not isinstance(call_id, str) or not call_id:
                    call_id = f"toolu_{uuid.uuid4().hex[:16]}"
                calls.append(
                    ToolCallRequest(
                        id=call_id,
                        name=name,
                        arguments=raw_input if isinstance(raw_input, dict) else None,
                        arguments_raw=json.dumps(raw_input, ensure_ascii=False),
                    )
                )
            # thinking / redacted_thinking and unknown block types are dropped.

        raw_stop = data.get("stop_reason")
        raw_stop = raw_stop if isinstance(raw_stop, str) else ""
        stop_reason = _STOP_MAP.get(raw_stop, "other")

        usage = data.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        # input_tokens is only the uncached part; the total counts every input token, and the
        # cache reads and writes are kept apart because they are priced apart.
        cache_read = _http.as_int(usage.get("cache_read_input_tokens"))
        cache_write = _http.as_int(usage.get("cache_creation_input_tokens"))
        return Completion(
            text="".join(texts),
            tool_calls=calls,
            stop_reason=stop_reason,
            raw_stop_reason=raw_stop,
            input_tokens=_http.as_int(usage.get("input_tokens")) + cache_read + cache_write,
            cached_input_tokens=cache_read,
            cache_write_tokens=cache_write,
            output_tokens=_http.as_int(usage.get("output_tokens")),
            model=data.get("model") if isinstance(data.get("model"), str) else model,
        )

    # -- API -----------------------------------------------------------------------------

    def complete(
        self,
        *,
        model: str,
        messages: list[Message],
        tools: list[ToolSpec],
        max_tokens: int,
        cancel_event: threading.Event | None = None,
        on_delta: OnDelta | None = None,
    ) -> Completion:
        with telemetry.chat(
            provider_name=self.telemetry_name or self.kind,
            model=model,
            max_tokens=max_tokens,
            server=self.base_url,
        ) as span:
            body = self.payload(model, messages, tools, max_tokens)
            if on_delta is not None and not self.stream_refused:
                body["stream"] = True
            try:
                completion = self._post(body, model, max_tokens, cancel_event, on_delta)
            except ProviderError as exc:
                if not (
                    exc.code == PROVIDER_BAD_REQUEST
                    and "stream" in exc.message
                    and body.get("stream")
                ):
                    raise
                # A server that does not stream (an Anthropic-compatible gateway, say): the
                # whole answer, as before, and the instance's later requests at once.
                del body["stream"]
                self.stream_refused = True
                completion = self._post(body, model, max_tokens, cancel_event, None)
            span.completed(completion)
            return completion

    def _post(
        self,
        body: dict[str, Any],
        model: str,
        max_tokens: int,
        cancel_event: threading.Event | None,
        on_delta: OnDelta | None,
    ) -> Completion:
        """One request. A streamed answer is held to the output limit as it grows
        (`_http.OutputMeter`: cut, it is a turn truncated at the limit), a whole one (or a
        stream's end) by the usage it reports (`_http.at_output_limit`)."""
        headers = self.headers()
        meter = _http.OutputMeter(self, max_tokens)
        stream = events = None
        if body.get("stream"):
            headers["accept"] = "text/event-stream, application/json"
            stream = _MessageStream(self, _http.safe_delta(on_delta), meter)
            events = _http.EventStream(stream.event)
        try:
            resp = _http.request(
                self,
                "POST",
                f"{self.base_url}/v1/messages",
                headers=headers,
                json_body=body,
                cancel_event=cancel_event,
                on_body=events,
            )
            _http.raise_for_status(self, resp)
            if stream is not None and events is not None and events.streamed:
                events.close()
                data = stream.body(resp.status)
            else:
                data = resp.json(self)
        except _http.OutputLimitReached:
            assert stream is not None  # only a stream's meter raises it
            return meter.cut(self.parse_completion(stream.cut(), model, 200))
        completion = self.parse_completion(data, model, resp.status)
        # output_tokens counts thinking too, which max_tokens bounds as well (never asked for).
        return _http.at_output_limit(completion, max_tokens, completion.output_tokens)

    def probe(self, *, model: str, tools: bool) -> ProbeResult:
        return probe_by_chat(self, model=model, tools=tools)
