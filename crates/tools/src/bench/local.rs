//! The stack `idemgate bench` drives when given no `--target`: the mock API
//! and a gateway in front of it, both in this process on free loopback
//! ports, with a store in a new temporary directory.
//!
//! Invariant: [`Local::stop`] shuts both down and removes the directory, so
//! a run leaves nothing behind; the gateway never pauses its route for
//! `unknown` operations (`pause_after_unknown = 0`), so `--faults` cannot
//! turn later first writes into refusals and skew the write count.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::cli::BenchDurability;
use crate::mock_upstream::MockUpstream;
use idemgate::config::{Config, ConfigError, InProgressMode, KeyMode, Overrides};
use idemgate::server::{Gateway, StartOptions};
use idemgate_store::StoreKey;

use super::BenchError;

/// `--sealed`: the variable the own gateway reads its store key from,
/// handed over in memory (never the process environment).
const STORE_KEY_ENV: &str = "IDEMGATE_BENCH_STORE_KEY";

/// How the own gateway is set up.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    pub(crate) durability: BenchDurability,
    /// `in_progress = "wait"` instead of `"reject"`.
    pub(crate) wait: bool,
    /// The store sealed with a key made for the run.
    pub(crate) sealed: bool,
    /// Forward the `Idempotency-Key` to the mock. Off for `--populate`: the
    /// mock keeps every key it sees in memory, which would swell the very
    /// resident memory that populating measures.
    pub(crate) forward_key: bool,
}

/// The running mock and gateway.
pub(crate) struct Local {
    mock: MockUpstream,
    gateway: Gateway,
    dir: PathBuf,
    store: PathBuf,
}

impl Local {
    pub async fn start(setup: Setup) -> Result<Local, BenchError> {
        let dir = std::env::temp_dir().join(format!("idemgate-bench-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).map_err(BenchError::Io)?;
        match start_in(&dir, setup).await {
            Ok((mock, gateway, store)) => Ok(Local {
                mock,
                gateway,
                dir,
                store,
            }),
            Err(error) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(error)
            }
        }
    }

    /// The gateway's URL for the bench's writes.
    pub fn target(&self) -> String {
        format!("http://{}/orders", self.gateway.addr())
    }

    /// The mock's URL for the same writes, bypassing the gateway.
    pub(crate) fn mock_target(&self) -> String {
        format!("http://{}/orders", self.mock.addr())
    }

    /// The mock's write counter.
    pub(crate) fn effects_url(&self) -> String {
        format!("http://{}/_effects", self.mock.addr())
    }

    pub fn store_file(&self) -> &Path {
        &self.store
    }

    /// Shuts the gateway (gracefully) and the mock down, removes the store.
    pub async fn stop(self) {
        self.gateway.shutdown().await;
        self.mock.stop().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn start_in(
    dir: &Path,
    setup: Setup,
) -> Result<(MockUpstream, Gateway, PathBuf), BenchError> {
    let mock = MockUpstream::start(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .map_err(BenchError::Io)?;
    let store = dir.join("bench.db");
    let config = config(&store, mock.addr(), setup).map_err(|e| BenchError::Start(e.to_string()));
    // A token of its own: the admin listener is unused, and an
    // IDEMGATE_ADMIN_TOKEN in the environment must not decide whether it starts.
    let mut options = StartOptions {
        admin_token: Some(uuid::Uuid::now_v7().simple().to_string()),
        ..StartOptions::default()
    };
    if setup.sealed {
        options
            .env
            .insert(STORE_KEY_ENV.into(), StoreKey::generate_base64());
    }
    let started = match config {
        Ok(config) => Gateway::start_with(config, options)
            .await
            .map_err(|e| BenchError::Start(e.to_string())),
        Err(error) => Err(error),
    };
    match started {
        Ok(gateway) => Ok((mock, gateway, store)),
        Err(error) => {
            mock.stop().await;
            Err(error)
        }
    }
}

/// What `serve --upstream` would run (one catch-all route), on free
/// loopback ports and `store`, as `setup` says.
fn config(store: &Path, mock: SocketAddr, setup: Setup) -> Result<Config, ConfigError> {
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut config = Config::single_route(&format!("http://{mock}"), KeyMode::Require)?;
    config.apply(&Overrides {
        listen: Some(loopback),
        admin_listen: Some(loopback),
        store_url: Some(format!("sqlite://{}", store.display())),
    })?;
    config.store.durability = setup.durability.into();
    config.store.encryption_key_env = setup.sealed.then(|| STORE_KEY_ENV.into());
    // The load generator's connections are all one client's: the own
    // gateway never refuses them, whatever the concurrency asked for.
    config.server.max_connections = config.server.max_connections.max(super::MAX_CONCURRENCY);
    for route in &mut config.routes {
        route.in_progress = match setup.wait {
            true => InProgressMode::Wait,
            false => InProgressMode::Reject,
        };
        route.pause_after_unknown = 0;
        if !setup.forward_key {
            route.forward_key_header = None;
        }
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_own_config_follows_the_setup() {
        for (durability, wait, sealed, forward_key) in [
            (BenchDurability::Full, false, true, true),
            (BenchDurability::Normal, true, false, false),
        ] {
            let setup = Setup {
                durability,
                wait,
                sealed,
                forward_key,
            };
            let mock = SocketAddr::from(([127, 0, 0, 1], 7000));
            let config = config(Path::new("/tmp/x.db"), mock, setup).expect("valid");
            assert!(config.server.listen.ip().is_loopback());
            assert!(config.server.max_connections >= crate::bench::MAX_CONCURRENCY);
            assert_eq!(config.store.durability, durability.into());
            assert_eq!(config.store.encryption_key_env.is_some(), sealed);
            let route = &config.routes[0];
            assert_eq!(route.pause_after_unknown, 0);
            assert_eq!(route.in_progress == InProgressMode::Wait, wait);
            assert_eq!(route.forward_key_header.is_some(), forward_key);
        }
    }
}
