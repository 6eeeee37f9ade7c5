//! Dead owners and peers: what a gateway does about operations whose
//! owner died, and, on a store shared by replicas (PostgreSQL), how it
//! keeps up with what its peers change.
//!
//! - At start, [`recover`] marks what dead owners left `in_progress`
//!   `unknown` and checks the pause latches of the routes it touched, no
//!   others, so a restart never undoes an operator's resume.
//! - On a shared store, [`watch`] repeats that every [`WATCH_EVERY`] (a
//!   peer whose lease runs out is dead, whenever that happens; the store
//!   marks each of its operations once, whichever replica gets there
//!   first) and re-reads the paused routes, so a pause or a latch set
//!   through one replica holds on every replica within that period. Its
//!   caller may name another period (tests do); each look that ends
//!   without a store error is counted
//!   (`idemgate_background_passes_total{task="replicas"}`).
//! - Either way, the MCP routes look for calls marked `unknown` in flight
//!   (at start, and on a shared store each period: a peer's marked by any
//!   replica): those may still run at their servers, and what would stop
//!   them there is kept back meanwhile (`Proxy::follow_marked_calls`).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::background;
use crate::config::Route;
use crate::metrics::{Metrics, Task};
use crate::pipeline::Proxy;
use idemgate_store::{Store, StoreError};

/// How often a replica looks for lost peers and re-reads the pauses.
pub(crate) const WATCH_EVERY: Duration = Duration::from_secs(1);

/// Marks dead owners' operations `unknown` and trips the latches of the
/// routes they were on.
pub async fn recover(store: &dyn Store, routes: &[Route]) -> Result<(), StoreError> {
    let touched = store.recover().await?;
    for route in routes.iter().filter(|r| r.pause_after_unknown > 0) {
        if touched.contains(&route.name)
            && store
                .trip_pause_latch(&route.name, route.pause_after_unknown)
                .await?
        {
            tracing::warn!(route = %route.name, "route paused: too many operations unknown");
        }
    }
    Ok(())
}

/// On a shared store, until `stop`: [`recover`], then follow the stored
/// pauses, every `every` ([`WATCH_EVERY`] unless a test says otherwise).
pub async fn watch(
    store: Arc<dyn Store>,
    proxy: Arc<Proxy>,
    routes: Vec<Route>,
    every: Duration,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    while background::tick(every, &stop).await {
        let mut recovered = recover(store.as_ref(), &routes).await.map(drop);
        if recovered.is_ok() {
            recovered = proxy.follow_marked_calls().await;
        }
        if let Err(error) = &recovered {
            tracing::warn!(%error, "cannot look for lost replicas; trying again");
        }
        let followed = store
            .paused_routes()
            .await
            .map(|paused| proxy.follow_pauses(&paused));
        if let Err(error) = &followed {
            tracing::warn!(%error, "cannot read the paused routes; trying again");
        }
        if recovered.is_ok() && followed.is_ok() {
            metrics.background_pass(Task::replicas);
        }
    }
}
