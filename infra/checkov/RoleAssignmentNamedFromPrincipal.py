from __future__ import annotations

import json
from typing import Any

from checkov.bicep.checks.resource.base_resource_check import BaseResourceCheck
from checkov.common.models.enums import CheckCategories, CheckResult

from _common import dig, unwrap


class RoleAssignmentNamedFromPrincipal(BaseResourceCheck):
    """A role assignment's name is built from the principal id it grants to.

    A name built from anything else (an identity's resource id, say) outlives the principal:
    once the identity is deleted and recreated under the same name, the next deployment PUTs
    the same assignment name with a new principal id, which Azure refuses
    (RoleAssignmentUpdateNotPermitted). Inside the template that creates the identity its
    principal id is known too late for a name, so the assignment goes in a module taking
    `principalId` as a parameter (infra/modules/queue-role.bicep).
    """

    def __init__(self) -> None:
        super().__init__(
            name="sendgate: role assignment names are built from the principal id they grant to",
            id="CKV_SENDGATE_13",
            categories=(CheckCategories.IAM,),
            supported_resources=("Microsoft.Authorization/roleAssignments",),
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        body = unwrap(conf)
        self.evaluated_keys = ["name", "properties/principalId"]
        principal = dig(body, "properties", "principalId")
        name = body.get("name")
        if not isinstance(principal, str) or not principal or name is None:
            return CheckResult.FAILED
        # The principal's own expression (a parameter, typically) inside the name's guid().
        if principal in json.dumps(name):
            return CheckResult.PASSED
        return CheckResult.FAILED


check = RoleAssignmentNamedFromPrincipal()
