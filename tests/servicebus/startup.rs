//! Start-up refusals for Service Bus settings that cannot work.

use std::process::{Command, Stdio};
use std::time::Duration;

use sendgate::startup::StartupError;

use crate::helpers::build_only;

#[tokio::test]
async fn without_a_namespace_endpoint_or_connection_string_start_up_names_servicebus_namespace() {
    let err = build_only(&[("SENDGATE_BACKEND", "servicebus")])
        .await
        .unwrap_err();
    match &err {
        StartupError::BackendConfig { var, .. } => assert_eq!(*var, "SERVICEBUS_NAMESPACE"),
        other => panic!("{other:?}"),
    }
    assert_eq!(err.exit_code(), 2);
    assert!(
        err.to_string().starts_with("SERVICEBUS_NAMESPACE: "),
        "{err}"
    );
}

#[tokio::test]
async fn a_malformed_connection_string_stops_start_up_without_showing_the_key() {
    let key = "VerySecretKeyMaterial0123456789=";
    for raw in [
        format!("Endpoint=https://ns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey={key}"),
        format!("Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKey={key}"),
        format!("sb://ns.servicebus.windows.net/;{key}"),
    ] {
        let err = build_only(&[
            ("SENDGATE_BACKEND", "servicebus"),
            ("SERVICEBUS_CONNECTION_STRING", &raw),
        ])
        .await
        .unwrap_err();
        match &err {
            StartupError::BackendConfig { var, .. } => {
                assert_eq!(*var, "SERVICEBUS_CONNECTION_STRING")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(err.exit_code(), 2);
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains(key), "{shown}");
    }
}

#[test]
fn the_binary_exits_2_with_one_line_naming_the_variable() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sendgate"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("SENDGATE_BACKEND", "servicebus")
        .env("SENDGATE_LISTEN", "127.0.0.1:0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("sendgate did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("SERVICEBUS_NAMESPACE"), "{stderr}");
}
