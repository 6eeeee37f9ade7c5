//! PostgreSQL for tests: [`PgSchema`], a schema of its own per test on the
//! server at 127.0.0.1:5432 (trust auth, user `postgres`, database `test`;
//! `IDEMGATE_TEST_POSTGRES` names another), dropped when the test ends, so
//! runs and tests never see each other's operations. The tests that need
//! it are `#[ignore]`d (`cargo test` says so); `cargo test --
//! --include-ignored`, as `.ci/run` runs, runs them and fails them without
//! a server.

use super::*;
use sqlx::Connection;

/// The server and database tests create their schemas in.
pub fn postgres_url() -> String {
    std::env::var("IDEMGATE_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// Which store a test that runs on each runs on ([`on_each_backend!`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A gateway made as `setup` says on `backend`: its own SQLite file, or a
/// PostgreSQL schema of its own, returned to be kept as long as it.
pub async fn spawn_gateway_on_backend(
    backend: Backend,
    setup: Setup,
) -> (TestGateway, Option<PgSchema>) {
    match backend {
        Backend::Sqlite => (spawn_gateway_with(setup).await, None),
        Backend::Postgres => {
            let schema = PgSchema::create().await;
            let gateway = spawn_gateway_with(setup.postgres(&schema)).await;
            (gateway, Some(schema))
        }
    }
}

/// Two tests of one `scenario(backend)`: `$sqlite` on SQLite, and
/// `$postgres`, ignored unless PostgreSQL is there (`.ci/run` runs it).
macro_rules! on_each_backend {
    ($scenario:ident: $sqlite:ident, $postgres:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $sqlite() {
            $scenario(Backend::Sqlite).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
        async fn $postgres() {
            $scenario(Backend::Postgres).await;
        }
    };
}
pub(crate) use on_each_backend;

/// A schema created for one test; the store URL points into it.
pub struct PgSchema {
    pub name: String,
    /// The store URL: the test database with this schema first on the search path.
    pub url: String,
    /// The scope key its gateways share (base64), also in `scope_key_file`.
    pub scope_key: String,
    pub scope_key_file: PathBuf,
    _key_dir: TempDir,
}

impl PgSchema {
    /// A fresh schema; panics, saying why, when no PostgreSQL answers.
    pub async fn create() -> PgSchema {
        let server = postgres_url();
        let connected = tokio::time::timeout(WAIT, sqlx::PgConnection::connect(&server)).await;
        let mut conn = match connected {
            Ok(Ok(conn)) => conn,
            Ok(Err(error)) => unavailable(&server, &error.to_string()),
            Err(_) => unavailable(&server, "no answer"),
        };
        let name = format!("idemgate_t_{}", uuid::Uuid::now_v7().simple());
        sqlx::query(&format!("CREATE SCHEMA {name}"))
            .execute(&mut conn)
            .await
            .expect("create a test schema");
        let _ = conn.close().await;
        let url = format!("{server}?options[search_path]={name}");
        let (scope_key, scope_key_file, key_dir) = new_scope_key_file();
        PgSchema {
            name,
            url,
            scope_key,
            scope_key_file,
            _key_dir: key_dir,
        }
    }
}

/// A fresh scope key (base64), the file holding it, and the directory
/// that holds the file as long as it is kept.
pub fn new_scope_key_file() -> (String, PathBuf, TempDir) {
    let key_dir = tempfile::tempdir().expect("tempdir");
    let scope_key = idemgate_store::StoreKey::generate_base64();
    let scope_key_file = key_dir.path().join("scope-key");
    std::fs::write(&scope_key_file, &scope_key).expect("scope key file");
    (scope_key, scope_key_file, key_dir)
}

/// A connection of the test's own to the server, beside any gateway's: to
/// cut, lock or read a schema under it.
pub async fn admin_connection() -> sqlx::PgConnection {
    sqlx::PgConnection::connect(&postgres_url())
        .await
        .expect("connect to PostgreSQL")
}

/// Store keys for stores opened directly: no seal, a fixed scope key.
pub fn test_store_keys() -> idemgate_store::StoreKeys {
    idemgate_store::StoreKeys {
        seal: idemgate_store::Seal::plain(),
        scope: idemgate_store::scope_key::ScopeKey::new(&[5; 32], "the test scope key"),
    }
}

impl PgSchema {
    /// Every row of every table in this schema as text, by table (a
    /// `bytea` column reads as hex): what a copy of the store holds.
    pub async fn dump(&self) -> Vec<(String, Vec<u8>)> {
        let mut conn = admin_connection().await;
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1",
        )
        .bind(&self.name)
        .fetch_all(&mut conn)
        .await
        .expect("tables");
        assert!(tables.iter().any(|t| t == "operations"), "{tables:?}");
        let mut stored = Vec::new();
        for table in tables {
            let rows: Option<String> = sqlx::query_scalar(&format!(
                "SELECT string_agg(t::text, E'\\n') FROM {}.{table} t",
                self.name
            ))
            .fetch_one(&mut conn)
            .await
            .expect("rows");
            stored.push((table, rows.unwrap_or_default().into_bytes()));
        }
        let _ = conn.close().await;
        stored
    }
}

fn unavailable(server: &str, reason: &str) -> ! {
    panic!(
        "this test needs PostgreSQL at {server} ({reason}): .ci/run starts it, \
         IDEMGATE_TEST_POSTGRES names another"
    )
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        // Drop may run inside or outside a runtime: a thread of its own.
        let (server, name) = (postgres_url(), self.name.clone());
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                let mut conn = sqlx::PgConnection::connect(&server).await?;
                sqlx::query(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
                    .execute(&mut conn)
                    .await?;
                conn.close().await
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop test schema {}", self.name);
        }
    }
}

/// How many PostgreSQL migrations the binary carries.
pub fn postgres_migrations() -> i64 {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crates/store-postgres/migrations"
    );
    let count = std::fs::read_dir(dir).expect("migrations").count();
    i64::try_from(count).expect("a few migrations")
}
