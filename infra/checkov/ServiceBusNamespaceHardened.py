from __future__ import annotations

from typing import Any

from checkov.bicep.checks.resource.base_resource_check import BaseResourceCheck
from checkov.common.models.enums import CheckCategories, CheckResult

from _common import dig, unwrap


class ServiceBusNamespaceHardened(BaseResourceCheck):
    """Service Bus namespace: TLS 1.2 minimum and SAS (local) auth disabled by default."""

    def __init__(self) -> None:
        super().__init__(
            name="sendgate: Service Bus namespace has minimumTlsVersion 1.2 and disableLocalAuth true",
            id="CKV_SENDGATE_1",
            categories=(CheckCategories.ENCRYPTION,),
            supported_resources=("Microsoft.ServiceBus/namespaces",),
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        props = dig(unwrap(conf), "properties")
        self.evaluated_keys = ["properties/minimumTlsVersion", "properties/disableLocalAuth"]
        if dig(props, "minimumTlsVersion") == "1.2" and dig(props, "disableLocalAuth") is True:
            return CheckResult.PASSED
        return CheckResult.FAILED


check = ServiceBusNamespaceHardened()
