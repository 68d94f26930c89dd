//! The console in headless Chromium (Debian's `chromium` and `chromium-driver`): log in, read the
//! depth tiles, open a dead letter's detail, filter and switch the dead-letter list, requeue
//! through the confirmation, and see the list and the depths change.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::key::Key;
use fantoccini::{Client, ClientBuilder, Locator};
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

/// The rendered text of the element with this id (empty while it is not on the page: the
/// confirmation builds its check list when the checks arrive).
async fn text(browser: &Client, id: &str) -> String {
    match browser.find(Locator::Id(id)).await {
        Ok(element) => element.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// How many elements match `css`.
async fn count(browser: &Client, css: &str) -> usize {
    browser.find_all(Locator::Css(css)).await.unwrap().len()
}

/// Whether the element with this id is displayed.
async fn shown(browser: &Client, id: &str) -> bool {
    browser
        .find(Locator::Id(id))
        .await
        .unwrap()
        .is_displayed()
        .await
        .unwrap()
}

/// Whether the element with this id is enabled.
async fn enabled(browser: &Client, id: &str) -> bool {
    browser
        .find(Locator::Id(id))
        .await
        .unwrap()
        .is_enabled()
        .await
        .unwrap()
}

async fn click(browser: &Client, locator: Locator<'_>) {
    browser.find(locator).await.unwrap().click().await.unwrap();
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn an_operator_logs_in_lists_and_requeues_in_a_browser(pool: PgPool) {
    let mut app = spawn_app(pool.clone()).await;
    let retry_id = retry_dead_letter(&mut app).await.to_string();
    let journal_id = journal_dead_letter(&app, "s-browser").await.to_string();
    let stranger = uuid::Uuid::now_v7().to_string();
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

        // A wrong password shows the error code; the right one opens the console.
        browser
            .find(Locator::Id("password"))
            .await
            .unwrap()
            .send_keys("wrong")
            .await
            .unwrap();
        click(&browser, Locator::Id("login-button")).await;
        wait_until("the login error", || async {
            text(&browser, "error").await.contains("bad_password")
        })
        .await;
        let password = browser.find(Locator::Id("password")).await.unwrap();
        password.clear().await.unwrap();
        password.send_keys(PASSWORD).await.unwrap();
        click(&browser, Locator::Id("login-button")).await;

        // Depth tiles, and the retry list (the kind shown first).
        wait_until("the depth tiles", || async {
            text(&browser, "retry-dead").await == "1"
                && text(&browser, "journal-dead").await == "1"
                && text(&browser, "retry-pending").await == "0"
                && text(&browser, "journal-processing").await == "0"
        })
        .await;
        wait_until("the depths' age", || async {
            text(&browser, "depths-updated").await.contains("updated")
        })
        .await;
        wait_until("the retry dead letter", || async {
            count(&browser, ".retry-row").await == 1
        })
        .await;
        assert!(!shown(&browser, "login").await);
        assert_eq!(count(&browser, ".journal-row").await, 0);
        let row = browser.find(Locator::Css(".retry-row")).await.unwrap();
        assert_eq!(
            row.attr("data-id").await.unwrap().as_deref(),
            Some(retry_id.as_str())
        );
        let when = browser
            .find(Locator::Css(".retry-row td.failed-at .when"))
            .await
            .unwrap();
        let raw = when.attr("title").await.unwrap().unwrap_or_default();
        let shown_time = when.text().await.unwrap();
        assert!(raw.contains('T'), "the raw time in the title: {raw:?}");
        assert!(
            shown_time.contains("ago") && !shown_time.contains(&raw),
            "a local time and its age: {shown_time:?}"
        );
        assert!(!enabled(&browser, "prev-page").await);
        assert!(!enabled(&browser, "next-page").await);

        // The detail: every field, the pretty-printed payload and the checks, none flagged.
        click(&browser, Locator::Css(".retry-row button.details")).await;
        wait_until("the detail's payload", || async {
            shown(&browser, "detail").await
                && text(&browser, "detail-payload")
                    .await
                    .contains("\"room\": \"r0\"")
        })
        .await;
        assert!(text(&browser, "detail-fields").await.contains(&retry_id));
        let checks = text(&browser, "detail-checks").await;
        assert!(
            checks.contains("Session impact: none") && checks.contains("Session active again: no"),
            "{checks}"
        );
        assert!(count(&browser, "#detail-checks li").await >= 5);
        assert_eq!(count(&browser, "#detail-checks li.warn").await, 0);
        click(&browser, Locator::Id("detail-close")).await;
        wait_until("the detail to close", || async {
            !shown(&browser, "detail").await
        })
        .await;

        // A character filter that matches nothing empties the list; clearing it (Enter) restores it.
        browser
            .find(Locator::Id("character-filter"))
            .await
            .unwrap()
            .send_keys(&stranger)
            .await
            .unwrap();
        click(&browser, Locator::Id("apply-filter")).await;
        wait_until("the filtered list to empty", || async {
            count(&browser, ".retry-row").await == 0 && count(&browser, "tr.empty-row").await == 1
        })
        .await;
        let filter = browser.find(Locator::Id("character-filter")).await.unwrap();
        filter.clear().await.unwrap();
        filter.send_keys(&Key::Enter).await.unwrap();
        wait_until("the unfiltered list", || async {
            count(&browser, ".retry-row").await == 1
        })
        .await;

        // Switch to the journal and requeue its entry: the confirmation shows what to check first.
        browser
            .find(Locator::Id("kind-filter"))
            .await
            .unwrap()
            .select_by_value("journal")
            .await
            .unwrap();
        wait_until("the journal dead letter", || async {
            count(&browser, ".journal-row").await == 1 && count(&browser, ".retry-row").await == 0
        })
        .await;
        let row = browser.find(Locator::Css(".journal-row")).await.unwrap();
        assert_eq!(
            row.attr("data-id").await.unwrap().as_deref(),
            Some(journal_id.as_str())
        );
        assert!(row.text().await.unwrap().contains("Aria"));
        click(&browser, Locator::Css(".journal-row button.requeue")).await;
        wait_until("the confirmation with its checks", || async {
            shown(&browser, "confirm").await
                && text(&browser, "c-ledger").await == "YES"
                && enabled(&browser, "confirm-requeue").await
        })
        .await;
        assert_eq!(text(&browser, "c-active").await, "no");
        assert_eq!(text(&browser, "c-transfer").await, "no");
        assert_eq!(text(&browser, "c-error").await, "store down");
        assert_eq!(count(&browser, "#confirm-checks li.warn").await, 1);
        click(&browser, Locator::Id("confirm-requeue")).await;
        wait_until("the journal list and depths", || async {
            !shown(&browser, "confirm").await
                && count(&browser, ".journal-row").await == 0
                && text(&browser, "journal-dead").await == "0"
                && text(&browser, "journal-pending").await == "1"
        })
        .await;
        assert!(text(&browser, "notice").await.contains(&journal_id));

        // Requeue the retry job from its detail.
        browser
            .find(Locator::Id("kind-filter"))
            .await
            .unwrap()
            .select_by_value("retry")
            .await
            .unwrap();
        wait_until("the retry list again", || async {
            count(&browser, ".retry-row").await == 1
        })
        .await;
        click(&browser, Locator::Css(".retry-row button.details")).await;
        wait_until("the detail", || async {
            shown(&browser, "detail").await && enabled(&browser, "detail-requeue").await
        })
        .await;
        click(&browser, Locator::Id("detail-requeue")).await;
        wait_until("the impact", || async {
            text(&browser, "c-impact").await == "none" && enabled(&browser, "confirm-requeue").await
        })
        .await;
        click(&browser, Locator::Id("confirm-requeue")).await;
        wait_until("the retry list to empty", || async {
            !shown(&browser, "detail").await
                && count(&browser, ".retry-row").await == 0
                && text(&browser, "retry-dead").await == "0"
                && text(&browser, "retry-pending").await == "1"
        })
        .await;

        // Logging out brings the login form back.
        click(&browser, Locator::Id("logout")).await;
        wait_until("the login form", || async {
            shown(&browser, "password").await && !shown(&browser, "main").await
        })
        .await;
    };
    run.await;
    browser.close().await.unwrap();
    assert_eq!(
        app.count("SELECT count(*) FROM persistence_retry_jobs")
            .await,
        1
    );
    assert_eq!(app.state.journal.queue().depths().await.unwrap().pending, 1);
}
