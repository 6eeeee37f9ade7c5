//! Rebuilds the crate when a migration is added: `sqlx::migrate!` embeds
//! the directory's files, and cargo would not otherwise see a new one.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
