from __future__ import annotations

from typing import Any

from checkov.bicep.checks.resource.base_resource_check import BaseResourceCheck
from checkov.common.models.enums import CheckCategories, CheckResult

from _common import dig, unwrap


class AppInsightsWorkspaceBased(BaseResourceCheck):
    """Application Insights keeps its data in a Log Analytics workspace.

    A classic (non-workspace) resource keeps telemetry in a store of its own, with its own
    retention and access: the gateway's spans would sit apart from its logs and alerts,
    and classic resources are retired. Workspace-based means a workspace id and ingestion
    into Log Analytics.
    """

    def __init__(self) -> None:
        super().__init__(
            name="sendgate: Application Insights is workspace-based",
            id="CKV_SENDGATE_12",
            categories=(CheckCategories.LOGGING,),
            supported_resources=("Microsoft.Insights/components",),
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        properties = dig(unwrap(conf), "properties")
        self.evaluated_keys = ["properties/WorkspaceResourceId", "properties/IngestionMode"]
        workspace = dig(properties, "WorkspaceResourceId")
        mode = dig(properties, "IngestionMode")
        if workspace and mode == "LogAnalytics":
            return CheckResult.PASSED
        return CheckResult.FAILED


check = AppInsightsWorkspaceBased()
