from __future__ import annotations

from typing import Any

from checkov.bicep.checks.resource.base_resource_check import BaseResourceCheck
from checkov.common.models.enums import CheckCategories, CheckResult

from _common import dig, unwrap


class RedisEnterpriseClusterHardened(BaseResourceCheck):
    """Azure Managed Redis cluster: TLS 1.2 minimum, and public network access decided
    explicitly (the template sets Disabled whenever a private endpoint is configured)."""

    def __init__(self) -> None:
        super().__init__(
            name="sendgate: Redis cluster has minimumTlsVersion 1.2 and an explicit publicNetworkAccess",
            id="CKV_SENDGATE_8",
            categories=(CheckCategories.NETWORKING,),
            supported_resources=("Microsoft.Cache/redisEnterprise",),
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        props = dig(unwrap(conf), "properties")
        self.evaluated_keys = ["properties/minimumTlsVersion", "properties/publicNetworkAccess"]
        if dig(props, "minimumTlsVersion") != "1.2":
            return CheckResult.FAILED
        # A literal "Enabled" means public access no matter how the template is deployed;
        # an expression (private endpoint or not) or "Disabled" is a decision the template makes.
        access = dig(props, "publicNetworkAccess")
        if access is None or access == "Enabled":
            return CheckResult.FAILED
        return CheckResult.PASSED


check = RedisEnterpriseClusterHardened()
