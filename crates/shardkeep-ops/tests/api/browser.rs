//! The console in headless Chromium (Debian's `chromium` and `chromium-driver`): log in, list
//! both dead-letter queues, requeue through the confirmation, and see the lists change.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{ClientBuilder, Locator};
use sqlx::PgPool;

use crate::support::{PASSWORD, journal_dead_letter, retry_dead_letter, spawn_app};

struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn chromedriver() -> Driver {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("the console test needs chromium and chromium-driver (apt-get install chromium chromium-driver): {e}")
        });
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Driver {
        child,
        url: format!("http://127.0.0.1:{port}"),
    }
}

async fn wait_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..100 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn an_operator_logs_in_lists_and_requeues_in_a_browser(pool: PgPool) {
    let mut app = spawn_app(pool.clone()).await;
    retry_dead_letter(&mut app).await;
    journal_dead_letter(&app, "s-browser").await;
    let driver = chromedriver().await;
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": "/usr/bin/chromium",
            "args": ["--headless", "--window-size=1280,1024", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                     "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"]
        }),
    );
    let browser = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .expect("a chromedriver session");
    let run = async {
        browser
            .goto(&format!("{}/console", app.base))
            .await
            .unwrap();
        browser
            .find(Locator::Id("password"))
            .await
            .unwrap()
            .send_keys("wrong")
            .await
            .unwrap();
        browser
            .find(Locator::Id("login-button"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        wait_until("the login error", || async {
            browser
                .find(Locator::Id("error"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
                .contains("bad_password")
        })
        .await;
        let password = browser.find(Locator::Id("password")).await.unwrap();
        password.clear().await.unwrap();
        password.send_keys(PASSWORD).await.unwrap();
        browser
            .find(Locator::Id("login-button"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        wait_until("both dead-letter lists", || async {
            browser
                .find_all(Locator::Css(".retry-row"))
                .await
                .unwrap()
                .len()
                == 1
                && browser
                    .find_all(Locator::Css(".journal-row"))
                    .await
                    .unwrap()
                    .len()
                    == 1
        })
        .await;
        assert_eq!(
            browser
                .find(Locator::Id("retry-dead"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
            "1"
        );
        assert_eq!(
            browser
                .find(Locator::Id("journal-dead"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
            "1"
        );

        // Requeue the journal entry: the confirmation shows what to check first.
        browser
            .find(Locator::Css(".journal-row button.requeue"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        wait_until("the confirmation", || async {
            !browser
                .find(Locator::Id("confirm"))
                .await
                .unwrap()
                .attr("class")
                .await
                .unwrap()
                .unwrap_or_default()
                .contains("hidden")
        })
        .await;
        assert_eq!(
            browser
                .find(Locator::Id("c-ledger"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
            "YES"
        );
        assert_eq!(
            browser
                .find(Locator::Id("c-active"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
            "no"
        );
        assert_eq!(
            browser
                .find(Locator::Id("c-transfer"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
            "no"
        );
        browser
            .find(Locator::Id("confirm-requeue"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        wait_until("the journal list to empty", || async {
            browser
                .find_all(Locator::Css(".journal-row"))
                .await
                .unwrap()
                .is_empty()
        })
        .await;
        assert_eq!(
            browser
                .find(Locator::Id("journal-pending"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
            "1"
        );

        // Requeue the retry job.
        browser
            .find(Locator::Css(".retry-row button.requeue"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        wait_until("the impact", || async {
            browser
                .find(Locator::Id("c-impact"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
                == "none"
        })
        .await;
        browser
            .find(Locator::Id("confirm-requeue"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        wait_until("the retry list to empty", || async {
            browser
                .find_all(Locator::Css(".retry-row"))
                .await
                .unwrap()
                .is_empty()
        })
        .await;
        assert_eq!(
            browser
                .find(Locator::Id("retry-pending"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
            "1"
        );
    };
    run.await;
    browser.close().await.unwrap();
    assert_eq!(
        crate::support::count(&pool, "SELECT count(*) FROM persistence_retry_jobs").await,
        1
    );
    assert_eq!(app.state.journal.queue().depths().await.unwrap().pending, 1);
}
