//! PostgreSQL 15 clusters of a test's own, beside the shared server of
//! [`PgSchema`], made with Debian's tools: [`PgPair`], a primary and a
//! standby streaming from it (`pg_createcluster`, `pg_basebackup -R`,
//! `pg_ctlcluster`), each on a free port of 127.0.0.1 with trust auth
//! (replication included), for tests that stop, kill or promote a
//! server. Every cluster is dropped (`pg_dropcluster --stop`) when its
//! [`PgCluster`] is, a panicking test's included. The tools run as root
//! (through `sudo -n` when the tests do not), the servers as `postgres`;
//! tests using them are `#[ignore]`d and `.ci/run` runs them.

use super::*;
use sqlx::Connection;

/// The PostgreSQL major version whose tools make the clusters.
const VERSION: &str = "15";

/// One cluster: its name (`pg_lsclusters`) and port.
pub struct PgCluster {
    pub name: String,
    pub port: u16,
}

/// A primary and a standby that streams from it (asynchronously), and a
/// scope key for the gateways that share them.
pub struct PgPair {
    pub primary: PgCluster,
    pub standby: PgCluster,
    pub scope_key_file: PathBuf,
    _key_dir: TempDir,
}

/// `program` to run as root, or as `user`: directly or through `runuser`
/// when the tests run as root, through `sudo -n` otherwise.
fn privileged(user: Option<&str>, program: &str) -> Command {
    use std::os::unix::fs::MetadataExt;
    let root = std::fs::metadata("/proc/self").is_ok_and(|me| me.uid() == 0);
    let mut cmd = match (root, user) {
        (true, None) => return Command::new(program),
        (true, Some(user)) => {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", user, "--"]);
            cmd
        }
        (false, user) => {
            let mut cmd = Command::new("sudo");
            cmd.arg("-n")
                .args(user.map(|user| ["-u", user]).into_iter().flatten());
            cmd
        }
    };
    cmd.arg(program);
    cmd
}

/// Runs a cluster tool as root, or as `user`; panics with what it said
/// when it fails.
async fn tool(user: Option<&str>, program: &str, args: &[&str]) -> String {
    let mut cmd = privileged(user, program);
    cmd.args(args);
    let (status, stdout, stderr) = run_to_exit_within(cmd, WAIT).await;
    assert!(
        status.success(),
        "{program} {} failed ({status}): {stdout}{stderr}",
        args.join(" ")
    );
    stdout
}

/// A port nothing listens on at the moment.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("its address").port()
}

impl PgCluster {
    /// A cluster made (not started) under a name of its own.
    async fn create(role: &str) -> PgCluster {
        let uuid = uuid::Uuid::now_v7().simple().to_string();
        let cluster = PgCluster {
            name: format!("idemgate_{role}_{}", &uuid[uuid.len() - 12..]),
            port: free_port(),
        };
        let port = cluster.port.to_string();
        let data = cluster.data_dir();
        tool(
            None,
            "pg_createcluster",
            &[
                VERSION,
                &cluster.name,
                "-p",
                &port,
                "-d",
                &data,
                "--",
                "--auth=trust",
            ],
        )
        .await;
        cluster
    }

    fn data_dir(&self) -> String {
        format!("/var/lib/postgresql/{VERSION}/{}", self.name)
    }

    /// Starts the cluster and returns once it accepts connections.
    pub async fn start(&self) {
        tool(None, "pg_ctlcluster", &[VERSION, &self.name, "start"]).await;
    }

    /// Kills the server the way a crash would: no checkpoint, every
    /// connection cut.
    pub async fn stop_immediately(&self) {
        let stop = [VERSION, &self.name, "stop", "-m", "immediate"];
        tool(None, "pg_ctlcluster", &stop).await;
    }

    /// The URL of `database` on this cluster alone.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// A connection of the test's own to `database`.
    pub async fn connect(&self, database: &str) -> sqlx::PgConnection {
        let url = self.url(database);
        sqlx::PgConnection::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let dropped = child_output(
            privileged(None, "pg_dropcluster")
                .args(["--stop", VERSION])
                .arg(&self.name),
        );
        match dropped {
            Ok(output) if output.status.success() => {}
            Ok(output) => eprintln!(
                "could not drop cluster {}: {}",
                self.name,
                String::from_utf8_lossy(&output.stderr)
            ),
            Err(error) => eprintln!("could not drop cluster {}: {error}", self.name),
        }
    }
}

impl PgPair {
    /// A started primary holding an empty `database`, and a started standby
    /// streaming from it.
    pub async fn create(database: &str) -> PgPair {
        let primary = PgCluster::create("primary").await;
        primary.start().await;
        let mut conn = primary.connect("postgres").await;
        sqlx::query(&format!("CREATE DATABASE {database}"))
            .execute(&mut conn)
            .await
            .expect("create the database");
        let standby = PgCluster::create("standby").await;
        // The standby's data directory becomes a copy of the primary's.
        let data = standby.data_dir();
        tool(None, "find", &[&data, "-mindepth", "1", "-delete"]).await;
        let port = primary.port.to_string();
        let copy = [
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-U",
            "postgres",
            "-D",
            &data,
            "-R",
            "-X",
            "stream",
            "--checkpoint=fast",
        ];
        tool(Some("postgres"), "pg_basebackup", &copy).await;
        standby.start().await;
        let conn = tokio::sync::Mutex::new(conn);
        let asked = &conn;
        eventually("the standby to stream from the primary", || async move {
            let streaming: Option<String> =
                sqlx::query_scalar("SELECT state FROM pg_stat_replication")
                    .fetch_optional(&mut *asked.lock().await)
                    .await
                    .expect("pg_stat_replication");
            (streaming.as_deref() == Some("streaming")).then_some(())
        })
        .await;
        let _ = conn.into_inner().close().await;
        let (_, scope_key_file, key_dir) = new_scope_key_file();
        PgPair {
            primary,
            standby,
            scope_key_file,
            _key_dir: key_dir,
        }
    }

    /// `database` as a libpq-style URL naming both servers, for whichever
    /// is the primary.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{database}?target_session_attrs=read-write",
            self.primary.port, self.standby.port
        )
    }

    /// Returns once the standby has replayed everything the primary has
    /// written so far, commits not yet flushed included (a session with
    /// `synchronous_commit = off` hears of its commit before that).
    pub async fn wait_replayed(&self) {
        let mut primary = self.primary.connect("postgres").await;
        let written: String = sqlx::query_scalar("SELECT pg_current_wal_insert_lsn()::text")
            .fetch_one(&mut primary)
            .await
            .expect("the primary's position");
        let _ = primary.close().await;
        let standby = tokio::sync::Mutex::new(self.standby.connect("postgres").await);
        let (asked, written) = (&standby, &written);
        eventually(
            "the standby to replay the primary's writes",
            || async move {
                let replayed: bool =
                    sqlx::query_scalar("SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn")
                        .bind(written)
                        .fetch_one(&mut *asked.lock().await)
                        .await
                        .expect("the standby's position");
                replayed.then_some(())
            },
        )
        .await;
        let _ = standby.into_inner().close().await;
    }

    /// Streams the standby's replication through 127.0.0.1:`link` (a
    /// relay in front of the primary) as `standby`, named by the primary's
    /// `synchronous_standby_names` when `synchronous`; returns once it
    /// streams so (as `sync` when synchronous).
    pub async fn replicate_through(&self, link: u16, synchronous: bool) {
        let mut standby = self.standby.connect("postgres").await;
        let conninfo = format!("host=127.0.0.1 port={link} user=postgres application_name=standby");
        sqlx::query(&format!("ALTER SYSTEM SET primary_conninfo = '{conninfo}'"))
            .execute(&mut standby)
            .await
            .expect("primary_conninfo");
        sqlx::query("SELECT pg_reload_conf()")
            .execute(&mut standby)
            .await
            .expect("reload the standby");
        let _ = standby.close().await;
        let primary = tokio::sync::Mutex::new(self.primary.connect("postgres").await);
        if synchronous {
            let mut conn = primary.lock().await;
            sqlx::query("ALTER SYSTEM SET synchronous_standby_names = 'standby'")
                .execute(&mut *conn)
                .await
                .expect("synchronous_standby_names");
            sqlx::query("SELECT pg_reload_conf()")
                .execute(&mut *conn)
                .await
                .expect("reload the primary");
        }
        let wanted = if synchronous { "sync" } else { "async" };
        let asked = &primary;
        eventually("the standby to stream through the link", || async move {
            let state: Option<String> = sqlx::query_scalar(
                "SELECT sync_state FROM pg_stat_replication
                 WHERE application_name = 'standby' AND state = 'streaming'",
            )
            .fetch_optional(&mut *asked.lock().await)
            .await
            .expect("pg_stat_replication");
            (state.as_deref() == Some(wanted)).then_some(())
        })
        .await;
        let _ = primary.into_inner().close().await;
    }

    /// Promotes the standby and returns once it is a primary.
    pub async fn promote(&self) {
        let mut standby = self.standby.connect("postgres").await;
        let promoted: bool = sqlx::query_scalar("SELECT pg_promote()")
            .fetch_one(&mut standby)
            .await
            .expect("pg_promote()");
        assert!(promoted, "the standby was not promoted");
        let _ = standby.close().await;
    }
}
