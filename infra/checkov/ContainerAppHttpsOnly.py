from __future__ import annotations

from typing import Any

from checkov.bicep.checks.resource.base_resource_check import BaseResourceCheck
from checkov.common.models.enums import CheckCategories, CheckResult

from _common import dig, unwrap


class ContainerAppHttpsOnly(BaseResourceCheck):
    """Container App ingress: HTTPS only (allowInsecure false), to port 8080."""

    def __init__(self) -> None:
        super().__init__(
            name="sendgate: Container App ingress is HTTPS only (allowInsecure false) to port 8080",
            id="CKV_SENDGATE_3",
            categories=(CheckCategories.NETWORKING,),
            supported_resources=("Microsoft.App/containerApps",),
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        ingress = dig(unwrap(conf), "properties", "configuration", "ingress")
        self.evaluated_keys = [
            "properties/configuration/ingress/allowInsecure",
            "properties/configuration/ingress/targetPort",
        ]
        if dig(ingress, "allowInsecure") is False and dig(ingress, "targetPort") == 8080:
            return CheckResult.PASSED
        return CheckResult.FAILED


check = ContainerAppHttpsOnly()
