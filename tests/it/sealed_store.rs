//! The sealed store (`store.encryption_key_env`), on SQLite and on
//! PostgreSQL: a marker the upstream returns in a response body and a
//! header, and a client sends in a stored request body, is replayed (from
//! the store, after a restart) and shown to operators, yet appears nowhere
//! in the store — not in SQLite's database, WAL or shared-memory files,
//! not in any row of the PostgreSQL schema. A wrong key, no key, or a
//! malformed one refuses to start with a message that says which; a key is
//! rotated with `store.previous_key_env` and `idemgate rekey`, which
//! refuses a store that does not exist; a sealed
//! value that was altered is reported (500 `store-unreadable`), never
//! replayed.

use crate::common::*;
use bytes::Bytes;
use http::StatusCode;
use idemgate_store::StoreKey;

const KEY_ENV: &str = "IDEMGATE_STORE_KEY";
const OLD_KEY_ENV: &str = "IDEMGATE_OLD_STORE_KEY";

/// A gateway (with the admin API) whose store is sealed under `key`, on
/// `backend`.
async fn sealed_gateway(backend: Backend, key: &str) -> (TestGateway, Option<PgSchema>) {
    let setup = Setup::route("store_request_body = true\n")
        .store(&format!("encryption_key_env = \"{KEY_ENV}\"\n"))
        .env(KEY_ENV, key)
        .admin();
    spawn_gateway_on_backend(backend, setup).await
}

fn marker() -> String {
    format!("sealed-marker-{}", uuid::Uuid::now_v7().simple())
}

/// A write whose request body, response body and a response header all
/// carry `marker`.
async fn write_marked(gateway: &TestGateway, key: &str, marker: &str) -> Response {
    send(
        gateway.addr(),
        "POST",
        "/orders",
        &[
            ("content-type", "application/json"),
            ("idempotency-key", key),
            ("authorization", ALICE),
            ("x-echo", marker),
        ],
        Bytes::from(format!(r#"{{"note":"{marker}"}}"#)),
    )
    .await
}

fn assert_marked(response: &Response, marker: &str) {
    assert!(
        find(&response.body, marker.as_bytes()).is_some(),
        "{response:?}"
    );
    assert_eq!(response.header("x-echo-tag"), Some(marker), "{response:?}");
}

/// Every byte the store holds: SQLite's files (database, WAL, shared
/// memory), or every row of the PostgreSQL schema.
async fn stored_bytes(gateway: &TestGateway, schema: Option<&PgSchema>) -> Vec<(String, Vec<u8>)> {
    match schema {
        Some(schema) => schema.dump().await,
        None => {
            let dir = gateway.store_path.parent().expect("store dir");
            files_starting_with(dir, "idemgate.db")
        }
    }
}

fn assert_nowhere(stored: &[(String, Vec<u8>)], marker: &str) {
    for (name, bytes) in stored {
        for needle in [marker.to_string(), hex::encode(marker)] {
            assert!(
                find(bytes, needle.as_bytes()).is_none(),
                "{marker} found in {name}"
            );
        }
    }
}

async fn marker_never_stored(backend: Backend) {
    let key = StoreKey::generate_base64();
    let (mut gateway, schema) = sealed_gateway(backend, &key).await;
    let marker = marker();
    let first = write_marked(&gateway, "k-marked", &marker).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_marked(&first, &marker);
    // From the store, not from the replay cache: a new process.
    gateway.restart().await;
    let replay = write_marked(&gateway, "k-marked", &marker).await;
    assert!(replay.is_replay(), "{replay:?}");
    assert_marked(&replay, &marker);
    // Operators see the opened request body.
    let shown = gateway.operation("k-marked").await;
    let body = shown["request"]["body"].to_string();
    assert!(body.contains(&marker), "{shown}");
    assert_eq!(gateway.upstream.writes(), 1);

    let stored = stored_bytes(&gateway, schema.as_ref()).await;
    let in_store = |needle: &str| {
        stored
            .iter()
            .any(|(_, b)| find(b, needle.as_bytes()).is_some())
    };
    // The search sees what is stored in clear: the key, and the path.
    assert!(in_store("k-marked") || in_store(&hex::encode("k-marked")));
    if backend == Backend::Sqlite {
        assert!(
            stored.iter().any(|(name, _)| name.ends_with("-wal")),
            "{:?}",
            stored.iter().map(|(n, _)| n).collect::<Vec<_>>()
        );
    }
    assert_nowhere(&stored, &marker);
}

on_each_backend!(marker_never_stored: sealed_payloads_never_reach_the_sqlite_files, sealed_payloads_never_reach_postgres);

/// A wrong key and no key refuse to start, naming the key ids; the old
/// key as `previous_key_env` opens; `rekey` seals everything under the new
/// one, after which the old key is needed no more.
async fn rotation(backend: Backend) {
    let (old, new) = (StoreKey::generate_base64(), StoreKey::generate_base64());
    let (mut gateway, _schema) = sealed_gateway(backend, &old).await;
    let marker = marker();
    assert_eq!(
        write_marked(&gateway, "k-old", &marker).await.status,
        StatusCode::CREATED
    );
    gateway.shutdown().await;

    let id = |key: &str| {
        let lookup = |_: &str| Some(key.to_string());
        StoreKey::from_env("K", "k", &lookup)
            .unwrap()
            .id()
            .to_string()
    };
    gateway.env.insert(KEY_ENV.into(), new.clone());
    let wrong = gateway
        .try_start()
        .await
        .err()
        .expect("a wrong key refused");
    let wrong = wrong.to_string();
    assert!(
        wrong.contains(&id(&old)) && wrong.contains(&id(&new)) && wrong.contains(KEY_ENV),
        "{wrong}"
    );

    let sealed_toml = gateway.toml.clone();
    gateway.toml = sealed_toml.replace(&format!("encryption_key_env = \"{KEY_ENV}\"\n"), "");
    let keyless = gateway.try_start().await.err().expect("no key refused");
    assert!(
        keyless.to_string().contains("no key is configured"),
        "{keyless}"
    );

    // Rotation: the new key seals, the old one still opens.
    gateway.toml = sealed_toml.replace(
        &format!("encryption_key_env = \"{KEY_ENV}\"\n"),
        &format!("encryption_key_env = \"{KEY_ENV}\"\nprevious_key_env = \"{OLD_KEY_ENV}\"\n"),
    );
    gateway.env.insert(OLD_KEY_ENV.into(), old.clone());
    gateway.start_again().await;
    assert_marked(&write_marked(&gateway, "k-old", &marker).await, &marker);
    assert_eq!(
        write_marked(&gateway, "k-new", &marker).await.status,
        StatusCode::CREATED
    );
    gateway.shutdown().await;

    let env = gateway.env.clone();
    let done = idemgate::rekey::run(&parse_config(&gateway.toml), &|name| env.get(name).cloned())
        .await
        .expect("rekey");
    assert_eq!((done.operations, done.resealed), (2, 1), "{done:?}");

    // Only the new key from now on.
    gateway.toml = sealed_toml;
    gateway.env.remove(OLD_KEY_ENV);
    gateway.start_again().await;
    for key in ["k-old", "k-new"] {
        let replay = write_marked(&gateway, key, &marker).await;
        assert!(replay.is_replay(), "{replay:?}");
        assert_marked(&replay, &marker);
    }
    assert_eq!(gateway.upstream.writes(), 2);
}

on_each_backend!(rotation: keys_rotate_on_sqlite, keys_rotate_on_postgres);

/// Flips the last byte of the stored response body of the operation with
/// `key`: the tag no longer matches.
async fn tamper(gateway: &TestGateway, schema: Option<&PgSchema>, key: &str) {
    match schema {
        None => {
            let conn = rusqlite::Connection::open(&gateway.store_path).expect("open");
            let mut body: Vec<u8> = conn
                .query_row(
                    "SELECT response_body FROM operations WHERE idem_key = ?1",
                    [key],
                    |row| row.get(0),
                )
                .expect("stored body");
            *body.last_mut().expect("not empty") ^= 1;
            let sql = format!("UPDATE operations SET response_body = $1 WHERE idem_key = '{key}'");
            alter(gateway, schema, &sql, Some(&body)).await;
        }
        Some(_) => {
            let sql = format!(
                "UPDATE operations SET response_body = set_byte(response_body,
                    length(response_body) - 1,
                    get_byte(response_body, length(response_body) - 1) # 1)
                 WHERE idem_key = '{key}'"
            );
            alter(gateway, schema, &sql, None).await;
        }
    }
}

async fn tampering(backend: Backend) {
    let key = StoreKey::generate_base64();
    let (mut gateway, schema) = sealed_gateway(backend, &key).await;
    let marker = marker();
    assert_eq!(
        write_marked(&gateway, "k-tampered", &marker).await.status,
        StatusCode::CREATED
    );
    gateway.shutdown().await;
    tamper(&gateway, schema.as_ref(), "k-tampered").await;
    gateway.start_again().await;
    let problem = assert_forgery_refused(&gateway, "k-tampered", &marker, 1).await;
    assert!(
        problem["detail"]
            .as_str()
            .unwrap_or("")
            .contains("response_body"),
        "{problem}"
    );
    // Other operations are served as usual, and nothing was sent again.
    assert_eq!(
        write_marked(&gateway, "k-other", &marker).await.status,
        StatusCode::CREATED
    );
    assert_eq!(gateway.upstream.writes(), 2);
}

on_each_backend!(tampering: a_tampered_value_is_an_error_on_sqlite, a_tampered_value_is_an_error_on_postgres);

/// A store used before a key was configured: its operations still
/// replay, new ones are sealed, and `rekey` seals the old ones; from then
/// on the store is sealed-only, and a value planted in clear is refused.
async fn plain_store_takes_a_key(backend: Backend) {
    let setup = Setup::route("store_request_body = true\n").admin();
    let (mut gateway, schema) = spawn_gateway_on_backend(backend, setup).await;
    let marker = marker();
    assert_eq!(
        write_marked(&gateway, "k-plain", &marker).await.status,
        StatusCode::CREATED
    );
    gateway.shutdown().await;
    gateway.toml = gateway.toml.replace(
        "durability = \"normal\"\n",
        &format!("durability = \"normal\"\nencryption_key_env = \"{KEY_ENV}\"\n"),
    );
    gateway
        .env
        .insert(KEY_ENV.into(), StoreKey::generate_base64());
    gateway.start_again().await;
    assert_marked(&write_marked(&gateway, "k-plain", &marker).await, &marker);
    gateway.shutdown().await;
    let env = gateway.env.clone();
    let config = parse_config(&gateway.toml);
    let done = idemgate::rekey::run(&config, &|name| env.get(name).cloned())
        .await
        .expect("rekey");
    assert_eq!((done.operations, done.resealed), (1, 1));
    let again = idemgate::rekey::run(&config, &|name| env.get(name).cloned())
        .await
        .expect("rekey twice");
    assert_eq!((again.operations, again.resealed), (1, 0));
    gateway.start_again().await;
    assert_marked(&write_marked(&gateway, "k-plain", &marker).await, &marker);
    gateway.shutdown().await;
    plant_cleartext(&gateway, schema.as_ref(), "k-plain").await;
    gateway.start_again().await;
    assert_forgery_refused(&gateway, "k-plain", &marker, 1).await;
}

on_each_backend!(plain_store_takes_a_key: a_plain_store_takes_a_key, a_plain_postgres_store_takes_a_key);

/// The forged response a writer of the database plants.
const FORGED: &str = r#"{"id":666,"status":"refunded","forged":true}"#;

/// Runs `sql` (with `$1` bound to `blob` when given), which changes one
/// row, on the stopped gateway's store, as someone who can write the
/// database would.
async fn alter(gateway: &TestGateway, schema: Option<&PgSchema>, sql: &str, blob: Option<&[u8]>) {
    match schema {
        None => {
            let conn = rusqlite::Connection::open(&gateway.store_path).expect("open");
            // SQLite numbers `$1` as the first parameter, like PostgreSQL.
            let changed = conn
                .execute(sql, rusqlite::params_from_iter(blob))
                .expect(sql);
            assert_eq!(changed, 1, "{sql}");
        }
        Some(schema) => {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect(&schema.url)
                .await
                .expect("connect");
            let mut query = sqlx::query(sql);
            if let Some(blob) = blob {
                query = query.bind(blob);
            }
            let changed = query.execute(&mut conn).await.expect(sql);
            assert_eq!(changed.rows_affected(), 1, "{sql}");
            let _ = conn.close().await;
        }
    }
}

/// Replaces the sealed response of the operation with `key` by
/// [`FORGED`] in clear, headers and body.
async fn plant_cleartext(gateway: &TestGateway, schema: Option<&PgSchema>, key: &str) {
    let sql = format!(
        r#"UPDATE operations SET response_body = $1,
            response_headers = '[["content-type","application/json"]]'
         WHERE idem_key = '{key}'"#
    );
    alter(gateway, schema, &sql, Some(FORGED.as_bytes())).await;
}

/// A retry of `key` gets 500 `store-unreadable` (its problem returned),
/// and so does an operator who shows it; nothing more was sent than the
/// `writes` before.
async fn assert_forgery_refused(
    gateway: &TestGateway,
    key: &str,
    marker: &str,
    writes: usize,
) -> serde_json::Value {
    let retry = write_marked(gateway, key, marker).await;
    assert!(!retry.is_replay(), "{retry:?}");
    let problem = retry.assert_problem(500, "store-unreadable");
    let shown = gateway
        .admin("GET", &format!("/admin/keys?key={key}"), "")
        .await
        .json();
    let id = shown["items"][0]["id"].as_str().expect("listed").to_owned();
    gateway
        .admin("GET", &format!("/admin/keys/{id}"), "")
        .await
        .assert_problem(500, "store-unreadable");
    assert_eq!(gateway.upstream.writes(), writes);
    problem
}

/// What a writer of a sealed store's database does to the stored
/// operations while the gateway is stopped.
#[derive(Clone, Copy, Debug)]
enum Forgery {
    /// A sealed response replaced by one in clear.
    Cleartext,
    /// `response_status` changed in clear (201 to 200).
    Status,
    /// Two operations' sealed values, with their operation ids, swapped
    /// between the rows of two keys: each key's row holds the other's.
    BetweenRows,
    /// The sealed request body put in the response body's place.
    BetweenFields,
}

async fn forgery_is_refused(backend: Backend, forgery: Forgery) {
    let key = StoreKey::generate_base64();
    let (mut gateway, schema) = sealed_gateway(backend, &key).await;
    let marker = marker();
    // One request body for both keys: the same fingerprint, so only the
    // seal tells the rows apart once they are swapped.
    for key in ["k-a", "k-b"] {
        let first = write_marked(&gateway, key, &marker).await;
        assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    }
    gateway.shutdown().await;
    let schema = schema.as_ref();
    match forgery {
        Forgery::Cleartext => plant_cleartext(&gateway, schema, "k-a").await,
        Forgery::Status => {
            let sql = "UPDATE operations SET response_status = 200 WHERE idem_key = 'k-a'";
            alter(&gateway, schema, sql, None).await;
        }
        Forgery::BetweenRows => {
            for (from, to) in [("k-a", "k-swap"), ("k-b", "k-a"), ("k-swap", "k-b")] {
                let sql =
                    format!("UPDATE operations SET idem_key = '{to}' WHERE idem_key = '{from}'");
                alter(&gateway, schema, &sql, None).await;
            }
        }
        Forgery::BetweenFields => {
            let sql = "UPDATE operations SET response_body = request_body WHERE idem_key = 'k-a'";
            alter(&gateway, schema, sql, None).await;
        }
    }
    gateway.start_again().await;
    assert_forgery_refused(&gateway, "k-a", &marker, 2).await;
}

macro_rules! forgeries {
    ($($name:ident: $forgery:ident),* $(,)?) => {$(
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                forgery_is_refused(Backend::Sqlite, Forgery::$forgery).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
            async fn postgres() {
                forgery_is_refused(Backend::Postgres, Forgery::$forgery).await;
            }
        }
    )*};
}

forgeries!(
    a_value_planted_in_clear_is_refused: Cleartext,
    a_status_changed_in_clear_is_refused: Status,
    sealed_values_swapped_between_rows_are_refused: BetweenRows,
    a_sealed_value_moved_between_fields_is_refused: BetweenFields,
);

/// The real binary: `idemgate rekey` on a SQLite store that does not
/// exist refuses it, saying so, and creates nothing (no database, no WAL,
/// no scope-key file); `idemgate migrate` still creates a store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rekey_refuses_a_store_that_does_not_exist() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("missing.db");
    let toml = gateway_toml_with(
        &db,
        "http://127.0.0.1:9",
        &Setup::route("").store(&format!("encryption_key_env = \"{KEY_ENV}\"\n")),
    );
    let config = write_config(dir.path(), "idemgate.toml", &toml);
    let files = || {
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .expect("read dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let mut cmd = binary();
    cmd.arg("rekey")
        .arg("--config")
        .arg(&config)
        .env(KEY_ENV, StoreKey::generate_base64());
    let (status, stdout, stderr) = run_to_exit_within(cmd, WAIT).await;
    assert!(!status.success(), "{stdout}{stderr}");
    assert!(stderr.contains("there is no store at"), "{stderr}");
    assert!(!stdout.contains("rekeyed"), "{stdout}");
    assert_eq!(files(), ["idemgate.toml"], "nothing created");

    let mut cmd = binary();
    cmd.args(["migrate", "--store"])
        .arg(format!("sqlite://{}", db.display()));
    let (status, _, stderr) = run_to_exit_within(cmd, WAIT).await;
    assert!(status.success(), "{stderr}");
    assert!(db.exists(), "migrate creates the store");
}

/// `rekey` on a PostgreSQL database without a store (a fresh schema)
/// refuses it and creates nothing there: no table, where opening it as a
/// gateway does would have migrated it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn rekey_refuses_a_postgres_database_without_a_store() {
    let schema = PgSchema::create().await;
    let setup = Setup::route("")
        .store(&format!("encryption_key_env = \"{KEY_ENV}\"\n"))
        .postgres(&schema);
    let config = parse_config(&gateway_toml_with(
        std::path::Path::new("unused.db"),
        "http://127.0.0.1:9",
        &setup,
    ));
    let key = StoreKey::generate_base64();
    let refused =
        idemgate::rekey::run(&config, &|name| (name == KEY_ENV).then(|| key.clone())).await;
    let error = refused.expect_err("refused").to_string();
    assert!(
        error.starts_with("there is no store at postgres"),
        "{error}"
    );
    let mut conn = admin_connection().await;
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1",
    )
    .bind(&schema.name)
    .fetch_one(&mut conn)
    .await
    .expect("tables");
    assert_eq!(tables, 0, "nothing created");
}

/// The real binary: a key variable unset, not base64, or not 32 bytes
/// refuses to start, naming the variable and the field; `idemgate rekey`
/// without a key says there is none to seal under.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_malformed_key_refuses_to_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = gateway_toml_with(
        &dir.path().join("idemgate.db"),
        "http://127.0.0.1:9",
        &Setup::route("").store(&format!("encryption_key_env = \"{KEY_ENV}\"\n")),
    );
    let config = write_config(dir.path(), "idemgate.toml", &toml);
    use base64::Engine;
    let short = base64::engine::general_purpose::STANDARD.encode([7u8; 16]);
    for (value, expected) in [
        (None, "is not set"),
        (Some("not base64!"), "not base64"),
        (Some(short.as_str()), "16 bytes"),
    ] {
        let mut cmd = binary();
        cmd.arg("serve")
            .arg("--config")
            .arg(&config)
            .env_remove(KEY_ENV);
        if let Some(value) = value {
            cmd.env(KEY_ENV, value);
        }
        let (status, _, stderr) = run_to_exit_within(cmd, WAIT).await;
        assert!(!status.success());
        assert!(
            stderr.contains(KEY_ENV)
                && stderr.contains("store.encryption_key_env")
                && stderr.contains(expected),
            "{stderr}"
        );
    }
    let plain = write_config(
        dir.path(),
        "plain.toml",
        &gateway_toml_with(
            &dir.path().join("idemgate.db"),
            "http://127.0.0.1:9",
            &Setup::route(""),
        ),
    );
    let mut cmd = binary();
    cmd.arg("rekey").arg("--config").arg(&plain);
    let (status, _, stderr) = run_to_exit_within(cmd, WAIT).await;
    assert!(!status.success());
    assert!(stderr.contains("no key to seal under"), "{stderr}");
}
