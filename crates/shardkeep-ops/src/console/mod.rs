//! The operator console at `/console`: a login of its own (an operator password opens a
//! server-side session held in a cookie), queue depths, both dead-letter lists, and requeue
//! behind a confirmation that shows what to check first. Console calls run on the server with
//! the server's own authority; no signing secret ever reaches the browser.

mod api;
mod session;

use axum::response::Html;

pub use api::{Depths, Row, RowPage, dead_letters, depths, detail, requeue_journal, requeue_retry};
pub use session::{COOKIE, CSRF_HEADER, LOGIN_WINDOW, SESSION_TTL, login, logout, require_session};

const PAGE: &str = include_str!("page.html");

/// `GET /console`: the page.
pub async fn page() -> Html<&'static str> {
    Html(PAGE)
}
