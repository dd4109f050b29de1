"""Helpers shared by the sendgate checkov policies (not a check itself)."""

from __future__ import annotations

from typing import Any


def unwrap(conf: dict[str, Any]) -> dict[str, Any]:
    """The resource body, whether or not the resource is in a loop or has a condition.

    checkov's Bicep parser wraps `[for ...]` and `if (...)` resources as
    {"loop_type": ..., "condition": ..., "config": {...}}.
    """
    inner = conf.get("config")
    if isinstance(inner, dict) and ("loop_type" in conf or "condition" in conf):
        return inner
    return conf


def dig(conf: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(conf, dict):
            return None
        conf = conf.get(key)
    return conf
