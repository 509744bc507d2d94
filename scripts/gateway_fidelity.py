"""Print the gateways' fidelity on real inputs, measured in one run.

For each provider's recorded traffic: accepted requests reproduced exactly by
parse_request -> render -> request_body, and accepted requests validate()
passes. For the 150 tau-bench trajectories: how many pass validate() after
rendering through each gateway, and the render + request_body time per
message (best of three runs after a warm-up) relative to OpenAI Chat.

Usage: python scripts/gateway_fidelity.py [DATA_DIR]   (default ../shared/data)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from turnloom.context import Gateway, Message, complete_pairs, get_gateway
from turnloom.context.gateways import AnthropicGateway

PROVIDERS = ("openai_chat", "openai_responses", "anthropic", "gemini")
FIELDS = {
    "openai_chat": ("messages",),
    "openai_responses": ("instructions", "input"),
    "anthropic": ("system", "messages"),
    "gemini": ("systemInstruction", "contents"),
}


def _body(gateway: Gateway, messages: list[Message]) -> dict[str, Any]:
    return gateway.request_body([i for m in messages for i in gateway.render(m)])


def recordings(data: Path) -> None:
    print("recorded traffic: exact round trips / accepted, validate() clean / accepted")
    for provider in PROVIDERS:
        gateway = get_gateway(provider)
        exact_gw = AnthropicGateway(merge_turns=False) if provider == "anthropic" else gateway
        path = data / "provider-recordings" / f"{provider}.jsonl"
        records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        accepted = [r for r in records if r["status"] == 200]
        exact = clean = 0
        for record in accepted:
            body = record["request"]
            want = {k: body[k] for k in FIELDS[provider] if k in body}
            exact += _body(exact_gw, exact_gw.parse_request(body)) == want
            continues = bool(body.get("previous_response_id") or body.get("conversation"))
            violations = gateway.validate(body[gateway.items_field], continues_response=continues)
            clean += not violations
        print(f"  {provider:17} {exact}/{len(accepted)} exact, {clean}/{len(accepted)} valid")


def tau_bench(data: Path) -> None:
    path = data / "tau-bench" / "airline-150.json"
    chat = get_gateway("openai_chat")
    trajectories = [
        complete_pairs([chat.parse(m) for m in entry["traj"]])
        for entry in json.loads(path.read_text(encoding="utf-8"))
    ]
    count = sum(len(t) for t in trajectories)
    print(f"tau-bench: {len(trajectories)} trajectories, {count} messages")
    base: float | None = None
    for provider in PROVIDERS:
        gateway = get_gateway(provider)
        valid = 0
        bodies = [_body(gateway, t) for t in trajectories]  # warm-up run
        elapsed = float("inf")
        for _ in range(3):  # best of three
            start = time.perf_counter()
            bodies = [_body(gateway, t) for t in trajectories]
            elapsed = min(elapsed, time.perf_counter() - start)
        for body in bodies:
            valid += not gateway.validate(body[gateway.items_field])
        base = base or elapsed
        print(
            f"  {provider:17} validate() clean {valid}/{len(trajectories)}; render+body "
            f"{elapsed / count * 1e6:.1f} us/message ({elapsed / base:.2f}x openai_chat)"
        )


def main() -> None:
    data = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("../shared/data")
    recordings(data)
    tau_bench(data)


if __name__ == "__main__":
    main()
