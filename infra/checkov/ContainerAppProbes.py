from __future__ import annotations

from typing import Any

from checkov.bicep.checks.resource.base_resource_check import BaseResourceCheck
from checkov.common.models.enums import CheckCategories, CheckResult

from _common import dig, unwrap


class ContainerAppProbes(BaseResourceCheck):
    """Every container: liveness on /health/live, readiness on /health/ready."""

    def __init__(self) -> None:
        super().__init__(
            name="sendgate: Container App has liveness /health/live and readiness /health/ready probes",
            id="CKV_SENDGATE_4",
            categories=(CheckCategories.GENERAL_SECURITY,),
            supported_resources=("Microsoft.App/containerApps",),
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        containers = dig(unwrap(conf), "properties", "template", "containers")
        self.evaluated_keys = ["properties/template/containers"]
        if not isinstance(containers, list) or not containers:
            return CheckResult.FAILED
        for container in containers:
            probes = dig(container, "probes")
            if not isinstance(probes, list):
                return CheckResult.FAILED
            paths = {
                dig(p, "type"): dig(p, "httpGet", "path") for p in probes if isinstance(p, dict)
            }
            if paths.get("Liveness") != "/health/live" or paths.get("Readiness") != "/health/ready":
                return CheckResult.FAILED
        return CheckResult.PASSED


check = ContainerAppProbes()
