from __future__ import annotations

from typing import Any

from checkov.bicep.checks.resource.base_resource_check import BaseResourceCheck
from checkov.common.models.enums import CheckCategories, CheckResult

from _common import dig, unwrap


class ScheduledQueryRuleIdentity(BaseResourceCheck):
    """Log alert rules run their query as a managed identity.

    Without one, a log alert queries with the permissions of whoever last saved it: the
    rule breaks when that person leaves, or quietly reads with their (wider) rights.
    """

    def __init__(self) -> None:
        super().__init__(
            name="sendgate: scheduled query rules run as a managed identity",
            id="CKV_SENDGATE_10",
            categories=(CheckCategories.IAM,),
            supported_resources=("Microsoft.Insights/scheduledQueryRules",),
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        identity = dig(unwrap(conf), "identity")
        self.evaluated_keys = ["identity/type"]
        kind = dig(identity, "type")
        if kind == "UserAssigned" and dig(identity, "userAssignedIdentities"):
            return CheckResult.PASSED
        if kind == "SystemAssigned":
            return CheckResult.PASSED
        return CheckResult.FAILED


check = ScheduledQueryRuleIdentity()
