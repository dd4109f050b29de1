//! The embedded store on a filesystem that fills up, a real one: a tmpfs of 2 MiB mounted
//! for the test (issue 40, item 5). Nothing is stored while the disk is full, and the room
//! may come back, so a send is busy (`503 backend_busy` with `Retry-After`), not a failure
//! the client gives up on; `/health/detailed` shows the store failing and why; sends are
//! taken again by themselves once there is room.

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use sendgate::backend::embedded::Store;
use sendgate_testkit::gateway::GatewayProcess;

/// A tmpfs of `size` mounted on a folder of the test's own, unmounted and deleted when
/// dropped (after everything that holds a file on it).
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(size: &str) -> Self {
        let id = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let dir = std::env::temp_dir().join(format!("sg-full-{id}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(mounted.success(), "mount a tmpfs (the suite runs as root)");
        Self(dir)
    }

    /// Write a file until the disk refuses (ENOSPC): what is left is less than a block.
    fn fill(&self) -> PathBuf {
        let path = self.0.join("filler");
        let mut file = std::fs::File::create(&path).unwrap();
        let chunk = vec![0u8; 4096];
        while file.write_all(&chunk).and_then(|()| file.flush()).is_ok() {}
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Status, code, whether `Retry-After` came, and how long the request took.
async fn send(gateway: &GatewayProcess, body: &str) -> (u16, String, bool, Duration) {
    let started = Instant::now();
    let response = gateway
        .client
        .post(gateway.url("/v1/queues/q/messages"))
        .header("Content-Type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .expect("answered");
    let took = started.elapsed();
    let status = response.status().as_u16();
    let after = response.headers().contains_key("Retry-After");
    let json: serde_json::Value = response.json().await.unwrap_or_default();
    let code = json["code"].as_str().unwrap_or("").to_owned();
    (status, code, after, took)
}

#[tokio::test]
async fn a_full_disk_is_busy_shown_on_health_and_recovered_by_itself() {
    let disk = SmallDisk::mount("2m");
    let data = disk.0.join("data");
    let data_dir = data.display().to_string();
    let gateway = GatewayProcess::start(&[
        ("SENDGATE_BACKEND", "embedded"),
        ("SENDGATE_QUEUES", "q"),
        ("SENDGATE_DATA_DIR", &data_dir),
        ("SENDGATE_SEND_TIMEOUT_MS", "3000"),
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "1000000"),
    ])
    .await;
    let body = format!("{{\"pad\":\"{}\"}}", "x".repeat(4000));
    let mut created = 0u64;
    assert_eq!(send(&gateway, &body).await.0, 201);
    created += 1;

    let filler = disk.fill();
    // What room the store had already taken (its log, free pages) fills first.
    let mut refused = Vec::new();
    for _ in 0..500 {
        let answer = send(&gateway, &body).await;
        if answer.0 == 201 {
            created += 1;
            continue;
        }
        refused.push(answer);
        break;
    }
    assert!(!refused.is_empty(), "the full disk never refused a send");
    for _ in 0..20 {
        refused.push(send(&gateway, &body).await);
    }
    let health = gateway.detailed().await;
    let longest = refused.iter().map(|a| a.3).max().unwrap_or_default();
    eprintln!(
        "while full: {:?}; longest {longest:?}; health: {} {}",
        refused
            .iter()
            .map(|a| format!("{} {}", a.0, a.1))
            .collect::<Vec<_>>(),
        health["status"],
        health["backends"]["primary"]
    );
    for (status, code, after, took) in &refused {
        assert_eq!(
            (*status, code.as_str(), *after),
            (503, "backend_busy", true)
        );
        assert!(*took < Duration::from_secs(1), "answered at once: {took:?}");
    }
    assert_eq!(health["status"], "degraded", "{health}");
    let store = &health["backends"]["primary"]["store"];
    assert_eq!(store["ok"], false, "{health}");
    assert!(
        store["error"].as_str().unwrap_or("").contains("full"),
        "{health}"
    );

    std::fs::remove_file(filler).unwrap();
    let freed = Instant::now();
    loop {
        let (status, ..) = send(&gateway, &body).await;
        if status == 201 {
            created += 1;
            break;
        }
        assert!(
            freed.elapsed() < Duration::from_secs(10),
            "not back by itself"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let back = freed.elapsed();
    let health = gateway.detailed().await;
    eprintln!(
        "first 201 {back:?} after room came back; health: {}",
        health["status"]
    );
    assert_eq!(
        health["backends"]["primary"]["store"]["ok"], true,
        "{health}"
    );
    assert_eq!(health["status"], "ok", "{health}");
    drop(gateway);
    let stored = Store::open(&data).unwrap().depth("q").unwrap();
    assert_eq!(stored, created, "stored exactly what was acknowledged");
}
