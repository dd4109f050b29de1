//! The ARM depth source: the backlog read from Azure Resource Manager's queue resource with
//! a bearer for ARM's scope (the *Reader* role suffices), never from the namespace's
//! management endpoint (which needs Manage / Data Owner).

use std::sync::Arc;
use std::time::Duration;

use sendgate::backend::servicebus::ServiceBus;
use sendgate::backend::{Backend, Backlog, DepthError};
use sendgate::config::BackendSettings;
use sendgate::domain::QueueName;
use sendgate_entra::CredentialChain;
use sendgate_testkit::arm_stub::{self, ArmStub};
use sendgate_testkit::entra::FakeToken;
use sendgate_testkit::servicebus_stub::ServiceBusStub;
use tokio::time::Instant;

use crate::helpers::settings_on;

const NAMESPACE_ID: &str =
    "/subscriptions/5f750a97-50d9-4e36-8081-c9ee4c0210d4/resourceGroups/gateway/providers/Microsoft.ServiceBus/namespaces/test";

/// The backend with the ARM depth source on `arm`, sends on `bus`; Entra tokens for ARM's
/// scope are `arm-token`, and nothing else gets one.
fn backend(bus: &ServiceBusStub, arm: &ArmStub) -> (ServiceBus, Arc<FakeToken>) {
    let endpoint = arm.endpoint();
    let settings = settings_on(
        bus,
        &[
            ("SENDGATE_SERVICEBUS_DEPTH_SOURCE", "arm"),
            ("SENDGATE_SERVICEBUS_ARM_NAMESPACE_ID", NAMESPACE_ID),
            ("SENDGATE_SERVICEBUS_ARM_ENDPOINT", &endpoint),
        ],
    );
    let BackendSettings::ServiceBus(plan) = settings.primary else {
        panic!("not servicebus")
    };
    let scope: &'static str = Box::leak(format!("{endpoint}/.default").into_boxed_str());
    let token = FakeToken::new(scope, "arm-token", Duration::from_secs(3600));
    let source = token.clone();
    let bus = ServiceBus::with_entra(&plan, move |asked| {
        Ok(CredentialChain::new(
            asked,
            vec![("fake", source.clone() as _)],
        ))
    })
    .expect("the backend builds");
    (bus, token)
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

#[tokio::test]
async fn the_backlog_is_read_from_the_arm_queue_resource_with_a_bearer_for_arm() {
    let bus = ServiceBusStub::start().await;
    let arm = ArmStub::start().await;
    arm.on_queue(
        "requests",
        arm_stub::json(200, &arm_stub::queue(41, 9, 2, "Active")),
    );
    let (backend, token) = backend(&bus, &arm);
    let queue = QueueName::parse("requests").unwrap();

    let backlog = backend.backlog(&queue, far()).await;
    assert_eq!(
        backlog,
        Ok(Backlog {
            messages: 43,
            send_disabled: false
        }),
        "active + scheduled, dead letters excluded"
    );
    let requests = arm.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(
        requests[0].request_line(),
        format!("GET {NAMESPACE_ID}/queues/requests?api-version=2024-01-01 HTTP/1.1")
    );
    assert_eq!(
        requests[0].header("Authorization"),
        Some("Bearer arm-token")
    );
    assert!(arm.violations().is_empty(), "{:?}", arm.violations());
    assert!(
        bus.requests().is_empty(),
        "nothing reaches the management endpoint: {:?}",
        bus.requests()
    );
    assert_eq!(token.calls(), 1);

    // A second read reuses the cached token.
    backend.backlog(&queue, far()).await.unwrap();
    assert_eq!(token.calls(), 1);
}

#[tokio::test]
async fn a_send_disabled_queue_and_arms_refusals_read_as_the_management_endpoints_do() {
    let bus = ServiceBusStub::start().await;
    let arm = ArmStub::start().await;
    let (backend, _) = backend(&bus, &arm);
    let queue = QueueName::parse("requests").unwrap();

    arm.on_queue(
        "requests",
        arm_stub::json(200, &arm_stub::queue(3, 0, 0, "SendDisabled")),
    );
    assert_eq!(
        backend.backlog(&queue, far()).await,
        Ok(Backlog {
            messages: 3,
            send_disabled: true
        })
    );
    arm.on_queue(
        "requests",
        arm_stub::json(403, arm_stub::AUTHORIZATION_FAILED_403),
    );
    match backend.backlog(&queue, far()).await {
        Err(DepthError::Unauthorized(why)) => {
            assert!(why.starts_with("HTTP 403: AuthorizationFailed: "), "{why}")
        }
        other => panic!("{other:?}"),
    }
    arm.on_queue(
        "requests",
        arm_stub::json(404, r#"{"error":{"code":"NotFound","message":"no queue"}}"#),
    );
    assert_eq!(
        backend.backlog(&queue, far()).await,
        Err(DepthError::QueueNotFound)
    );
    arm.on_queue("requests", arm_stub::json(200, r#"{"properties":{}}"#));
    assert!(matches!(
        backend.backlog(&queue, far()).await,
        Err(DepthError::Failed(d)) if d.contains("countDetails")
    ));
    assert!(bus.requests().is_empty());
}
