from __future__ import annotations

from typing import Any

from checkov.bicep.checks.resource.base_resource_check import BaseResourceCheck
from checkov.common.models.enums import CheckCategories, CheckResult

from _common import dig, unwrap


class RedisEnterpriseDatabaseHardened(BaseResourceCheck):
    """Azure Managed Redis database: TLS only and no access keys (Entra ID only).

    checkov's built-in Redis checks cover only Microsoft.Cache/redis (Azure Cache for
    Redis), not Azure Managed Redis, so without this nothing would notice a plaintext
    listener or keys turned back on.
    """

    def __init__(self) -> None:
        super().__init__(
            name="sendgate: Redis database has clientProtocol Encrypted and accessKeysAuthentication Disabled",
            id="CKV_SENDGATE_7",
            categories=(CheckCategories.ENCRYPTION,),
            supported_resources=("Microsoft.Cache/redisEnterprise/databases",),
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        props = dig(unwrap(conf), "properties")
        self.evaluated_keys = ["properties/clientProtocol", "properties/accessKeysAuthentication"]
        # Both spelled out: the API's defaults (Encrypted, and keys Enabled) are not relied on.
        if dig(props, "clientProtocol") == "Encrypted" and dig(props, "accessKeysAuthentication") == "Disabled":
            return CheckResult.PASSED
        return CheckResult.FAILED


check = RedisEnterpriseDatabaseHardened()
