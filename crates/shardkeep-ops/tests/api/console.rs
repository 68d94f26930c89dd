use reqwest::header::COOKIE;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::support::{
    PASSWORD, console_login as login, journal_dead_letter, retry_dead_letter, spawn_app,
};

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
        .get(format!("{}/console/api/depths", app.base))
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
    let get = |path: String| {
        let http = app.http.clone();
        let cookie = cookie.clone();
        let base = app.base.clone();
        async move {
            let response = http
                .get(format!("{base}{path}"))
                .header(COOKIE, cookie)
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    let (_, depths) = get("/console/api/depths".into()).await;
    assert_eq!(depths["retry"]["dead"], 1);
    assert_eq!(depths["journal"]["dead"], 1);
    let (_, page) = get("/console/api/dead-letters?kind=journal&character=aria".into()).await;
    assert_eq!(page["items"][0]["dead_letter_id"], journal_id.to_string());
    assert_eq!(page["items"][0]["what"], "permanent_removal");
    assert_eq!(page["has_more"], false);
    let (_, page) = get("/console/api/dead-letters?kind=journal&character=Nobody".into()).await;
    assert_eq!(page["items"].as_array().map(Vec::len), Some(0));
    let (status, bad) = get("/console/api/dead-letters?kind=mail".into()).await;
    assert_eq!(
        (status, &bad["error"]["code"]),
        (400, &json!("invalid_kind"))
    );
    let (status, bad) = get("/console/api/dead-letters?offset=-3".into()).await;
    assert_eq!(
        (status, &bad["error"]["code"]),
        (400, &json!("invalid_offset"))
    );
    let (_, detail) = get(format!("/console/api/dead-letters/journal/{journal_id}")).await;
    assert_eq!(detail["checks"]["session_active_again"], true);
    assert_eq!(detail["checks"]["deletes_resume_ledger"], true);
    assert_eq!(detail["checks"]["transfer_already_confirmed"], false);
    assert_eq!(detail["payload"]["player"]["character_name"], "Aria");
    let (_, detail) = get(format!("/console/api/dead-letters/retry/{retry_id}")).await;
    assert_eq!(detail["checks"]["session_impact"], "none");
    assert_eq!(detail["payload"]["room"], "r0");
    let (status, _) = get(format!(
        "/console/api/dead-letters/retry/{}",
        uuid::Uuid::now_v7()
    ))
    .await;
    assert_eq!(status, 404);
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
        .header("x-shardkeep-console", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(logout.status().as_u16(), 200);
    let after = app
        .http
        .get(format!("{}/console/api/depths", app.base))
        .header(COOKIE, &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(after.status().as_u16(), 401);
}
