from __future__ import annotations

from typing import Any

from checkov.bicep.checks.resource.base_resource_check import BaseResourceCheck
from checkov.common.models.enums import CheckCategories, CheckResult

from _common import dig, unwrap


class ServiceBusQueueDuplicateDetection(BaseResourceCheck):
    """sendgate sets MessageId = Idempotency-Key: the queue must detect duplicates."""

    def __init__(self) -> None:
        super().__init__(
            name="sendgate: Service Bus queue has requiresDuplicateDetection true and a window",
            id="CKV_SENDGATE_2",
            categories=(CheckCategories.GENERAL_SECURITY,),
            supported_resources=("Microsoft.ServiceBus/namespaces/queues",),
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        props = dig(unwrap(conf), "properties")
        self.evaluated_keys = [
            "properties/requiresDuplicateDetection",
            "properties/duplicateDetectionHistoryTimeWindow",
        ]
        if dig(props, "requiresDuplicateDetection") is True and dig(
            props, "duplicateDetectionHistoryTimeWindow"
        ):
            return CheckResult.PASSED
        return CheckResult.FAILED


check = ServiceBusQueueDuplicateDetection()
