from __future__ import annotations

from typing import Any

from checkov.bicep.checks.resource.base_resource_check import BaseResourceCheck
from checkov.common.models.enums import CheckCategories, CheckResult

from _common import dig, unwrap


class ContainerAppSecretsFromKeyVault(BaseResourceCheck):
    """Container App secrets are Key Vault references read with an identity, never values."""

    def __init__(self) -> None:
        super().__init__(
            name="sendgate: Container App secrets are Key Vault references (keyVaultUrl + identity), no inline values",
            id="CKV_SENDGATE_5",
            categories=(CheckCategories.SECRETS,),
            supported_resources=("Microsoft.App/containerApps",),
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        secrets = dig(unwrap(conf), "properties", "configuration", "secrets")
        self.evaluated_keys = ["properties/configuration/secrets"]
        if secrets is None:
            return CheckResult.PASSED
        if not isinstance(secrets, list):
            return CheckResult.FAILED
        for secret in secrets:
            if not isinstance(secret, dict) or "value" in secret:
                return CheckResult.FAILED
            if not secret.get("keyVaultUrl") or not secret.get("identity"):
                return CheckResult.FAILED
        return CheckResult.PASSED


check = ContainerAppSecretsFromKeyVault()
