from __future__ import annotations

import json
from typing import Any

from checkov.bicep.checks.resource.base_resource_check import BaseResourceCheck
from checkov.common.models.enums import CheckCategories, CheckResult

from _common import dig, unwrap

# The only built-in roles sendgate's identities may get, the gateway's and the alerts'
# (infra/README.md says why). Never Azure Service Bus Data Owner
# (090c5cfd-751d-490a-894a-3ce6f1109419): its Manage right would let the process taking
# producers' traffic purge and reconfigure the queue; the depth is read with Reader.
ALLOWED_ROLES = {
    "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39",  # Azure Service Bus Data Sender (queue scope)
    "acdd72a7-3385-48ef-bd42-f606fba81ae7",  # Reader (queue scope, readDepth: the ARM depth source)
    "4633458b-17de-408a-b874-0445c86b69e6",  # Key Vault Secrets User (one secret)
    "7f951dda-4ed3-4680-a7ca-43fe172d538d",  # AcrPull (one registry, optional)
    "73c42c96-874c-492b-b04d-ab87d138a893",  # Log Analytics Reader (the alerts' identity, the workspace)
}


class RoleAssignmentsLeastPrivilege(BaseResourceCheck):
    """Role assignments use only the roles listed above, each with an explicit (narrow) scope."""

    def __init__(self) -> None:
        super().__init__(
            name="sendgate: role assignments grant only Data Sender/Reader/Secrets User/AcrPull/Log Analytics Reader (never Data Owner) on an explicit scope",
            id="CKV_SENDGATE_6",
            categories=(CheckCategories.IAM,),
            supported_resources=("Microsoft.Authorization/roleAssignments",),
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        body = unwrap(conf)
        self.evaluated_keys = ["properties/roleDefinitionId", "scope"]
        if not body.get("scope"):
            return CheckResult.FAILED  # resource-group-wide (or wider) assignment
        role = json.dumps(dig(body, "properties", "roleDefinitionId"))
        if any(role_id in role for role_id in ALLOWED_ROLES):
            return CheckResult.PASSED
        return CheckResult.FAILED


check = RoleAssignmentsLeastPrivilege()
