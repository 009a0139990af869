"""``openai_compatible``: the Chat Completions API (OpenAI, Ollama, vLLM, llama.cpp,
OpenRouter, LM Studio, ...).

``base_url`` is the API root including the version, e.g. ``https://api.openai.com/v1`` or
``http://localhost:11434/v1``; requests go to ``{base_url}/chat/completions``.

Asked for a turn with an ``on_delta`` callback, the request is streamed (``"stream": true``, the
usage asked for in the last event): the Server-Sent Events are parsed as they arrive, each piece
of visible text and of a tool call handed to ``on_delta``, and the pieces assembled into the same
Completion a whole answer gives. A server that answers a streamed request with a whole JSON body
is read as one; one that refuses the ``stream`` field (a 400 naming it) is asked again without,
and the instance (a run's) asks its later turns whole at once.
A stream that ends before its ``finish_reason`` (or ``[DONE]``) is an interrupted request.

The output-per-turn limit (``max_tokens``) is held as the stream grows, not only asked for: a
server that writes clearly past it (`_http.OutputMeter`) is cut off at once, and the turn is one
truncated at the limit (``stop_reason`` "length", nothing of it kept); a whole answer whose usage
counts clearly more visible output tokens than asked is truncated at the limit too.
"""

from __future__ import annotations

import json
import threading
import uuid
from itertools import compress, count
from operator import is_not
from typing import Any

import httpx

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

_FINISH_MAP = {
    "stop": "end",
    "end_turn": "end",
    "eos": "end",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "length",
    "content_filter": "content_filter",
}

_CONTEXT_KEYS = ("context_length", "max_model_len", "context_window", "max_context_length")


def parse_arguments(raw: Any) -> tuple[dict[str, Any] | None, str]:
    """Turn a tool call's ``arguments`` (normally a JSON string) into ``(dict|None, raw)``.

    An empty string counts as ``{}`` (several servers send it for argument-less calls).
    """
    if isinstance(raw, dict):
        return raw, json.dumps(raw, ensure_ascii=False)
    if raw is None:
        return {}, ""
    if not isinstance(raw, str):
        return None, json.dumps(raw, ensure_ascii=False)
    if not raw.strip():
        return {}, raw
    try:
        value = json.loads(raw)
    except ValueError:
        return None, raw
    return (value if isinstance(value, dict) else None), raw


def context_window_from_model_entry(entry: dict[str, Any]) -> int | None:
    """Context window reported in a ``/v1/models`` entry (vLLM, Ollama, llama.cpp,
    OpenRouter), or None."""
    candidates: list[Any] = [entry.get(key) for key in _CONTEXT_KEYS]
    meta = entry.get("meta")
    if isinstance(meta, dict):
        candidates += [meta.get("n_ctx"), meta.get("n_ctx_train")]
    top = entry.get("top_provider")
    if isinstance(top, dict):
        candidates.append(top.get("context_length"))
    for value in candidates:
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _reasoned(data: Any) -> bool:
    """Whether a whole answer came with hidden reasoning (`reasoning_content`, `reasoning`)."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return False
    message = choices[0].get("message")
    return isinstance(message, dict) and bool(
        message.get("reasoning_content") or message.get("reasoning")
    )


def visible_output(usage: Any, *, reasoned: bool) -> int | None:
    """The output tokens of an answer's visible text and tool calls by the server's `usage`:
    `completion_tokens` less the hidden reasoning's (`completion_tokens_details`
    `.reasoning_tokens`), which some servers do not hold to `max_tokens`. None when there is no
    count, or when the answer reasoned (`reasoned`) and the count does not say how much."""
    if not isinstance(usage, dict) or "completion_tokens" not in usage:
        return None
    details = usage.get("completion_tokens_details")
    hidden = details.get("reasoning_tokens") if isinstance(details, dict) else None
    if hidden is None and reasoned:
        return None
    return max(0, _http.as_int(usage.get("completion_tokens")) - _http.as_int(hidden))


class _ChatStream:
    """The events of one streamed Chat Completion, assembled as they arrive (on the loop) into
    the body a whole answer would have had; visible text and tool-call pieces go to
    ``on_delta`` on the way (``reasoning_content`` / ``reasoning`` never do)."""

    def __init__(self, provider: Provider, on_delta: OnDelta, meter: _http.OutputMeter) -> None:
        self.provider, self.on_delta, self.meter = provider, on_delta, meter
        self.reasoned = False  # hidden reasoning came (its tokens may be in the usage)
        self.text: list[str] = []
        self.refusal: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}
        self.finish: str | None = None
        self.usage: Any = None
        self.model: Any = None
        self.done = False
        self.error: dict[str, Any] | None = None

    def event(self, _name: str, data: str) -> None:
        if self.done or self.error is not None:
            return
        if data.strip() == "[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            snippet = self.provider.redact(data[:2000])[:200]
            raise self.provider.error(
                PROVIDER_BAD_RESPONSE, f"a streamed event is not valid JSON: {snippet!r}"
            ) from None
        if not isinstance(chunk, dict):
            raise self.provider.error(PROVIDER_BAD_RESPONSE, "a streamed event is not an object")
        if "error" in chunk and not chunk.get("choices"):
            self.error = chunk  # parse_completion classifies it as a whole answer's
            return
        if isinstance(chunk.get("model"), str):
            self.model = chunk["model"]
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
            visible = visible_output(self.usage, reasoned=self.reasoned)
            if visible is not None and self.finish is None:
                # A count as it goes (vLLM's continuous usage stats); the last one, after the
                # finish, is the whole answer's (`at_output_limit`).
                self.meter.report(visible)
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return  # e.g. the usage event, whose choices are empty
        choice = choices[0]
        delta = choice.get("delta")
        if isinstance(delta, dict):
            self._delta(delta)
        if isinstance(choice.get("finish_reason"), str):
            self.finish = choice["finish_reason"]

    def _delta(self, delta: dict[str, Any]) -> None:
        if delta.get("reasoning_content") or delta.get("reasoning"):
            self.reasoned = True
        content = delta.get("content")
        if isinstance(content, str) and content:
            self.meter.add(content)
            self.text.append(content)
            self.on_delta("text", {"text": content})
        refusal = delta.get("refusal")
        if isinstance(refusal, str) and refusal:
            self.meter.add(refusal)
            self.refusal.append(refusal)  # a declined turn: discarded, never shown
        raw_calls = delta.get("tool_calls")
        if not isinstance(raw_calls, list):
            legacy = delta.get("function_call")
            raw_calls = [{"index": 0, "function": legacy}] if isinstance(legacy, dict) else []
        for position, raw in enumerate(raw_calls):
            if not isinstance(raw, dict):
                continue
            index = raw.get("index", position)
            index = index if isinstance(index, int) and not isinstance(index, bool) else position
            call = self.calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
            if isinstance(raw.get("id"), str) and raw["id"]:
                call["id"] = raw["id"]
            function = raw.get("function")
            function = function if isinstance(function, dict) else {}
            name = function.get("name")
            name = name if isinstance(name, str) and name != call["name"] else ""
            arguments = function.get("arguments")
            if isinstance(arguments, dict):  # a server that sends the object whole
                arguments = json.dumps(arguments, ensure_ascii=False)
            arguments = arguments if isinstance(arguments, str) else ""
            self.meter.add(name)
            self.meter.add(arguments)
            call["name"] += name
            call["arguments"] += arguments
            if name or arguments:
                self.on_delta("tool_call", {"index": index, "name": name, "arguments": arguments})

    def cut(self) -> dict[str, Any]:
        """What the stream said before it was cut at the output limit: its usage and model,
        none of what it wrote (`OutputMeter.cut` makes the turn of it)."""
        body: dict[str, Any] = {
            "choices": [{"message": {"content": None}, "finish_reason": "length"}],
            "usage": self.usage,
        }
        if self.model is not None:
            body["model"] = self.model
        return body

    def body(self, status: int) -> dict[str, Any]:
        """What a whole answer would have been; a stream cut off before its end is an
        interrupted request (nothing of it is kept)."""
        if self.error is not None:
            return self.error
        if self.finish is None and not self.done:
            raise self.provider.error(
                PROVIDER_SERVER_ERROR,
                "the streamed answer ended before the turn was complete",
                status=status,
            )
        message: dict[str, Any] = {"content": "".join(self.text) or None}
        if self.calls:
            message["tool_calls"] = [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
                for _, call in sorted(self.calls.items())
            ]
        if self.refusal:
            message["refusal"] = "".join(self.refusal)
        body: dict[str, Any] = {
            "choices": [{"message": message, "finish_reason": self.finish}],
            "usage": self.usage,
        }
        if self.model is not None:
            body["model"] = self.model
        return body


#: Where `wire_body` puts the encoded messages: a string no JSON encoder writes otherwise.
_SPLICE = "\x00acthelm:messages\x00"
_SPLICE_JSON = json.dumps(_SPLICE).encode()


@register
class OpenAICompatibleProvider(Provider):
    kind = "openai_compatible"
    label = "OpenAI-compatible (OpenAI, Ollama, vLLM, llama.cpp)"
    telemetry_name = "openai"
    supports_tools = True
    supports_cancel = True
    #: Set once the server refused ``max_tokens`` for ``max_completion_tokens`` (newer OpenAI
    #: models): the instance's later requests (a run's turns) send the latter at once.
    completion_tokens_field: bool = False

    # -- wire mapping --------------------------------------------------------------------

    def headers(self) -> dict[str, str]:
        headers = {"accept": "application/json", **self.extra_headers}
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        return headers

    @staticmethod
    def wire_messages(messages: list[Message]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for msg in messages:
            if msg.role == "tool":
                out.append(
                    {"role": "tool", "tool_call_id": msg.tool_call_id or "", "content": msg.content}
                )
            elif msg.role == "assistant" and msg.tool_calls:
                out.append(
                    {
                        "role": "assistant",
                        "content": msg.content or None,
                        "tool_calls": [
                            {
                                "id": call.id,
                                "type": "function",
                                "function": {
                                    "name": call.name,
                                    "arguments": (
                                        json.dumps(call.arguments, ensure_ascii=False)
                                        if call.arguments is not None
                                        else call.arguments_raw
                                    ),
                                },
                            }
                            for call in msg.tool_calls
                        ],
                    }
                )
            else:
                out.append({"role": msg.role, "content": msg.content})
        return out

    @staticmethod
    def wire_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
        return [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                },
            }
            for tool in tools
        ]

    def payload(
        self, model: str, messages: list[Message], tools: list[ToolSpec], max_tokens: int
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "messages": self.wire_messages(messages),
            "max_tokens": max_tokens,
            "stream": False,
        }
        if tools:
            body["tools"] = self.wire_tools(tools)
        return body

    def wire_body(self, body: dict[str, Any], messages: list[Message]) -> bytes:
        """`body` (the payload without its messages) with `messages` as JSON. The messages the
        last request began with, as the same Message objects, keep their encoding (a provider
        is a run's); only what follows is encoded: a turn encodes what is new, and finding the
        kept prefix runs in C (no Python step per message), so a step's cost does not grow with
        the conversation. The same bytes `json.dumps` of the whole payload gives."""
        last: tuple[list[Message], list[bytes]] | None = self.__dict__.get("_wire_last")
        kept = 0
        parts: list[bytes] = []
        if last is not None:
            before, encoded = last
            # The first position whose message is not the same object, else the shorter length.
            kept = next(
                compress(count(), map(is_not, before, messages)), min(len(before), len(messages))
            )
            parts = encoded[:kept]
        for msg in messages[kept:]:
            parts.append(json.dumps(self.wire_messages([msg])[0], ensure_ascii=False).encode())
        self.__dict__["_wire_last"] = (list(messages), parts)
        ordered = {"model": body.get("model"), "messages": _SPLICE, **body}  # payload's order
        head = json.dumps(ordered, ensure_ascii=False).encode()
        return head.replace(_SPLICE_JSON, b"[" + b", ".join(parts) + b"]", 1)

    def parse_completion(self, data: Any, model: str, status: int) -> Completion:
        if not isinstance(data, dict):
            raise _http.bad_shape(self, "body is not a JSON object", status)
        if "error" in data and not data.get("choices"):
            # Some gateways (OpenRouter) answer upstream errors with 200 and an error object
            # carrying the real HTTP code; classify it like that status.
            err = data["error"]
            err_code = err.get("code") if isinstance(err, dict) else None
            encoded = json.dumps(data).encode()
            if isinstance(err_code, int) and 400 <= err_code < 600:
                _http.raise_for_status(self, _http.HttpResponse(err_code, httpx.Headers(), encoded))
            summary, _ = _http.error_text(encoded, self.redact)
            raise _http.bad_shape(self, f"error object in a 2xx answer: {summary}", status)
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise _http.bad_shape(self, "missing choices[0]", status)
        choice = choices[0]
        message = choice.get("message")
        if not isinstance(message, dict):
            raise _http.bad_shape(self, "missing choices[0].message", status)

        text = self._content_text(message.get("content"), status)
        # reasoning_content / reasoning are deliberately ignored (never stored as text).
        tool_calls = self._tool_calls(message, status)

        raw_finish = choice.get("finish_reason")
        raw_finish = raw_finish if isinstance(raw_finish, str) else ""
        stop_reason = _FINISH_MAP.get(raw_finish, "other")
        if tool_calls and stop_reason == "end":
            stop_reason = "tool_calls"  # e.g. Ollama reports "stop" with tool calls
        refusal = message.get("refusal")
        if isinstance(refusal, str) and refusal.strip() and not tool_calls:
            stop_reason = "refusal"
            text = text or refusal

        usage = data.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        input_tokens = _http.as_int(usage.get("prompt_tokens"))
        details = usage.get("prompt_tokens_details")
        details = details if isinstance(details, dict) else {}
        # OpenAI / OpenRouter: prompt_tokens_details.cached_tokens; DeepSeek:
        # prompt_cache_hit_tokens. Both are part of prompt_tokens.
        cached = _http.as_int(details.get("cached_tokens")) or _http.as_int(
            usage.get("prompt_cache_hit_tokens")
        )
        return Completion(
            text=text,
            tool_calls=tool_calls,
            stop_reason=stop_reason,
            raw_stop_reason=raw_finish,
            input_tokens=input_tokens,
            cached_input_tokens=min(cached, input_tokens),
            output_tokens=_http.as_int(usage.get("completion_tokens")),
            reported_cost=_http.as_cost(usage.get("cost")),
            model=data.get("model") if isinstance(data.get("model"), str) else model,
        )

    def _content_text(self, content: Any, status: int) -> str:
        if content is None:
            return ""
        if isinstance(content, str):
            return content
        if isinstance(content, list):  # content parts
            texts = []
            for part in content:
                if isinstance(part, dict) and part.get("type") in ("text", "output_text"):
                    value = part.get("text")
                    if isinstance(value, str):
                        texts.append(value)
            return "".join(texts)
        raise _http.bad_shape(self, "message.content is neither a string nor null", status)

    def _tool_calls(self, message: dict[str, Any], status: int) -> list[ToolCallRequest]:
        raw_calls = message.get("tool_calls")
        if raw_calls is None:
            raw_calls = []
            legacy = message.get("function_call")
            if isinstance(legacy, dict):
                raw_calls = [{"type": "function", "function": legacy}]
        if not isinstance(raw_calls, list):
            raise _http.bad_shape(self, "message.tool_calls is not a list", status)
        calls = []
        for raw in raw_calls:
            if not isinstance(raw, dict) or not isinstance(raw.get("function"), dict):
                raise _http.bad_shape(self, "tool call without a function object", status)
            function = raw["function"]
            name = function.get("name")
            if not isinstance(name, str) or not name:
                raise _http.bad_shape(self, "tool call without a function name", status)
            arguments, arguments_raw = parse_arguments(function.get("arguments"))
            call_id = raw.get("id")
            if not isinstance(call_id, str) or not call_id:
                call_id = f"call_{uuid.uuid4().hex[:16]}"
            calls.append(
                ToolCallRequest(
                    id=call_id, name=name, arguments=arguments, arguments_raw=arguments_raw
                )
            )
        return calls

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
        body = self.payload(model, [], tools, max_tokens)  # the messages: wire_body
        del body["messages"]
        if self.completion_tokens_field:
            body["max_completion_tokens"] = body.pop("max_tokens")
        if on_delta is not None and not self.stream_refused:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        with telemetry.chat(
            provider_name=self.telemetry_name or self.kind,
            model=model,
            max_tokens=max_tokens,
            server=self.base_url,
        ) as span:
            completion = None
            for _attempt in range(3):
                try:
                    completion = self._post(
                        body, messages, model, max_tokens, cancel_event, on_delta
                    )
                    break
                except ProviderError as exc:
                    if exc.code != PROVIDER_BAD_REQUEST:
                        raise
                    if "max_completion_tokens" in exc.message and "max_tokens" in body:
                        # Newer OpenAI models reject max_tokens, ask for max_completion_tokens
                        # (remembered: the run's later turns ask for it at once).
                        body["max_completion_tokens"] = body.pop("max_tokens")
                        self.completion_tokens_field = True
                    elif "stream" in exc.message and body.get("stream"):
                        # A server that does not stream: the whole answer, as before.
                        body["stream"] = False
                        body.pop("stream_options", None)
                        self.stream_refused = True
                    else:
                        raise
            assert completion is not None  # each attempt returns or raises
            span.completed(completion)
            return completion

    def _post(
        self,
        body: dict[str, Any],
        messages: list[Message],
        model: str,
        max_tokens: int,
        cancel_event: threading.Event | None,
        on_delta: OnDelta | None = None,
    ) -> Completion:
        """One request. A streamed answer is held to the output limit as it grows
        (`_http.OutputMeter`: cut, it is a turn truncated at the limit), a whole one (or a
        stream's end) by the usage it reports (`_http.at_output_limit`)."""
        meter = _http.OutputMeter(self, max_tokens)
        chat = _ChatStream(self, _http.safe_delta(on_delta), meter) if body.get("stream") else None
        events = _http.EventStream(chat.event) if chat is not None else None
        headers = self.headers()
        if events is not None:
            headers["accept"] = "text/event-stream, application/json"
        try:
            resp = _http.request(
                self,
                "POST",
                f"{self.base_url}/chat/completions",
                headers=headers,
                encoded_body=self.wire_body(body, messages),
                cancel_event=cancel_event,
                on_body=events,
            )
            _http.raise_for_status(self, resp)
            if chat is not None and events is not None and events.streamed:
                events.close()
                data = chat.body(resp.status)
                reasoned = chat.reasoned
            else:
                data = resp.json(self)
                reasoned = _reasoned(data)
        except _http.OutputLimitReached:
            assert chat is not None  # only a stream's meter raises it
            return meter.cut(self.parse_completion(chat.cut(), model, 200))
        completion = self.parse_completion(data, model, resp.status)
        usage = data.get("usage") if isinstance(data, dict) else None
        return _http.at_output_limit(
            completion, max_tokens, visible_output(usage, reasoned=reasoned)
        )

    def context_window(self, model: str) -> int | None:
        """Best effort: the model's context window from ``GET {base_url}/models``."""
        try:
            resp = _http.request(
                self,
                "GET",
                f"{self.base_url}/models",
                headers=self.headers(),
                timeout=min(self.timeout, 15.0),
            )
            if resp.status != 200:
                return None
            data = resp.json(self)
        except ProviderError:
            return None
        entries = data.get("data") if isinstance(data, dict) else data
        if not isinstance(entries, list):
            return None
        entries = [e for e in entries if isinstance(e, dict)]
        matching = [e for e in entries if e.get("id") == model or e.get("name") == model]
        if not matching and len(entries) == 1:
            matching = entries  # single-model servers (llama.cpp) name the model freely
        for entry in matching:
            window = context_window_from_model_entry(entry)
            if window:
                return window
        return None

    def probe(self, *, model: str, tools: bool) -> ProbeResult:
        return probe_by_chat(
            self, model=model, tools=tools, context_window=self.context_window(model)
        )
