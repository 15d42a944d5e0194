//! The admin page in a real browser: Debian's headless `chromium`, driven through
//! `chromedriver` (W3C WebDriver) by the `fantoccini` client. The page is served on a real
//! socket; the test sees a dead letter, clicks its requeue button and reads the database.
//!
//! Why WebDriver and fantoccini rather than the DevTools protocol: chromedriver ships in the
//! same Debian package family as chromium and always matches its version; WebDriver is the
//! standard a test would keep if the browser changed; fantoccini is a small, long-kept client
//! (tokio and hyper, both already in the tree) that needs no TLS here (chromedriver is on
//! loopback), whereas the CDP crates pull a WebSocket stack and track Chrome's protocol.
//!
//! Without chromium (or chromedriver) the test says so and passes, unless `CI` is set: in CI it
//! fails. `CHROMIUM` and `CHROMEDRIVER` override the binaries' paths (default
//! `/usr/bin/chromium`, `/usr/bin/chromedriver`). With `ADMIN_SCREENSHOT=path.png` the test
//! saves a screenshot of the page there (how `docs/admin.png` was made).

#![allow(clippy::unwrap_used, clippy::print_stderr)]

mod admin_common;

use std::net::TcpListener as StdListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use admin_common::{DEAD, Db};
use fantoccini::{ClientBuilder, Locator};
use serde_json::json;

/// The browser and its driver, or `None` (test skipped) when either is missing outside CI.
fn browser() -> Option<(PathBuf, PathBuf)> {
    let chromium = PathBuf::from(std::env::var("CHROMIUM").unwrap_or("/usr/bin/chromium".into()));
    let driver =
        PathBuf::from(std::env::var("CHROMEDRIVER").unwrap_or("/usr/bin/chromedriver".into()));
    let missing: Vec<String> = [&chromium, &driver]
        .into_iter()
        .filter(|p| !p.exists())
        .map(|p| p.display().to_string())
        .collect();
    if missing.is_empty() {
        return Some((chromium, driver));
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI is set and {} is missing: install chromium and chromium-driver (apt-get install \
         chromium chromium-driver)",
        missing.join(" and ")
    );
    eprintln!(
        "SKIPPED admin page browser test: {} not found (install chromium and chromium-driver, \
         or set CHROMIUM / CHROMEDRIVER); in CI this fails",
        missing.join(" and ")
    );
    None
}

/// chromedriver on a free port, killed on drop.
struct Driver {
    child: Child,
    port: u16,
}

impl Driver {
    async fn start(path: &PathBuf) -> Self {
        let port = StdListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(path)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", path.display()));
        let driver = Self { child, port };
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return driver;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("chromedriver did not listen on port {port} within 10 s");
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn requeue_a_dead_letter_from_the_page_in_chromium() {
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };
    let db = Db::sqlite().await;
    db.seed().await;
    db.exec(&format!(
        "UPDATE {} SET last_error = 'nats: no responders for subject \"charges.created\" \
         <script>alert(1)</script>' WHERE id = {}",
        db.outbox,
        db.id(DEAD[0])
    ))
    .await;
    let app: axum::Router = axum::Router::new().nest("/admin", db.router(true).await);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let driver = Driver::start(&chromedriver).await;
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1100,900"],
        }),
    );
    let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(capabilities)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .unwrap();

    client.goto(&format!("http://{addr}/admin")).await.unwrap();
    let row = client
        .find(Locator::Id(&format!("dead-{}", DEAD[0])))
        .await
        .unwrap();
    let text = row.text().await.unwrap();
    assert!(
        text.contains("<script>alert(1)</script>"),
        "the last error is shown as text, not run: {text}"
    );
    let alert = client.get_alert_text().await;
    assert!(alert.is_err(), "no script ran: {alert:?}");
    if let Some(path) = std::env::var_os("ADMIN_SCREENSHOT") {
        std::fs::write(&path, client.screenshot().await.unwrap()).unwrap();
    }

    client
        .find(Locator::Id(&format!("requeue-{}", DEAD[0])))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let flash = client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Id("flash"))
        .await
        .unwrap();
    assert!(
        flash.text().await.unwrap().contains(DEAD[0]),
        "the page says which dead letter was requeued"
    );
    assert!(
        client
            .current_url()
            .await
            .unwrap()
            .as_str()
            .ends_with(&format!("/admin?done=requeued&id={}", DEAD[0])),
        "back on the page after the POST"
    );
    assert!(
        client
            .find(Locator::Id(&format!("dead-{}", DEAD[0])))
            .await
            .is_err(),
        "the row left the dead letters"
    );
    assert_eq!(
        db.pending_with_id(DEAD[0]).await,
        1,
        "requeued in the database"
    );
    assert_eq!(db.dead_letters().await, 2);

    client.close().await.unwrap();
    drop(driver);
    server.abort();
}
