from __future__ import annotations

from typing import Any

from checkov.bicep.checks.resource.base_resource_check import BaseResourceCheck
from checkov.common.models.enums import CheckCategories, CheckResult

from _common import dig, unwrap


class AlertRulesNotify(BaseResourceCheck):
    """Alert rules are enabled and notify an action group.

    A rule left disabled, or firing into no action group, looks like monitoring in the
    portal and tells nobody anything.
    """

    def __init__(self) -> None:
        super().__init__(
            name="sendgate: alert rules (log and metric) are enabled and notify an action group",
            id="CKV_SENDGATE_9",
            categories=(CheckCategories.LOGGING,),
            supported_resources=(
                "Microsoft.Insights/scheduledQueryRules",
                "Microsoft.Insights/metricAlerts",
            ),
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        props = dig(unwrap(conf), "properties")
        self.evaluated_keys = ["properties/enabled", "properties/actions"]
        if dig(props, "enabled") is not True:
            return CheckResult.FAILED
        actions = dig(props, "actions")
        # scheduledQueryRules: actions.actionGroups = [id, ...];
        # metricAlerts: actions = [{ actionGroupId }, ...].
        if isinstance(actions, dict):
            groups = actions.get("actionGroups")
            return CheckResult.PASSED if isinstance(groups, list) and groups else CheckResult.FAILED
        if isinstance(actions, list) and actions:
            if all(isinstance(a, dict) and a.get("actionGroupId") for a in actions):
                return CheckResult.PASSED
        return CheckResult.FAILED


check = AlertRulesNotify()
