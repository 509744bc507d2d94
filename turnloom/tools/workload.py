"""A built-in, deterministic, multi-turn, tool-using workload.

It lets ``turnloom replay`` and ``turnloom loadtest`` run on a fresh machine
without data files. Each trajectory is a list of OpenAI Chat messages shaped
like the tau-bench airline sessions: a system prompt, then turns of a user
message, zero to three rounds of tool calls (sometimes two in parallel) with
their results, and a final assistant answer. Call ids are sometimes reused in
a later turn, as recorded GPT-4o traffic does. The same ``seed`` always gives
the same trajectories.
"""

from __future__ import annotations

__all__ = ("generate_trajectories",)

import json
import random
from typing import Any

_TOOLS = (
    ("get_user_details", ("user_id",)),
    ("get_reservation_details", ("reservation_id",)),
    ("search_direct_flight", ("origin", "destination", "date")),
    ("update_reservation_baggages", ("reservation_id", "total_baggages")),
    ("calculate", ("expression",)),
)
_CITIES = ("JFK", "SEA", "SFO", "ORD", "ATL", "LAX", "BOS", "DEN")
_ASKS = (
    "I need to change my flight from {a} to {b}.",
    "Can you check my reservation {r}?",
    "How many bags can I bring on reservation {r}?",
    "Please book a one-way flight from {a} to {b} on May {d}.",
    "What does it cost to upgrade to business class?",
    "Thanks, that is all I needed.",
)


def _arguments(rng: random.Random, fields: tuple[str, ...]) -> str:
    values: dict[str, Any] = {}
    for field in fields:
        if field in ("origin", "destination"):
            values[field] = rng.choice(_CITIES)
        elif field == "date":
            values[field] = f"2024-05-{rng.randint(10, 28):02d}"
        elif field == "total_baggages":
            values[field] = rng.randint(0, 4)
        elif field == "expression":
            values[field] = f"{rng.randint(100, 999)} - {rng.randint(10, 99)}"
        else:
            values[field] = f"{field[:4]}_{rng.randint(1000, 9999)}"
    return json.dumps(values)


def _result(rng: random.Random, name: str) -> str:
    if name == "calculate":
        return str(rng.randint(1, 999))
    if rng.random() < 0.05:
        return ""
    return json.dumps(
        {
            "status": rng.choice(("confirmed", "pending", "ok")),
            "flights": [
                {
                    "flight_number": f"HAT{rng.randint(1, 300):03d}",
                    "price": rng.randint(80, 1500),
                    "seats": rng.randint(0, 9),
                }
                for _ in range(rng.randint(0, 3))
            ],
        }
    )


def generate_trajectories(
    sessions: int = 24, *, turns: tuple[int, int] = (3, 9), seed: int = 0
) -> list[list[dict[str, Any]]]:
    """Generate ``sessions`` trajectories of OpenAI Chat messages.

    Args:
        sessions: how many trajectories.
        turns: inclusive range of user turns per trajectory.
        seed: the random seed; equal seeds give equal trajectories.

    Returns:
        one list of native OpenAI Chat messages (dicts) per session.
    """
    out: list[list[dict[str, Any]]] = []
    for index in range(sessions):
        rng = random.Random(f"{seed}:{index}")
        messages: list[dict[str, Any]] = [
            {
                "role": "system",
                "content": "# Airline agent policy\n\nHelp the user with reservations. "
                f"Session {index}. Confirm before changing a booking.",
            }
        ]
        call_number = 0
        for turn in range(rng.randint(*turns)):
            ask = rng.choice(_ASKS).format(
                a=rng.choice(_CITIES),
                b=rng.choice(_CITIES),
                r=f"R{rng.randint(10000, 99999)}",
                d=rng.randint(10, 28),
            )
            messages.append({"role": "user", "content": ask})
            for _ in range(rng.choice((0, 1, 1, 2, 3))):
                calls: list[dict[str, Any]] = []
                for _ in range(2 if rng.random() < 0.2 else 1):
                    # Reuse a small id space so ids recur across turns.
                    call_number = call_number + 1 if rng.random() < 0.8 else 1
                    name, fields = rng.choice(_TOOLS)
                    calls.append(
                        {
                            "id": f"call_{index}_{call_number}",
                            "type": "function",
                            "function": {"name": name, "arguments": _arguments(rng, fields)},
                        }
                    )
                if len({c["id"] for c in calls}) != len(calls):
                    calls = calls[:1]
                messages.append({"role": "assistant", "content": None, "tool_calls": calls})
                for c in calls:
                    messages.append(
                        {
                            "role": "tool",
                            "tool_call_id": c["id"],
                            "name": c["function"]["name"],
                            "content": _result(rng, c["function"]["name"]),
                        }
                    )
            messages.append(
                {
                    "role": "assistant",
                    "content": f"Turn {turn}: here is what I found for you. "
                    + " ".join(rng.choice(_CITIES) for _ in range(rng.randint(3, 40))),
                }
            )
        out.append(messages)
    return out
