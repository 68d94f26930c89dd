//! Rebuilds the crate when a migration is added or removed: `sqlx::migrate!` embeds the
//! migration directories at compile time and only tracks the files it already knew.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
    println!("cargo:rerun-if-changed=migrations_sqlite");
}
