"""The Gemini gateway (``systemInstruction`` and ``contents`` of ``generateContent``).

Rendering (Message -> native ``Content`` items ``{"role", "parts"}``):

* ``user``: ``{"role": "user"}`` with ``text``, ``inlineData`` (base64 image
  with ``mimeType``; also an image given as a ``data:`` URL, which
  ``fileUri`` does not take) and ``fileData`` (image URL as ``fileUri``)
  parts; ``gemini`` opaque parts verbatim.
* ``assistant``: ``{"role": "model"}``; reasoning produced by Gemini becomes
  a thought part (``{"text", "thought": true}`` with its
  ``thoughtSignature``); tool calls become ``functionCall`` parts (``id``,
  ``name``, ``args``: the arguments decoded to an object) with their
  ``thoughtSignature`` kept verbatim; parallel calls are one content.
* ``tool`` (or ``user`` carrying results): one ``{"role": "user"}`` content of
  ``functionResponse`` parts (``id``, ``name``, ``response``); a result's
  text is sent as ``{"output": text}`` or, for an error, ``{"error": text}``
  (Gemini's documented keys); images of a result go in the response's
  ``parts``. Other parts of a ``user`` message follow in a second content.
* ``system`` and ``developer``: a turnloom item ``{"role": "system",
  "parts"}`` in the Context; :meth:`GeminiGateway.request_body` moves every
  such item, wherever it is, into ``systemInstruction`` (parts in order,
  sent with role ``user``), because ``contents`` has no system role.

Where system messages live in a Context: as ``{"role": "system"}`` items
where they were appended; only the request body lifts them.

:meth:`GeminiGateway.request_body` also merges adjacent function-response
contents into one and orders its parts as the calls of the model turn they
answer (by id, else by name), and fills a response's ``name`` from its call.

Lossy mappings, documented: ``developer`` becomes a system instruction and
later system messages move to ``systemInstruction`` (no in-conversation
system role); reasoning of other providers is dropped; a tool result's text
parts are joined into one ``output`` string; a ``response`` object other
than ``{"output": str}`` / ``{"error": str}`` is carried as its JSON text;
a result's multimodal ``parts`` parse into the result's image parts, and
into ``gemini`` opaque parts for other media; an image's ``detail`` is not carried, and
an image URL without a media type gets the type its file name suggests
(``image/*`` when it suggests none); tool call
arguments travel as an object (re-encoded as compact JSON, and arguments
that are not a JSON object raise :class:`~turnloom.errors.ProviderRuleError`);
media that is not an image (audio, video, PDF) is kept only as an opaque
``gemini`` part; opaque parts of other gateways are dropped with a logged
warning; empty and whitespace-only text is never emitted, except a text
part carrying a thought signature (``{"text": "", "thoughtSignature"}``, as
the official SDK keeps model output) and blank text of a content parsed with
it (``keep_blank``).

Layout kept for exact re-emission (``Message.layout``): ``"snake": true`` for
contents written with snake_case part keys (``function_call``,
``inline_data``, ``thought_signature``, as the Vertex AI traffic has them);
``"json_results"`` (call ids whose ``response`` was carried as JSON text),
``"keep_blank"`` (the content held blank text). Set by a host or the runtime:
``"injected": true`` marks calls the model did not produce (the runtime-state
call): the first function call of such a model content is sent with Google's
placeholder thought signature, since Gemini 3 rejects an unsigned call in the
current turn.

Thought signatures: a signature is kept verbatim where the model put it;
when :func:`~turnloom.context.complete_pairs` leaves out the signed first call
of a parallel step, the signature moves to the step's first kept call.

Call ids: ids are optional on Gemini (model output may omit them; calls and
responses without one are matched by name and have nothing to rename). An id
that is given is matched to its response by id, so a reused one is renamed
``<id>_r<n>`` in its ``functionCall`` and the ``functionResponse`` answering
it, by the rule of :mod:`turnloom.context.callids`, in every prepared input
and in :meth:`GeminiGateway.request_body`; no id is ever added.

Source: Gemini API reference (``Content``, ``Part``, ``FunctionCall``,
``FunctionResponse``, ``systemInstruction``); function calling guide:
respond to every function call of a model turn in one content, in order.
"""

from __future__ import annotations

__all__ = ("GeminiGateway",)

import base64
import json
import logging
import mimetypes
import threading
from collections.abc import Sequence
from typing import Any

from turnloom.context._media import is_image_media_type
from turnloom.context._untrack import untrack_atoms
from turnloom.context.body import BodyWriter, write_body, written_body
from turnloom.context.callids import CallIdRenamer, register_rewriter, rename_call_ids
from turnloom.context.gateway import (
    Gateway,
    GatewayType,
    NativeContent,
    Violation,
    register_gateway,
)
from turnloom.context.gateways._common import (
    args_object,
    args_text,
    blank,
    check_render_depth,
    drop_foreign,
    empty_input,
    json_text,
    layout_of,
    make_layout,
    parse_sdk,
    render_inline,
    require_object,
    violation,
)
from turnloom.context.message import (
    ImagePart,
    Message,
    NativeKeys,
    OpaquePart,
    Part,
    ReasoningPart,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    admit_message,
    decode_json_text,
)
from turnloom.context.pairing import STEP_SIGNATURE_KEYS
from turnloom.errors import InvalidMessageError, excerpt

_log = logging.getLogger("turnloom.gateway.gemini")
_warned_lock = threading.Lock()

_GATEWAY = GatewayType.gemini.value
# The instructions field as written, then the other spelling the API (and
# parse_request) reads: a request's own fields may set neither.
_INSTRUCTIONS = ("systemInstruction", "system_instruction")

# camelCase (REST JSON, canonical) -> snake_case (accepted too; Vertex traffic)
_KEYS = {
    "functionCall": "function_call",
    "functionResponse": "function_response",
    "inlineData": "inline_data",
    "fileData": "file_data",
    "thoughtSignature": "thought_signature",
    "mimeType": "mime_type",
    "fileUri": "file_uri",
}
_SNAKE = frozenset(_KEYS.values())
_PLAIN = object()  # a response sent as {"output": text} / {"error": text}
# A Part holds exactly one of these data fields (Gemini API, ``Part`` union).
_DATA = frozenset(
    {"text", "executableCode", "codeExecutionResult", "executable_code", "code_execution_result"}
    | {"functionCall", "functionResponse", "inlineData", "fileData"}
    | {"function_call", "function_response", "inline_data", "file_data"}
)


def _check_json_results(message: Message, where: str) -> None:
    """A result listed in ``json_results`` whose text is JSON holds strict JSON.

    Render decodes such a text into the ``response`` object; NaN, a lone
    surrogate or nesting past the depth cap would make the body invalid.
    """
    listed = (message.layout or {}).get("json_results", ())
    for i, part in enumerate(message.parts):
        if type(part) is ToolResultPart and part.call_id in listed:
            text = "".join(p.text for p in part.content if type(p) is TextPart)
            try:
                json.loads(text)
            except ValueError:
                continue  # not JSON: a plain output of the same id, sent as such
            except RecursionError:
                pass  # decode_json_text refuses it, typed
            decode_json_text(text, where=where, field=f"content[{i}].content")


# The keys this gateway writes itself: extras never replace them (checked at the
# door); the functionResponse object is where a result's extras go.
_WRITES = NativeKeys(
    message=frozenset({"role", "parts"}),
    text=_DATA,
    image=_DATA,
    tool_call=_DATA,
    tool_result=frozenset({"id", "name", "response", "parts"}),
    reasoning=_DATA | {"thought", "thoughtSignature", "thought_signature"},
    hints={
        "snake": "flag",
        "json_results": "ids",
        "no_id": "ids",
        "keep_blank": "flag",
        "injected": "flag",
    },
    check_layout=_check_json_results,
)

# The thought signature of a call the model did not produce (the runtime-state
# call, a host's injected call). Source: Gemini API, Thought Signatures, FAQ
# (https://ai.google.dev/gemini-api/docs/thought-signatures#faqs): such calls
# may carry the dummy signature "context_engineering_is_the_way_to_go" or
# "skip_thought_signature_validator"; Vertex AI documents the second for
# requests built by hand. The field is bytes, so the JSON carries its base64
# encoding: the recorded accepted request test_google_model_structured_output#1
# of ../shared/data/provider-recordings/gemini.jsonl sends exactly this value.
_INJECTED_SIGNATURE = base64.b64encode(b"skip_thought_signature_validator").decode("ascii")


def _k(name: str, snake: bool) -> str:
    return _KEYS[name] if snake else name


@written_body
class GeminiGateway(Gateway):
    """Renders and parses Gemini ``Content`` items. Thread-safe.

    Its one piece of state: whether it has warned yet that a request body
    left out a leading call turn (see :meth:`request_body`).
    """

    __slots__ = ("_warned_leading",)

    def _left_out_leading_call_turn(self) -> None:
        """Log that a body left out a leading call turn: a warning once, then at DEBUG.

        The rule is deterministic: every body of the same history leaves the
        same turn out, so a warning per body would repeat on every model call.
        """
        with _warned_lock:
            first = not getattr(self, "_warned_leading", False)
            self._warned_leading = True
        _log.log(
            logging.WARNING if first else logging.DEBUG,
            "Left out a leading model turn with function calls (and its responses): "
            "Gemini needs a user turn before it.%s",
            " Later ones are logged at DEBUG." if first else "",
        )

    @property
    def type(self) -> GatewayType:
        return GatewayType.gemini

    items_field = "contents"
    """The field of :meth:`request_body` that holds the item list."""

    def tool_definition(
        self, name: str, description: str, parameters: dict[str, Any]
    ) -> dict[str, Any]:
        """One function tool's ``tools`` entry.

        Shape: ``{"functionDeclarations": [{"name", "description", "parameters"}]}``.
        """
        # One ``Tool``; its declaration may be merged into the agent's own ``Tool``.
        return {
            "functionDeclarations": [
                {"name": name, "description": description, "parameters": parameters}
            ]
        }

    # -- rendering -------------------------------------------------------

    def render(self, message: Message) -> list[NativeContent]:
        """Render ``message`` into zero, one or two Gemini contents.

        Raises:
            ProviderRuleError: a tool call's arguments are not a JSON object.
        """
        check_render_depth(message)
        layout = layout_of(message, _GATEWAY)
        own = message.layout is None or bool(layout)
        snake = bool(layout.get("snake"))
        role = message.role
        if role is Role.assistant:
            no_id = layout.get("no_id", ())
            keep_blank = bool(layout.get("keep_blank"))
            parts = [
                p
                for part in message.parts
                if (p := self._model_part(part, own, snake, no_id, keep_blank)) is not None
            ]
            if not parts:
                return []
            if layout.get("injected"):
                _sign_injected(parts, snake)
            item: NativeContent = {"role": "model", "parts": parts}
            if own and message.extras:
                item.update(message.extras)
            return [item]
        out: list[NativeContent] = []
        results = message.tool_results
        if results:
            responses = [self._response_part(r, layout, own, snake) for r in results]
            out.append({"role": "user", "parts": responses})
        keep_blank = bool(layout.get("keep_blank"))
        rest = [
            p
            for part in message.parts
            if type(part) is not ToolResultPart
            and (p := self._user_part(part, own, snake, keep_blank)) is not None
        ]
        if rest:
            native_role = "system" if role in (Role.system, Role.developer) else "user"
            item = {"role": native_role, "parts": rest}
            if own and message.extras:
                item.update(message.extras)
            out.append(item)
        return out

    def _user_part(
        self, part: Part, own: bool, snake: bool, keep_blank: bool = False
    ) -> dict[str, Any] | None:
        if type(part) is TextPart:
            # A blank text carrying a thought signature is kept: the signature
            # belongs to the model step (the official SDK keeps such parts).
            if blank(part.text) and not keep_blank and not (own and _signed(part.extras)):
                return None
            block: dict[str, Any] = {"text": part.text}
        elif type(part) is ImagePart:
            block = _image_block(part, snake)
        elif type(part) is OpaquePart:
            if part.gateway == _GATEWAY:
                return part.item
            drop_foreign(part, _GATEWAY, _log)
            return None
        else:
            if type(part) is ReasoningPart:
                drop_foreign(part, _GATEWAY, _log)
            elif type(part) is ToolCallPart:
                _log.warning("Dropped tool call %s from a user message.", excerpt(part.call_id))
            return None
        if own and part.extras:
            block.update(part.extras)
        return block

    def _model_part(
        self, part: Part, own: bool, snake: bool, no_id: Sequence[str], keep_blank: bool
    ) -> dict[str, Any] | None:
        if type(part) is ToolCallPart:
            call: dict[str, Any] = {
                "id": part.call_id,
                "name": part.name,
                "args": args_object(part.arguments, part.call_id, "Gemini"),
            }
            if part.call_id in no_id:
                del call["id"]
            block: dict[str, Any] = {_k("functionCall", snake): call}
            if own and part.extras:
                block.update(part.extras)
            return block
        if type(part) is ReasoningPart:
            if part.gateway != _GATEWAY:
                drop_foreign(part, _GATEWAY, _log)
                return None
            block = {"text": part.text, "thought": True}
            if part.signature is not None:
                block[_k("thoughtSignature", snake)] = part.signature
            if part.extras:
                block.update(part.extras)
            return block
        if type(part) is ToolResultPart:
            _log.warning("Dropped the result of call %s from a model turn.", excerpt(part.call_id))
            return None
        return self._user_part(part, own, snake, keep_blank)

    def _response_part(
        self, result: ToolResultPart, layout: dict[str, Any], own: bool, snake: bool
    ) -> dict[str, Any]:
        texts = [p.text for p in result.content if type(p) is TextPart]
        text = "".join(texts)
        response: Any = _PLAIN
        if result.call_id in layout.get("json_results", ()):
            # The hint names call ids: with one id answered twice in a content,
            # a text that is not JSON was a plain output of the same id.
            try:
                response = json.loads(text)
            except ValueError:
                response = _PLAIN
            except RecursionError:
                # Only a message that skipped the door gets here (it refuses the text).
                where = f"The result of call {excerpt(result.call_id)}"
                decode_json_text(text, where=where, field="text")
                raise
        if response is _PLAIN:
            response = {"error": text} if result.is_error else {"output": text}
        inner: dict[str, Any] = {
            "id": result.call_id,
            "name": result.name or "",
            "response": response,
        }
        if result.call_id in layout.get("no_id", ()):
            del inner["id"]
        media = [
            _image_block(p, snake) if isinstance(p, ImagePart) else p.item
            for p in result.content
            if type(p) is ImagePart or (type(p) is OpaquePart and p.gateway == _GATEWAY)
        ]
        if media:
            inner["parts"] = media
        if own and result.extras:
            inner.update(result.extras)
        return {_k("functionResponse", snake): inner}

    # -- parsing ---------------------------------------------------------

    def parse(self, item: NativeContent) -> Message:
        """Parse one Gemini ``Content`` (a request content or a candidate's content).

        ``model`` parses to ``assistant``; a ``user`` content of function
        responses only to ``tool``. A function call without an ``id`` (model
        output may omit it) gets the call id ``"<name>#<n>"``, ``n`` counting the
        content's earlier calls of that name without an id (a function response
        without an id likewise, so the n-th response of a name answers the n-th
        call of that name). The count is per parsed Content: parse a step's
        id-less calls as one Content, and their responses as one.

        A provider SDK's object (a pydantic model, or a dict or list holding
        them, as its SDK returned them) is taken as its JSON data
        (``model_dump(mode="json", exclude_none=True)``).

        The message returned is the one :func:`~turnloom.context.admit_message`
        holds for the parsed one (normalised), so it can be committed as it
        is; ``item`` is left as it is and shares nothing with it.

        Raises:
            InvalidMessageError: not an object, an unknown role, parts of the
                wrong shape.
            InvalidTextError: a string holds a lone surrogate (not valid UTF-8).
            DuplicateIdError: two tool calls of the item share a call id.
        """
        return parse_sdk(self._parse_checked, item)

    def _parse_checked(self, item: NativeContent) -> Message:
        return admit_message(self._parse_item(item), where="A Gemini content")[0]

    def _parse_item(self, item: NativeContent) -> Message:
        item = require_object(item, "Gemini", "content")
        role_name = item.get("role", "user")
        if role_name not in ("user", "model", "system"):
            raise InvalidMessageError(
                f"Gemini content has unknown role {excerpt(role_name)}.", field="role"
            )
        raw = item.get("parts")
        if not isinstance(raw, list):
            raise InvalidMessageError("Gemini content has no parts list.", field="parts")
        extras = {k: v for k, v in item.items() if k not in ("role", "parts")}
        snake = any(isinstance(p, dict) and _SNAKE.intersection(p) for p in raw)
        parts: list[Part] = []
        json_results: list[str] = []
        no_id: list[str] = []
        for i, block in enumerate(raw):
            parts.append(self._parse_part(block, i, snake, json_results, no_id))
        if role_name == "model":
            role = Role.assistant
        elif role_name == "system":
            role = Role.system
        elif parts and all(type(p) is ToolResultPart for p in parts):
            role = Role.tool
        else:
            role = Role.user
        keep_blank = any(type(p) is TextPart and blank(p.text) for p in parts)
        layout = make_layout(
            _GATEWAY,
            {
                "snake": snake,
                "json_results": json_results,
                "no_id": no_id,
                "keep_blank": keep_blank,
            },
        )
        if layout is None and (extras or any(getattr(p, "extras", None) for p in parts)):
            layout = {"gateway": _GATEWAY}
        return Message(role=role, content=tuple(parts), extras=extras or None, layout=layout)

    def _parse_part(
        self, block: Any, i: int, snake: bool, json_results: list[str], no_id: list[str]
    ) -> Part:
        field = f"parts[{i}]"
        if not isinstance(block, dict):
            raise InvalidMessageError(f"Gemini {field} must be an object.", field=field)
        sig_key = _k("thoughtSignature", snake)
        call = block.get(_k("functionCall", snake))
        if isinstance(call, dict):
            name = call.get("name")
            if not isinstance(name, str) or not name:
                raise InvalidMessageError(
                    f"Gemini {field} function call has no name.", field=f"{field}.name"
                )
            call_id = call.get("id")
            if not isinstance(call_id, str) or not call_id:
                call_id = _unnamed_id(name, no_id)
            if set(call) - {"id", "name", "args"}:
                return OpaquePart(gateway=_GATEWAY, item=block)
            extras = {k: v for k, v in block.items() if k != _k("functionCall", snake)}
            return ToolCallPart(
                call_id=call_id,
                name=name,
                arguments=args_text(
                    call.get("args", {}), "Gemini", f"{field}.{_k('functionCall', snake)}.args"
                ),
                extras=extras or None,
            )
        response = block.get(_k("functionResponse", snake))
        if isinstance(response, dict) and len(block) == 1:
            name = response.get("name")
            call_id = response.get("id")
            if not isinstance(call_id, str) or not call_id:
                call_id = _unnamed_id(name, no_id)
            value = response.get("response", {})
            extras = {k: v for k, v in response.items() if k not in _WRITES.tool_result}
            media = response.get("parts", [])
            if not isinstance(media, list) or not all(isinstance(m, dict) for m in media):
                raise InvalidMessageError(
                    f"Gemini {field} functionResponse parts must be a list of objects.",
                    field=f"{field}.parts",
                )
            if isinstance(value, dict) and len(value) == 1 and isinstance(value.get("output"), str):
                text, is_error = value["output"], False
            elif (
                isinstance(value, dict) and len(value) == 1 and isinstance(value.get("error"), str)
            ):
                text, is_error = value["error"], True
            else:
                text = json_text(
                    value, "Gemini", f"{field}.{_k('functionResponse', snake)}.response"
                )
                is_error = isinstance(value, dict) and "error" in value
                json_results.append(call_id)
            return ToolResultPart(
                call_id=call_id,
                content=(
                    TextPart(text=text),
                    *(_media_part(m, snake) for m in media),
                ),
                is_error=is_error,
                name=name if isinstance(name, str) and name else None,
                extras=extras or None,
            )
        if isinstance(block.get("text"), str):
            extras = {k: v for k, v in block.items() if k not in ("text", "thought", sig_key)}
            if block.get("thought") is True:
                signature = block.get(sig_key)
                return ReasoningPart(
                    text=block["text"],
                    signature=signature if isinstance(signature, str) else None,
                    gateway=_GATEWAY,
                    extras=extras or None,
                )
            if "thought" in block:
                extras["thought"] = block["thought"]
            if sig_key in block:
                extras[sig_key] = block[sig_key]
            return TextPart(text=block["text"], extras=extras or None)
        image = _parse_image(block, snake)
        if image is not None:
            return image
        return OpaquePart(gateway=_GATEWAY, item=block)

    def parse_request(self, body: dict[str, Any]) -> list[Message]:
        """Parse a generateContent body: ``systemInstruction``, then ``contents``.

        Function responses without a ``name``-resolvable id keep the id the
        parser gives them; function calls get the ids of their model turn.

        Raises:
            InvalidMessageError: ``contents`` is missing or an item is malformed.
        """
        body = require_object(body, "Gemini", "request body")
        out: list[Message] = []
        system = next((body[k] for k in _INSTRUCTIONS if k in body), None)
        if system is not None:
            system = require_object(system, "Gemini", "systemInstruction")
            message = self.parse({"role": "system", "parts": system.get("parts", [])})
            out.append(message)
        contents = body.get("contents")
        if not isinstance(contents, list):
            raise InvalidMessageError("Gemini request body has no contents list.", field="contents")
        for item in contents:
            out.append(self.parse(item))
        return out

    # -- rules -----------------------------------------------------------

    def validate(
        self, items: Sequence[NativeContent], *, continues_response: bool = False
    ) -> list[Violation]:
        """Check Gemini's structural rules over a ``contents`` list.

        Rules (Source: Gemini API function calling): the function calls of a model turn
        are answered by the directly following ``user`` content, which holds one
        ``functionResponse`` per call, in call order (matched by id, else by name), and
        no response that answers no call of that turn; a model turn with function calls
        directly follows a user turn or a function-response turn (the API rejects it
        after another model turn or first); call ids (where given) unique in the whole
        input, so a response matched by id answers one call; every
        response has a name; roles are ``user`` or ``model`` (unset means ``user``); no
        content without parts; no empty or whitespace-only text part (thought parts
        excepted), except a content whose only part is an empty text: the Gemini API
        accepts an empty prompt (recorded traffic, 6 requests), and except a part that
        carries a thought signature (``{"text": "", "thoughtSignature": ...}``, model
        output the official SDK keeps). When a function call of the input carries a
        thought signature (Gemini 3 traffic), the first function call of every model
        step of the current turn
        (the contents after the last user content that is not only function
        responses) carries one too: Gemini 3 rejects the request otherwise (Source:
        Gemini API, Thought Signatures). Adjacent contents of
        the same role are accepted (recorded traffic). ``system`` items are turnloom's
        and are lifted by :meth:`request_body`.

        Returns:
            every violation, in item order; empty when the input is valid.
        """
        out: list[Violation] = empty_input(items, "contents")
        _check_signatures(items, out)
        calls: list[tuple[str | None, str]] = []  # (id, name) of the previous model turn
        calls_at = -1
        previous_role: str | None = None
        all_calls: dict[str, int] = {}  # every call id so far -> its content
        for index, item in enumerate(items):
            # ``role`` may be left unset (a user turn), as parse() reads it.
            role = item.get("role", "user") if isinstance(item, dict) else None
            if role == "system":
                continue
            if role not in ("user", "model"):
                out.append(
                    violation(
                        index, "unknown_role", f"Item {index} has unknown role {excerpt(role)}."
                    )
                )
                calls, calls_at = [], -1
                continue
            parts = item.get("parts")
            if not isinstance(parts, list) or not parts:
                out.append(violation(index, "empty_message", f"Content {index} has no parts."))
                parts = []
            responses: list[tuple[int, str | None, str | None]] = []
            turn_calls: list[tuple[str | None, str]] = []
            for j, part in enumerate(parts):
                if not isinstance(part, dict):
                    continue
                if isinstance(part.get("text"), str) and not part.get("thought"):
                    if (
                        blank(part["text"])
                        and (part["text"] or len(parts) > 1)
                        and not _signed(part)
                    ):
                        out.append(
                            violation(
                                index,
                                "empty_text",
                                f"Content {index} parts[{j}] is empty or whitespace-only text.",
                            )
                        )
                fr = part.get("functionResponse", part.get("function_response"))
                if fr is not None and not isinstance(fr, dict):
                    out.append(
                        violation(
                            index,
                            "malformed_function_response",
                            f"Content {index} parts[{j}] has a function response that is not "
                            "an object.",
                        )
                    )
                if isinstance(fr, dict):
                    name = fr.get("name")
                    if not isinstance(name, str) or not name:
                        out.append(
                            violation(
                                index,
                                "missing_name",
                                f"Content {index} parts[{j}] is a function response "
                                "without a name.",
                            )
                        )
                    responses.append((j, fr.get("id"), name))
                fc = part.get("functionCall", part.get("function_call"))
                if isinstance(fc, dict) and role == "model":
                    call_id = fc.get("id")
                    if call_id is not None and any(c[0] == call_id for c in turn_calls):
                        out.append(
                            violation(
                                index,
                                "duplicate_call_id",
                                f"Content {index} has two function calls with id "
                                f"{excerpt(call_id)}.",
                            )
                        )
                    elif isinstance(call_id, str) and call_id in all_calls:
                        out.append(
                            violation(
                                index,
                                "duplicate_call_id",
                                f"Content {index} reuses function call id {excerpt(call_id)} of "
                                f"content {all_calls[call_id]}; call ids must be unique in a "
                                "request.",
                            )
                        )
                    if isinstance(call_id, str):
                        all_calls.setdefault(call_id, index)
                    turn_calls.append((call_id, str(fc.get("name"))))
            if calls:
                _check_answers(calls, calls_at, index, role, responses, out)
            elif responses:
                out.append(
                    violation(
                        index,
                        "tool_result_without_call",
                        f"Content {index} holds function responses, but the content before it "
                        "is not a model turn with function calls.",
                    )
                )
            if turn_calls and previous_role != "user":
                out.append(
                    violation(
                        index,
                        "function_call_turn_position",
                        f"Content {index} calls functions but does not directly follow a user "
                        "turn or a function-response turn.",
                    )
                )
            previous_role = role
            calls, calls_at = (turn_calls, index) if role == "model" and turn_calls else ([], -1)
        if calls:
            out.append(
                violation(
                    calls_at,
                    "tool_call_without_result",
                    f"The function calls of content {calls_at} have no function-response turn.",
                )
            )
        return sorted(out, key=lambda v: v.index)

    def request_body(self, items: Sequence[NativeContent]) -> dict[str, Any]:
        """``{"systemInstruction": ..., "contents": [...]}`` for ``items``.

        Every ``system`` item's parts go into ``systemInstruction`` (role
        ``user``), omitted when there is none. Adjacent ``model`` contents are
        merged into one (so a call turn follows the user turn), and adjacent
        contents made only of function responses are merged into one; its
        responses are ordered as the calls of the preceding model turn (by id,
        else by name; responses answering no call keep their order at the end)
        and a missing name is filled from the call. A call sent without an id
        (model output may omit it) is answered by the response with the id
        :meth:`parse` gave it (``"<name>#<n>"``), else by name; that
        response is sent without an id, like its call. A model turn with calls
        that nothing precedes (its user turn held only parts Gemini cannot
        carry, or was cut) is left out with its responses, with a warning
        logged the first time this gateway instance leaves one out, then at
        DEBUG (the same history leaves the same turn out of every body). A
        call id used by an earlier call is first renamed in its call
        and in the responses answering it (the rule of
        :mod:`turnloom.context.callids`), so responses matched by id answer
        their own call. Input items are not modified, and the body shares
        no container with them (see :meth:`~turnloom.context.Gateway.request_body`).

        Source: Gemini API function calling (one response turn, call order;
        "function call turn comes immediately after a user turn or after a
        function response turn").
        """
        return write_body(self.body_writer(), items)

    def body_writer(self) -> BodyWriter:
        """A new :class:`~turnloom.context.body.BodyWriter` of :meth:`request_body`."""
        return _GeminiBody(self)


class _GeminiBody(BodyWriter):
    """:meth:`GeminiGateway.request_body`, item by item.

    The last content is held back (the next item may merge into it); a
    content is settled when the next one does not: its responses are put in
    call order, then the leading-call-turn rule decides whether it goes out.
    """

    __slots__ = (
        "_calls",
        "_drop_responses",
        "_front",
        "_front_at",
        "_gateway",
        "_held",
        "_held_at",
        "_held_to",
        "_system",
        "_system_tags",
    )

    field = "contents"
    header = _INSTRUCTIONS[:1]
    spellings = _INSTRUCTIONS[1:]

    def __init__(self, gateway: GeminiGateway, *, rename: bool = True) -> None:
        super().__init__(rename=rename)
        self._gateway = gateway  # reports a left-out leading call turn
        self._system: list[Any] = []
        self._system_tags: set[int] = set()
        self._held: NativeContent | None = None
        self._held_at = 0
        self._held_to = 0
        self._calls: list[dict[str, Any]] = []  # the calls of the last settled model content
        self._front = True  # no content handed out yet
        self._front_at = 0  # the tag of the first content handed out
        self._drop_responses = False  # a leading call turn was left out: its responses go too
        if type(self) is _GeminiBody and type(gateway) is GeminiGateway:
            # Its slots only ever hold, besides the renamer and ``marks`` of
            # every writer (a CallIdRenamer made by turnloom, out of the
            # collector itself, or None; None or a list of int pairs), bools,
            # ints, a set of ints, the native items it was fed (a history's,
            # JSON-encoded, which can refer to nothing outside themselves) in
            # lists and merged into new dicts, and a GeminiGateway, whose one
            # slot holds a bool (a subclass may hold anything: then it stays
            # tracked). Nothing it refers to can lead back to it, so it can
            # be in no cycle (a history's body cache holds one).
            untrack_atoms(self)

    def feed(self, items: Sequence[NativeContent], out: list[NativeContent], tag: int = 0) -> None:
        renamer = self.renamer
        if renamer is not None:
            items = rename_call_ids(GatewayType.gemini, items, renamer)
        for item in items:
            if item.get("role") == "system":
                self._system.extend(item.get("parts", ()))
                self._system_tags.add(tag)
                continue
            held = self._held
            if held is not None and (
                (_only_responses(item) and _only_responses(held))
                or (item.get("role") == "model" and held.get("role") == "model")
            ):
                self._held = {**held, "parts": [*held["parts"], *item["parts"]]}
                self._held_to = tag
                continue
            if held is not None:
                self._settle(held, out)
            self._held = item
            self._held_at = self._held_to = tag

    def _settle(self, content: NativeContent, out: list[NativeContent]) -> None:
        if content.get("role") == "model":
            self._calls = [
                fc
                for p in content.get("parts", ())
                if isinstance(p, dict)
                and isinstance(fc := p.get("functionCall", p.get("function_call")), dict)
            ]
        elif self._calls and _only_responses(content):
            content = _ordered(content, self._calls)
            self._calls = []
        else:
            self._calls = []
        if self._front:
            if self._drop_responses:
                self._drop_responses = False
                if _only_responses(content):
                    return
            if content.get("role") == "model" and _has_calls(content):
                # Nothing precedes this call turn (its user turn was cut, or
                # held only parts Gemini cannot carry): the API rejects it,
                # so the call group is left out, as complete_pairs leaves
                # out unusable pairs.
                self._gateway._left_out_leading_call_turn()
                self._drop_responses = True
                return
            self._front = False
            self._front_at = self._held_at
        self._hand_out(out, content, self._held_at, self._held_to)

    def finish(self, out: list[NativeContent]) -> dict[str, Any]:
        if self._held is not None:
            self._settle(self._held, out)
            self._held = None
        if self._system:
            return {"systemInstruction": {"role": "user", "parts": list(self._system)}}
        return {}

    def copy(self) -> _GeminiBody:
        other = _GeminiBody(self._gateway, rename=False)
        other.renamer = self._copied_renamer()
        other._system = list(self._system)
        other._system_tags = set(self._system_tags)
        other._held = self._held
        other._held_at = self._held_at
        other._held_to = self._held_to
        other._calls = self._calls
        other._front = self._front
        other._front_at = self._front_at
        other._drop_responses = self._drop_responses
        return other

    def held_origin(self) -> int | None:
        return self._held_at if self._held is not None else None

    def can_open(self, body_item: NativeContent) -> bool:
        # A user content that is not only responses neither merges, nor is
        # reordered, nor left out, whatever precedes it.
        return body_item.get("role") == "user" and not _only_responses(body_item)

    def forget(self, first_kept: int, dropped: CallIdRenamer) -> bool:
        if any(0 < tag < first_kept for tag in self._system_tags):
            return False
        # The leading-call-turn rule was done before the first kept content.
        if self._front or self._front_at >= first_kept:
            return False
        self._system_tags = {tag for tag in self._system_tags if tag >= first_kept or not tag}
        return self._forget_ids(dropped)


def _check_answers(
    calls: list[tuple[str | None, str]],
    calls_at: int,
    index: int,
    role: str,
    responses: list[tuple[int, str | None, str | None]],
    out: list[Violation],
) -> None:
    if role != "user" or not responses:
        out.append(
            violation(
                calls_at,
                "tool_call_without_result",
                f"The function calls of content {calls_at} are not answered by content {index}.",
            )
        )
        return
    want = [c[0] if c[0] is not None else c[1] for c in calls]
    got = [r[1] if r[1] is not None else r[2] for r in responses]
    extra = [g for g in got if g not in want]
    for g in extra:
        out.append(
            violation(
                index,
                "tool_result_without_call",
                f"Content {index} answers {excerpt(g)}, which is not a call of content {calls_at}.",
            )
        )
    missing = [w for w in want if w not in got]
    for w in missing:
        out.append(
            violation(
                calls_at,
                "tool_call_without_result",
                f"Call {excerpt(w)} of content {calls_at} has no response in content {index}.",
            )
        )
    if not extra and not missing and got != want:
        out.append(
            violation(
                index,
                "function_response_order",
                f"Content {index} answers the calls of content {calls_at} out of call order.",
            )
        )


def _signed(part: dict[str, Any] | None) -> bool:
    """The part (or a part's extras) carries a thought signature."""
    return bool(part) and any(k in part for k in STEP_SIGNATURE_KEYS)  # type: ignore[operator]


def _sign_injected(parts: list[dict[str, Any]], snake: bool) -> None:
    """Give the first function call of an injected step the placeholder signature."""
    key = _k("functionCall", snake)
    for n, part in enumerate(parts):
        if key in part:
            if not _signed(part):
                parts[n] = {**part, _k("thoughtSignature", snake): _INJECTED_SIGNATURE}
            return


def _check_signatures(items: Sequence[NativeContent], out: list[Violation]) -> None:
    """Flag an unsigned current-turn step when the input's function calls carry signatures.

    A function call signed by the model marks Gemini 3 traffic, which signs
    every step and rejects an unsigned one; a signature on thought text alone
    is Gemini 2.5 traffic, which does not validate call signatures, and the
    placeholder of an injected call is not the model's.
    """
    if not any(
        _signed(p)
        and ("functionCall" in p or "function_call" in p)
        and _INJECTED_SIGNATURE not in (p.get(k) for k in STEP_SIGNATURE_KEYS)
        for c in items
        if isinstance(c, dict) and isinstance(c.get("parts"), list)
        for p in c["parts"]
        if isinstance(p, dict)
    ):
        return
    start = 0
    for index, item in enumerate(items):
        if (
            isinstance(item, dict)
            and item.get("role", "user") == "user"
            and not _only_responses(item)
        ):
            start = index + 1
    for index in range(start, len(items)):
        item = items[index]
        if not isinstance(item, dict) or item.get("role") != "model":
            continue
        parts = item.get("parts")
        first = next(
            (
                p
                for p in (parts if isinstance(parts, list) else ())
                if isinstance(p, dict) and ("functionCall" in p or "function_call" in p)
            ),
            None,
        )
        if first is not None and not _signed(first):
            call = first.get("functionCall", first.get("function_call"))
            name = call.get("name") if isinstance(call, dict) else None
            out.append(
                violation(
                    index,
                    "missing_thought_signature",
                    f"Content {index} calls {excerpt(name)} in the current turn without a thought "
                    "signature on its first function call, while the input carries "
                    "signatures; Gemini 3 rejects it.",
                )
            )


def _has_calls(item: NativeContent) -> bool:
    return any(
        isinstance(p, dict) and ("functionCall" in p or "function_call" in p)
        for p in item.get("parts", ())
    )


def _only_responses(item: NativeContent) -> bool:
    parts = item.get("parts")
    return (
        item.get("role") == "user"
        and isinstance(parts, list)
        and bool(parts)
        and all(
            isinstance(p, dict)
            and isinstance(p.get("functionResponse", p.get("function_response")), dict)
            for p in parts
        )
    )


def _ordered(item: NativeContent, calls: list[dict[str, Any]]) -> NativeContent:
    parts = list(item["parts"])

    def inner(p: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        key = "functionResponse" if "functionResponse" in p else "function_response"
        return key, p[key]

    ordered: list[Any] = []
    for call in calls:
        call_id, name = call.get("id"), call.get("name")
        if call_id is not None:
            match = next((p for p in parts if inner(p)[1].get("id") == call_id), None)
        else:
            # Model output may omit call ids: parse names such a call
            # "<name>#<n>", which is the id the host answers with. The
            # call is matched by name, same-name responses in position order,
            # and the response is sent without the id the call never had.
            same = [p for p in parts if _answers_by_name(inner(p)[1], name)]
            match = min(same, key=lambda p: _position(inner(p)[1], name), default=None)
        if match is None:
            continue
        parts.pop(next(n for n, q in enumerate(parts) if q is match))
        key, fr = inner(match)
        fixed = dict(fr)
        if not fixed.get("name") and name:
            fixed["name"] = name
        if call_id is None:
            fixed.pop("id", None)
        ordered.append(match if fixed == fr else {**match, key: fixed})
    ordered.extend(parts)
    if ordered == item["parts"]:
        return item
    return {**item, "parts": ordered}


def _unnamed_id(name: Any, no_id: list[str]) -> str:
    """The id parse gives a call (or response) without one: ``"<name>#<n>"``, ``n`` counting
    the content's earlier ones of that name without an id; appended to ``no_id``.

    Text or calls of other names before it do not move ``n``, so the n-th response of
    a name answers the n-th call of that name, as Gemini matches them.
    """
    prefix = f"{name}#"
    call_id = f"{prefix}{sum(1 for other in no_id if other.startswith(prefix))}"
    no_id.append(call_id)
    return call_id


def _answers_by_name(response: dict[str, Any], name: Any) -> bool:
    if response.get("name"):
        return bool(response["name"] == name)
    response_id = response.get("id")
    return isinstance(response_id, str) and response_id.startswith(f"{name}#")


def _position(response: dict[str, Any], name: Any) -> int:
    """The number parse gave a call without id ("<name>#<n>"), else -1."""
    response_id = response.get("id")
    if isinstance(response_id, str) and response_id.startswith(f"{name}#"):
        suffix = response_id[len(f"{name}#") :]
        if suffix.isdigit():
            return int(suffix)
    return -1


def _media_part(block: dict[str, Any], snake: bool) -> ImagePart | OpaquePart:
    """One part of a function response's ``parts``: an image, else kept verbatim."""
    return _parse_image(block, snake) or OpaquePart(gateway=_GATEWAY, item=block)


def _image_block(part: ImagePart, snake: bool) -> dict[str, Any]:
    mime = _k("mimeType", snake)
    inline = render_inline(part)
    if inline is not None:
        # A data URL goes as inlineData too: fileUri takes no data URL.
        return {_k("inlineData", snake): {mime: inline[0], "data": inline[1]}}
    media = part.media_type or mimetypes.guess_type(part.url or "")[0] or "image/*"
    return {_k("fileData", snake): {mime: media, _k("fileUri", snake): part.url}}


def _parse_image(block: dict[str, Any], snake: bool) -> ImagePart | None:
    if len(block) != 1:
        return None
    mime = _k("mimeType", snake)
    inline = block.get(_k("inlineData", snake))
    if isinstance(inline, dict) and inline.keys() == {mime, "data"}:
        media = inline[mime]
        if is_image_media_type(media) and isinstance(inline["data"], str):
            return ImagePart(data=inline["data"], media_type=media)
    file = block.get(_k("fileData", snake))
    uri = _k("fileUri", snake)
    if isinstance(file, dict) and file.keys() == {mime, uri}:
        media = file[mime]
        # Other media, and a type the door refuses, stay opaque (verbatim).
        if is_image_media_type(media):
            return ImagePart(url=file[uri], media_type=media)
    return None


register_gateway(GatewayType.gemini, GeminiGateway, _WRITES)


def _rewrite_call_ids(item: NativeContent, renamer: CallIdRenamer) -> NativeContent:
    """Report one content's call and response ids to ``renamer``; the content with its ids.

    Calls and responses without an id (model output may omit it) are matched
    by name and have nothing to rename.
    """
    parts = item.get("parts") if isinstance(item, dict) else None
    role = item.get("role", "user") if isinstance(item, dict) else None
    if not isinstance(parts, list) or role not in ("user", "model"):
        return item
    new_parts: list[Any] | None = None
    other = False
    for j, part in enumerate(parts):
        if not isinstance(part, dict):
            other = True
            continue
        if role == "model":
            key = "functionCall" if "functionCall" in part else "function_call"
        else:
            key = "functionResponse" if "functionResponse" in part else "function_response"
        inner = part.get(key)
        if not isinstance(inner, dict):
            other = True
            continue
        call_id = inner.get("id")
        if not isinstance(call_id, str):
            continue
        new_id = renamer.call(call_id) if role == "model" else renamer.result(call_id)
        if new_id != call_id:
            if new_parts is None:
                new_parts = list(parts)
            new_parts[j] = {**part, key: {**inner, "id": new_id}}
    if role == "user" and other:
        # User content that is not a function response starts the next turn.
        renamer.end_group()
    return item if new_parts is None else {**item, "parts": new_parts}


register_rewriter(GatewayType.gemini, _rewrite_call_ids)
