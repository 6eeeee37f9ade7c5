//! Waiting on events, never on the clock: [`eventually`] polls a probe
//! until it gives a value, for at most [`WAIT`]; [`next_full_pass`] waits
//! for a pass of a background task that began after the call, which a
//! "nothing happened" assertion needs before it can mean anything.

use super::*;

/// How often [`eventually`] asks again.
const POLL_EVERY: Duration = Duration::from_millis(20);

/// The first value `probe` gives, asking every [`POLL_EVERY`]; panics,
/// naming `what` it waited for, after [`WAIT`].
pub async fn eventually<T, F, Fut>(what: &str, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    within_wait(probe)
        .await
        .unwrap_or_else(|| panic!("waited {WAIT:?} for {what}"))
}

/// Like [`eventually`], for at most `limit`: for an event the gateway
/// itself schedules further away than [`WAIT`] (a look on a backoff whose
/// ceiling is longer), the limit being that schedule's bound.
pub async fn eventually_within<T, F, Fut>(what: &str, limit: Duration, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    poll_until(limit, probe)
        .await
        .unwrap_or_else(|| panic!("waited {limit:?} for {what}"))
}

/// Like [`eventually`], `None` after [`WAIT`], for a caller that says
/// more about what went wrong.
pub async fn within_wait<T, F, Fut>(probe: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    poll_until(WAIT, probe).await
}

/// The first value `probe` gives within `limit`, asking every
/// [`POLL_EVERY`].
async fn poll_until<T, F, Fut>(limit: Duration, mut probe: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = probe().await {
            return Some(value);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// How many passes of the background `task` (`retention`, `alerts`,
/// `replicas`) the gateway whose admin listener is `admin` has finished.
pub async fn background_passes(admin: SocketAddr, task: &str) -> f64 {
    let series = format!("idemgate_background_passes_total{{task=\"{task}\"}}");
    let text = scrape_metrics(admin).await;
    metric(&text, &series).unwrap_or_else(|| panic!("no {series} in:\n{text}"))
}

/// Returns once the background `task` of the gateway at `admin` has run
/// a whole pass that began after the call: the count moves on twice,
/// since the first pass to end may have begun before.
pub async fn next_full_pass(admin: SocketAddr, task: &str) {
    let before = background_passes(admin, task).await;
    eventually(&format!("a whole {task} pass"), || async move {
        (background_passes(admin, task).await >= before + 2.0).then_some(())
    })
    .await;
}

/// Returns once the system clock is past `millis` (since the Unix epoch):
/// for what the clock of `idemgate serve` processes decides (a retention, a
/// late window), which a test cannot move as it moves a `ManualClock`.
/// Panics if that is more than [`WAIT`] away.
pub async fn system_clock_past(millis: i64) {
    use idemgate_model::clock::{Clock, SystemClock};
    let ahead = u64::try_from(millis - SystemClock.now_millis()).unwrap_or(0);
    assert!(
        Duration::from_millis(ahead) <= WAIT,
        "{ahead} ms is longer than a test waits"
    );
    while SystemClock.now_millis() <= millis {
        let ahead = millis + 1 - SystemClock.now_millis();
        tokio::time::sleep(Duration::from_millis(u64::try_from(ahead).unwrap_or(1))).await;
    }
}
