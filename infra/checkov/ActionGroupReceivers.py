from __future__ import annotations

from typing import Any

from checkov.bicep.checks.resource.base_resource_check import BaseResourceCheck
from checkov.common.models.enums import CheckCategories, CheckResult

from _common import dig, unwrap


def _receivers(value: Any) -> list[Any] | None:
    """The receivers of one kind: a literal list, or the body of a `[for ...]` over them."""
    if value is None:
        return []
    if isinstance(value, list):
        return value
    if isinstance(value, dict) and "loop_type" in value and isinstance(value.get("config"), dict):
        return [value["config"]]
    return None  # an expression the check cannot see into


class ActionGroupReceivers(BaseResourceCheck):
    """Action group: enabled; e-mail and webhook receivers use the common alert schema;
    no webhook is a literal plain-HTTP URL (a URL from a parameter is checked by the
    template's own guard at deployment time)."""

    def __init__(self) -> None:
        super().__init__(
            name="sendgate: action group is enabled, receivers use the common alert schema, webhooks are not plain HTTP",
            id="CKV_SENDGATE_11",
            categories=(CheckCategories.LOGGING,),
            supported_resources=("Microsoft.Insights/actionGroups",),
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        props = dig(unwrap(conf), "properties")
        self.evaluated_keys = [
            "properties/enabled",
            "properties/emailReceivers",
            "properties/webhookReceivers",
        ]
        if dig(props, "enabled") is not True:
            return CheckResult.FAILED
        emails = _receivers(dig(props, "emailReceivers"))
        hooks = _receivers(dig(props, "webhookReceivers"))
        if emails is None or hooks is None:
            return CheckResult.FAILED
        for receiver in emails + hooks:
            if not isinstance(receiver, dict) or receiver.get("useCommonAlertSchema") is not True:
                return CheckResult.FAILED
        for hook in hooks:
            uri = hook.get("serviceUri")
            if isinstance(uri, str) and not uri.lower().startswith("https://"):
                return CheckResult.FAILED
        return CheckResult.PASSED


check = ActionGroupReceivers()
