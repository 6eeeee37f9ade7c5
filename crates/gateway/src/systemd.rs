//! Telling systemd how the gateway is doing: the service notification
//! protocol of sd_notify(3), for `Type=notify` (and systemd 253's
//! `Type=notify-reload`) units such as `contrib/idemgate.service`.
//!
//! `serve` ([`Notifier`], from `main.rs`) sends, as datagrams to the socket
//! systemd names in `NOTIFY_SOCKET`:
//!
//! - `STATUS=` while starting, so a slow migration shows in `systemctl status`;
//! - `READY=1` once [`Gateway::start_with`] returned: the store is migrated
//!   and open, the recovery ran, both listeners are bound. A unit ordered
//!   after idemgate starts only then;
//! - `RELOADING=1` with `MONOTONIC_USEC=` (what `notify-reload` requires to
//!   match the reload to its signal) when SIGHUP arrives, and `READY=1` with
//!   the reload's outcome in `STATUS=` when it is done;
//! - `STOPPING=1` when SIGTERM starts the drain;
//! - `WATCHDOG=1` every half `WATCHDOG_USEC` (`WatchdogSec=`), and only
//!   while the store's writer commits ([`Gateway::health`], what `/readyz`
//!   asks): a gateway whose store is wedged stops pinging, and systemd
//!   restarts it;
//! - `STATUS=` again whenever what an operator should read changed: where it
//!   serves, how many operations are held `unknown`, or that the store does
//!   not answer.
//!
//! `NOTIFY_SOCKET` is read as sd_notify(3) reads it: a path, or `@` and a
//! name in Linux's abstract namespace (how systemd names its socket to a
//! unit in a private mount namespace, and how a container runtime may).
//! Unset or empty (not under systemd), nothing is sent and no timer runs;
//! a value that names no socket (a path with none there; an abstract name
//! nobody hears at the first notification) is logged once, at start, and
//! counts as unset. Notifications that cannot be sent are logged once per
//! run of failures and never stop the gateway: serving matters more than
//! telling.

use std::ffi::OsStr;
use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use sd_notify::NotifyState;
use tokio::time::{MissedTickBehavior, interval, timeout};

use crate::server::{Gateway, Health};
use crate::tls::TlsError;
use idemgate_store::StoreError;

/// How often the status is refreshed when no watchdog asks for more.
pub(crate) const STATUS_EVERY: Duration = Duration::from_secs(30);

/// The service manager, if one listens.
#[derive(Debug, Clone)]
pub struct Notifier {
    /// Where it listens (`NOTIFY_SOCKET`).
    socket: Option<SocketAddr>,
    /// `WATCHDOG_USEC`, when it is meant for this process.
    watchdog: Option<Duration>,
    /// How the sends went ([`Heard`]), shared by the clones.
    heard: Arc<AtomicU8>,
}

/// How a [`Notifier`]'s sends went, so that a socket nobody listens on is
/// said once, not at every notification.
#[repr(u8)]
enum Heard {
    /// Nothing sent yet.
    NotYet,
    /// The last send went through.
    Yes,
    /// The last sends failed (said once).
    Failing,
    /// The first send failed: nobody listens, as if unset.
    Nobody,
}

impl Notifier {
    /// The service manager this process's environment names, if any.
    pub fn from_env() -> Notifier {
        let named = std::env::var_os("NOTIFY_SOCKET");
        let socket = named.as_deref().and_then(|name| {
            destination(name).unwrap_or_else(|error| {
                tracing::warn!(?name, %error, "NOTIFY_SOCKET names no socket: systemd is not told");
                None
            })
        });
        let listening = socket.is_some();
        Notifier {
            socket,
            watchdog: sd_notify::watchdog_enabled().filter(|_| listening),
            heard: Arc::new(AtomicU8::new(Heard::NotYet as u8)),
        }
    }

    /// `STATUS=` alone: what the gateway is doing before it is ready.
    pub fn starting(&self, what: &str) {
        self.send(&[NotifyState::Status(what)]);
    }

    /// `READY=1`: the gateway serves.
    pub async fn ready(&self, gateway: &Gateway) {
        let status = serving(gateway, &gateway.health().await);
        self.send(&[NotifyState::Ready, NotifyState::Status(&status)]);
    }

    /// `RELOADING=1` with `MONOTONIC_USEC=`: a SIGHUP is being handled.
    pub fn reloading(&self) {
        if self.socket.is_none() {
            return;
        }
        match NotifyState::monotonic_usec_now() {
            Ok(now) => self.send(&[
                NotifyState::Reloading,
                now,
                NotifyState::Status("reloading the TLS certificates"),
            ]),
            Err(error) => {
                tracing::warn!(%error, "no monotonic clock for MONOTONIC_USEC");
                self.send(&[NotifyState::Reloading]);
            }
        }
    }

    /// `READY=1` after a reload, its outcome in `STATUS=`.
    pub async fn reloaded(&self, gateway: &Gateway, outcome: &Result<(), TlsError>) {
        let status = reload_status(outcome, &serving(gateway, &gateway.health().await));
        self.send(&[NotifyState::Ready, NotifyState::Status(&status)]);
    }

    /// `STOPPING=1`: the drain starts.
    pub fn stopping(&self, grace: Duration) {
        let status = format!(
            "draining: /readyz says 503, requests in flight finish within {}",
            humantime::format_duration(grace)
        );
        self.send(&[NotifyState::Stopping, NotifyState::Status(&status)]);
    }

    /// Every [`Notifier::period`]: `WATCHDOG=1` while the gateway is
    /// healthy, and `STATUS=` when it changed. Never returns; without a
    /// service manager it only waits.
    pub async fn keep_watch(&self, gateway: &Gateway) {
        let Some(period) = self.period() else {
            return std::future::pending().await;
        };
        let mut ticks = interval(period);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        ticks.tick().await; // the first tick is now: READY=1 just told all
        let mut shown = String::new();
        loop {
            ticks.tick().await;
            // A store that does not answer within the period is not healthy.
            let health = timeout(period, gateway.health()).await.unwrap_or_else(|_| {
                let within = humantime::format_duration(period);
                Err(StoreError::Busy(format!("no answer within {within}")))
            });
            // One datagram a tick: the ping and what the status became.
            let mut states = Vec::with_capacity(2);
            if health.is_ok() && self.watchdog.is_some() {
                states.push(NotifyState::Watchdog);
            }
            let status = serving(gateway, &health);
            if status != shown {
                shown = status;
                states.push(NotifyState::Status(&shown));
            }
            if !states.is_empty() {
                self.send(&states);
            }
        }
    }

    /// How often [`Notifier::keep_watch`] looks: half the watchdog's
    /// timeout, as sd_watchdog_enabled(3) advises, at most
    /// `STATUS_EVERY`; `None` without a service manager.
    pub fn period(&self) -> Option<Duration> {
        self.socket.as_ref()?;
        let watchdog = self.watchdog.map_or(STATUS_EVERY, |timeout| timeout / 2);
        Some(watchdog.min(STATUS_EVERY).max(Duration::from_millis(1)))
    }

    /// Sends `states`. The first send failing means nobody listens (an
    /// abstract name cannot be looked at before): said once, and nothing
    /// more is sent; a later failure is said once per run of failures.
    fn send(&self, states: &[NotifyState<'_>]) {
        let Some(socket) = &self.socket else {
            return;
        };
        if self.heard.load(Ordering::Relaxed) == Heard::Nobody as u8 {
            return;
        }
        let message: String = states.iter().map(|state| format!("{state}\n")).collect();
        match send_to(socket, message.as_bytes()) {
            Ok(()) => self.heard.store(Heard::Yes as u8, Ordering::Relaxed),
            Err(error) => {
                let before = self.heard.swap(Heard::Failing as u8, Ordering::Relaxed);
                if before == Heard::NotYet as u8 {
                    self.heard.store(Heard::Nobody as u8, Ordering::Relaxed);
                    tracing::warn!(%error, "NOTIFY_SOCKET names no socket anyone listens on: systemd is not told");
                } else if before == Heard::Yes as u8 {
                    tracing::warn!(%error, "cannot notify systemd (NOTIFY_SOCKET)");
                }
            }
        }
    }
}

/// The socket `NOTIFY_SOCKET` names: `None` when it is empty, an abstract
/// name after `@`, else a path. (The sd-notify crate connects to any value
/// as a path, so an abstract name was never reached.)
/// A path must be a socket now: one that is not (nothing there yet, a
/// file) names none, and counts as unset rather than warned of at every
/// notification.
fn destination(name: &OsStr) -> io::Result<Option<SocketAddr>> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::FileTypeExt;
    match name.as_bytes() {
        [] => Ok(None),
        [b'@', name @ ..] => abstract_name(name).map(Some),
        _ => {
            if !std::fs::metadata(name)?.file_type().is_socket() {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a socket"));
            }
            SocketAddr::from_pathname(name).map(Some)
        }
    }
}

#[cfg(target_os = "linux")]
fn abstract_name(name: &[u8]) -> io::Result<SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    SocketAddr::from_abstract_name(name)
}

#[cfg(not(target_os = "linux"))]
fn abstract_name(_: &[u8]) -> io::Result<SocketAddr> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "an abstract socket name (`@…`) is Linux's",
    ))
}

/// One datagram to `socket`, from a socket of its own.
fn send_to(socket: &SocketAddr, message: &[u8]) -> io::Result<()> {
    UnixDatagram::unbound()?.send_to_addr(message, socket)?;
    Ok(())
}

/// The status line while serving: where, and how many operations are
/// held; or that the store does not answer.
pub fn serving(gateway: &Gateway, health: &Result<Health, StoreError>) -> String {
    let listeners = format!(
        "proxy on {}, admin on {}",
        gateway.addr(),
        gateway.admin_addr()
    );
    match health {
        Ok(Health { held: 1 }) => format!("serving {listeners}; 1 operation held"),
        Ok(Health { held }) => format!("serving {listeners}; {held} operations held"),
        Err(error) => format!("{listeners}; the store does not answer: {error}"),
    }
}

/// The status line after a SIGHUP: its outcome, then what `serving` says.
pub(crate) fn reload_status(outcome: &Result<(), TlsError>, serving: &str) -> String {
    match outcome {
        Ok(()) => format!("reloaded; {serving}"),
        Err(error) => format!("reload failed, the previous certificate stays: {error}; {serving}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watch_runs_at_half_the_watchdog_and_at_least_every_status_period() {
        let socket = SocketAddr::from_pathname("/run/systemd/notify").unwrap();
        let under = |watchdog| Notifier {
            socket: Some(socket.clone()),
            watchdog,
            heard: Arc::default(),
        };
        assert_eq!(
            under(Some(Duration::from_secs(10))).period(),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            under(Some(Duration::from_secs(600))).period(),
            Some(STATUS_EVERY)
        );
        assert_eq!(under(None).period(), Some(STATUS_EVERY));
        let alone = Notifier {
            socket: None,
            watchdog: None,
            heard: Arc::default(),
        };
        assert_eq!(alone.period(), None);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn notify_socket_is_read_as_sd_notify_reads_it() {
        use std::os::linux::net::SocketAddrExt;
        let read = |value: &str| destination(OsStr::new(value)).unwrap();
        assert!(read("").is_none(), "empty is unset");
        let named = read("@idemgate-notify").unwrap();
        assert_eq!(named.as_abstract_name(), Some(&b"idemgate-notify"[..]));
        let dir = tempfile::tempdir().unwrap();
        let bound = dir.path().join("notify");
        let _socket = UnixDatagram::bind(&bound).unwrap();
        let path = read(bound.to_str().unwrap()).unwrap();
        assert_eq!(path.as_pathname(), Some(bound.as_path()));
        // A path with no socket there names none.
        let missing = dir.path().join("missing");
        assert!(destination(missing.as_os_str()).is_err());
        std::fs::write(&missing, b"").unwrap();
        assert!(
            destination(missing.as_os_str()).is_err(),
            "a file, not a socket"
        );
    }

    #[test]
    fn a_failed_reload_says_so_and_that_the_old_certificate_stays() {
        let failed = Err(TlsError::Invalid {
            path: "proxy.crt".into(),
            reason: "no certificate".into(),
        });
        let status = reload_status(&failed, "serving here");
        assert!(status.starts_with("reload failed"), "{status}");
        assert!(status.ends_with("; serving here"), "{status}");
        assert_eq!(
            reload_status(&Ok(()), "serving here"),
            "reloaded; serving here"
        );
    }
}
