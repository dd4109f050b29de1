//! Headless Chromium driven through chromedriver (WebDriver) with fantoccini, for the status
//! page's browser tests.
//!
//! Chromium and chromedriver come from Debian's packages (`scripts/ensure-chromium.sh`,
//! which [`crate::ensure::chromium`] runs once): a test that needs them fails loudly when they cannot be had; it
//! never skips. Each [`Browser`] starts its own chromedriver on a free port, in a process
//! group of its own, and kills that group (chromedriver and the Chromium it started) when
//! dropped.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

use crate::gateway::free_port;

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// One headless Chromium session.
pub struct Browser {
    pub client: Client,
    driver: Child,
    /// Chromium's profile: one per browser, so parallel tests share nothing.
    _profile: tempfile::TempDir,
}

impl Browser {
    pub async fn start() -> Self {
        Self::launch(true).await
    }

    /// A browser with JavaScript switched off: what the server renders is all it shows.
    pub async fn without_javascript() -> Self {
        Self::launch(false).await
    }

    async fn launch(javascript: bool) -> Self {
        crate::ensure::chromium();
        let port = free_port();
        let mut driver = Command::new(CHROMEDRIVER);
        driver
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own group, so Drop can end Chromium with it.
            .process_group(0);
        let driver = driver.spawn().expect("chromedriver starts");
        let profile = tempfile::tempdir().expect("a profile directory");
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": CHROMIUM,
                "args": [
                    "--headless=new",
                    // Root in a container: Chromium's sandbox cannot start there.
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--window-size=1280,1100",
                    "--hide-scrollbars",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
                // 1 allows, 2 blocks.
                "prefs": {
                    "profile.managed_default_content_settings.javascript":
                        if javascript { 1 } else { 2 },
                },
            }),
        );
        let webdriver = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&webdriver)
                .await
            {
                Ok(client) => break client,
                Err(e) => {
                    assert!(
                        started.elapsed() < Duration::from_secs(30),
                        "no WebDriver session from chromedriver on {webdriver}: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        Self {
            client,
            driver,
            _profile: profile,
        }
    }

    /// The text of the first element matching `css`, or `None` while there is none.
    pub async fn text(&self, css: &str) -> Option<String> {
        let element = self.client.find(Locator::Css(css)).await.ok()?;
        element.text().await.ok()
    }

    /// How many elements match `css` now.
    pub async fn count(&self, css: &str) -> usize {
        self.client
            .find_all(Locator::Css(css))
            .await
            .map(|all| all.len())
            .unwrap_or(0)
    }

    /// Wait (up to 20 s: the page polls every 2 s) until the text of `css` satisfies `ok`;
    /// returns it. The failure names the last text seen.
    pub async fn wait_text(&self, css: &str, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let started = Instant::now();
        loop {
            let text = self.text(css).await;
            if let Some(text) = &text {
                if ok(text) {
                    return text.clone();
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{css}: never {what}; last seen {text:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Wait (up to 20 s) until exactly `n` elements match `css`.
    pub async fn wait_count(&self, css: &str, n: usize) {
        let started = Instant::now();
        loop {
            let count = self.count(css).await;
            if count == n {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{css}: never {n} elements; last seen {count}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Run `script` in the page and return its value.
    pub async fn eval(&self, script: &str) -> serde_json::Value {
        self.client
            .execute(script, vec![])
            .await
            .expect("the script runs")
    }

    /// End the session, then chromedriver (Drop does the rest).
    pub async fn close(self) {
        let _ = self.client.clone().close().await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The whole group: chromedriver and the Chromium processes it started. The `--` is
        // needed: procps's `kill -KILL -PGID` reads `-PGID` as an option and signals every
        // process (kill(-1)); `kill -s KILL -- -PGID` signals only the group.
        let group = self.driver.id();
        if group > 1 {
            let _ = Command::new("kill")
                .args(["-s", "KILL", "--", &format!("-{group}")])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
