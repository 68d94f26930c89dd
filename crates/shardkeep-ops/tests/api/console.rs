use reqwest::header::{COOKIE, SET_COOKIE};
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::support::{PASSWORD, journal_dead_letter, retry_dead_letter, spawn_app};

async fn login(app: &crate::support::TestApp, password: &str) -> (u16, Option<String>) {
    let response = app
        .http
        .post(format!("{}/console/login", app.base))
        .json(&json!({ "password": password }))
        .send()
        .await
        .unwrap();
    let cookie = response
        .headers()
        .get(SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or_default().to_owned());
    (response.status().as_u16(), cookie)
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn the_console_needs_its_own_login(pool: PgPool) {
    let mut app = spawn_app(pool.clone()).await;
    let page = app
        .http
        .get(format!("{}/console", app.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("shardkeep console") && page.contains("password"));
    assert!(
        !page.contains("0123456789abcdef0123"),
        "no signing secret in the page"
    );
    let anonymous = app
        .http
        .get(format!("{}/console/api/overview", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status().as_u16(), 401);
    assert_eq!(login(&app, "guess").await.0, 401);
    let bad_json = app
        .http
        .post(format!("{}/console/login", app.base))
        .body("{")
        .send()
        .await
        .unwrap();
    assert_eq!(bad_json.status().as_u16(), 400);
    let (status, cookie) = login(&app, PASSWORD).await;
    assert_eq!(status, 200);
    let cookie = cookie.unwrap();
    assert!(cookie.starts_with("shardkeep_console="));

    let retry_id = retry_dead_letter(&mut app).await;
    let journal_id = journal_dead_letter(&app, "s-c").await;
    app.state
        .coord
        .session_activate("s-c", shardkeep::Ttl::from_secs(60).unwrap())
        .await
        .unwrap();
    let overview: Value = app
        .http
        .get(format!("{}/console/api/overview", app.base))
        .header(COOKIE, &cookie)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(overview["retry"]["active_dead_letters"], 1);
    assert_eq!(overview["journal"]["dead"], 1);
    let preview: Value = app
        .http
        .get(format!(
            "{}/console/api/journal/{journal_id}/preview",
            app.base
        ))
        .header(COOKIE, &cookie)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(preview["session_active_again"], true);
    assert_eq!(preview["deletes_resume_ledger"], true);
    assert_eq!(preview["transfer_already_confirmed"], false);
    let preview: Value = app
        .http
        .get(format!("{}/console/api/retry/{retry_id}/preview", app.base))
        .header(COOKIE, &cookie)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(preview["session_impact"], "none");
    // Writes need the console header (a cross-site form cannot send it).
    let forged = app
        .http
        .post(format!("{}/console/api/retry/{retry_id}/requeue", app.base))
        .header(COOKIE, &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status().as_u16(), 403);
    let requeued: Value = app
        .http
        .post(format!("{}/console/api/retry/{retry_id}/requeue", app.base))
        .header(COOKIE, &cookie)
        .header("x-shardkeep-console", "1")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(requeued["requeued"], true);
    let logout = app
        .http
        .post(format!("{}/console/logout", app.base))
        .header(COOKIE, &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(logout.status().as_u16(), 200);
    let after = app
        .http
        .get(format!("{}/console/api/overview", app.base))
        .header(COOKIE, &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(after.status().as_u16(), 401);
}
